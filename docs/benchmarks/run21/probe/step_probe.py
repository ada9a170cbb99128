"""examples/bench_bf12.py with the bf12 tensor-core kernel replaced by a probe build (PROBE_EXT:
base or tiled; gpu_calls/probe/probe_m16.py builds it): the packed step's timing with the tiled
plane order (its logits are wrong: timing only)."""
import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from probe_m16 import build  # noqa: E402

ext = build(os.environ["PROBE_EXT"])


class Adapter:
    """The library's call without the probe's ``blocks`` argument (inserted as 1 after ``splits``)."""

    def bf12_mma_out(self, *args):
        args = list(args)
        args.insert(len(args) - 4, 1)
        return ext.bf12_mma_out(*args)


from specc.codegen.kernels import linear_bf12_mma as mma  # noqa: E402

mma.extension = lambda device: Adapter()
sys.argv = ["examples/bench_bf12.py"] + sys.argv[1:]
runpy.run_path("examples/bench_bf12.py", run_name="__main__")
