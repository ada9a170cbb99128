"""Token forcing: is a system's greedy output the stock output, position by position?

Stock decodes each prompt; its target's logits over prompt + output give, at every generated
position, the token stock chose and the top-2 margin there. The system under test is then fed
stock's tokens (prefill on the prompt, then verify blocks over stock's tokens through its KV
cache) and its argmax is compared at every position. A mismatch is a *numerical tie* only when
stock's own top-2 margin there is below the stated tolerance; ties are counted and reported,
every other mismatch fails. Finally the system decodes freely and must reproduce stock's tokens
up to the first tie position.

Optional fp32 audit (``referee=Fp32Referee(stock_target)``, ``specc verify --fp32-audit``): a
mismatch above the tolerance is asked again of the same stock model run in fp32 on the same
weights. When fp32 prefers stock's token over the system's by no more than stock's own
low-precision error on those two logits (or prefers the system's token), stock's choice is
within its own rounding noise: the position is reported as an *audited tie* (a list of its own,
with both numbers), not folded into the ordinary ties. Every other mismatch still fails. The
ordinary ties get both numbers too (for the record; they are ties either way). In fp32 stock
this never applies. ``ForcingReport.audit`` says whether the audit ran, and why not where an
fp32 copy of stock does not fit (:func:`fp32_referee`).

A system is anything with ``forced_argmax(prompt, tokens) -> list[int]`` and
``generate(prompt, max_new_tokens, eos_token_ids) -> GenerationResult`` (the eager decoder and
the compiled engine both are).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Protocol, Sequence

import torch

# Default tie tolerances (logit units) by compute dtype. fp32: rounding-order noise on CPU is
# ~1e-5. bf16: measured on the H200 (docs/benchmarks/qwen3-8b-equality.md): two HF attention
# backends disagree at positions with margins up to 0.22 on random weights, so 0.25.
DEFAULT_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.25, "float16": 0.05}


class System(Protocol):
    def forced_argmax(self, prompt: list[int], tokens: list[int]) -> list[int]: ...

    def generate(self, prompt, max_new_tokens: int, eos_token_ids=()): ...


@dataclasses.dataclass
class StockRun:
    prompt: list[int]
    tokens: list[int]
    margins: list[float]  # stock's top-2 logit margin at each generated position
    accepted_lengths: list[int] = dataclasses.field(default_factory=list)  # stock's per-step commits


@dataclasses.dataclass
class Mismatch:
    prompt_index: int
    position: int
    expected: int
    got: int
    margin: float
    fp32_margin: float | None = None  # fp32 logit(expected) - logit(got), with an fp32 referee
    stock_error: float | None = None  # max |stock logit - fp32 logit| over the two tokens, with a referee


@dataclasses.dataclass
class ForcingReport:
    tolerance: float
    prompts: int = 0
    positions: int = 0
    ties: list[Mismatch] = dataclasses.field(default_factory=list)
    audited_ties: list[Mismatch] = dataclasses.field(default_factory=list)
    failures: list[Mismatch] = dataclasses.field(default_factory=list)
    generation_failures: list[str] = dataclasses.field(default_factory=list)
    nonfinite: list[str] = dataclasses.field(default_factory=list)  # positions with NaN/inf logits
    audit: str | None = None  # whether an fp32 audit ran, and why not (None: not asked)

    @property
    def passed(self) -> bool:
        return not self.failures and not self.generation_failures and not self.nonfinite and self.positions > 0

    def summary(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        text = (f"token forcing {verdict}: {self.prompts} prompts, {self.positions} positions, "
                f"{len(self.failures)} mismatches, {len(self.ties)} numerical ties (tolerance {self.tolerance:g})")
        if self.audited_ties:
            text += f", {len(self.audited_ties)} fp32-audited ties"
        if self.failures:
            m = self.failures[0]
            text += (f"; first mismatch: prompt {m.prompt_index} position {m.position}: expected {m.expected}, "
                     f"got {m.got}, stock margin {m.margin:.4g}")
        if self.generation_failures:
            text += f"; free generation: {self.generation_failures[0]}"
        if self.nonfinite:
            text += f"; non-finite logits: {self.nonfinite[0]}"
        if self.positions == 0:
            text += "; nothing was checked (0 positions)"
        if self.audit:
            text += f"; {self.audit}"
        return text

    def to_json(self) -> dict:
        return {"passed": self.passed, "tolerance": self.tolerance, "prompts": self.prompts,
                "positions": self.positions, "ties": [dataclasses.asdict(m) for m in self.ties],
                "audited_ties": [dataclasses.asdict(m) for m in self.audited_ties],
                "failures": [dataclasses.asdict(m) for m in self.failures],
                "generation_failures": list(self.generation_failures), "nonfinite": list(self.nonfinite),
                "audit": self.audit}


@torch.inference_mode()
def stock_margins(hf_target, prompt: list[int], tokens: list[int]) -> list[float]:
    """Stock target's top-2 margin at each generated position (one forward, no cache)."""
    if not tokens:
        return []
    ids = torch.tensor([prompt + tokens], device=hf_target.device)
    return top2_margins(hf_target(input_ids=ids).logits[0, len(prompt) - 1:-1])


