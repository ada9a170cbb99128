"""The engine that runs a compiled artifact: ``specc.load(path) -> Engine``.

It imports the generated step modules, binds their weights, allocates static caches and runs
the device-resident speculative loop (``specc.runtime.device_loop``: drafts, verification input
and greedy acceptance stay on the device, one small host copy per step) with the compiled steps
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

from specc.codegen.artifact import ArtifactError, check_files, read_manifest
from specc.models.dflash import DFlashSpec
from specc.result import GenerationResult
from specc.runtime.compiled import import_step_class
from specc.runtime.drafters import drafter_from_manifest
from specc.runtime.device_loop import DeviceSpeculativeDecoder


class Engine:
    def __init__(self, path: Path, manifest: dict, steps: dict, device: torch.device, max_len: int):
        self.path, self.manifest, self.device = path, manifest, device
        self.method = manifest["method"]
        self.num_draft = int(manifest.get("num_draft") or 0)
        section = manifest.get("drafter") or {}
        # the drafting strategy the method recorded (artifacts before it: named like the method)
        strategy = section.get("strategy") or self.method
        self.tree_budget = int((manifest.get("tree") or {}).get("budget") or 0)
        self.loop = build_loop(steps, strategy, self.num_draft, max_len, drafter_section=section,
                               tree_budget=self.tree_budget)
        self.steps = self.loop.steps  # GraphedStep-wrapped on CUDA
        self.eos_token_ids = tuple(manifest["model"].get("eos_token_ids", ()))
        self.last_stats: dict = {}
        self.tokenizer = None

    def _eos(self, eos_token_id):
        if eos_token_id is None:
            return self.eos_token_ids
        return (eos_token_id,) if isinstance(eos_token_id, int) else tuple(eos_token_id)

    def generate(self, input_ids, max_new_tokens: int = 64, eos_token_id=None, profile: bool = False) -> GenerationResult:
        """Greedy generation. ``eos_token_id``: an id, ids, or None for the model's own EOS; () for none.
        ``profile``: also time the loop's parts (prefill / draft / verify / accept) into
        ``last_stats["part_seconds"]`` (synchronises at each boundary)."""
        self.loop.profile = profile
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = self.loop.generate(input_ids, max_new_tokens, self._eos(eos_token_id))
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        self.last_stats = {"seconds": elapsed, "tokens": len(result.tokens),
                           "tokens_per_s": len(result.tokens) / elapsed if elapsed > 0 else 0.0,
                           "tau": result.stats.tau, "steps": result.stats.steps}
        if profile:
            self.last_stats["part_seconds"] = dict(self.loop.part_seconds)
        return result

    def stream(self, input_ids, max_new_tokens: int = 64, eos_token_id=None) -> Iterator[int]:
        """Yield tokens as they are committed (one verification step at a time)."""
        yield from self.loop.stream(input_ids, max_new_tokens, self._eos(eos_token_id))

    def forced_argmax(self, prompt, tokens):
        return self.loop.forced_argmax(prompt, tokens)

    def graph_stats(self) -> dict:
        """Per step role: CUDA graphs captured, replays, eager calls (empty on CPU)."""
        return {role: step.stats() for role, step in self.steps.items() if hasattr(step, "stats")}

    def set_max_len(self, max_len: int) -> None:
        if max_len > self.loop.max_len:
            self.loop.resize(max_len)


def build_loop(steps: dict, strategy: str | None, num_draft: int, max_len: int, pard_token: int | None = None,
               graphs: bool | None = None, drafter_section: dict | None = None,
               tree_budget: int = 0) -> DeviceSpeculativeDecoder:
    """The device-resident loop over step callables {"target": ..., "drafter": ...}.

    The drafter is the drafting strategy registered under ``strategy`` in
    ``specc.runtime.drafters.DRAFTERS`` (None or an unregistered name such as "ar": plain AR),
    built from ``drafter_section`` (the manifest's ``drafter`` section; ``pard_token`` is the
    older way to give its one field).

    On CUDA (or ``graphs=True``) every step is wrapped in ``GraphedStep`` sharing one memory
    pool, drafting is uncapped at the end of the budget (one verify shape; the surplus is
    clipped) and all drafter input shapes are captured before the first step, so no graph is
    captured while tokens are being timed.

    ``tree_budget`` N > 0 (an artifact with a ``target_tree`` step): tree verification of N
    drafted nodes per step through that step (sharing the target's decoding state)."""
    target = steps["target"]
    if graphs is None:
        graphs = target.device.type == "cuda"
    if graphs:
        from specc.runtime.graphs import GraphedStep

        pool = torch.cuda.graph_pool_handle()
        rows = {"target": num_draft + 1, "target_tree": tree_budget + 1}
        steps = {role: GraphedStep(step, rows.get(role, 2 * num_draft + 2), pool=pool)
                 for role, step in steps.items()}
    section = dict(drafter_section or {})
    if pard_token is not None:
        section["pard_token"] = pard_token
    drafter = drafter_from_manifest(strategy, steps.get("drafter"), section) if strategy else None
    tree_step = steps.get("target_tree")
    loop = DeviceSpeculativeDecoder(steps["target"], drafter, num_draft if drafter else 0, max_len,
                                    cap_to_budget=not graphs, tree_budget=tree_budget if tree_step is not None else 0,
                                    tree_target=tree_step)
    loop.capture_shapes = graphs
    loop.steps = steps
    return loop


def load(path, device: str | torch.device | None = None, max_len: int = 2048, check: bool = True) -> Engine:
    """Load a compiled artifact. Refuses (ArtifactError) a tampered or incomplete one."""
    path = Path(path)
    manifest = read_manifest(path)
    if check:
        check_files(path, manifest)
    dev = torch.device(device or manifest["deployment"].get("device", "cpu"))
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ArtifactError(f"{path}: compiled for CUDA but no GPU is available (pass device='cpu')")
    try:
        tensors = load_file(str(path / "weights.safetensors"), device=str(dev))
    except Exception as exc:
        raise ArtifactError(f"{path}: weights unreadable ({type(exc).__name__})") from exc
    unique = uuid.uuid4().hex[:8]
    steps = {}
    for role, info in manifest["steps"].items():
        cls = import_step_class(path / info["module"], info["class"], unique)
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
    engine = Engine(path, manifest, steps, dev, max_len)
    if any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        from specc.models.loading import load_tokenizer

        engine.tokenizer = load_tokenizer(path)
    return engine
