"""Plain autoregressive decoding: the target alone, one token per forward (the baseline)."""

from __future__ import annotations

from specc.methods.base import Method
from specc.methods.registry import register_method


@register_method
class AR(Method):
    name = "ar"
    description = "the target alone, one token per step (baseline)"
