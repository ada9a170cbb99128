"""Decoding state: what a step reads and writes besides its inputs, owned by the runtime.

Each layer kind DECLARES its state as :class:`StateSpec` entries (``CausalLM.state_specs()``,
``DFlashDrafter.state_specs()``); nothing finds caches by attribute name. A spec names the
attribute path that holds the buffer on the step module, its ``kind``, its per-slot shape and
dtype, and ``extra_len`` (scratch positions past ``max_len``, e.g. a DFlash drafter's block).
The IR carries the spec on the buffer's ``get_attr`` node (``node.meta["state"]``), emission
records it in the artifact manifest, and :class:`DecodingState` allocates, commits, forks,
releases and binds the buffers for ``batch`` slots (rows).

A state *kind* (:data:`STATE_KINDS`) says how a buffer is laid out and what committing accepted
positions means for it. Kinds:

- ``"kv"`` (static KV, one of K or V): buffer ``[batch, heads, max_len + extra_len, head_dim]``,
  per-slot shape ``(heads, head_dim)``. The step writes new entries at ``lengths[b] + j``.
  Chain commit: nothing to move, the row's length grows by the accepted count. Tree commit
  (an accepted path of block slots per row): the path's entries are moved to the front of the
  block (``specc.codegen.kernels.kv_cache.kv_compact``), then the length grows.

- ``"recurrent"`` (gated DeltaNet, fp32, per-slot shape ``(Hv, dk, dv)``) and ``"conv"`` (the
  short causal convolution's window, per-slot shape ``(channels, kernel - 1)``): no length axis,
  so a verify step cannot be rolled back by a length. Buffer ``[batch, 2 + max_block, *shape]``
  (``specc.models.state.SnapshotLayout``): entry 0 live, entry 1 the state before the step,
  entry 2 + i the state after block node i (a chain's node i is its i-th token; a tree node's
  state continues its parent's, its conv window follows its ancestor path). Commit copies, per
  row, the entry of the last committed node into entry 0: chain ``1 + accepted[b]`` (0 tokens:
  the state before the step), tree ``2 + path[b, accepted[b] - 1]``. Lengths are not involved.

A kind that fits the same interface later (not implemented here):

- ``"paged_kv"``: per-slot shape ``(heads, head_dim)``; the buffer is a page pool plus a
  ``[batch, pages]`` page table owned by the state; allocate/fork/release manage pages (fork
  shares pages copy-on-write), commit is the same length update / compaction within the pages.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Iterable

import torch

from specc.models.state import StateSpec, get_attr, idempotent_step, layout, set_attr, state_specs_of

__all__ = ["StateSpec", "StateKind", "KVState", "SnapshotState", "STATE_KINDS", "DecodingState", "reserve_block",
           "state_specs_of", "slot_view", "state_buffers", "bind_rows", "idempotent_step"]


class StateKind:
    """Commit semantics of one kind of state buffer (its layout: ``specc.models.state``)."""

    name = ""

    def buffer_shape(self, spec: StateSpec, batch: int, max_len: int) -> tuple[int, ...]:
        return layout(self.name).buffer_shape(spec, batch, max_len)

    def slot_shape(self, buffer: torch.Tensor) -> tuple[int, ...]:
        return layout(self.name).slot_shape(buffer)

    def commit(self, buffers: list[torch.Tensor], lengths: torch.Tensor, accepted: torch.Tensor,
               path: torch.Tensor | None) -> None:
        """Make the accepted positions of the last step the rows' state, for every buffer of
        this kind at once (kinds may pair buffers, e.g. K with V). Called before the state's
        ``lengths`` grow by ``accepted``. ``path`` [B, P]: block slots (relative to
        ``lengths``) of the accepted tree path, or None for a chain (accepted = a prefix)."""
        raise NotImplementedError

    def fork(self, buffer: torch.Tensor, src: int, dst: int, length: int) -> None:
        buffer[dst] = buffer[src]

    def release(self, buffer: torch.Tensor, slot: int) -> None:
        """Nothing to free in a static buffer; paged kinds return the slot's pages here."""


class KVState(StateKind):
    name = "kv"

    def commit(self, buffers, lengths, accepted, path):
        """Chain: nothing to move (the length update is the commit). Tree: move the path's K/V
        entries ``lengths[b] + path[b, p]`` to ``lengths[b] + p`` with ``kv_compact_layers`` (one
        launch for every layer's K/V pair where they share a layout)."""
        if path is None or not buffers:
            return
        from specc.codegen.kernels.kv_cache import kv_compact, kv_compact_layers

        base = lengths[:, None]
        steps = torch.arange(path.shape[1], device=path.device)[None]
        src = torch.where(path >= 0, base + path, torch.full_like(path, -1))
        dst = base + steps
        pairs = list(zip(buffers[0::2], buffers[1::2]))
        # one launch over fixed buffers only: its address table is made once per set of caches
        if not len(buffers) % 2 and all(k.shape == v.shape for k, v in pairs):
            kv_compact_layers(pairs, src, dst, accepted)
            return
        if len(buffers) % 2:  # an unpaired buffer: its partner is a scratch copy
            pairs.append((buffers[-1], buffers[-1].clone()))
        for cache_k, cache_v in pairs:
            if cache_k.shape != cache_v.shape:
                kv_compact(cache_k, cache_k.clone(), src, dst, accepted)
                kv_compact(cache_v, cache_v.clone(), src, dst, accepted)
            else:
                kv_compact(cache_k, cache_v, src, dst, accepted)

    def fork(self, buffer, src, dst, length):
        buffer[dst, :, :length] = buffer[src, :, :length]


