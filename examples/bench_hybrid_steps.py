"""Compiled hybrid (gated DeltaNet + gated attention) targets at real shapes: bf16 token forcing
and step times (random weights).

1. Token forcing in bf16: a Qwen3.5-shaped target (transformers' ``Qwen3_5TextConfig``
   defaults: hidden 4096, 32 layers of which 24 GDN, Hk 16 / Hv 32 heads of dk = dv = 128,
   about 9B parameters; ``--layers N`` keeps the first N) with random weights, compiled in
   memory with the default pipeline (verify and tree verify steps) and driven by a random PARD
   drafter (Qwen3-0.6B shapes, the target's vocabulary) through the engine's loop, chain (k = 7)
   and tree (16 nodes). The reference is HF transformers' greedy generation on the same
   tensors; forcing compares the compiled argmax at every position (ties below the bf16
   tolerance are reported, not failed) and the free speculative generation, with the fp32
   audit (``specc.verify.fp32_referee``: HF again in fp32 on the same weights; the report says
   when it does not fit). Random drafters accept little: this checks the verify paths and the
   GDN state commits (mostly of 0 or 1 accepted tokens), not acceptance.
   Before forcing, the precision probe: logits at every stock position (prompt + stock's
   tokens, one forward each) of HF in bf16 (stock), HF in fp32, the compiled target step and
   the eager model definition, and how far each is from fp32 and from stock. Compiled about as
   far from fp32 as stock is: the forcing mismatches are bf16 noise (which this deep random
   hybrid amplifies); clearly farther: a precision or correctness problem in the compiled step.
2. Step times with CUDA graphs (median of replays, CUDA events), bs1, context 1024: the compiled
   target at Q = 1 (AR step, GDN decode), Q = 16 (chain verify) and a 16-node tree verify; per
   GDN layer the delta-rule and conv kernels at the same shapes; and the commit strategies of
   one GDN layer: snapshots (the verify kernel writes every node's state, a commit copies one)
   against replay (the verify kernel writes none, a commit re-runs the accepted tokens from the
   state before the step) for 0..16 accepted tokens.

    PYTHONPATH=. python3 examples/bench_hybrid_steps.py --out $OUT/hybrid_steps.json
    PYTHONPATH=. python3 examples/bench_hybrid_steps.py --skip-steps --cases chain --out $OUT/hybrid_forcing.json
    PYTHONPATH=. python3 examples/bench_hybrid_steps.py --skip-steps --layers 4 --out $OUT/hybrid_l4.json
    PYTHONPATH=. python3 examples/bench_hybrid_steps.py --skip-steps --cases chain --layers 4 --no-graphs
    PYTHONPATH=. python3 examples/bench_hybrid_steps.py --state-audit --layers 4 --out $OUT/hybrid_state_audit.json
    PYTHONPATH=. python3 examples/bench_hybrid_steps.py --tiny --device cpu    # a CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch

from specc.bench.shapes import QWEN3_06B, build_causal, build_hybrid, hf_hybrid_twin, hybrid_raw, tiny

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


def precision_probe(target, hf, referee, runs, step, dev, first: int = 4) -> dict:
    """Logits at every generated position of each stock run (one forward over prompt + stock's
    tokens) from stock (HF in the run's dtype), HF in fp32 (the referee's copy; absent when stock
    runs in fp32), the compiled target step and the eager model definition; their deviations
    (``specc.verify.precision``) from fp32 and from stock."""
    from specc.verify.precision import deviation_line, logit_deviation

    names = ("stock", "fp32", "compiled", "eager")
    got = {name: [] for name in names}
    with torch.inference_mode():
        for index, run in enumerate(runs):
            ids = torch.tensor([run.prompt + run.tokens], device=dev)
            n, start = ids.shape[1], len(run.prompt) - 1
            pos, fresh = torch.arange(n, device=dev)[None], torch.zeros(1, dtype=torch.long, device=dev)
            if referee is not None:
                low, ref = referee.logits(index, run)
                got["stock"].append(low)
                got["fp32"].append(ref)
            else:
                got["stock"].append(hf(input_ids=ids).logits[0, start:-1].float())
            step.setup_caches(1, n + 1, device=dev)
            got["compiled"].append(step(ids, pos, fresh)[0, start:-1].float())
            target.setup_caches(1, n + 1, device=dev)
            got["eager"].append(target(ids, pos, fresh)[0, start:-1].float())
    cat = {name: torch.cat(v) for name, v in got.items() if v}
    pairs = [("compiled", "stock"), ("eager", "stock")]
    if "fp32" in cat:
        pairs = [("stock", "fp32"), ("compiled", "fp32"), ("eager", "fp32")] + pairs
    out = {}
    for a, b in pairs:
        out[f"{a}_vs_{b}"] = dev_ = logit_deviation(cat[a], cat[b], first)
        print(f"[precision] {deviation_line(f'{a} vs {b}', dev_)}", flush=True)
    if "fp32" in cat and out["stock_vs_fp32"]["max_abs"] > 0:
        ratio = out["compiled_vs_fp32"]["max_abs"] / out["stock_vs_fp32"]["max_abs"]
        out["compiled_over_stock_error"] = ratio
        print(f"[precision] compiled's max deviation from fp32 is {ratio:.2f}x stock's own (about 1: bf16 noise; "
              f"clearly above: the compiled step rounds or computes differently)", flush=True)
    else:
        print("[precision] stock runs in fp32: no fp32 reference beyond stock itself", flush=True)
    margins = torch.tensor([m for r in runs for m in r.margins])
    out["stock_margin"] = {"min": float(margins.min()), "median": float(margins.median())}
    return out


def forcing(dtype, dev, small: bool, prompts: int, new_tokens: int, layers: int | None = None,
            cases: tuple[str, ...] = ("chain", "tree"), graphs: bool = True) -> dict:
    """Token forcing of the compiled chain / tree cases against HF (module doc, 1.); ``graphs``:
    through CUDA graphs as the engine runs on a GPU (False: every step eager, which tells a
    graph-capture defect from a kernel one)."""
    from specc.runtime.engine import build_loop
    from specc.verify import StockRun, fp32_referee, stock_margins, verify_system
    from specc.verify.forcing import DEFAULT_TOLERANCE, top2_margins

    raw = hybrid_raw(small, layers)
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
                              eos_token_id=None, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
            tokens = out.sequences[0, len(prompt):].tolist()
            # margins of the logits stock chose its tokens from (prefill, then one-token decodes);
            # a separate full forward differs from them by bf16 noise (other GDN forms)
            decoded = top2_margins(torch.cat(out.logits))
            full = stock_margins(hf, prompt, tokens)
            runs.append(StockRun(prompt, tokens, decoded))
            shift = max(abs(a - b) for a, b in zip(decoded, full))
            print(f"[forcing] stock margins: decode path vs one full forward differ by up to {shift:.3f}", flush=True)
    print(f"[forcing] HF greedy reference: {time.perf_counter() - t0:.1f} s", flush=True)
    t0 = time.perf_counter()
    referee, audit = fp32_referee(hf)
    print(f"[forcing] {audit} ({time.perf_counter() - t0:.1f} s)", flush=True)
    name = str(dtype).removeprefix("torch.")
    res = {"layers": raw["num_hidden_layers"], "audit": audit, "cuda_graphs": graphs and dev == "cuda"}
    wanted = [c for c in (("chain k=7", 7, 0), ("tree 16 nodes", 7, 16)) if c[0].split()[0] in cases]
    for label, k, tree in wanted:
        t0 = time.perf_counter()
        steps, _ = compiled_steps(target, draft, k, tree)
        print(f"[forcing] {label}: compiled in {time.perf_counter() - t0:.1f} s", flush=True)
        if "precision" not in res:
            res["precision"] = precision_probe(target, hf, referee, runs, steps["target"], dev)
        loop = build_loop(steps, "pard", k, 12 + new_tokens + 2, 3, graphs=graphs and dev == "cuda",
                          tree_budget=tree)
        t0 = time.perf_counter()
        with torch.inference_mode():
            report = verify_system(loop, runs, DEFAULT_TOLERANCE[name], referee=referee, audit=audit)
        res[label] = report.to_json()
        print(f"[forcing] {label}: {report.summary()} ({time.perf_counter() - t0:.1f} s)", flush=True)
        for m in report.failures + report.audited_ties:
            print(f"[forcing]   prompt {m.prompt_index} position {m.position}: stock margin {m.margin:.3f}, "
                  f"fp32 margin {m.fp32_margin if m.fp32_margin is None else round(m.fp32_margin, 3)}, "
                  f"stock's own error {m.stock_error if m.stock_error is None else round(m.stock_error, 3)}", flush=True)
        del loop, steps
    return res


def state_audit(dtype, dev, small: bool, prompts: int, new_tokens: int, layers: int | None = None, k: int = 7,
                tolerance: float = 0.1, warmups: int | None = None) -> dict:
    """Where the compiled chain verify's GDN state first departs (``specc.verify.state_audit``):
    random tokens forced in blocks of k + 1 through the compiled target step three ways, the
    recurrent state and conv window of every GDN layer and the logits compared after every
    block: graphed as the engine runs it (CUDA graphs on a GPU) against the same step eager
    (about 0 unless capture or replay goes wrong: tolerance 1e-2), and the eager step against
    the model definition in fp32 on the same bf16-rounded weights (bf16 noise: ``tolerance``).
    ``warmups``: warm-up calls before each capture (None: GraphedStep's choice for the step; 2
    replays the protocol that advanced the state of the first block of each shape three times)."""
    from specc.runtime.device_loop import DeviceSpeculativeDecoder
    from specc.runtime.graphs import GraphedStep
    from specc.verify.state_audit import block_states, compare_blocks, divergence_line

    raw = hybrid_raw(small, layers)
    target = build_hybrid(raw, dtype, dev, seed=1)
    steps, _ = compiled_steps(target, None, k, 0)
    step = steps["target"]
    g = torch.Generator().manual_seed(0)
    vocab = raw["vocab_size"]
    runs = [(torch.randint(4, vocab, (12,), generator=g).tolist(), torch.randint(4, vocab, (new_tokens,), generator=g).tolist())
            for _ in range(prompts)]
    max_len = 12 + new_tokens + 2

    def records(system):  # each loop binds its own state to the step: run it to the end first
        loop = DeviceSpeculativeDecoder(system, None, k, max_len)
        with torch.inference_mode():
            return [block_states(loop, prompt, tokens) for prompt, tokens in runs]

    wrap = dict(warmup=warmups, eager_first=False) if warmups is not None else {}
    graphed = records(GraphedStep(step, k + 1, **wrap) if dev == "cuda" else step)
    eager = records(step)
    del target, steps, step
    reference = build_hybrid(raw, dtype, dev, seed=1).float()
    fp32 = records(reference)
    res = {"layers": raw["num_hidden_layers"], "k": k, "cuda_graphs": dev == "cuda", "graph_warmups": warmups,
           "prompts": []}
    for index in range(prompts):
        pair = {"graphed_vs_eager": compare_blocks(graphed[index], eager[index], 1e-2),
                "eager_vs_fp32": compare_blocks(eager[index], fp32[index], tolerance)}
        for label, cmp in pair.items():
            print(f"[state audit] prompt {index}: {divergence_line(label.replace('_', ' '), cmp)}", flush=True)
        res["prompts"].append(pair)
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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (a smoke run)")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--layers", type=int, help="keep only the first N target layers (same shapes; default all)")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"),
                    help="default: bfloat16 on CUDA, float32 on the CPU")
    ap.add_argument("--cases", default="chain,tree", help="forcing cases: chain, tree or both (default chain,tree)")
    ap.add_argument("--skip-forcing", action="store_true")
    ap.add_argument("--state-audit", action="store_true",
                    help="only the per-block GDN state audit of the chain verify (graphed vs eager vs fp32)")
    ap.add_argument("--graph-warmups", type=int, metavar="N",
                    help="--state-audit: N warm-up calls before each CUDA-graph capture (default: the engine's choice)")
    ap.add_argument("--no-graphs", action="store_true",
                    help="force every step eagerly (default on CUDA: through CUDA graphs, as the engine runs)")
    ap.add_argument("--skip-steps", action="store_true", help="forcing and the precision probe only")
    ap.add_argument("--out", help="write the results as JSON")
    args = ap.parse_args(argv)
    dev = args.device
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if dev == "cuda" else torch.float32)
    if args.layers is not None and args.layers < 1:
        ap.error("--layers must be >= 1")
    cases = tuple(c.strip() for c in args.cases.split(",") if c.strip())
    if not cases or any(c not in ("chain", "tree") for c in cases):
        ap.error(f"--cases takes chain, tree or chain,tree (got {args.cases!r})")
    context = min(args.context, 64) if args.tiny else args.context
    import transformers
    import triton

    res = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "dtype": str(dtype),
           "versions": {"torch": torch.__version__, "triton": triton.__version__,
                        "transformers": transformers.__version__}}
    if args.state_audit:
        res["state_audit"] = audit = state_audit(dtype, dev, args.tiny, args.prompts, args.tokens, args.layers,
                                                 warmups=args.graph_warmups)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(res, f, indent=2)
        if any(p["graphed_vs_eager"]["first"] is not None for p in audit["prompts"]):
            raise SystemExit(1)
        return
    if not args.skip_forcing:
        res["forcing"] = forcing(dtype, dev, args.tiny, args.prompts, min(args.tokens, 12) if args.tiny else args.tokens,
                                 args.layers, cases, graphs=not args.no_graphs)
    if not args.skip_steps:
        res["steps"] = step_times(dtype, dev, args.tiny, context)
    ok = all(r["passed"] for r in res.get("forcing", {}).values() if isinstance(r, dict) and "passed" in r)
    res["forcing_passed"] = ok if "forcing" in res else None
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2, default=lambda o: o if not isinstance(o, float) or math.isfinite(o) else None)
    steps = res.get("steps", {})
    print(json.dumps({"forcing_passed": res["forcing_passed"], "ar_ms": steps.get("ar_ms"),
                      "verify16_ms": steps.get("verify16_ms"), "tree16_ms": steps.get("tree16_ms")}))
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
