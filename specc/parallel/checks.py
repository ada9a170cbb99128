"""Checks of a sharded target against the 1-rank model: token forcing (:func:`tp_forward_check`)
and speculative decoding (:func:`tp_speculative_check`)."""

from __future__ import annotations

import dataclasses
import gc
from typing import Any, Sequence

import torch

from specc.parallel.jobs import TPJob, TPResult, TPSpecJob
from specc.parallel.launch import run_tp
from specc.parallel.loading import build_model
from specc.parallel.steps import (
    DEFAULT_PASSES, DEFAULT_PROMPT, compile_step, forced_logits, greedy_tokens, time_steps, time_steps_graphed,
    trace_target, weight_summary,
)


@dataclasses.dataclass
class Reference:
    """The 1-rank run: greedy tokens, forced logits/argmax, top-2 margins, weights, step times."""

    tokens: list[int]
    logits: torch.Tensor
    weights: dict[str, int]
    step_times: dict | None = None

    @property
    def argmax(self) -> list[int]:
        return self.logits.argmax(-1).tolist()

    @property
    def margins(self) -> list[float]:
        top = self.logits.topk(2, dim=-1).values
        return (top[:, 0] - top[:, 1]).tolist()


def reference_run(source: Any, prompt: Sequence[int], num_tokens: int, *, block: int = 4, dtype: str = "float32",
                  device: str = "cpu", passes: Sequence[str] = DEFAULT_PASSES, timing: dict | None = None,
                  tokens: Sequence[int] | None = None, compiled: bool = False) -> Reference:
    """The 1-rank oracle: greedy tokens and forced logits from the model's own forward (its weights
    summary and, with ``timing``, step times from its traced IR with ``passes``, unsharded; with
    ``compiled`` from the generated step of that IR, CUDA-graphed on the GPU)."""
    dev = torch.device(device)
    model = build_model(source, dtype, dev)
    n = len(tokens) if tokens is not None else num_tokens
    job = TPJob(source, list(prompt), [0] * n, block, dtype, tuple(passes), timing=timing)
    model.setup_caches(1, job.cache_len())
    toks = list(tokens) if tokens is not None else greedy_tokens(model, prompt, num_tokens, dev)
    for layer in model.layers:
        layer.self_attn.cache_k.zero_()
        layer.self_attn.cache_v.zero_()
    logits = forced_logits(model, prompt, toks, block, dev)
    ir, _ = trace_target(model, passes)
    weights = weight_summary(ir)
    times = None
    if timing:
        fn = compile_step(ir, job.cache_len()) if compiled else ir
        timer = time_steps_graphed if compiled else time_steps
        times = timer(fn, qs=list(timing.get("qs", [1, block])), context=int(timing.get("context", 0)),
                      repeats=int(timing.get("repeats", 20)), warmup=int(timing.get("warmup", 3)), device=dev,
                      vocab=model.config.vocab_size)
        del fn
    del ir, model
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return Reference(toks, logits, weights, times)


@dataclasses.dataclass
class TPCheck:
    """Sharded vs 1-rank token forcing for one model."""

    name: str
    world_size: int
    reference: Reference
    result: TPResult
    atol: float
    rtol: float
    tie_tol: float

    @property
    def mismatches(self) -> list[tuple[int, int]]:
        """(rank, position) where a rank's argmax differs from the reference's."""
        ref = self.reference.argmax
        return [(r, i) for r, am in enumerate(self.result.argmax) for i, (a, b) in enumerate(zip(am, ref)) if a != b] + \
            [(r, -1) for r, am in enumerate(self.result.argmax) if len(am) != len(ref)]

    @property
    def ties(self) -> list[tuple[int, int]]:
        """Mismatches at positions where the reference's top-2 margin is below ``tie_tol``."""
        m = self.reference.margins
        return [(r, i) for r, i in self.mismatches if i >= 0 and m[i] < self.tie_tol]

    @property
    def max_abs_diff(self) -> float:
        return float((self.result.logits - self.reference.logits).abs().max())

    @property
    def logits_close(self) -> bool:
        return bool(torch.allclose(self.result.logits, self.reference.logits, atol=self.atol, rtol=self.rtol))

    @property
    def argmax_equal(self) -> bool:
        return not self.mismatches

    @property
    def ok(self) -> bool:
        return self.argmax_equal and self.logits_close

    def summary(self) -> str:
        w = self.result.weights
        return (f"{self.name}: world {self.world_size} ({self.result.backend}), {len(self.reference.tokens)} forced tokens, "
                f"argmax {'identical' if self.argmax_equal else f'differs at {self.mismatches} (ties {self.ties})'}, "
                f"max |logit diff| {self.max_abs_diff:.3g} ({'allclose' if self.logits_close else 'NOT allclose'} at "
                f"atol {self.atol:g} rtol {self.rtol:g}); parameter bytes per rank "
                f"{[x['parameter_bytes'] for x in w]} vs {self.reference.weights['parameter_bytes']} on 1 rank")

    def to_json(self) -> dict:
        return {"name": self.name, "world_size": self.world_size, "backend": self.result.backend,
                "tokens": self.reference.tokens, "reference_argmax": self.reference.argmax,
                "argmax": self.result.argmax, "mismatches": self.mismatches, "ties": self.ties,
                "max_abs_logit_diff": self.max_abs_diff, "logits_close": self.logits_close, "atol": self.atol,
                "rtol": self.rtol, "weights_per_rank": self.result.weights, "reference_weights": self.reference.weights,
                "pass_stats": self.result.pass_stats, "ok": self.ok}