class SnapshotState(StateKind):
    """Kinds whose step writes per-node snapshots (``recurrent``, ``conv``): commit selects one."""

    def __init__(self, name: str):
        self.name = name

    def commit(self, buffers, lengths, accepted, path):
        if not buffers:
            return
        rows = accepted.shape[0]
        acc = accepted.to(torch.long)
        if path is None:
            entry = 1 + acc
        else:
            last = path.gather(1, (acc - 1).clamp(min=0)[:, None])[:, 0]
            entry = torch.where(acc > 0, 2 + last, torch.ones_like(acc))
        index = torch.arange(rows, device=acc.device)
        for buffer in buffers:
            buffer[:rows, 0] = buffer[index, entry]

    def fork(self, buffer, src, dst, length):
        buffer[dst, 0] = buffer[src, 0]


STATE_KINDS: dict[str, StateKind] = {"kv": KVState(), "recurrent": SnapshotState("recurrent"),
                                     "conv": SnapshotState("conv")}


def _kind(name: str) -> StateKind:
    try:
        return STATE_KINDS[name]
    except KeyError:
        raise ValueError(f"unknown state kind {name!r} (known: {', '.join(STATE_KINDS)})") from None


def reserve_block(step, block: int) -> None:
    """Size the per-node snapshots of a step whose state keeps them (a model definition with
    ``max_block``: hybrid targets) for verify blocks of up to ``block`` tokens; call before its
    ``setup_caches``. A compiled step's snapshot capacity is fixed by its artifact: a block
    larger than it is refused (a chain would silently keep only its final state). Steps without
    snapshot kinds are left alone. A wrapper (``GraphedStep``) sizes the step it holds."""
    step = _unwrapped(step)
    if getattr(step, "max_block", None) is not None:
        step.max_block = int(block)
        return
    capacity = min((spec.extra_len - 1 for spec in state_specs_of(step) if isinstance(STATE_KINDS.get(spec.kind),
                                                                                        SnapshotState)), default=None)
    if capacity is not None and block > capacity:
        raise ValueError(f"verify blocks of {block} tokens exceed the {capacity} per-node state entries the "
                         "step was compiled with (recompile with fewer drafts or a smaller tree)")


