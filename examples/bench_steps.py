"""Step-time benchmark and bf16 token forcing of compiled modules at real shapes (random weights).

One GPU run does both halves of the codegen/runtime check:

1. Token forcing in bf16: Qwen3-8B and Llama-3.1-8B shaped targets, each with a PARD drafter
   (Qwen3-0.6B / Llama-3.2-1B shapes) and a DFlash-b16 drafter (5 layers), compiled in memory
   with the default pass pipeline and run through the speculative loop; stock is HF transformers
   eager on the same weights. Random drafters accept little: this checks the compiled target's
   verify path and the drafters' kernels, not acceptance.
2. Step times with CUDA graphs (median of replays, CUDA events), Qwen3-8B shapes, bs1, context
   1024: compiled AR step, compiled verify at Q = 1, 4, 8, 16, 32, 64, compiled DFlash-b16 draft
   step, beside the same weights run as cuBLAS linears + SDPA in a CUDA graph (the DESIGN.md
   baseline, measured in the same run) and the weight-bytes floor at the measured copy bandwidth.

    PYTHONPATH=. python3 examples/bench_steps.py --out $OUT/steps.json
    PYTHONPATH=. python3 examples/bench_steps.py --tiny --device cpu   # a CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import time

import torch

# Real shapes and random-weight builders: one definition, shared with `specc bench --shapes`.
from specc.bench.shapes import (  # noqa: E402
    LLAMA_1B,
    LLAMA_8B,
    QWEN3_06B,
    QWEN3_8B,
    build_causal,
    build_dflash,
    dflash_config,
    hf_twin,
    tiny,
)


def compiled_system(target, draft_module, method: str, k: int, spec, max_len: int, graphs: bool,
                    linear_choice=None, pipeline: str | None = None):
    """The compiled steps under the engine's loop (``specc.runtime.engine.build_loop``);
    ``linear_choice``: a ``codegen.linear_choice.LinearChoice`` for the lowering (None: Triton);
    ``pipeline``: the pass pipeline (None: the compile default)."""
    from specc.codegen.build import build_steps
    from specc.passes.pipelines import DEFAULT_PIPELINE
    from specc.runtime.compiled import instantiate
    from specc.runtime.engine import build_loop

    target.setup_caches(1, 16)
    draft_module.setup_caches(1, 16)
    built = build_steps(target, draft_module, pipeline or DEFAULT_PIPELINE, spec, linear_choice=linear_choice)
    steps = {"target": instantiate(built.emitted["target"]), "drafter": instantiate(built.emitted["drafter"], spec)}
    pard_token = draft_module.config.raw["pard_token"] if method == "pard" else None
    system = build_loop(steps, method, k, max_len, pard_token, graphs=graphs)
    return system, built


def forcing_case(name, tcfg, pcfg, method, dtype, dev, prompts, new_tokens, tol, graphs, small, linear_choice=None):
    from specc.models.dflash import DFlashDrafter
    from specc.stock import DFlashReference, generate_dflash, generate_pard
    from specc.verify import Fp32Referee, StockRun, stock_margins, verify_system

    target = build_causal(tcfg, dtype, dev, seed=1)
    hf_target = hf_twin(target, tcfg, attn="eager")
    if method == "pard":
        draft = build_causal(pcfg, dtype, dev, seed=2)
        hf_draft, k, spec, module = hf_twin(draft, pcfg, attn="eager"), 7, None, draft
    else:
        L = tcfg["num_hidden_layers"]
        ids = [1, L // 4, L // 2, 3 * L // 4, L - 3] if not small else [0, 1, 2]
        dcfg = dflash_config(tcfg, ids) if not small else dict(tiny(dflash_config(tcfg, ids)), num_hidden_layers=2,
                                                                 dflash_config={"mask_token_id": 5, "target_layer_ids": ids})
        draft = build_dflash(dcfg, dtype, dev, seed=3)
        ref = DFlashReference(dcfg).to(dev, dtype)
        ref.load_state_dict({k_: v for k_, v in draft.state_dict().items() if "cache" not in k_ and k_ != "inv_freq"},
                            strict=False)
        spec, k = draft.spec, draft.spec.block_size - 1
        target.capture_layers = tuple(spec.target_layer_ids)
        module = DFlashDrafter(draft, target.embed_tokens, target.lm_head)
    max_len = max(len(p) for p in prompts) + new_tokens + 2
    system, built = compiled_system(target, module, method, k, spec, max_len, graphs, linear_choice)
    runs = []
    t0 = time.time()
    for p in prompts:
        if method == "pard":
            res = generate_pard(hf_target, hf_draft, pcfg["pard_token"], p, new_tokens, k, ())
        else:
            res = generate_dflash(hf_target, ref, p, new_tokens, k + 1, ())
        runs.append(StockRun(p, res.tokens, stock_margins(hf_target, p, res.tokens)))
    stock_s = time.time() - t0
    referee = Fp32Referee(hf_target) if dtype != torch.float32 else None
    report = verify_system(system, runs, tol, referee=referee)
    out = report.to_json()
    out["passed_without_audit"] = report.passed and not report.audited_ties
    if referee is not None:
        out["fp32_audit"] = fp32_audit(referee, runs, out["failures"] + out["audited_ties"] + out["ties"])
        del referee
    out.update(case=name, method=method, stock_seconds=round(stock_s, 1), lowering=built.lowering,
               compiled_tau=system.generate(prompts[0], new_tokens, ()).stats.tau,
               min_stock_margin=min(min(r.margins) for r in runs))
    print(f"[forcing] {name}: {report.summary()}", flush=True)
    del system, built, target, hf_target, draft, module
    torch.cuda.empty_cache() if dev.type == "cuda" else None
    return out


def fp32_audit(referee, runs, positions) -> list[dict]:
    """For each disagreement (failure, tie or audited tie): what stock run in fp32 on the same
    weights says (``specc.verify.Fp32Referee``): the fp32 margin between stock's token and the
    compiled step's, beside stock's own bf16 error on those two logits and the logit scale."""
    out = []
    for p in positions:
        margin, error = referee(p["prompt_index"], runs[p["prompt_index"]], p["position"], p["expected"], p["got"])
        out.append({**p, "fp32_margin_expected_minus_got": margin, "stock_bf16_abs_error": error})
    return out


def time_graph(fn, args, reps: int = 30) -> float:
    """Median ms of a CUDA-graph replay of fn(*args), warm-up and capture excluded (the
    calibration timer: side-stream warm-up, one graph, CUDA events); perf_counter on CPU."""
    device = "cuda" if torch.cuda.is_available() and any(isinstance(a, torch.Tensor) and a.is_cuda for a in args) else "cpu"
    return time_on(device, fn, args, reps)


def time_on(device: str, fn, args=(), reps: int = 30) -> float:
    from specc.search.calibrate import Timer

    with torch.inference_mode():
        return Timer(device, reps=reps)(lambda: fn(*args)) * 1e3


class CublasBaseline:
    """The DESIGN.md baseline on the same weights: cuBLAS linears + SDPA over a static KV cache,
    one forward per step (gpt-fast style), to be CUDA-graphed. Reads the specc model's tensors."""

    def __init__(self, model, max_len: int):
        import torch.nn.functional as F

        self.F, self.m, cfg = F, model, model.config
        dev, dt = model.embed_tokens.weight.device, model.embed_tokens.weight.dtype
        self.kc = [torch.zeros(1, cfg.num_kv_heads, max_len, cfg.head_dim, device=dev, dtype=dt) for _ in model.layers]
        self.vc = [torch.zeros_like(c) for c in self.kc]
        self.qkv = [torch.cat([l.self_attn.q_proj.weight, l.self_attn.k_proj.weight, l.self_attn.v_proj.weight])
                    for l in model.layers]
        self.gu = [torch.cat([l.mlp.gate_proj.weight, l.mlp.up_proj.weight]) for l in model.layers]

    def _norm(self, x, w, eps):
        return self.F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype) * w

    def __call__(self, ids, positions, cache_len):
        F, m, cfg = self.F, self.m, self.m.config
        bsz, q = ids.shape
        h, kv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        x = F.embedding(ids, m.embed_tokens.weight)
        freqs = positions[..., None].float() * m.inv_freq
        cos = torch.cat([freqs, freqs], -1).cos().to(x.dtype)[:, None]
        sin = torch.cat([freqs, freqs], -1).sin().to(x.dtype)[:, None]

        def rope(t):
            half = t.shape[-1] // 2
            return t * cos + torch.cat([-t[..., half:], t[..., :half]], -1) * sin

        slots = positions[0]
        max_len = self.kc[0].shape[2]
        visible = torch.arange(max_len, device=ids.device)[None, :] <= positions[0][:, None]
        for i, layer in enumerate(m.layers):
            a = layer.self_attn
            qq, kk, vv = F.linear(self._norm(x, layer.input_layernorm.weight, cfg.rms_norm_eps), self.qkv[i]).split(
                [h * d, kv * d, kv * d], -1)
            qq, kk = qq.view(bsz, q, h, d), kk.view(bsz, q, kv, d)
            if a.q_norm is not None:
                qq, kk = self._norm(qq, a.q_norm.weight, cfg.rms_norm_eps), self._norm(kk, a.k_norm.weight, cfg.rms_norm_eps)
            qq, kk = rope(qq.transpose(1, 2)), rope(kk.transpose(1, 2))
            self.kc[i].index_copy_(2, slots, kk)
            self.vc[i].index_copy_(2, slots, vv.view(bsz, q, kv, d).transpose(1, 2))
            att = F.scaled_dot_product_attention(qq, self.kc[i], self.vc[i], attn_mask=visible, enable_gqa=True)
            x = x + F.linear(att.transpose(1, 2).reshape(bsz, q, h * d), a.o_proj.weight)
            g, u = F.linear(self._norm(x, layer.post_attention_layernorm.weight, cfg.rms_norm_eps), self.gu[i]).chunk(2, -1)
            x = x + F.linear(F.silu(g) * u, layer.mlp.down_proj.weight)
        return F.linear(self._norm(x, m.norm.weight, cfg.rms_norm_eps), m.lm_head.weight)


