"""Compiled hybrid (gated DeltaNet + gated attention) targets at real shapes: bf16 token forcing
and step times (random weights).

1. Token forcing in bf16: a Qwen3.5-shaped target (transformers' ``Qwen3_5TextConfig``
   defaults: hidden 4096, 32 layers of which 24 GDN, Hk 16 / Hv 32 heads of dk = dv = 128,
   about 9B parameters) with random weights, compiled in memory with the default pipeline
   (verify and tree verify steps) and driven by a random PARD drafter (Qwen3-0.6B shapes, the
   target's vocabulary) through the engine's loop, chain (k = 7) and tree (16 nodes). The
   reference is HF transformers' greedy generation on the same tensors; forcing compares the
   compiled argmax at every position (ties below the bf16 tolerance are reported, not failed)
   and the free speculative generation. Random drafters accept little: this checks the verify
   paths and the GDN state commits (mostly of 0 or 1 accepted tokens), not acceptance.
2. Step times with CUDA graphs (median of replays, CUDA events), bs1, context 1024: the compiled
   target at Q = 1 (AR step, GDN decode), Q = 16 (chain verify) and a 16-node tree verify; per
   GDN layer the delta-rule and conv kernels at the same shapes; and the commit strategies of
   one GDN layer: snapshots (the verify kernel writes every node's state, a commit copies one)
   against replay (the verify kernel writes none, a commit re-runs the accepted tokens from the
   state before the step) for 0..16 accepted tokens.

    PYTHONPATH=. python3 examples/bench_hybrid_steps.py --out $OUT/hybrid_steps.json
    PYTHONPATH=. python3 examples/bench_hybrid_steps.py --tiny --device cpu    # a CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch

from specc.bench.shapes import QWEN3_06B, build_causal, init_, tiny

TINY_HYBRID = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                   linear_key_head_dim=8, linear_value_head_dim=8, max_position_embeddings=4096, eos_token_id=511)


def hybrid_raw(small: bool) -> dict:
    """config.json of the target: transformers' Qwen3.5 defaults (real shapes) or a tiny one."""
    from transformers import Qwen3_5TextConfig

    raw = Qwen3_5TextConfig(**(TINY_HYBRID if small else {})).to_dict()
    raw["model_type"] = "qwen3_5_text"
    return raw


def build_hybrid(raw: dict, dtype, dev, seed: int):
    """A HybridLM with random weights: N(0, 0.02) matrices (residual outputs scaled by depth),
    zero-centred norms at 0, GDN output norms at 1, conv taps N(0, 0.3), A_log = log U(1, 16)
    and dt_bias = 1 (HF's initialisation of the decay)."""
    from specc.models.hybrid import HybridLM
    from specc.models.hybrid_config import hybrid_config_from_hf

    cfg = hybrid_config_from_hf(raw)
    with torch.device("meta"):
        model = HybridLM(cfg)
    model = model.to_empty(device=dev)
    init_(model, seed)
    g = torch.Generator(device=dev).manual_seed(seed + 100)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape, device=dev).uniform_(1, 16, generator=g).log())
            elif name.endswith("dt_bias") or name.endswith("linear_attn.norm.weight"):
                p.fill_(1.0)
            elif p.dim() == 1:
                p.zero_()
            elif "conv1d" in name:
                p.copy_(torch.randn(p.shape, generator=g, device=dev) * 0.3)
    model = model.to(dtype)
    model.inv_freq = cfg.rope.inv_freq(cfg.rotary_dim).to(dev)
    return model.eval()