class DecodingState:
    """The state buffers of one step for ``batch`` slots of up to ``max_len`` tokens, plus the
    per-slot committed lengths (a [B] long tensor on the device).

    ``attribute``: how a spec's name maps to the attribute that holds its buffer on the bound
    module (identity for model definitions; a flattening function for generated steps)."""

    def __init__(self, specs: Iterable[StateSpec], device=None, dtype: torch.dtype | None = None,
                 attribute=None):
        self.specs = list(specs)
        for spec in self.specs:
            _kind(spec.kind)
        self.device = torch.device(device or "cpu")
        self.dtype = dtype
        self.attribute = attribute or (lambda name: name)
        self.buffers: dict[str, torch.Tensor] = {}
        self.lengths = torch.zeros(0, dtype=torch.long, device=self.device)
        self.batch = self.max_len = 0

    def allocate(self, batch: int, max_len: int) -> "DecodingState":
        """(Re)allocate every buffer for ``batch`` slots of ``max_len`` tokens; lengths = 0."""
        for spec in self.specs:
            dtype = getattr(torch, spec.dtype) if spec.dtype else (self.dtype or torch.float32)
            shape = _kind(spec.kind).buffer_shape(spec, batch, max_len)
            self.buffers[spec.name] = torch.zeros(shape, dtype=dtype, device=self.device)
        self.lengths = torch.zeros(batch, dtype=torch.long, device=self.device)
        self.batch, self.max_len = batch, max_len
        return self

    @classmethod
    def adopt(cls, module, batch: int, max_len: int, kinds: Iterable[str] | None = None) -> "DecodingState":
        """A state over the buffers ``module`` already holds for its declared specs (a model
        definition that allocated its own, ``setup_caches``), lengths 0; ``kinds``: only the
        specs of these kinds (None: all)."""
        specs = [s for s in state_specs_of(module) if kinds is None or s.kind in kinds]
        state = cls(specs, getattr(module, "device", None))
        state.buffers = {spec.name: get_attr(module, spec.name) for spec in state.specs}
        state.lengths = torch.zeros(batch, dtype=torch.long, device=state.device)
        state.batch, state.max_len = batch, max_len
        return state

    def bind(self, module) -> None:
        """Set the buffers as attributes of ``module`` (a model definition or a compiled step)."""
        for spec in self.specs:
            set_attr(module, self.attribute(spec.name), self.buffers[spec.name])

    def commit(self, accepted: torch.Tensor, path: torch.Tensor | None = None) -> None:
        """Keep ``accepted[b]`` new positions of each slot, written by the last step at
        ``lengths[b] + j``. Chain (``path`` None): the accepted positions are the block's
        prefix, so for KV the commit is the length update alone. Tree: ``path`` [B, P] gives
        the block slots (relative to ``lengths``) of the accepted path in order (-1 = none);
        each kind moves / selects its entries (KV: compaction with ``kv_compact``; recurrent
        and conv states: the snapshot of the last committed node, chains included) before the
        lengths grow."""
        for kind in dict.fromkeys(spec.kind for spec in self.specs):
            buffers = [self.buffers[spec.name] for spec in self.specs if spec.kind == kind]
            _kind(kind).commit(buffers, self.lengths, accepted, path)
        self.lengths += accepted.to(self.lengths.dtype)

    def narrowed(self, rows: int) -> "DecodingState":
        """The first ``rows`` slots as a state of their own: views sharing this state's storage
        (buffers and lengths), so a step bound to it (``bind``) runs over a batch bucket of the
        allocated slots and what it commits is this state's (``DeviceSpeculativeDecoder.set_width``)."""
        if not 1 <= rows <= self.batch:
            raise ValueError(f"a state of {self.batch} slots has no first {rows}")
        view = copy.copy(self)
        view.buffers = {name: buffer[:rows] for name, buffer in self.buffers.items()}
        view.lengths = self.lengths[:rows]
        view.batch = rows
        return view

    def fork(self, src_slot: int, dst_slot: int) -> None:
        """Copy slot ``src_slot``'s state and length into ``dst_slot`` (a shared prefix)."""
        length = int(self.lengths[src_slot])
        for spec in self.specs:
            _kind(spec.kind).fork(self.buffers[spec.name], src_slot, dst_slot, length)
        self.lengths[dst_slot] = self.lengths[src_slot]

    def move(self, src: list[int], dst: list[int], length: int) -> None:
        """Move the sequences of slots ``src`` into the free slots ``dst`` (pairwise; ``src`` are
        then free), one copy per buffer for all of them (each kind's ``fork`` over index
        tensors) and no device read: ``length`` is the longest of their lengths, from the
        caller's host mirror. How a scheduler compacts its requests into a batch bucket."""
        if set(src) & set(dst) or len(src) != len(dst) or len(set(dst)) != len(dst):
            raise ValueError(f"move: sources {src} and destinations {dst} must be distinct slots, pairwise")
        if not src:
            return
        from specc.runtime.uploads import upload

        s, d = upload(src, self.device), upload(dst, self.device)
        for spec in self.specs:
            _kind(spec.kind).fork(self.buffers[spec.name], s, d, length)
        self.lengths[d] = self.lengths[s]
        for slot in src:
            for spec in self.specs:
                _kind(spec.kind).release(self.buffers[spec.name], slot)
        self.lengths[s] = 0

    def release(self, slot: int) -> None:
        """Free ``slot`` for another sequence (its length becomes 0)."""
        for spec in self.specs:
            _kind(spec.kind).release(self.buffers[spec.name], slot)
        self.lengths[slot] = 0


def _unwrapped(module):
    """The step a wrapper (``specc.runtime.graphs.GraphedStep``) holds, else the module itself:
    state attributes live on the wrapped step."""
    from specc.runtime.graphs import GraphedStep

    return module.step if isinstance(module, GraphedStep) else module


def state_buffers(module) -> dict[str, torch.Tensor]:
    """The state buffers ``module`` holds now, by spec name (a wrapper's: the wrapped step's)."""
    inner = _unwrapped(module)
    return {spec.name: get_attr(inner, spec.name) for spec in state_specs_of(inner)}


def bind_rows(module, buffers: dict[str, torch.Tensor], rows: int) -> None:
    """Bind the first ``rows`` slots of ``buffers`` (``state_buffers`` of the full allocation) as
    ``module``'s state: views sharing their storage, so calls of the step run over a batch bucket
    of the allocated slots. Unlike ``slot_view`` the binding stays; graphs captured over another
    binding must be dropped by the caller."""
    inner = _unwrapped(module)
    for name, buffer in buffers.items():
        set_attr(inner, name, buffer if rows == buffer.shape[0] else buffer[:rows])  # all rows: the buffer itself


@contextlib.contextmanager
def slot_view(module, slot: int):
    """Bind row ``slot`` of each state buffer ``module`` declares (a ``[1, ...]`` view sharing the
    buffer's storage) for the duration, so a batch-1 call of the step reads and writes that slot
    only: how one request's prefill (or a drafter's catch-up forward) lands in its slot of a
    batch while the other rows' state stays untouched. Call the step eagerly inside (never
    through a CUDA graph, which would keep pointing at the view)."""
    inner = _unwrapped(module)
    full = state_buffers(module)
    try:
        for name, buffer in full.items():
            set_attr(inner, name, buffer[slot:slot + 1])
        yield
    finally:
        for name, buffer in full.items():
            set_attr(inner, name, buffer)
