"""Per-row sampling parameters: one batch of rows, each with its own request's ``SamplingParams``.

A continuous batch holds requests with different temperatures, top-k / top-p / min-p, repetition
penalties and seeds, greedy and sampled together. :class:`RowParams` keeps each field as a tensor
with one entry per row, and :func:`process_rows` applies HF's processors (``specc.sampling.
processors``: same order, same rules) to every row with that row's values in the same batched
ops. Every processor runs on every row, and a row whose processor is off (top_k 0, top_p 1, min_p
0, penalty 1) keeps its scores through ``torch.where``: static shapes and no Python branch on a
row's values, so a step stays one CUDA graph whichever requests are in it, and setting a row
(``RowParams.set_row``) writes into the same tensors (no host sync, graph-safe).

Which processors run at all is decided on the host from the requests' parameters: a processor
that no row has had on since the rows were made (``RowParams.used``) is skipped, which leaves every
row's result bit for bit the same (an off row keeps its scores either way) and spares a uniform
batch (say temperature 1 alone) the two full-vocabulary sorts. The set only grows, when a request
enters with a processor the batch has not used yet (at most three changes per batch), never inside
a step and never from device values: a CUDA graph of the step is captured per set.

A greedy row (temperature 0) keeps its raw scores (temperature 1, every processor off) and its
distribution (:func:`rows_probs`) is the one-hot of their argmax: speculative sampling over a
one-hot distribution accepts exactly the target's argmax, so the row's tokens are its greedy
tokens.

Why the thresholds are stored as they are: HF compares the cumulative probability with
``1 - top_p`` computed in Python (float64) and then rounded to the scores' float32;
``top_p_cut`` holds that rounded value, so a row's mask is HF's bit for bit (tests/sampling/
test_rows.py checks every row against HF's warpers with its own parameters).
"""

from __future__ import annotations

import dataclasses

import torch

from specc.sampling.params import SamplingParams

__all__ = ["RowParams", "process_rows", "rows_probs"]

_PROCESSORS = ("top_k", "top_p", "min_p")

_OFF = SamplingParams()  # greedy: every processor off


def _fields(params: SamplingParams | None) -> tuple:
    """(greedy, temperature, top_k, top_p_cut, min_p, penalty) of one row; a greedy row's
    processors are all off (SamplingParams: every other field is ignored when greedy)."""
    p = params if params is not None and not params.greedy else _OFF
    greedy = p is _OFF
    return (greedy, 1.0 if greedy else float(p.temperature), p.top_k, 1.0 - p.top_p, p.min_p,
            1.0 if greedy else float(p.repetition_penalty))


@dataclasses.dataclass
class RowParams:
    """Each field [B] on the device. ``top_k`` 0, ``top_p_cut`` 0 (top_p 1), ``min_p`` 0 and
    ``penalty`` 1 are off; ``greedy`` rows have temperature 1 and every processor off."""

    greedy: torch.Tensor       # bool
    temperature: torch.Tensor  # float32
    top_k: torch.Tensor        # int64
    top_p_cut: torch.Tensor    # float32: 1 - top_p, rounded as HF's comparison rounds it
    min_p: torch.Tensor        # float32
    penalty: torch.Tensor      # float32
    # processors some row has had on since these rows were made (host side, only grows)
    used: set = dataclasses.field(default_factory=set, compare=False)

    @classmethod
    def of(cls, params: list[SamplingParams | None], device) -> "RowParams":
        """One row per entry (None or greedy: a greedy row)."""
        cols = list(zip(*(_fields(p) for p in params))) if params else [()] * 6
        dtypes = (torch.bool, torch.float32, torch.long, torch.float32, torch.float32, torch.float32)
        rows = cls(*(torch.tensor(list(c), dtype=d, device=device) for c, d in zip(cols, dtypes)))
        for p in params:
            rows._use(p)
        return rows

    def set_row(self, row: int, params: SamplingParams | None) -> None:
        """A request with ``params`` now holds ``row`` (in place: the tensors keep their storage)."""
        for tensor, value in zip(self._tensors(), _fields(params)):
            tensor[row] = value
        self._use(params)

    def _use(self, params: SamplingParams | None) -> None:
        if params is None or params.greedy:
            return
        on = {"top_k": params.top_k > 0, "top_p": params.top_p < 1, "min_p": params.min_p > 0}
        self.used.update(name for name in _PROCESSORS if on[name])

    def index(self, rows) -> "RowParams":
        """The parameters of ``rows`` (a slice, an index tensor or list)."""
        if isinstance(rows, list):
            rows = torch.tensor(rows, dtype=torch.long, device=self.greedy.device)
        return RowParams(*(t[rows] for t in self._tensors()), used=self.used)

    def _tensors(self) -> tuple:
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "used")

    @property
    def rows(self) -> int:
        return self.greedy.shape[0]