def hf_hybrid_twin(model, raw: dict):
    """HF's Qwen3_5ForCausalLM sharing ``model``'s tensors (parameter names match, ``model.``
    prefixed)."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    cfg = Qwen3_5TextConfig(**{k: v for k, v in raw.items() if k != "model_type"})
    cfg._attn_implementation = "eager"
    with torch.device("meta"):
        hf = Qwen3_5ForCausalLM(cfg)
    state = {(k if k.startswith("lm_head") else "model." + k): v for k, v in model.named_parameters()}
    hf.load_state_dict(state, strict=False, assign=True)
    for m in hf.modules():
        if hasattr(m, "inv_freq"):
            m.inv_freq = model.inv_freq.clone()
            m.original_inv_freq = model.inv_freq.clone()
    return hf.eval()


def binary_tree(n: int, dev) -> tuple[torch.Tensor, torch.Tensor]:
    """(ancestor mask [n, n], depth [n]) of a binary tree in topological order: parent (i-1)//2."""
    parents = [-1] + [(i - 1) // 2 for i in range(1, n)]
    mask = torch.zeros(n, n, dtype=torch.bool)
    depth = torch.zeros(n, dtype=torch.long)
    for i, p in enumerate(parents):
        mask[i, i] = True
        if p >= 0:
            mask[i] |= mask[p]
            depth[i] = depth[p] + 1
    return mask.to(dev), depth.to(dev)


def compiled_steps(target, draft, k: int, tree: int):
    """The target's verify (+ tree verify) and the PARD drafter's step, compiled in memory."""
    from specc.codegen.build import build_steps
    from specc.passes.pipelines import DEFAULT_PIPELINE
    from specc.runtime.compiled import instantiate
    from specc.runtime.state import reserve_block

    reserve_block(target, max(k, tree) + 1)
    target.setup_caches(1, 16)
    if draft is not None:
        draft.setup_caches(1, 16)
    built = build_steps(target, draft, DEFAULT_PIPELINE, None, tree=tree > 0)
    return {role: instantiate(e) for role, e in built.emitted.items()}, built


def forcing(dtype, dev, small: bool, prompts: int, new_tokens: int) -> dict:
    from specc.runtime.engine import build_loop
    from specc.verify import StockRun, stock_margins, verify_system
    from specc.verify.forcing import DEFAULT_TOLERANCE

    raw = hybrid_raw(small)
    target = build_hybrid(raw, dtype, dev, seed=1)
    hf = hf_hybrid_twin(target, raw)
    pcfg = dict(tiny(QWEN3_06B, 2) if small else QWEN3_06B, vocab_size=raw["vocab_size"], pard_token=3)
    draft = build_causal(pcfg, dtype, dev, seed=2)
    g = torch.Generator().manual_seed(0)
    runs = []
    t0 = time.perf_counter()
    with torch.inference_mode():
        for _ in range(prompts):
            prompt = torch.randint(4, raw["vocab_size"], (12,), generator=g).tolist()
            out = hf.generate(torch.tensor([prompt], device=dev), max_new_tokens=new_tokens, do_sample=False,
                              eos_token_id=None, pad_token_id=0)
            tokens = out[0, len(prompt):].tolist()
            runs.append(StockRun(prompt, tokens, stock_margins(hf, prompt, tokens)))
    print(f"[forcing] HF greedy reference: {time.perf_counter() - t0:.1f} s", flush=True)
    name = "bfloat16" if dtype == torch.bfloat16 else "float32"
    res = {}
    for label, k, tree in (("chain k=7", 7, 0), ("tree 16 nodes", 7, 16)):
        steps, _ = compiled_steps(target, draft, k, tree)
        loop = build_loop(steps, "pard", k, 12 + new_tokens + 2, 3, graphs=dev == "cuda", tree_budget=tree)
        with torch.inference_mode():
            report = verify_system(loop, runs, DEFAULT_TOLERANCE[name])
        res[label] = report.to_json()
        print(f"[forcing] {label}: {report.summary()}", flush=True)
        del loop, steps
    return res


def timed(fn, args, dev) -> float:
    from specc.search.calibrate import Timer

    with torch.inference_mode():
        return Timer(dev, reps=30 if dev == "cuda" else 3)(lambda: fn(*args)) * 1e3


def step_times(dtype, dev, small: bool, context: int) -> dict:
    raw = hybrid_raw(small)
    target = build_hybrid(raw, dtype, dev, seed=1)
    steps, _ = compiled_steps(target, None, 15, 16)
    step, tree_step = steps["target"], steps["target_tree"]
    state = step.setup_caches(1, context + 64, device=dev)
    state.bind(tree_step)
    vocab = raw["vocab_size"]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, vocab, (1, context + 16), generator=g).to(dev)
    with torch.inference_mode():
        step(ids[:, :context], torch.arange(context, device=dev)[None], torch.tensor([0], device=dev))
    lens = torch.tensor([context], device=dev)
    mask, depth = binary_tree(16, dev)
    res = {"context": context, "config": {k: raw[k] for k in ("hidden_size", "num_hidden_layers", "linear_num_key_heads",
                                                              "linear_num_value_heads", "linear_key_head_dim",
                                                              "linear_value_head_dim", "vocab_size")},
           "weight_bytes": float(sum(p.numel() * p.element_size() for n, p in target.named_parameters()
                                     if "embed" not in n))}
    res["ar_ms"] = timed(step, (ids[:, context:context + 1], lens[:, None], lens), dev)
    res["verify16_ms"] = timed(step, (ids[:, context:context + 16], context + torch.arange(16, device=dev)[None], lens),
                               dev)
    res["tree16_ms"] = timed(tree_step, (ids[:, context:context + 16], (context + depth)[None], lens, mask[None]), dev)
    for key in ("ar_ms", "verify16_ms", "tree16_ms"):
        print(f"[steps] compiled target {key[:-3]}: {res[key]:.3f} ms ({res[key] / res['ar_ms']:.2f}x AR)", flush=True)
    res["gdn_layer"] = gdn_layer_times(raw, dev)
    return res


