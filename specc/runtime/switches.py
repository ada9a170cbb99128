"""On/off switches of the runtime read from the environment (``SPECC_STEP_GRAPHS``,
``SPECC_BATCH_DRAFT_AHEAD``): one parser, so every switch takes the same spellings and refuses a
typo instead of silently meaning its default."""

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
    (``DeviceSpeculativeDecoder.batch_draft_ahead``): ``SPECC_BATCH_DRAFT_AHEAD`` = 1 (default off)."""
    return env_switch("SPECC_BATCH_DRAFT_AHEAD", False)