def tp_forward_check_many(sources: Sequence[Any], world_size: int = 2, *, prompt: Sequence[int] | None = None,
                          num_tokens: int = 12, block: int = 4, dtype: str = "float32", device: str = "cpu",
                          passes: Sequence[str] = DEFAULT_PASSES, atol: float = 1e-4, rtol: float = 1e-4,
                          tie_tol: float = 1e-3, port: int | None = None,
                          tokens: Sequence[Sequence[int] | None] | None = None,
                          load: str | Sequence[str] = "sharded", compiled: bool = False) -> list[TPCheck]:
    """:func:`tp_forward_check` for several models with ONE start of the ranks (``tokens``: per
    source, tokens to force instead of the 1-rank greedy ones, or None; ``load``: one mode or
    one per source; ``compiled``: the ranks run specc's generated steps, see :class:`TPJob`)."""
    refs, jobs = [], []
    for i, src in enumerate(sources):
        p = list(prompt if prompt is not None else DEFAULT_PROMPT)
        forced = tokens[i] if tokens is not None else None
        ref = reference_run(src, p, num_tokens, block=block, dtype=dtype, device=device, passes=passes, tokens=forced)
        refs.append(ref)
        name = str(src) if not isinstance(src, dict) else f"random {src['config'].get('model_type', '')}"
        mode = load if isinstance(load, str) else load[i]
        jobs.append(TPJob(src, p, ref.tokens, block, dtype, tuple(passes), name=name, load=mode, compiled=compiled))
    results = run_tp(jobs, world_size, device=device, port=port)
    return [TPCheck(job.name, world_size, ref, res, atol, rtol, tie_tol) for job, ref, res in zip(jobs, refs, results)]


def tp_forward_check(source: Any, world_size: int = 2, **kwargs) -> TPCheck:
    """Token forcing of the ``world_size``-way sharded target against the 1-rank model.

    source: a checkpoint path (or ``{"config": ..., "seed": ...}``). kwargs: ``prompt``
    (token ids; default a fixed 7-token prompt), ``num_tokens`` (12: greedy tokens of the 1-rank
    run to force), ``tokens`` (a list per source: force these instead), ``block`` (4: verify block size), ``dtype`` ("float32"), ``device`` ("cpu":
    gloo ranks; "cuda": NCCL, one GPU per rank), ``passes`` (before sharding), ``atol``/``rtol``
    (logits allclose), ``tie_tol`` (top-2 margin under which a mismatch is a numerical tie),
    ``port``, ``load`` ("sharded": ranks materialise only their slices; "full": each rank
    builds the whole model, fuses, then shards), ``compiled`` (False: the ranks run their traced
    IR; True: specc's generated steps, with ``passes=COMPILED_PASSES``). Returns a
    :class:`TPCheck` (``.ok``, ``.mismatches``, ``.summary()``)."""
    return tp_forward_check_many([source], world_size, **kwargs)[0]


def tp_speculative_check(target: Any, drafter: Any, world_size: int = 2, *, prompt: Sequence[int] | None = None,
                         max_new_tokens: int = 16, method: str = "ar-draft", num_draft: int = 3, dtype: str = "float32",
                         device: str = "cpu", port: int | None = None) -> dict:
    """Speculative decoding with the target sharded over ``world_size`` ranks (drafter
    replicated, generated steps, the device loop) against plain greedy decoding of the 1-rank
    model: returns ``{"reference": tokens, "ranks": [tokens per rank], "equal": bool, "tau":
    [...], "result": TPSpecResult}``; ``equal`` is True when every rank produced exactly the
    reference tokens."""
    p = list(prompt if prompt is not None else DEFAULT_PROMPT)
    model = build_model(target, dtype, torch.device(device if torch.device(device).type == "cpu" else "cuda:0"))
    model.setup_caches(1, len(p) + max_new_tokens + 1)
    reference = greedy_tokens(model, p, max_new_tokens, next(model.parameters()).device)
    del model
    gc.collect()
    job = TPSpecJob(target, drafter, p, max_new_tokens, method, num_draft, dtype)
    res = run_tp([job], world_size, device=device, port=port)[0]
    return {"reference": reference, "ranks": res.tokens, "equal": all(t == reference for t in res.tokens),
            "tau": res.tau, "result": res}