def gdn_layer_times(raw: dict, dev) -> dict:
    """One GDN layer's kernels at the target's shapes, and snapshot vs replay commits."""
    from specc.codegen.kernels import gated_delta as kern

    hk, hv = raw["linear_num_key_heads"], raw["linear_num_value_heads"]
    dk, dv, width = raw["linear_key_head_dim"], raw["linear_value_head_dim"], raw["linear_conv_kernel_dim"]
    channels = 2 * hk * dk + hv * dv
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    g = torch.Generator().manual_seed(1)
    lens = torch.tensor([100], device=dev)
    snap = torch.randn(1, 18, hv, dk, dv, generator=g).to(dev) * 0.1  # 16 per-node entries
    bare = snap[:, :2].clone()  # live + before: the verify of the replay strategy writes no nodes
    conv = torch.randn(1, 18, channels, width - 1, generator=g).to(dtype).to(dev)
    weight = (torch.randn(channels, 1, width, generator=g) * 0.3).to(dtype).to(dev)
    parents = torch.tensor([[-1] + [(i - 1) // 2 for i in range(1, 16)]], device=dev)
    out = {}

    def block(q):
        mixed = torch.randn(1, q, channels, generator=g).to(dtype).to(dev)
        decay = (-torch.rand(1, q, hv, generator=g)).to(dev)
        beta = torch.rand(1, q, hv, generator=g).to(dtype).to(dev)
        return mixed, decay, beta

    m1, d1, b1 = block(1)
    m16, d16, b16 = block(16)
    out["delta_rule_ms"] = {
        "decode": timed(kern.delta_rule_step, (m1, d1, b1, snap, lens, hk), dev),
        "chain16": timed(kern.delta_rule_step, (m16, d16, b16, snap, lens, hk), dev),
        "tree16": timed(kern.delta_rule_step, (m16, d16, b16, snap, lens, hk, parents), dev)}
    out["conv_ms"] = {"decode": timed(kern.conv_step, (m1, conv, weight, lens), dev),
                      "chain16": timed(kern.conv_step, (m16, conv, weight, lens), dev),
                      "tree16": timed(kern.conv_step, (m16, conv, weight, lens, parents), dev)}
    for key in ("delta_rule_ms", "conv_ms"):
        print(f"[gdn layer] {key[:-3]}: " + ", ".join(f"{k} {v:.4f} ms" for k, v in out[key].items()), flush=True)

    def select(buf, entry):
        buf[:, 0] = buf[:, entry]

    copy_ms = timed(select, (snap, 9), dev)
    verify_snap = out["delta_rule_ms"]["chain16"]
    verify_bare = timed(kern.delta_rule_step, (m16, d16, b16, bare, lens, hk), dev)
    out["commit"] = {"snapshot_verify_ms": verify_snap, "select_ms": copy_ms, "replay_verify_ms": verify_bare,
                     "replay_ms": {}}
    for accepted in (1, 4, 8, 16):
        out["commit"]["replay_ms"][accepted] = timed(
            kern.delta_rule_step, (m16[:, :accepted], d16[:, :accepted], b16[:, :accepted], bare, lens, hk), dev)
    c = out["commit"]
    print(f"[commit] snapshot: verify {verify_snap:.4f} + select {copy_ms:.4f} ms; replay: verify {verify_bare:.4f} + "
          + ", ".join(f"{a} accepted {t:.4f}" for a, t in c["replay_ms"].items()) + " ms", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (a smoke run)")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--skip-forcing", action="store_true")
    ap.add_argument("--out", help="write the results as JSON")
    args = ap.parse_args()
    dev = args.device
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    context = min(args.context, 64) if args.tiny else args.context
    import transformers
    import triton

    res = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "dtype": str(dtype),
           "versions": {"torch": torch.__version__, "triton": triton.__version__,
                        "transformers": transformers.__version__}}
    if not args.skip_forcing:
        res["forcing"] = forcing(dtype, dev, args.tiny, args.prompts, min(args.tokens, 12) if args.tiny else args.tokens)
    res["steps"] = step_times(dtype, dev, args.tiny, context)
    ok = all(r["passed"] for r in res.get("forcing", {}).values())
    res["forcing_passed"] = ok if "forcing" in res else None
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2, default=lambda o: o if not isinstance(o, float) or math.isfinite(o) else None)
    print(json.dumps({"forcing_passed": res["forcing_passed"], "ar_ms": res["steps"]["ar_ms"],
                      "verify16_ms": res["steps"]["verify16_ms"], "tree16_ms": res["steps"]["tree16_ms"]}))
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
