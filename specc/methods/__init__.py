"""Speculation methods: one module per method, one registry.

Everything that depends on *how* a target and a drafter speculate together lives in the method's
module (``ar.py``, ``ar_draft.py``, ``pard.py``, ``dflash.py``); the rest of specc asks the
registry (``get_method(name)``) instead of comparing method names. See ``base.Method`` for the
hooks and docs/architecture.md for where a new method goes.
"""

from specc.methods.base import DraftShape, LoadedPair, Method
from specc.methods.registry import (
    UnknownMethod,
    available_methods,
    default_method,
    get_method,
    method_names,
    methods_for_kind,
    register_method,
)

# The built-in methods register themselves on import (order = listing order).
import specc.methods.ar  # noqa: E402,F401
import specc.methods.ar_draft  # noqa: E402,F401
import specc.methods.pard  # noqa: E402,F401
import specc.methods.dflash  # noqa: E402,F401

__all__ = ["DraftShape", "LoadedPair", "Method", "UnknownMethod", "available_methods", "default_method",
           "get_method", "method_names", "methods_for_kind", "register_method"]
