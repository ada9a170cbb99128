"""``GraphedStep``'s call protocol on the CPU, for tests: what a step's state goes through when
it is CUDA-graphed (warm-up calls run the step, a capture records without running it, a replay
runs it once), with a stand-in for the graph."""

from __future__ import annotations

import torch

from specc.models.state import get_attr, state_specs_of
from specc.runtime.graphs import GraphedStep


class _Replay:
    """The CPU stand-in for a captured graph: replaying runs the step on the static inputs and
    writes its results into the static outputs."""

    def __init__(self, owner, static_in, out):
        self.owner, self.static_in, self.out = owner, static_in, out

    def replay(self):
        got = self.owner._run(*self.static_in)
        for dst, src in zip(*(x if isinstance(x, tuple) else (x,) for x in (self.out, got))):
            dst.copy_(src)


class CpuGraphedStep(GraphedStep):
    """GraphedStep's protocol on CPU tensors (module doc): the warm-ups run the step; the
    capture computes the static outputs and then undoes its state writes (a CUDA capture
    records kernels without running them)."""

    def _on_device(self, tensor) -> bool:
        return True  # CPU tensors are "graphed" by the stand-in

    def _capture(self, args, key):
        static_in = [a.clone() if torch.is_tensor(a) else a for a in args]
        for _ in range(self.warmup):
            self._run(*static_in)
        names = [spec.name for spec in state_specs_of(self.step)]
        saved = {name: get_attr(self.step, name).clone() for name in names}
        out = self._run(*static_in)
        out = tuple(t.clone() for t in out) if isinstance(out, tuple) else out.clone()
        for name in names:
            get_attr(self.step, name).copy_(saved[name])
        entry = (static_in, _Replay(self, static_in, out), out)
        self.graphs[key] = entry
        return entry