def _col(values: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """[B] -> [B, 1, ..., 1], broadcasting over ``scores`` [B, ..., V]."""
    return values.reshape(values.shape[0], *([1] * (scores.dim() - 1)))


def process_rows(logits: torch.Tensor, rows: RowParams, seen: torch.Tensor | None = None) -> torch.Tensor:
    """Logits [B, ..., V] -> processed fp32 logits, row b with row b's parameters, in HF's order:
    repetition penalty (``seen`` [B, ..., V] bool, the context's tokens; None: no row has one),
    temperature, top-k, top-p, min-p. -inf marks tokens that cannot be sampled."""
    scores = logits.float()
    neg_inf = float("-inf")  # a Python scalar: no host -> device copy per call (capturable in a CUDA graph)
    if seen is not None:
        penalty = _col(rows.penalty, scores)
        penalized = torch.where(scores < 0, scores * penalty, scores / penalty)
        scores = torch.where(seen & (penalty != 1), penalized, scores)
    scores = scores / _col(rows.temperature, scores)
    if "top_k" in rows.used:  # below the k-th largest (ties with it kept)
        k = _col(rows.top_k, scores)
        descending = torch.sort(scores, dim=-1, descending=True)[0]
        kth = descending.gather(-1, (k.clamp(1, scores.shape[-1]) - 1).expand(*scores.shape[:-1], 1))
        scores = torch.where((k > 0) & (scores < kth), neg_inf, scores)
    if "top_p" in rows.used:  # HF's ascending cumulative sum, the most likely token always kept
        cut = _col(rows.top_p_cut, scores)
        # stable: which of several equal scores at the cut goes must not depend on the sort
        # algorithm, which on a GPU follows the number of rows (batch invariance)
        ascending, order = torch.sort(scores, dim=-1, descending=False, stable=True)
        remove = ascending.softmax(-1).cumsum(-1) <= cut
        remove[..., -1:] = False
        remove = torch.zeros_like(remove).scatter(-1, order, remove)
        scores = torch.where(remove & (cut > 0), neg_inf, scores)
    if "min_p" in rows.used:  # less likely than min_p times the most likely token (that one stays)
        min_p = _col(rows.min_p, scores)
        probs = scores.softmax(-1)
        remove = probs < min_p * probs.amax(-1, keepdim=True)
        remove.scatter_(-1, probs.argmax(-1, keepdim=True), False)
        scores = torch.where(remove & (min_p > 0), neg_inf, scores)
    return scores


def rows_probs(logits: torch.Tensor, rows: RowParams, seen: torch.Tensor | None = None) -> torch.Tensor:
    """The sampling distribution [B, ..., V] (fp32) of each row: ``process_rows``' softmax, or
    for a greedy row the one-hot of its argmax."""
    scores = process_rows(logits, rows, seen)
    hot = torch.zeros_like(scores).scatter_(-1, scores.argmax(-1, keepdim=True), 1.0)
    return torch.where(_col(rows.greedy, scores), hot, scores.softmax(-1))