def copy_bandwidth(dev) -> float:
    """Bytes/s of a device-to-device copy (read + write counted)."""
    x = torch.empty(2 * 2**30 if dev.type == "cuda" else 2**24, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    ms = time_on(dev.type, lambda: y.copy_(x), (), reps=20)
    return 2 * x.numel() / (ms / 1e3)


def read_bandwidth(dev) -> float:
    """Bytes/s of streaming a large bf16 tensor once (a sum): what a weight-read floor can use."""
    x = torch.ones(2**31 if dev.type == "cuda" else 2**22, dtype=torch.bfloat16, device=dev)
    ms = time_on(dev.type, lambda: x.sum(dtype=torch.float32), (), reps=20)
    return x.numel() * 2 / (ms / 1e3)


def step_times(dtype, dev, context: int, small: bool = False) -> dict:
    from specc.models.dflash import DFlashDrafter

    tcfg = tiny(QWEN3_8B) if small else QWEN3_8B
    ids_ = [0, 1, 2] if small else [1, 9, 17, 25, 33]
    dcfg = dflash_config(tcfg, ids_)
    if small:
        dcfg = dict(tiny(dcfg), num_hidden_layers=2, dflash_config={"mask_token_id": 5, "target_layer_ids": ids_})
    target = build_causal(tcfg, dtype, dev, seed=1)
    draft = build_dflash(dcfg, dtype, dev, seed=3)
    spec = draft.spec
    target.capture_layers = ()
    module = DFlashDrafter(draft, target.embed_tokens, target.lm_head)
    system, built = compiled_system(target, module, "dflash", 15, spec, context + 128, graphs=False)
    t_step = system.target
    d_step = system.drafter.drafter
    weight_bytes = float(sum(p.numel() * p.element_size() for n, p in target.named_parameters() if "embed" not in n))
    res = {"weight_bytes_per_target_step": weight_bytes, "context": context, "verify_ms": {}}
    for q in (1, 4, 8, 16, 32, 64):
        ids = torch.randint(0, tcfg["vocab_size"], (1, q), device=dev)
        pos = torch.arange(context, context + q, device=dev)[None]
        res["verify_ms"][q] = time_graph(t_step, (ids, pos, torch.tensor([context], device=dev)))
        print(f"[steps] compiled target Q={q:3d}: {res['verify_ms'][q]:.3f} ms", flush=True)
    res["ar_ms"] = res["verify_ms"][1]
    # pass ablations on the same weights: target step at Q = 1 and 16 per pipeline
    from specc.codegen.build import build_steps
    from specc.passes.pipelines import DEFAULT_PIPELINE
    from specc.runtime.compiled import instantiate

    variants = {"default": DEFAULT_PIPELINE,
                "without fuse_residual_add": DEFAULT_PIPELINE.replace("fuse_residual_add,", ""),
                "with pack_weights_12bit": DEFAULT_PIPELINE.replace("dce", "pack_weights_12bit,dce")}
    res["pipelines"] = {}
    for label, pipeline in variants.items():
        if label == "default":
            res["pipelines"][label] = {"pipeline": pipeline, "ms": {1: res["verify_ms"][1], 16: res["verify_ms"][16]}}
            continue
        step = instantiate(build_steps(target, None, pipeline).emitted["target"])
        step.setup_caches(1, context + 128)
        times = {}
        for q in (1, 16):
            ids = torch.randint(0, tcfg["vocab_size"], (1, q), device=dev)
            pos = torch.arange(context, context + q, device=dev)[None]
            times[q] = time_graph(step, (ids, pos, torch.tensor([context], device=dev)))
        res["pipelines"][label] = {"pipeline": pipeline, "ms": times}
        print(f"[steps] target step {label}: Q=1 {times[1]:.3f} ms, Q=16 {times[16]:.3f} ms", flush=True)
        del step
    baseline = CublasBaseline(target, context + 128)
    res["cublas_sdpa_graph_ms"] = {}
    for q in (1, 4, 8, 16, 32, 64):
        ids = torch.randint(0, tcfg["vocab_size"], (1, q), device=dev)
        pos = torch.arange(context, context + q, device=dev)[None]
        res["cublas_sdpa_graph_ms"][q] = time_graph(baseline, (ids, pos, torch.tensor([context], device=dev)))
        print(f"[steps] cuBLAS+SDPA graph Q={q:3d}: {res['cublas_sdpa_graph_ms'][q]:.3f} ms", flush=True)
    del baseline
    n_ctx = 8
    block = torch.randint(0, tcfg["vocab_size"], (1, 16), device=dev)
    hidden = torch.randn(1, n_ctx, len(ids_) * tcfg["hidden_size"], device=dev, dtype=dtype)
    pos = torch.arange(context - n_ctx, context + 16, device=dev)[None]
    res["dflash_draft_ms"] = time_graph(d_step, (block, hidden, pos, torch.tensor([context - n_ctx], device=dev)))
    res["dflash_draft_weight_bytes"] = float(sum(p.numel() * p.element_size() for p in draft.parameters()))
    print(f"[steps] compiled DFlash-b16 draft step: {res['dflash_draft_ms']:.3f} ms", flush=True)
    return res


def install_linear_sweep(path: str) -> list[dict]:
    """``linear.set_config`` the fastest config of every (M, shape) of a sweep_linear.py run."""
    from examples.sweep_linear import SHAPES as shapes
    from specc.codegen.kernels import linear as L

    with open(path) as f:
        sweep = json.load(f)
    installed = []
    for key, top in sweep["best"].items():
        m, name = key.split(":")
        n, k = shapes[name]
        L.set_config(int(m), n, k, top[0]["config"])
        installed.append({"m": int(m), "shape": name, "config": top[0]["config"], "us": top[0]["us"]})
        print(f"[steps] linear M={m} {name}: {top[0]['config']}", flush=True)
    return installed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="steps.json")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny configs (CPU smoke test)")
    ap.add_argument("--skip-forcing", action="store_true")
    ap.add_argument("--skip-steps", action="store_true")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--linear-sweep", default=None,
                    help="a sweep_linear.py JSON: install each (M, shape)'s fastest config first (to measure a table "
                         "before shipping it)")
    ap.add_argument("--cases", default=None, help="comma-separated forcing cases to run (default: all), e.g. 'qwen3-8b + dflash-b16'")
    args = ap.parse_args()
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    tol = 0.25 if dtype == torch.bfloat16 else 1e-3
    result = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "torch": torch.__version__,
              "dtype": str(dtype), "tie_tolerance": tol, "forcing": [], "date": time.strftime("%Y-%m-%d")}
    try:
        import triton

        result["triton"] = triton.__version__
    except ImportError:
        pass
    if args.linear_sweep:
        result["linear_overrides"] = install_linear_sweep(args.linear_sweep)
    gen = torch.Generator().manual_seed(0)
    cases = [("qwen3-8b + pard", QWEN3_8B, QWEN3_06B, "pard"), ("qwen3-8b + dflash-b16", QWEN3_8B, None, "dflash"),
             ("llama-3.1-8b + pard", LLAMA_8B, LLAMA_1B, "pard"), ("llama-3.1-8b + dflash-b16", LLAMA_8B, None, "dflash")]
    if not args.skip_forcing:
        wanted = None if args.cases is None else {c.strip() for c in args.cases.split(",")}
        unknown = (wanted or set()) - {c[0] for c in cases}
        if unknown:
            ap.error(f"unknown case {sorted(unknown)[0]!r}; cases: {', '.join(c[0] for c in cases)}")
        for name, tcfg, pcfg, method in cases:
            if args.tiny:
                tcfg, pcfg = tiny(tcfg), tiny(pcfg, 2) if pcfg else None
            # drawn for every case, run or not: a case sees the same prompts alone as in the full run
            prompts = [torch.randint(10, tcfg["vocab_size"] - 10, (24,), generator=gen).tolist() for _ in range(2)]
            if wanted is not None and name not in wanted:
                continue
            result["forcing"].append(forcing_case(name, tcfg, pcfg, method, dtype, dev, prompts, args.tokens, tol,
                                                  graphs=dev.type == "cuda", small=args.tiny))
    if not args.skip_steps:
        result["copy_bandwidth_Bps"] = copy_bandwidth(dev)
        bw = result["read_bandwidth_Bps"] = read_bandwidth(dev)
        steps = step_times(dtype, dev, 64 if args.tiny else 1024, small=args.tiny)
        steps["floor_ms"] = steps["weight_bytes_per_target_step"] / bw * 1e3
        result["steps"] = steps
        print(f"[steps] read bandwidth {bw / 1e12:.2f} TB/s (copy {result['copy_bandwidth_Bps'] / 1e12:.2f}); "
              f"weight floor {steps['floor_ms']:.2f} ms; "
              f"AR {steps['ar_ms']:.2f} ms = {steps['ar_ms'] / steps['floor_ms']:.2f}x floor "
              f"(cuBLAS+SDPA graph {steps['cublas_sdpa_graph_ms'][1]:.2f} ms); "
              f"verify Q=16 / AR = {steps['verify_ms'][16] / steps['ar_ms']:.2f}", flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
