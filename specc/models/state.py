"""State a model declares: what a step reads and writes besides its inputs (KV caches; the
recurrent state and conv window of hybrid targets' GDN layers).

A model definition DECLARES its state as :class:`StateSpec` entries (``CausalLM.state_specs()``,
``DFlashDrafter.state_specs()``); nothing finds caches by attribute name. This module holds the
declaration and the *layout* of each kind (the buffer shape for ``batch`` slots of ``max_len``
positions, and a buffer's per-slot shape), enough for a model to allocate its own buffers when
it runs eagerly and for emission to record them. What committing accepted positions means for a
kind, and the object that owns a generation's state, are the runtime's
(``specc.runtime.state.DecodingState``).
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

import torch

__all__ = ["StateSpec", "StateLayout", "KVLayout", "SnapshotLayout", "LAYOUTS", "layout", "allocate_buffers", "bind_buffers",
           "get_attr", "set_attr", "state_specs_of", "idempotent_step"]


@dataclasses.dataclass(frozen=True)
class StateSpec:
    """One state buffer of a step. ``name``: attribute path on the module the step was traced
    from (``layers.0.self_attn.cache_k``); ``kind``: a key of :data:`STATE_KINDS`; ``shape``:
    the per-slot shape (kv: ``(heads, head_dim)``); ``dtype``: a torch dtype name, or None for
    the step's own dtype; ``extra_len``: positions past ``max_len``."""

    name: str
    kind: str
    shape: tuple[int, ...]
    dtype: str | None = None
    extra_len: int = 0

    def renamed(self, name: str) -> "StateSpec":
        return dataclasses.replace(self, name=name)

    def with_prefix(self, prefix: str) -> "StateSpec":
        return self.renamed(prefix + self.name)

    def to_manifest(self) -> dict:
        """The artifact manifest's ``caches`` entry (kv entries also carry ``heads``/``head_dim``,
        what manifests before StateSpec had)."""
        entry = {"kind": self.kind, "shape": list(self.shape), "dtype": self.dtype, "extra_len": self.extra_len}
        if self.kind == "kv":
            entry["heads"], entry["head_dim"] = int(self.shape[0]), int(self.shape[1])
        return entry

    @classmethod
    def from_manifest(cls, name: str, entry: dict) -> "StateSpec":
        """Also reads old entries ``{"heads", "head_dim", "dtype", "extra_len"}`` (static KV)."""
        kind = entry.get("kind", "kv")
        shape = entry.get("shape")
        if shape is None:
            shape = (entry["heads"], entry["head_dim"])
        return cls(name, kind, tuple(int(s) for s in shape), entry.get("dtype"), int(entry.get("extra_len", 0)))


class StateLayout:
    """How a kind's buffer is laid out, and whether steps write it idempotently."""

    # Whether a step's writes of this kind depend on its inputs alone, so that running it twice
    # on the same inputs leaves what running it once does (what CUDA-graph warm-up calls and
    # benchmark repetitions assume; :func:`idempotent_step`).
    idempotent = True

    def buffer_shape(self, spec: StateSpec, batch: int, max_len: int) -> tuple[int, ...]:
        raise NotImplementedError

    def slot_shape(self, buffer: torch.Tensor) -> tuple[int, ...]:
        """The per-slot shape of an existing buffer (what emission records)."""
        raise NotImplementedError


class KVLayout(StateLayout):
    """Static KV (one of K or V): ``[batch, heads, max_len + extra_len, head_dim]``."""

    def buffer_shape(self, spec, batch, max_len):
        heads, head_dim = spec.shape
        return (batch, heads, max_len + spec.extra_len, head_dim)

    def slot_shape(self, buffer):
        return (int(buffer.shape[1]), int(buffer.shape[3]))


class SnapshotLayout(StateLayout):
    """Per-slot state with no length axis (GDN recurrent state, conv window):
    ``[batch, 1 + extra_len, *shape]``. Entry 0 is the live state; the step writes the state
    before it at entry 1 and the state after its block node i at entry 2 + i
    (``extra_len`` = the largest verify block + 1), which commit selects from.

    Not idempotent: a chain step (``specc.models.gdn``) reads the live entry 0 and overwrites
    it with the state after its block, so a second call on the same inputs continues from the
    first call's result (a tree step writes only entries 1 and 2 + i, but the kind cannot tell
    the two apart)."""

    idempotent = False

    def buffer_shape(self, spec, batch, max_len):
        return (batch, 1 + spec.extra_len, *spec.shape)

    def slot_shape(self, buffer):
        return tuple(int(s) for s in buffer.shape[2:])


LAYOUTS: dict[str, StateLayout] = {"kv": KVLayout(), "recurrent": SnapshotLayout(), "conv": SnapshotLayout()}


def layout(kind: str) -> StateLayout:
    try:
        return LAYOUTS[kind]
    except KeyError:
        raise ValueError(f"unknown state kind {kind!r} (known: {', '.join(LAYOUTS)})") from None


def _owner(module, path: str):
    owner_path, _, leaf = path.rpartition(".")
    owner = module
    for part in owner_path.split(".") if owner_path else ():
        owner = owner[int(part)] if part.isdigit() and isinstance(owner, torch.nn.ModuleList) else getattr(owner, part)
    return owner, leaf


def set_attr(module, path: str, value) -> None:
    owner, leaf = _owner(module, path)
    setattr(owner, leaf, value)


def get_attr(module, path: str):
    owner, leaf = _owner(module, path)
    return getattr(owner, leaf)


def state_specs_of(module) -> list[StateSpec]:
    """The state a module declares (``state_specs()``), or [] when it declares none."""
    fn = getattr(module, "state_specs", None)
    return list(fn()) if callable(fn) else []


def idempotent_step(module) -> bool:
    """Whether calling ``module`` (a model definition or a compiled step) again on the same
    inputs leaves the same state and outputs as calling it once: true unless it declares a kind
    whose layout is not (:attr:`StateLayout.idempotent`: the GDN layers' recurrent state and
    conv window). ``specc.runtime.graphs.GraphedStep`` asks before warming a step up: a warm-up
    call of a hybrid chain step would advance its recurrent state once more."""
    return all(layout(spec.kind).idempotent for spec in state_specs_of(module))


def allocate_buffers(specs: Iterable[StateSpec], batch: int, max_len: int, dtype: torch.dtype | None,
                     device) -> dict[str, torch.Tensor]:
    """Zeroed buffers for ``batch`` slots of ``max_len`` positions, by spec name (a spec's own
    dtype wins over ``dtype``)."""
    out = {}
    for spec in specs:
        dt = getattr(torch, spec.dtype) if spec.dtype else (dtype or torch.float32)
        out[spec.name] = torch.zeros(layout(spec.kind).buffer_shape(spec, batch, max_len), dtype=dt, device=device)
    return out


def bind_buffers(module, buffers: dict[str, torch.Tensor]) -> None:
    """Set each buffer as the attribute its spec names (an attribute path) on ``module``."""
    for name, buffer in buffers.items():
        set_attr(module, name, buffer)
