"""A/B of one kernel option in the whole compiled Qwen3-8B AR step: the GEMV norm prologue with
its row statistics computed in the kernel (``LinearConfig.rstd_in_kernel``, the default) vs the
``row_rstd`` pre-kernel, alternated three times in one process (CUDA graphs, median of 30
replays each); Q = 16 once for reference. Writes ``$OUT/ab_rstd.json``.

    PYTHONPATH=. python3 examples/ab_gemv_rstd.py
"""
import json
import os
import sys

import torch

sys.path.insert(0, ".")
from examples.bench_steps import QWEN3_8B, time_graph  # noqa: E402
from examples.profile_step import build_step, step_args  # noqa: E402
from specc.codegen.kernels import linear as L  # noqa: E402


def main() -> None:
    dev = torch.device("cuda")
    step, _, _ = build_step(QWEN3_8B, torch.bfloat16, dev, 1152)
    norm_shapes = [(6144, 4096), (24576, 4096)]
    res = {"in_kernel": [], "pre_kernel": []}
    a1, a16 = step_args(QWEN3_8B, dev, 1, 1024), step_args(QWEN3_8B, dev, 16, 1024)
    for rnd in range(3):
        for label, flag in (("in_kernel", None), ("pre_kernel", False)):
            for n, k in norm_shapes:
                L.set_config(1, n, k, L.get_config(1, n, k).replace(rstd_in_kernel=flag))
            res[label].append(time_graph(step, a1, 30))
            print(f"[ab] round {rnd} {label}: AR {res[label][-1]:.3f} ms", flush=True)
    L.clear_configs()
    res["q16"] = time_graph(step, a16, 30)
    print(f"[ab] Q=16 {res['q16']:.3f} ms", flush=True)
    json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "ab_rstd.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
