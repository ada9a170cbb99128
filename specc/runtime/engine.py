"""The engine that runs a compiled artifact: ``specc.load(path) -> Engine``.

It imports the generated step modules, binds their weights, allocates static caches and runs
the device-resident speculative loop (``specc.runtime.device_loop``: drafts, verification input
and acceptance, greedy or sampling, stay on the device, one small host copy per step) with the compiled steps
in place of the model definitions (same signatures as the definitions, so the loop is checked
against the eager reference loop and stock on the same inputs).
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Iterator

import torch
from safetensors.torch import load_file

from specc.codegen.artifact import ArtifactError
from specc.models.dflash import DFlashSpec
from specc.result import GenerationResult, as_prompt_list
from specc.runtime.compiled import import_step_class
from specc.runtime.drafters import drafter_from_manifest
from specc.runtime.device_loop import DeviceSpeculativeDecoder
from specc.runtime.step_graphs import step_graphs_enabled
from specc.switches import batch_draft_ahead_enabled
from specc.sampling.params import SamplingParams


class Engine:
    def __init__(self, path: Path, manifest: dict, steps: dict, device: torch.device, max_len: int):
        self.path, self.manifest, self.device = path, manifest, device
        self.method = manifest["method"]
        self.num_draft = int(manifest.get("num_draft") or 0)
        section = manifest.get("drafter") or {}
        # the drafting strategy the method recorded (artifacts before it: named like the method)
        strategy = section.get("strategy") or self.method
        self.tree_budget = _tree_budget(path, manifest)
        self.loop = build_loop(steps, strategy, self.num_draft, max_len, drafter_section=section,
                               tree_budget=self.tree_budget)
        self.steps = self.loop.steps  # GraphedStep-wrapped on CUDA
        self.loop.vocab_size = _vocab_size(manifest)  # prompts with ids past it are refused before any step
        self.batching = _batching(path, manifest, self.num_draft)  # the compiler's choice (docs/cost-model.md)
        if hasattr(self.loop, "two_level_k1"):
            self.loop.two_level_k1 = self.batching.get("two_level_k1")
        self.eos_token_ids = tuple(manifest["model"].get("eos_token_ids", ()))
        self.last_stats: dict = {}
        self.load_stats: dict = {}  # seconds per one-time phase (specc.runtime.warmup)
        self.tokenizer = None

    def _eos(self, eos_token_id):
        if eos_token_id is None:
            return self.eos_token_ids
        return (eos_token_id,) if isinstance(eos_token_id, int) else tuple(eos_token_id)

    def generate(self, input_ids, max_new_tokens: int = 64, eos_token_id=None, profile: bool | str = False,
                 sampling: SamplingParams | None = None, *, temperature: float | None = None,
                 top_k: int | None = None, top_p: float | None = None, min_p: float | None = None,
                 repetition_penalty: float | None = None, seed: int | None = None) -> GenerationResult:
        """Generation: greedy by default, speculative sampling with ``temperature`` > 0 (and
        ``top_k`` / ``top_p`` / ``min_p`` / ``repetition_penalty`` / ``seed``, or a whole
        ``sampling=SamplingParams(...)`` that the keywords override); equal in distribution to
        sampling the target alone (docs/sampling.md). ``eos_token_id``: an id, ids, or None for
        the model's own EOS; () for none. ``profile``: also time the loop's parts (prefill / draft
        / verify / accept) into ``last_stats["part_seconds"]``: True synchronises at each boundary
        (wall time per part); "events" records CUDA events instead (device time per part, nothing
        synchronised, plus ``between``: the host's time between steps; ``EventTimer``)."""
        params = SamplingParams.coerce(sampling, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                       repetition_penalty=repetition_penalty, seed=seed)
        self.loop.profile = profile
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        first_at = None
        gen = self.loop.stream(input_ids, max_new_tokens, self._eos(eos_token_id), params)
        while True:
            try:
                next(gen)
            except StopIteration as stop:
                result = stop.value
                break
            if first_at is None:  # the prefill's token reached the host (a device sync)
                first_at = time.perf_counter()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        end = time.perf_counter()
        self.last_stats = timing_stats(start, first_at, end, result)
        if profile:
            self.last_stats["part_seconds"] = dict(self.loop.part_seconds)
        return result

    def generate_batch(self, prompts, max_new_tokens=64, eos_token_id=None, batch_size: int | None = None,
                       sampling: SamplingParams | None = None, seeds=None, buckets: bool = True,
                       **sampling_fields) -> list[GenerationResult]:
        """Generation for several prompts of any lengths, decoded ``batch_size`` at a time
        (default: all together) with continuous batching; one result per prompt, in order, each
        equal to that prompt run alone (greedy; sampling: the same params and seed give the same
        tokens).
        ``max_new_tokens``: one budget or one per prompt; ``eos_token_id`` as in ``generate``;
        sampling as in ``generate`` (one ``SamplingParams`` for every prompt), or a list of one
        ``SamplingParams`` (or None: greedy) per prompt, greedy and sampled mixed in one batch
        (keywords override each); one seed per prompt in ``seeds`` (default: the params' seed).
        ``buckets``: steps over the smallest bucket of slots that holds the running requests
        (docs/batching.md, "Batch buckets"; False: every step over all ``batch_size`` slots).
        ``last_stats``: seconds and tokens/s of the batch."""
        if isinstance(prompts, (str, bytes)):
            raise TypeError("generate_batch takes a list of prompts, each token ids (tokenize text first)")
        prompts = [as_prompt_list(p) for p in prompts]
        if isinstance(sampling, (list, tuple)):
            if len(sampling) != len(prompts):
                raise ValueError(f"sampling: {len(sampling)} params given for {len(prompts)} prompts")
            params = [SamplingParams.coerce(s, **sampling_fields) for s in sampling]
        else:
            params = SamplingParams.coerce(sampling, **sampling_fields)
        budgets = list(max_new_tokens) if isinstance(max_new_tokens, (list, tuple)) else [max_new_tokens] * len(prompts)
        if len(budgets) != len(prompts):
            raise ValueError(f"{len(budgets)} max_new_tokens for {len(prompts)} prompts")
        if not prompts:
            return []
        self.set_max_len(max(len(p) + int(m) for p, m in zip(prompts, budgets)) + 1)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        results = self.loop.generate_batch(prompts, budgets, self._eos(eos_token_id), params, seeds,
                                           batch_size=batch_size, buckets=buckets)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        tokens = sum(len(r.tokens) for r in results)
        self.last_stats = {"seconds": elapsed, "tokens": tokens, "tokens_per_s": tokens / elapsed if elapsed > 0 else 0.0,
                           "prompts": len(prompts), "batch_size": self.loop.capacity}
        return results

    def scheduler(self, capacity: int, max_len: int | None = None, draft_length=None,
                  sampling: SamplingParams | None = None, buckets: bool = True):
        """A continuous-batching scheduler over this engine's loop (``specc.runtime.batching``:
        ``submit`` / ``step`` / ``cancel`` / ``take``) with ``capacity`` slots of up to
        ``max_len`` tokens each (prompt + new tokens; default: the engine's). Requests without
        their own EOS ids stop at the model's. ``draft_length``: a rule choosing each step's
        drafts (``specc.runtime.adaptive.GoodputDraftLength``; None: the artifact's k, or, when
        the artifact's batching choice is per-request k, the goodput rule over its recorded step
        curve). ``buckets``: as in ``generate_batch``. One scheduler drives the engine at a time:
        making one (or calling ``generate``) starts the loop over."""
        from specc.runtime.batching import BatchScheduler

        if max_len is not None:
            self.set_max_len(max_len)
        if draft_length is None:
            draft_length = self.default_draft_length()
        return BatchScheduler(self.loop, capacity, self.eos_token_ids, draft_length, sampling=sampling, buckets=buckets)

    def default_draft_length(self):
        """The goodput rule the artifact's batching choice asks for, over the step curve the
        compiler recorded (per-request k: one k per row; goodput k: one k per step), else None
        (the artifact's k every step)."""
        from specc.runtime.step_curve import draft_length_rule

        return draft_length_rule(self.batching, self.num_draft)

    def stream(self, input_ids, max_new_tokens: int = 64, eos_token_id=None, sampling: SamplingParams | None = None,
               **sampling_fields) -> Iterator[int]:
        """Yield tokens as they are committed (one verification step at a time); the generator
        returns the ``GenerationResult`` (``StopIteration.value``), as ``generate`` does. Sampling
        as in ``generate`` (``temperature=``, ``top_p=``, ... or ``sampling=``)."""
        params = SamplingParams.coerce(sampling, **sampling_fields)
        return (yield from self.loop.stream(input_ids, max_new_tokens, self._eos(eos_token_id), params))

    def forced_argmax(self, prompt, tokens):
        return self.loop.forced_argmax(prompt, tokens)

    def graph_stats(self) -> dict:
        """Per step role, and per graphed function of the loop around the verify forward
        (``chain_accept``, ``tree_*``): CUDA graphs captured, replays, eager calls (empty on CPU)."""
        return self.loop.graph_stats()

    def set_max_len(self, max_len: int) -> None:
        """Grow the decoding state to ``max_len`` tokens a request (never shrinks it); a length
        whose caches would not fit the device's free memory is refused (ValueError) first."""
        if max_len > self.loop.max_len:
            check_max_len(self.manifest, max_len, self.device)
            self.loop.resize(max_len)


# the warm-up generates at least a one-token prompt and two new tokens, plus the verify's slack
MIN_MAX_LEN = 4


def manifest_kv_bytes_per_token(manifest: dict) -> int:
    """Bytes of KV cache one token of ``max_len`` costs a batch row: every distinct ``kv`` state
    buffer the steps declare (the target's steps share theirs), head x dim x dtype size."""
    seen = {}
    for info in (manifest.get("steps") or {}).values():
        for name, spec in (info.get("caches") or {}).items():
            if isinstance(spec, dict) and spec.get("kind", "kv") == "kv":
                size = getattr(torch, str(spec.get("dtype", "float32"))).itemsize
                elements = 1
                for d in spec.get("shape") or (spec.get("heads", 0), spec.get("head_dim", 0)):
                    elements *= int(d)
                seen[name] = elements * size
    return sum(seen.values())


def check_max_len(manifest: dict, max_len, device: torch.device) -> None:
    """ValueError for a ``max_len`` that is not an integer >= MIN_MAX_LEN, or whose KV caches
    would take more than 90% of the memory the device has free (``loading.check_fits``, a
    CheckpointError, which is a ValueError; before anything is allocated)."""
    from specc.models.loading import check_fits

    if not isinstance(max_len, int) or isinstance(max_len, bool) or max_len < MIN_MAX_LEN:
        raise ValueError(f"max_len must be an integer >= {MIN_MAX_LEN} (prompt + new tokens a request holds), "
                         f"got {max_len!r}")
    check_fits(manifest_kv_bytes_per_token(manifest) * max_len, f"max_len {max_len}'s KV cache", device)


def timing_stats(start: float, first_at: float | None, end: float, result: GenerationResult) -> dict:
    """Wall-clock figures of one generation: total, time to first token (prefill), and steady
    decode: the tokens after the first over the time after the first token (``decode_steps``
    verification steps, ``decode_step_s`` each on average, ``tokens_per_step`` committed each)."""
    n, elapsed = len(result.tokens), end - start
    ttft = (first_at - start) if first_at is not None else elapsed
    decode_s = end - first_at if first_at is not None else 0.0
    steps = result.stats.steps  # verification steps, all after the prefill's token
    decode_tokens = max(0, n - 1)
    return {"seconds": elapsed, "tokens": n, "tokens_per_s": n / elapsed if elapsed > 0 else 0.0,
            "time_to_first_token_s": ttft, "decode_seconds": decode_s, "decode_tokens": decode_tokens,
            "decode_tokens_per_s": decode_tokens / decode_s if decode_s > 0 and decode_tokens else 0.0,
            "decode_steps": steps, "decode_step_s": decode_s / steps if steps else 0.0,
            "tokens_per_step": decode_tokens / steps if steps else 0.0,
            "tau": result.stats.tau, "steps": result.stats.steps}


def _vocab_size(manifest: dict) -> int | None:
    size = (manifest.get("model") or {}).get("vocab_size")
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def _tree_budget(path, manifest: dict) -> int:
    """The manifest's tree budget (0: chains); a malformed ``tree`` section is an ArtifactError."""
    tree = manifest.get("tree") or {}
    budget = tree.get("budget", 0) if isinstance(tree, dict) else None
    if not isinstance(budget, int) or isinstance(budget, bool) or not 0 <= budget <= 4096:
        raise ArtifactError(f"{path}: manifest 'tree' must be {{'budget': 0..4096, ...}}, got {tree!r:.80}")
    return budget


def _batching(path, manifest: dict, num_draft: int) -> dict:
    """The manifest's batching choice ({} when absent); a malformed one is an ArtifactError."""
    section = manifest.get("batching") or {}
    k1 = section.get("two_level_k1") if isinstance(section, dict) else None
    ok = isinstance(section, dict) and isinstance(section.get("per_request_k", False), bool) and isinstance(
        section.get("goodput_k", False), bool) and (
        k1 is None or (isinstance(k1, int) and not isinstance(k1, bool) and 1 <= k1 < max(num_draft, 1)))
    prior = section.get("prior_alpha") if isinstance(section, dict) else None
    ok = ok and (prior is None or (isinstance(prior, (int, float)) and not isinstance(prior, bool) and 0 <= prior <= 1))
    if ok and section.get("curve") is not None:
        from specc.runtime.step_curve import StepCurve

        try:
            StepCurve.from_section(section["curve"])
        except ValueError:
            ok = False
    if not ok:
        raise ArtifactError(f"{path}: manifest 'batching' must be {{'two_level_k1': None or 1..k-1, "
                            f"'per_request_k': bool, 'goodput_k': bool, 'prior_alpha': 0..1, ...}}, got {section!r:.80}")
    return section


def build_loop(steps: dict, strategy: str | None, num_draft: int, max_len: int, pard_token: int | None = None,
               graphs: bool | None = None, drafter_section: dict | None = None,
               tree_budget: int = 0) -> DeviceSpeculativeDecoder:
    """The device-resident loop over step callables {"target": ..., "drafter": ...}.

    The drafter is the drafting strategy registered under ``strategy`` in
    ``specc.runtime.drafters.DRAFTERS`` (None or an unregistered name such as "ar": plain AR),
    built from ``drafter_section`` (the manifest's ``drafter`` section; ``pard_token`` is the
    older way to give its one field).

    On CUDA (or ``graphs=True``) every step is wrapped in ``GraphedStep`` sharing one memory
    pool (the ragged step in ``GraphedRaggedStep``: a graph per token-count bucket, captured when
    a bucket first occurs), drafting is uncapped at the end of the budget (one verify shape; the
    surplus is clipped) and all drafter input shapes are captured before the first step, so no
    dense step's graph is captured while tokens are being timed.

    ``tree_budget`` N > 0 (an artifact with a ``target_tree`` step): tree verification of N
    drafted nodes per step through that step (sharing the target's decoding state)."""
    target = steps["target"]
    if graphs is None:
        graphs = target.device.type == "cuda"
    if graphs:
        from specc.runtime.graphs import GraphedStep, new_pool

        pool = new_pool()  # shared by the loop's graphed steps; lives as long as they do
        rows = {"target": num_draft + 1, "target_tree": tree_budget + 1}
        from specc.runtime.ragged_graphs import GraphedRaggedStep

        # the ragged step's token count changes from step to step: graphed per token-count bucket
        steps = {role: GraphedRaggedStep(step, pool=pool) if role == "target_ragged" else
                 GraphedStep(step, rows.get(role, 2 * num_draft + 2), pool=pool) for role, step in steps.items()}
    section = dict(drafter_section or {})
    if pard_token is not None:
        section["pard_token"] = pard_token
    drafter = drafter_from_manifest(strategy, steps.get("drafter"), section) if strategy else None
    tree_step = steps.get("target_tree")
    loop = DeviceSpeculativeDecoder(steps["target"], drafter, num_draft if drafter else 0, max_len,
                                    cap_to_budget=not graphs, tree_budget=tree_budget if tree_step is not None else 0,
                                    tree_target=tree_step, ragged_target=steps.get("target_ragged"))
    loop.capture_shapes = graphs
    # batch 1: launch the next draft before the host's bookkeeping (``draft_ahead``): exact on the CPU,
    # timed on the H200 (bench_tree --e2e-8b): 0.98x in run 8, -3.2% decode step in run 15; opt-in
    loop.draft_ahead = False
    # batch 1: each greedy chain step as one CUDA graph, launched ahead (``specc.runtime.step_graphs``):
    # exact on the CPU (a capture stand-in) and on the GPU, 4% faster steps on the H200
    # (docs/benchmarks/h200-run15.md); on unless SPECC_STEP_GRAPHS=0
    loop.step_graphs = graphs and step_graphs_enabled()
    # batch > 1: launch the next step's draft between the decision and the host read (DFlash, PARD:
    # their full-window drafts); exact on the CPU (tests/runtime/test_device_loop_batch_draft_ahead.py);
    # H100, B = 16: 4.4% shorter speculative steps (docs/benchmarks/run28.md); on unless SPECC_BATCH_DRAFT_AHEAD=0
    loop.batch_draft_ahead = graphs and batch_draft_ahead_enabled()
    loop.steps = steps
    return loop


def load(path, device: str | torch.device | None = None, max_len: int = 2048, check: bool = True,
         threads: int | None = None, expect_hash: str | None = None, warmup: bool = True,
         progress=None) -> Engine:
    """Load a compiled artifact: this runs its code (docs/artifact.md). Refuses (ArtifactError) a
    tampered, incomplete or escaping one; ``expect_hash`` pins the sha256 of its manifest.json.

    ``warmup``: do the one-time work now (``specc.runtime.warmup``: kernel compilation into a
    cache keyed by the artifact, CUDA-graph capture of every step shape); ``progress(msg,
    seconds)`` hears about each phase. ``engine.load_stats`` has seconds per phase.

    On CPU, torch's intra-op threads are set to ``threads``, else specc's default
    (:mod:`specc.threads`: ``SPECC_THREADS``, else min(physical cores, 4, idle cores));
    ``threads=0`` leaves torch's setting alone."""
    from specc.codegen.artifact_trust import read_manifest_pinned, verify_artifact
    from specc.runtime import warmup as _warm

    t_start = time.perf_counter()
    path = Path(path)
    manifest, _ = read_manifest_pinned(path, expect_hash)
    sources = verify_artifact(path, manifest, check)
    t_verified = time.perf_counter()
    dev = torch.device(device or manifest["deployment"].get("device", "cpu"))
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ArtifactError(f"{path}: compiled for CUDA but no GPU is available (pass device='cpu')")
    if threads != 0 and dev.type == "cpu":
        from specc.threads import configure_threads

        configure_threads(threads)
    cache_dir = _warm.kernel_cache_dir(path) if dev.type == "cuda" else None
    if dev.type == "cuda":  # the driver's context: its own phase, so a slow one is not blamed on specc
        torch.zeros(1, device=dev)
        torch.cuda.synchronize(dev)
    t_device = time.perf_counter()
    try:
        tensors = load_file(str(path / "weights.safetensors"), device=str(dev))
    except Exception as exc:
        raise ArtifactError(f"{path}: weights unreadable ({type(exc).__name__})") from exc
    t_weights = time.perf_counter()
    unique = uuid.uuid4().hex[:8]
    steps = {}
    for role, info in manifest["steps"].items():
        cls = import_step_class(path / info["module"], info["class"], unique, sources[info["module"]])
        step = cls()
        try:
            weights = {name: tensors[key] for name, key in info["weights"].items()}
        except KeyError as exc:
            raise ArtifactError(f"{path}: weights.safetensors lacks {exc.args[0]}") from None
        spec = None
        d = (manifest.get("drafter") or {}).get("dflash") if role == "drafter" else None
        if d:
            spec = DFlashSpec(d["block_size"], d["mask_token_id"], tuple(d["target_layer_ids"]), d.get("num_target_layers"))
        step.bind(weights, info["caches"], spec)
        steps[role] = step
    check_max_len(manifest, max_len, dev)
    try:
        engine = Engine(path, manifest, steps, dev, max_len)
    except (ValueError, KeyError) as exc:  # e.g. a drafting strategy missing a field it needs
        raise ArtifactError(f"{path}: {' '.join(str(exc).split())}") from None
    t_bound = time.perf_counter()
    if any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        from specc.models.loading import load_tokenizer

        engine.tokenizer = load_tokenizer(path)
    t_read = time.perf_counter()
    # "read" is the sum of the phases before it (kept for callers that want one number)
    engine.load_stats = {"verify": t_verified - t_start, "device_init": t_device - t_verified,
                         "weights": t_weights - t_device, "modules": t_bound - t_weights,
                         "tokenizer": t_read - t_bound, "read": t_read - t_start, "kernel_cache": cache_dir}
    if progress:
        progress("artifact read, weights bound", engine.load_stats["read"])
    if warmup:
        try:
            engine.load_stats.update(_warm.warm_up(engine.loop, int(manifest["model"]["vocab_size"]),
                                                   progress=progress, cache_dir=cache_dir))
        except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:  # its code does not fit
            raise ArtifactError(f"{path}: the artifact failed while warming up ({type(exc).__name__}: "
                                f"{' '.join(str(exc).split())[:300]}); is it intact and from this specc version?"
                                ) from exc
    engine.load_stats["total"] = time.perf_counter() - t_start
    return engine
