"""The base class of generated step modules, and loading them from an artifact.

A generated ``target.py`` / ``drafter.py`` defines a ``CompiledStep`` subclass whose ``forward``
is the lowered graph. The artifact's manifest says which flat attributes are weights (stored in
weights.safetensors) and which are state buffers (``caches``: a ``StateSpec`` per flat attribute,
allocated here through a ``DecodingState``, per batch size and max length).
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import torch

from specc.codegen.artifact import ArtifactError
from specc.models.dflash import DFlashSpec
from specc.runtime.state import DecodingState, StateSpec


class CompiledStep(torch.nn.Module):
    """Same call signature as the specc.models module it was traced from.

    ``ragged_rows``: whether the step takes the ragged row descriptor (``row_slots``,
    ``row_starts``: a packed verify of rows with their own token counts); the emitted class of
    an artifact's ``target_ragged`` role sets it True."""

    ragged_rows = False

    def bind(self, weights: dict[str, torch.Tensor], caches: dict[str, dict], spec: DFlashSpec | None = None) -> None:
        for name, tensor in weights.items():
            setattr(self, name, tensor)
        self._cache_specs = dict(caches)
        self._state_specs = [StateSpec.from_manifest(name, entry) for name, entry in caches.items()]
        self._spec = spec
        self._device = next(iter(weights.values())).device if weights else torch.device("cpu")
        self.max_batch = self.max_len = 0

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def spec(self) -> DFlashSpec:
        if self._spec is None:
            raise AttributeError("this step is not a DFlash drafter")
        return self._spec

    def state_specs(self) -> list[StateSpec]:
        """The state this step declares (from the manifest), named by flat attribute."""
        return list(self._state_specs)

    def setup_caches(self, batch: int, max_len: int, dtype=None, device=None) -> DecodingState:
        """Allocate the declared state through a ``DecodingState`` and bind it (``dtype``, when
        given, overrides the recorded dtypes)."""
        specs = self._state_specs
        if dtype is not None:
            specs = [StateSpec(s.name, s.kind, s.shape, None, s.extra_len) for s in specs]
        state = DecodingState(specs, device or self._device, dtype).allocate(batch, max_len)
        state.bind(self)
        self.max_batch, self.max_len = batch, max_len
        return state


def instantiate(emitted, spec: DFlashSpec | None = None) -> CompiledStep:
    """Build a step straight from an ``EmittedStep`` (no files): exec its source in a fresh
    module and bind the in-memory weights. For benchmarks at sizes where writing weights is slow."""
    import types

    module = types.ModuleType(f"specc_compiled_mem_{id(emitted):x}")
    exec(compile(emitted.source, f"<specc {emitted.class_name}>", "exec"), module.__dict__)
    step = getattr(module, emitted.class_name)()
    step.bind(emitted.weights, emitted.caches, spec)
    return step


def import_step_class(path: Path, class_name: str, unique: str, source: bytes | None = None) -> type[CompiledStep]:
    """Execute a generated module from its bytes (``source``: the bytes the manifest's hash was
    checked on), never through the import system: no bytecode cache is read or written."""
    return exec_step_module(Path(path).read_bytes() if source is None else source, Path(path).name, class_name, unique)


def exec_step_module(source: bytes, name: str, class_name: str, unique: str):
    """Execute a step module from its verified bytes (never through the import system) and
    return its step class."""
    mod_name = f"specc_compiled_{unique}_{Path(name).stem}"
    module = types.ModuleType(mod_name)
    module.__file__ = f"<specc artifact {name}>"
    sys.modules[mod_name] = module  # dataclasses/pickling look their module up
    try:
        code = compile(source, f"<specc artifact {name}>", "exec", dont_inherit=True)
        exec(code, module.__dict__)
    except Exception as exc:
        sys.modules.pop(mod_name, None)
        raise ArtifactError(f"{name}: executing the step module failed: {type(exc).__name__}: {exc}") from exc
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, CompiledStep)):
        raise ArtifactError(f"{name}: {class_name} is not a CompiledStep subclass")
    return cls
