"""Where passes are found: the built-in ones, ``@register_pass`` in user code, and plugins.

Plugins are installed packages that declare the entry-point group ``specc.passes``::

    [project.entry-points."specc.passes"]
    my_fusion = "my_package.passes:MyFusion"

Each entry point loads a Pass subclass (or a module that registers its passes on import).
Pipelines are strings: ``"fuse_qkv,fuse_gate_up"`` names registered passes; an item
``+module:Class`` (or ``+path/to/file.py:Class``) imports a user's pass without registering
anything beforehand.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Iterable

from specc.errors import UserError
from specc.passes.base import Pass

ENTRY_POINT_GROUP = "specc.passes"


class PipelineError(UserError, ValueError):
    """A pipeline string or pass name that cannot be resolved (message is one line)."""


@dataclasses.dataclass(frozen=True)
class PassInfo:
    name: str
    cls: type[Pass]
    origin: str

    @property
    def doc(self) -> str:
        return self.cls.doc

    @property
    def after(self) -> tuple[str, ...]:
        return tuple(self.cls.after)

    @property
    def before(self) -> tuple[str, ...]:
        return tuple(self.cls.before)


_REGISTRY: dict[str, PassInfo] = {}
_PLUGINS_LOADED = False
plugin_errors: list[str] = []


def _origin(cls: type) -> str:
    mod = cls.__module__ or ""
    return "builtin" if mod.startswith("specc.passes") else f"module {mod}"


def _same_definition(a: type, b: type) -> bool:
    """The same class imported twice (reload, or as a module and as a file path)."""
    if a.__qualname__ != b.__qualname__:
        return False
    if a.__module__ == b.__module__:
        return True
    fa = getattr(sys.modules.get(a.__module__), "__file__", None)
    fb = getattr(sys.modules.get(b.__module__), "__file__", None)
    return bool(fa and fb and Path(fa).resolve() == Path(fb).resolve())


def register_pass(cls: type[Pass] | None = None, *, name: str | None = None, origin: str | None = None):
    """Class decorator: make a Pass subclass available by name (pipelines, ``specc passes``).

    Re-registering the same class (same module and qualified name, e.g. after a reload) replaces
    the entry. Taking the name of a built-in pass is an error; another user pass of the same name
    is replaced with a RuntimeWarning (code re-run in a notebook, a script importing itself).
    """

    def do(c: type[Pass]) -> type[Pass]:
        if not (isinstance(c, type) and issubclass(c, Pass)):
            raise TypeError(f"register_pass expects a subclass of specc.passes.Pass, got {c!r}")
        if name:
            c.name = name
        if not c.name:
            raise ValueError(f"pass {c.__qualname__} has no name")
        old = _REGISTRY.get(c.name)
        if old is not None and old.cls is not c and not _same_definition(old.cls, c):
            where = f"{old.cls.__module__}.{old.cls.__qualname__}"
            if old.origin == "builtin" or _origin(c) == "builtin":
                raise ValueError(f"pass name {c.name!r} is already registered by {where}")
            # user code re-run (a notebook cell, a script importing its own module): newest wins
            warnings.warn(f"pass {c.name!r}: {c.__module__}.{c.__qualname__} replaces {where}", RuntimeWarning,
                          stacklevel=2)
        _REGISTRY[c.name] = PassInfo(c.name, c, origin or (old.origin if old and old.cls is c else _origin(c)))
        return c

    return do(cls) if cls is not None else do


def load_plugins(refresh: bool = False) -> list[str]:
    """Load every ``specc.passes`` entry point once; returns errors (also kept in ``plugin_errors``)."""
    global _PLUGINS_LOADED
    if _PLUGINS_LOADED and not refresh:
        return list(plugin_errors)
    _PLUGINS_LOADED = True
    plugin_errors.clear()
    try:
        eps = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    except TypeError:  # pragma: no cover - python < 3.10 API
        eps = importlib.metadata.entry_points().get(ENTRY_POINT_GROUP, [])
    for ep in eps:
        try:
            obj = ep.load()
        except Exception as exc:
            plugin_errors.append(f"entry point {ep.name} = {ep.value}: {type(exc).__name__}: {exc}")
            continue
        if isinstance(obj, type) and issubclass(obj, Pass):
            try:
                register_pass(obj, origin=f"plugin {ep.value}")
            except ValueError as exc:
                plugin_errors.append(f"entry point {ep.name}: {exc}")
    return list(plugin_errors)


def available_passes() -> dict[str, PassInfo]:
    """Every registered pass (built-in, registered by imported code, plugins), by name."""
    # the built-in passes registered themselves when specc.passes (this module's package) was imported
    load_plugins()
    return dict(sorted(_REGISTRY.items()))


def get_pass(name: str) -> type[Pass]:
    passes = available_passes()
    if name not in passes:
        close = difflib.get_close_matches(name, passes, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise PipelineError(f"unknown pass {name!r} (run `specc passes` for the list{hint})")
    return passes[name].cls


def _import_user_object(ref: str) -> Any:
    module_part, sep, attr = ref.partition(":")
    if not sep or not module_part or not attr:
        raise PipelineError(f"+{ref}: write +module:Class or +path/to/file.py:Class")
    if module_part.endswith(".py") or os.sep in module_part or "/" in module_part:
        path = Path(module_part).expanduser()
        if not path.is_file():
            raise PipelineError(f"+{ref}: no such file {path}")
        mod_name = f"specc_user_pass_{path.stem}"
        spec = importlib.util.spec_from_file_location(mod_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            raise PipelineError(f"+{ref}: importing {path} failed: {type(exc).__name__}: {exc}") from exc
    else:
        try:
            module = importlib.import_module(module_part)
        except ModuleNotFoundError as exc:
            # console scripts do not put the working directory on sys.path; user code often lives there
            if os.getcwd() in sys.path or exc.name != module_part.split(".")[0]:
                raise PipelineError(f"+{ref}: cannot import {module_part} ({exc})") from exc
            sys.path.insert(0, os.getcwd())
            try:
                module = importlib.import_module(module_part)
            except ModuleNotFoundError as exc2:
                raise PipelineError(f"+{ref}: cannot import {module_part} ({exc2})") from exc2
        except Exception as exc:
            raise PipelineError(f"+{ref}: importing {module_part} failed: {type(exc).__name__}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise PipelineError(f"+{ref}: {module_part} has no attribute {attr!r}") from exc


def as_pass(item: Any) -> Pass:
    """A Pass instance from an instance, a Pass subclass, a registered name or ``+module:Class``."""
    if isinstance(item, Pass):
        return item
    if isinstance(item, type) and issubclass(item, Pass):
        return item()
    if isinstance(item, str):
        text = item.strip()
        if text.startswith("+"):
            obj = _import_user_object(text[1:])
            if isinstance(obj, type) and issubclass(obj, Pass):
                if obj.name not in _REGISTRY:
                    register_pass(obj)
                return obj()
            if isinstance(obj, Pass):
                return obj
            if callable(obj):
                made = obj()
                if isinstance(made, Pass):
                    return made
            raise PipelineError(f"{text}: not a specc.passes.Pass subclass or instance")
        return get_pass(text)()
    raise PipelineError(f"not a pass: {item!r}")


def parse_pipeline(spec: str | Iterable[Any] | None) -> list[Pass]:
    """``"fuse_qkv,fuse_gate_up,+examples.custom_pass:FuseSiluMulDown"`` -> Pass instances."""
    if spec is None:
        return []
    items = [s for s in spec.split(",") if s.strip()] if isinstance(spec, str) else list(spec)
    return [as_pass(item) for item in items]


def check_pipeline(flag: str, text: str | None) -> None:
    """UserError naming the command-line ``flag`` for a pipeline with an unknown pass (None: no
    pipeline given): what `specc compile` and `specc bench` check before anything is loaded."""
    if text is None:
        return
    try:
        parse_pipeline(text)
    except Exception as exc:  # noqa: BLE001 - the registry's message names the pass
        raise UserError(f"{flag} {text!r}: {exc}") from None


def plugin_records(pipeline: str | None) -> list[dict]:
    """The non-built-in passes of a pipeline string (after it ran, so they are registered): what
    an artifact compiled with it needs besides specc to be loaded again (the manifest's
    ``plugins``; ``specc.codegen.artifact_trust.check_plugins`` checks them at load)."""
    records = []
    for item in [s.strip() for s in (pipeline or "").split(",") if s.strip()]:
        if item.startswith("+"):
            ref = item[1:]
            module_part = ref.partition(":")[0]
            if module_part.endswith(".py") or "/" in module_part:
                f = Path(module_part).expanduser().resolve()
                records.append({"ref": ref, "file": str(f), "sha256": hashlib.sha256(f.read_bytes()).hexdigest()
                                if f.is_file() else None})
            else:
                records.append({"ref": ref, "module": module_part})
        else:
            info = _REGISTRY.get(item)
            if info is not None and info.origin != "builtin":
                records.append({"ref": item, "pass": item, "origin": info.origin, "module": info.cls.__module__})
    return records
