"""Weightless IRs of a target (+ drafter) pair: built from config.json on the meta device."""

from __future__ import annotations

import json
from typing import Any


class MetaPair:
    """A target (+ drafter) built from config.json on the meta device, traced per pipeline.

    ``irs(pipeline, options)`` -> (target verify IR, drafter draft IR or None) after the passes;
    cached per pipeline. No weights: this is how real sizes (Qwen3-8B) are predicted on a laptop.
    The method (``specc.methods``) wires the pair together as it does with weights.
    """

    def __init__(self, target_config, drafter_config=None, method: str = "ar", dtype: str | None = None):
        from specc.methods import get_method

        self.method = method
        loaded = get_method(method).load_meta(target_config, drafter_config, dtype=dtype)
        self.target_model, self.drafter = loaded.target, loaded.draft
        self._cache: dict[tuple, tuple] = {}

    def irs(self, pipeline: str = "", options: dict[str, Any] | None = None):
        from specc.codegen.build import run_passes, trace_step

        key = (pipeline, json.dumps(options or {}, sort_keys=True))
        if key not in self._cache:
            t_ir = trace_step(self.target_model, "target")
            run_passes(t_ir, pipeline, options=options, check=False)
            d_ir = None
            if self.drafter is not None:
                d_ir = trace_step(self.drafter, "drafter")
                run_passes(d_ir, pipeline, options=options, check=False)
            self._cache[key] = (t_ir, d_ir)
        return self._cache[key]
