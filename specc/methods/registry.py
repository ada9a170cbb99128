"""The registry of speculation methods: built-ins, user code, and ``specc.methods`` entry points.

    from specc.methods import get_method, register_method, available_methods

Each name maps to one ``Method`` instance. Registration mirrors the pass registry: a class
decorated with ``@register_method`` (or an entry point in the ``specc.methods`` group naming a
``Method`` subclass) becomes selectable everywhere a method is named (`--method`, manifests, the
cost model and the search).
"""

from __future__ import annotations

import importlib.metadata

from specc.errors import UserError
from specc.methods.base import Method

ENTRY_POINT_GROUP = "specc.methods"

_REGISTRY: dict[str, Method] = {}
_PLUGINS_LOADED = False
plugin_errors: list[str] = []


class UnknownMethod(UserError):
    """A method name that no registered method carries."""


def register_method(cls: type[Method]) -> type[Method]:
    """Register a ``Method`` subclass under its ``name`` (class decorator)."""
    if not (isinstance(cls, type) and issubclass(cls, Method)):
        raise TypeError(f"{cls!r} is not a specc.methods.Method subclass")
    if not cls.name:
        raise ValueError(f"method {cls.__qualname__} has no name")
    old = _REGISTRY.get(cls.name)
    if old is not None and type(old).__qualname__ != cls.__qualname__ and type(old).__module__.startswith("specc.methods."):
        raise ValueError(f"method name {cls.name!r} is already registered by {type(old).__module__}")
    _REGISTRY[cls.name] = cls()
    return cls


def load_plugins() -> list[str]:
    """Load every ``specc.methods`` entry point once; returns the errors met."""
    global _PLUGINS_LOADED
    if _PLUGINS_LOADED:
        return list(plugin_errors)
    _PLUGINS_LOADED = True
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            register_method(obj)
        except Exception as exc:  # a broken plugin must not break the built-in methods
            plugin_errors.append(f"entry point {ep.name} = {ep.value}: {type(exc).__name__}: {exc}")
    return list(plugin_errors)


def available_methods() -> dict[str, Method]:
    """Every registered method by name (built-ins first)."""
    load_plugins()  # the built-ins registered themselves when specc.methods was imported
    return dict(_REGISTRY)


def method_names() -> tuple[str, ...]:
    return tuple(available_methods())


def get_method(name: str) -> Method:
    """The method registered as ``name``; ``UnknownMethod`` (one line) otherwise."""
    methods = available_methods()
    if name not in methods:
        raise UnknownMethod(f"unknown method {name!r} (choose from {', '.join(methods)})")
    return methods[name]


def methods_for_kind(kind: str) -> tuple[str, ...]:
    """Methods that can use a drafter checkpoint of ``kind``, the default one first."""
    methods = available_methods().values()
    default = [m.name for m in methods if kind in m.default_for]
    return tuple(default + [m.name for m in methods if kind in m.drafter_kinds and m.name not in default])


def default_method(drafter_kind: str | None) -> Method:
    """The method used when no --method is given: plain AR without a drafter, else the drafter
    kind's default."""
    if drafter_kind is None:
        return next(m for m in available_methods().values() if not m.uses_drafter)
    names = methods_for_kind(drafter_kind)
    if not names:
        raise UserError(f"no speculation method can use a {drafter_kind} drafter")
    return get_method(names[0])