def top2_margins(logits: torch.Tensor) -> list[float]:
    """Top-2 margin of each row of ``logits`` [T, V]; NaN where a row is not all finite. Also for
    the logits stock decoded with (``generate(output_logits=True)``): in bf16 a separate forward
    over the whole sequence takes other kernels and can move a margin by the rounding noise."""
    logits = logits.float()
    top2 = logits.topk(2, dim=-1).values
    margins = top2[:, 0] - top2[:, 1]
    # a position whose logits are not all finite has no meaningful argmax: NaN marks it (it fails)
    return torch.where(torch.isfinite(logits).all(dim=-1), margins, torch.full_like(margins, float("nan"))).tolist()


class Fp32Referee:
    """The stock target again in fp32 on the same weights, asked about a mismatch: (fp32 margin
    between stock's token and the system's, stock's own error on those two logits). Logits are
    computed once per run (one forward over prompt + stock tokens in each precision) and cached
    by the run's index: use one referee per list of runs."""

    def __init__(self, stock_target):
        import copy

        self.stock = stock_target
        self.fp32 = copy.deepcopy(stock_target).float()  # .float() converts tensor by tensor
        self._cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def logits(self, index: int, run: StockRun) -> tuple[torch.Tensor, torch.Tensor]:
        """(stock's, fp32's) logits [T, V] at run ``index``'s generated positions."""
        if index not in self._cache:
            with torch.inference_mode():
                ids = torch.tensor([list(run.prompt) + list(run.tokens)], device=self.stock.device)
                start = len(run.prompt) - 1
                self._cache[index] = (self.stock(input_ids=ids).logits[0, start:-1].float(),
                                      self.fp32(input_ids=ids).logits[0, start:-1].float())
        return self._cache[index]

    def __call__(self, index: int, run: StockRun, position: int, expected: int, got: int) -> tuple[float, float]:
        low, ref = (t[position] for t in self.logits(index, run))
        error = max(abs(low[expected] - ref[expected]).item(), abs(low[got] - ref[got]).item())
        return (ref[expected] - ref[got]).item(), error


