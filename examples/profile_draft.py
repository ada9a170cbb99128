"""Where the compiled DFlash-b16 draft step spends its time at Qwen3-8B shapes (random weights).

The draft step reads the target's hidden states of the newly committed tokens (context), runs the
drafter's layers over the block and projects the block through the target's lm_head. Its weights
are ~1 GB of drafter layers plus the 1.2 GB lm_head, a ~0.5 ms floor at HBM speed; this profiles
a CUDA-graph replay per kernel (``examples/profile_step.kernel_profile``) so the gap is visible.

    PYTHONPATH=. python3 examples/profile_draft.py --out $OUT/profile_draft.json
"""

from __future__ import annotations

import argparse
import json

import torch

from examples.bench_steps import QWEN3_8B, build_causal, build_dflash, compiled_system, dflash_config, time_graph
from examples.profile_step import kernel_profile


def main() -> None:
    from specc.models.dflash import DFlashDrafter

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--ctx-tokens", type=int, default=8, help="newly committed tokens fed as context")
    ap.add_argument("--out", default="profile_draft.json")
    args = ap.parse_args()
    dev, dtype = torch.device("cuda"), torch.bfloat16
    ids_ = [1, 9, 17, 25, 33]
    dcfg = dflash_config(QWEN3_8B, ids_)
    target = build_causal(QWEN3_8B, dtype, dev, seed=1)
    draft = build_dflash(dcfg, dtype, dev, seed=3)
    target.capture_layers = ()
    module = DFlashDrafter(draft, target.embed_tokens, target.lm_head)
    system, _ = compiled_system(target, module, "dflash", 15, draft.spec, args.context + 128, graphs=False)
    d_step = system.drafter.drafter
    n, c = args.ctx_tokens, args.context
    block = torch.randint(0, QWEN3_8B["vocab_size"], (1, 16), device=dev)
    hidden = torch.randn(1, n, len(ids_) * QWEN3_8B["hidden_size"], device=dev, dtype=dtype)
    pos = torch.arange(c - n, c + 16, device=dev)[None]
    step_args = (block, hidden, pos, torch.tensor([c - n], device=dev))
    ms = time_graph(d_step, step_args)
    prof = kernel_profile(d_step, step_args)
    weights = float(sum(p.numel() * p.element_size() for p in draft.parameters())) \
        + float(target.lm_head.weight.numel() * target.lm_head.weight.element_size())
    print(f"[draft] {ms:.3f} ms graphed; kernels {prof['kernel_us_per_step']:.1f} us, span {prof['span_us_per_step']:.1f} us, "
          f"{prof['launches_per_step']:.0f} launches; weight floor {weights / 4.8e12 * 1e3:.3f} ms at 4.8 TB/s")
    for r in prof["kernels"][:12]:
        print(f"    {r['us_per_step']:9.1f} us  x{r['calls_per_step']:4.0f}  {r['kernel']}")
    with open(args.out, "w") as f:
        json.dump({"ms": ms, "weight_bytes": weights, **prof}, f, indent=1)


if __name__ == "__main__":
    main()
