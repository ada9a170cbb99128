"""Batched rows: B requests at once through continuous batching, timed by decode step.

`specc bench --batch 1,16,32` and ``examples/bench_batching.py`` both time a system at B > 1 the
same way: B prompts go through a ``BatchScheduler`` of B slots (``drive``: what
``Engine.generate_batch`` does), each prompt is prefilled alone into its slot (admission), and
every decode step (one speculative step over all slots, ending in the step's host read) is timed
apart. A row's figures (``measured``):

- ``tokens_per_s``: all new tokens / wall seconds, admissions (prefills) included;
- ``decode_tokens_per_s`` (static): decode tokens / decode seconds of this fixed batch, where rows
  that finished early idle while the slowest request ends;
- ``steady_tokens_per_s``: B x tokens per request-step / mean step time, what the same step gives
  with every slot full, as under continuous batching that refills finished slots (the cost model
  predicts this one);
- ``step_ms``, ``tokens_per_step`` (per request-step), ``decode_steps``, ``prefill_seconds``.

One untimed pass of the same workload precedes the timed one (Triton compiles, CUDA-graph
captures for every batch bucket and draft length the pass meets).

The speculative row at B verifies the way `specc compile` would build it for a deployment of
batch size B: ``batching_choice.batching_section`` picks one level, two-level verification (its
k1) or a goodput draft-length rule from the cost model and the acceptance, and the loop runs that
(``apply_batching``); the row names the choice and why. Where the choice is a mechanism, a
second row (``"reference": true``) runs the same loop in one level, so the mechanism's gain is
measured in the same run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

import torch

__all__ = ["DECODE_RANGE", "ONE_LEVEL_REFERENCE", "Run", "drive", "timed", "run_batch", "measured", "random_prompts",
           "apply_batching", "stated_rates", "BatchedRows"]

DECODE_RANGE = "specc.bench.decode_step"  # the host range around each decode step (kernel profiles)
# the batching section of the reference row: every row verifies the loop's k in one level
ONE_LEVEL_REFERENCE = {"two_level_k1": None, "per_request_k": False, "goodput_k": False, "chosen": "one level",
                       "source": "reference: no batching mechanism (every row verifies its k drafts in one level)"}


@dataclasses.dataclass
class Run:
    """One pass of continuous batching: results per prompt, the draft lengths a rule chose, and
    the wall time of the decode steps alone (each ends in the step's host read, so it is the
    device's step time plus the host's glue; admissions, i.e. prefills, are outside it)."""

    results: list
    ks: list
    decode_seconds: float
    decode_steps: int
    audit: dict | None = None  # per decode step: host reads, blocking uploads, glue ops, forwards (mean)


def drive(loop, prompts, tokens, rule=None, audit: bool = False, capacity: int | None = None,
          buckets: bool = False) -> Run:
    """``prompts`` through a BatchScheduler of ``capacity`` slots (None: len(prompts), what
    ``generate_batch`` does), under the draft-length ``rule`` (None: the loop's k), timing the
    decode steps apart. ``tokens``: new tokens per request, one for all or one per prompt.
    ``buckets``: the scheduler's batch buckets (off by default here: a row's steady figure
    assumes every step ran over all the slots). ``audit``: count each decode step's host reads,
    blocking uploads, glue ops and forwards (``specc.bench.step_audit``; slows the steps: never
    on a timed pass)."""
    from specc.bench.step_audit import StepAudit
    from specc.runtime.batching import BatchScheduler

    scheduler = BatchScheduler(loop, capacity or len(prompts), (), rule, buckets=buckets)
    budgets = list(tokens) if isinstance(tokens, (list, tuple)) else [tokens] * len(prompts)
    rids = [scheduler.submit(p, m, ()) for p, m in zip(prompts, budgets)]
    ks, seconds, steps = [], 0.0, 0
    totals: dict = {}
    while not scheduler.idle:
        scheduler.admit()
        if not scheduler.num_running:
            continue
        start = time.perf_counter()
        with StepAudit(loop) if audit else contextlib.nullcontext() as counted, \
                torch.profiler.record_function(DECODE_RANGE):
            scheduler.decode()
        seconds += time.perf_counter() - start
        steps += 1
        for key, value in (counted.counts() if audit else {}).items():
            totals[key] = totals.get(key, 0) + value
        if rule is not None:  # what each running request was offered (per-row rules: its own k)
            ks.extend(scheduler.last_request_drafts)
    mean = {f"{key}_per_step": value / max(steps, 1) for key, value in totals.items()} if audit else None
    return Run([scheduler.take(r) for r in rids], ks, seconds, steps, mean)


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed(run, loop, device, warmup: bool = True):
    """(result of the timed call, seconds, seconds of the untimed pass before it); a replayed
    acceptance restarts its draws before the timed call, so both passes draw the same counts."""
    warm = 0.0
    if warmup:
        start = time.perf_counter()
        run()
        _sync(device)
        warm = time.perf_counter() - start
    if hasattr(loop.verifier, "reset"):
        loop.verifier.reset()
    _sync(device)
    start = time.perf_counter()
    out = run()
    _sync(device)
    return out, time.perf_counter() - start, warm


def run_batch(loop, prompts, tokens, device, rule=None, audit: bool = False, warmup: bool = True):
    """(Run of the timed pass, its seconds, the untimed pass's seconds); ``audit``: a third,
    audited pass after the timed one, whose per-step counts land in the Run's ``audit``."""
    run, seconds, warm = timed(lambda: drive(loop, prompts, tokens, rule), loop, device, warmup)
    if audit:
        run.audit = drive(loop, prompts, tokens, rule, audit=True).audit
    return run, seconds, warm


def measured(run: Run, seconds: float, batch: int) -> dict:
    """A row's figures (see the module docstring for the two decode throughputs)."""
    results = run.results
    new = sum(len(r.tokens) for r in results)
    steps = sum(r.stats.steps for r in results)
    decode_tokens = new - len(results)  # each request's first token comes from its prefill
    tokens_per_step = decode_tokens / steps if steps else 0.0
    step_s = run.decode_seconds / max(run.decode_steps, 1)
    return {"batch": batch, "seconds": seconds, "tokens": new, "tokens_per_s": new / seconds,
            "tokens_per_s_per_request": new / seconds / batch,
            "tokens_per_step": tokens_per_step,
            "decode_steps": run.decode_steps, "decode_seconds": run.decode_seconds,
            "prefill_seconds": seconds - run.decode_seconds,  # admissions: prefills (and first tokens)
            "step_ms": 1e3 * step_s,
            "decode_tokens_per_s": decode_tokens / run.decode_seconds if run.decode_seconds > 0 else 0.0,
            "steady_tokens_per_s": batch * tokens_per_step / step_s if step_s > 0 else 0.0,
            **({"audit": run.audit} if run.audit is not None else {})}


def random_prompts(count: int, mean_len: int, vocab: int, seed: int) -> list[list[int]]:
    """``count`` random prompts of ``mean_len`` +- 25% tokens (different lengths: the slots' caches
    and the ragged verify see rows at different positions, as real traffic does)."""
    g = torch.Generator().manual_seed(seed)
    lo, hi = max(1, int(mean_len * 0.75)), max(1, int(mean_len * 1.25))
    return [torch.randint(10, vocab - 10, (int(torch.randint(lo, hi + 1, (1,), generator=g)),), generator=g).tolist()
            for _ in range(count)]


def apply_batching(loop, section: dict, num_draft: int):
    """Set ``loop`` up as a batching choice (``batching_section``'s dict or an artifact's
    ``manifest["batching"]``) asks: its two-level k1 on the loop; returns the draft-length rule
    for the scheduler (None: the loop's k every step)."""
    from specc.runtime.step_curve import draft_length_rule

    if hasattr(loop, "two_level_k1"):
        loop.two_level_k1 = section.get("two_level_k1")
    return draft_length_rule(section, num_draft)


def stated_rates(row: dict, expected: float, ar_row: dict | None) -> dict | None:
    """A replayed batched row's steady decode rate at the acceptance model's E tokens per
    request-step instead of the mean its draws gave: B x E / the measured step time. Only for rows
    that draft the loop's k for every row (one level or two-level: both commit a one-level step's
    tokens); a goodput rule drafts fewer, so E(k) is not its expectation (None)."""
    if row.get("draft_rule") or not row.get("step_ms") or not expected:
        return None
    step_s = row["step_ms"] / 1e3
    out = {"tokens_per_step": expected, "drawn_tokens_per_step": row.get("tokens_per_step"),
           "decode_step_s": step_s, "steady_tokens_per_s": row["batch"] * expected / step_s}
    if ar_row is not None and ar_row.get("steady_tokens_per_s"):
        out["steady_speedup_vs_ar"] = out["steady_tokens_per_s"] / ar_row["steady_tokens_per_s"]
    return out


def context_of(prompts, tokens: int) -> int:
    """The KV-cache length a prediction prices: the mean prompt plus half the new tokens."""
    return int(sum(len(p) for p in prompts) / max(len(prompts), 1) + tokens / 2)


def _option(pricer, section: dict, batch: int, acceptance):
    """The priced option a batching section chose (the cost model's steady tokens/s for it)."""
    if section.get("two_level_k1"):
        return pricer.two_level(batch, acceptance, int(section["two_level_k1"]))
    if section.get("per_request_k"):
        return pricer.per_request(batch, acceptance)
    if section.get("goodput_k"):
        return pricer.dense_goodput(batch, acceptance)
    return pricer.one_level(batch, acceptance)


class BatchedRows:
    """specc's rows at one batch size B > 1 for `specc bench` (see the module docstring): the
    compiled AR loop and the speculative loop over B requests, each with the cost model's steady
    tokens/s beside it."""

    def __init__(self, device, tokens: int, warmup: bool, cost, say=None):
        self.device, self.tokens, self.warmup, self.cost = torch.device(device), int(tokens), bool(warmup), cost
        self.say = say or (lambda msg: None)

    def _row(self, name: str, loop, batch: int, prompts, rule=None, one_time: float = 0.0) -> tuple[dict, Run]:
        self.say(f"timing {name} at B={batch}")
        run, seconds, warm = run_batch(loop, prompts, self.tokens, self.device, rule, warmup=self.warmup)
        row = {"system": name, "kind": "specc", "one_time_s": one_time + warm, **measured(run, seconds, batch),
               "prompt_lengths": [len(p) for p in prompts]}
        lengths = [x for r in run.results for x in r.stats.accepted_lengths]
        if lengths:
            row["accepted_lengths"] = lengths
            row["tau"] = sum(lengths) / len(lengths)
        self.say(f"{name} at B={batch}: {row['steady_tokens_per_s']:,.1f} steady decode tok/s")
        return row, run

    def ar(self, name: str, loop, batch: int, prompts, target_ir, one_time: float = 0.0) -> tuple[dict, list]:
        """The AR loop at B rows: (row, each request's tokens)."""
        row, run = self._row(name, loop, batch, prompts, one_time=one_time)
        pred = self.cost.predict(target_ir, None, method="ar", batch_size=batch,
                                 context=context_of(prompts, self.tokens))
        row["prediction"] = {"tokens_per_s": pred.tokens_per_s, "step_s": pred.step_time,
                             "expected_tokens_per_step": 1.0, "acceptance": "AR (no drafts)", "what": "steady decode"}
        return row, [r.tokens for r in run.results]

    def speculative(self, name: str, loop, batch: int, prompts, irs, impl, k: int, *, stated=None, seed: int = 0,
                    acceptance=None, section: dict | None = None, one_time: float = 0.0) -> tuple[dict, list]:
        """The speculative loop at B rows: (row, each request's tokens). ``stated``: an acceptance
        model to replay (else the target decides); ``acceptance``: what the batching choice is
        priced with when the target decides (None: measured by a one-level pass first);
        ``section``: a batching choice to run as given (an artifact's), else the cost model
        chooses for B (``batching_section``, what `specc compile` writes for a batch-B deployment)."""
        from specc.runtime.replay import ReplayVerifier
        from specc.runtime.verifiers import ChainVerifier
        from specc.search.acceptance import AcceptanceModel
        from specc.search.batching_choice import batching_section
        from specc.search.batching_cost import BatchingPricer

        if stated is not None:  # draws by absolute position: a function of the verify's inputs, as two-level needs
            loop.verifier = ReplayVerifier(stated.alphas, seed=seed, source=stated.source,
                                           lengths=lambda: loop.state.lengths)
        else:
            loop.verifier = ChainVerifier()
        if hasattr(loop, "two_level_k1"):
            loop.two_level_k1 = None
        chose_with = stated or acceptance
        if chose_with is None:  # the target decides: one untimed one-level pass measures what to choose with
            self.say(f"measuring {name}'s acceptance at B={batch} (one level) to choose its batching")
            first = drive(loop, prompts, self.tokens)
            chose_with = AcceptanceModel.from_accepted_lengths([r.stats.accepted_lengths for r in first.results], k,
                                                               source=f"measured at B={batch} in this run")
        pricer = BatchingPricer(self.cost, irs[0], irs[1], impl, k, context_of(prompts, self.tokens))
        given = section is not None and section is not ONE_LEVEL_REFERENCE
        if section is None:
            section = batching_section(pricer, batch, chose_with, ragged=bool(getattr(loop, "verifies_ragged", False)),
                                       num_draft=k, curve=True)
        rule = apply_batching(loop, section, k)
        try:
            row, run = self._row(name, loop, batch, prompts, rule, one_time)
        finally:
            if hasattr(loop, "two_level_k1"):
                loop.two_level_k1 = None
            loop.verifier = ChainVerifier()
        acc = stated or AcceptanceModel.from_accepted_lengths([r.stats.accepted_lengths for r in run.results], k,
                                                              source=f"measured at B={batch} in this run")
        option = _option(pricer, section, batch, acc)
        row.update({"num_draft": k, "replay": stated is not None,
                    "acceptance": stated.source if stated is not None else "real (the target decides)",
                    "mechanism": section.get("chosen") or "one level",
                    "mechanism_source": ("the artifact's batching choice: " if given else "") + section["source"],
                    "two_level_k1": section.get("two_level_k1"), "draft_rule": rule is not None,
                    "reference": section is ONE_LEVEL_REFERENCE,
                    "graphs": loop.graph_stats() if hasattr(loop, "graph_stats") else None,
                    "prediction": {**option.to_json(), "acceptance": acc.source, "what": "steady decode"}})
        if rule is not None:
            ks = run.ks
            row["mean_k"] = sum(ks) / len(ks) if ks else 0.0
        if stated is not None:
            row["acceptance_model"] = stated.to_json()
            row["expected_tokens_per_step"] = stated.expected_tokens(k)
        return row, [r.tokens for r in run.results]