def fp32_referee(stock_target, free_bytes: int | None = None) -> tuple[Fp32Referee | None, str]:
    """An :class:`Fp32Referee` of ``stock_target`` when its fp32 copy fits in the free memory of
    the target's device (``free_bytes``: override, for tests), else None; and the one line a
    forcing report carries about it (``verify_system(..., audit=)``). Why ask first: a stock
    model too large to copy in fp32 would otherwise end the run in an out-of-memory error instead
    of a report that says its mismatches went unaudited."""
    params = list(stock_target.parameters())
    if params and all(p.dtype == torch.float32 for p in params):
        return None, "fp32 audit: not needed (stock runs in fp32)"
    need = sum(p.numel() for p in params) * 4  # parameters() lists a shared tensor once
    if free_bytes is None:
        from specc.models.loading import available_memory_bytes

        free_bytes = available_memory_bytes(params[0].device if params else torch.device("cpu"))
    if free_bytes is not None and need > free_bytes:
        return None, (f"fp32 audit: off (an fp32 copy of stock needs {need / 2**30:.1f} GiB, "
                      f"{free_bytes / 2**30:.1f} GiB free): mismatches are not audited")
    return Fp32Referee(stock_target), f"fp32 audit: on (stock in fp32 on the same weights, {need / 2**30:.1f} GiB)"


def run_stock_reference(pair, prompts: Sequence[list[int]], max_new_tokens: int, num_draft=None,
                        dtype=torch.float32, device="cpu", stock=None,
                        progress: Callable[[int, int], None] | None = None) -> list[StockRun]:
    """Stock's tokens and margins on each prompt (``stock``: a StockSystem to reuse, e.g. to
    build an :class:`Fp32Referee` from its target; ``progress(done, total)`` after each prompt)."""
    from specc.stock.runner import StockSystem

    stock = stock if stock is not None else StockSystem(pair, num_draft, dtype, device)
    runs = []
    for prompt in prompts:
        result = stock.generate(prompt, max_new_tokens)
        runs.append(StockRun(list(prompt), result.tokens, stock_margins(stock.target, list(prompt), result.tokens),
                             list(result.stats.accepted_lengths)))
        if progress is not None:
            progress(len(runs), len(prompts))
    return runs


def verify_system(system: System, runs: Sequence[StockRun], tolerance: float, eos_token_ids=(),
                  referee: Fp32Referee | None = None,
                  progress: Callable[[int, int], None] | None = None, audit: str | None = None) -> ForcingReport:
    """Force stock's tokens through ``system`` on every run and decode freely; ``progress(done,
    total)`` after each prompt; ``audit``: the report's line about the fp32 audit (default: says
    it ran when a referee is given)."""
    if audit is None and referee is not None:
        audit = "fp32 audit: on"
    report = ForcingReport(tolerance=tolerance, prompts=len(runs), audit=audit)
    for index, run in enumerate(runs):
        got = system.forced_argmax(run.prompt, run.tokens)
        report.positions += len(run.tokens)
        bad = [pos for pos, margin in enumerate(run.margins) if not math.isfinite(margin)]
        if bad:  # NaN/inf in stock's logits: argmax agreement there proves nothing
            report.nonfinite.append(f"prompt {index}: stock's logits are not finite at {len(bad)} positions "
                                    f"(first {bad[0]}): non-finite weights or an overflow")
        first_tie = None
        for pos, (want, have) in enumerate(zip(run.tokens, got)):
            if want == have:
                continue
            m = Mismatch(index, pos, want, int(have), float(run.margins[pos]))
            if referee is not None:
                m.fp32_margin, m.stock_error = referee(index, run, pos, want, int(have))
            if m.margin < tolerance:
                kind = report.ties
            elif referee is not None:
                # fp32 prefers stock's token by no more than stock's own error, or the system's
                kind = report.audited_ties if m.fp32_margin <= m.stock_error else report.failures
            else:
                kind = report.failures
            kind.append(m)
            if kind is not report.failures and first_tie is None:
                first_tie = pos
        free = system.generate(run.prompt, len(run.tokens), eos_token_ids).tokens
        limit = len(run.tokens) if first_tie is None else first_tie  # a tie may go either way
        if free[:limit] != run.tokens[:limit]:
            diverge = next((i for i, (a, b) in enumerate(zip(free, run.tokens)) if a != b), min(len(free), limit))
            report.generation_failures.append(
                f"prompt {index}: free decoding diverges from stock at token {diverge} (no tie before it)")
        if progress is not None:
            progress(index + 1, len(runs))
    return report
