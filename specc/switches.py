"""On/off switches read from the environment (``SPECC_STEP_GRAPHS``, ``SPECC_BATCH_DRAFT_AHEAD``,
``SPECC_RESIDUAL_NORM``; docs/environment.md lists every variable): one parser, so every switch
takes the same spellings and refuses a typo instead of silently meaning its default. A leaf
module (os only) that codegen, the runtime and the cost model all read."""

from __future__ import annotations

import os

ON, OFF = ("1", "on", "true"), ("0", "off", "false")


def env_switch(name: str, default: bool) -> bool:
    """``name``'s value as a switch: 1 / on / true, 0 / off / false; unset or empty: ``default``."""
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value not in ON + OFF:
        raise ValueError(f"{name}={value!r}: use 1 (on) or 0 (off)")
    return value in ON


def batch_draft_ahead_enabled() -> bool:
    """Whether loops built by ``engine.build_loop`` on CUDA draft ahead at batch > 1
    (``DeviceSpeculativeDecoder.batch_draft_ahead``): ``SPECC_BATCH_DRAFT_AHEAD`` = 0 turns it off
    (default on: H100, B = 16, the speculative step 11.14 -> 10.64 ms, docs/benchmarks/run28.md)."""
    return env_switch("SPECC_BATCH_DRAFT_AHEAD", True)


def residual_norm_enabled() -> bool:
    """Whether lowering pairs a cuBLAS residual add with the norm after it, and the cost model
    prices the pairs (``codegen/residual_norm.py``): ``SPECC_RESIDUAL_NORM`` = 0 turns it off
    (default on)."""
    return env_switch("SPECC_RESIDUAL_NORM", True)
