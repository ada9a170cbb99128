"""The search memory: validated mechanisms per model family x deployment, as JSON files.

One file per (family, deployment), ``<dir>/<family>__<deployment>.json``; the directory is
``$SPECC_MEMORY_DIR`` or ``~/.cache/specc/memory`` (``specc search --memory FILE`` names the
file itself; its directory then holds the other deployments' files). Format::

    {"format": "specc-memory/1", "family": "qwen3", "deployment": "h200-bs1",
     "entries": [{"mechanism": "num_draft 15 -> 7", "parameters": {"passes": {...}, "num_draft": 7, "options": {...}},
                  "predicted_gain": 1.12, "measured_gain": null, "validated": true,
                  "date": "2026-12-03T10:00:00+00:00", "specc_version": "0.1.0",
                  "model": "...", "drafter": "...", "method": "dflash", "deployment": "h200-bs1",
                  "prediction": {"tokens_per_s": ..., "speedup": ...}, "notes": ""}],
     "acceptance": {"<model>|<drafter>|<method>|k=<k>": {"alphas": [...], "source": "...", "date": "...",
                                                         "weights": "<weights_fingerprint of both>"}}}

``parameters`` always holds the *complete* configuration (passes per role, num_draft, pass
options), so an entry can be re-applied as is; ``mechanism`` says what it changed relative to
the configuration it improved on, and the gains are relative to that configuration (tokens/s
ratio). ``validated`` means it passed token forcing against stock. Later search rounds and
searches on other deployments try validated entries first; ``choose_pipeline`` picks among them
by predicted tokens/s.

Acceptance belongs to the weights, not to the names: a drafter retrained in the same directory,
or a zoo model updated by a new specc, accepts differently. A record therefore carries
:func:`weights_fingerprint` of the target and drafter it was measured on, and a lookup that
knows the weights (`specc compile`, `specc cost` given a checkpoint) takes only a record with the
same fingerprint; records without one (older memories) do not match it, so a compile measures
afresh once. A lookup from a bare config.json (no weights to fingerprint) takes any record.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import re
from pathlib import Path
from typing import Any, Iterable

from specc.errors import UserError

FORMAT = "specc-memory/1"


def memory_dir() -> Path:
    env = os.environ.get("SPECC_MEMORY_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specc" / "memory"


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "x"


def family_of(raw_config: dict[str, Any]) -> str:
    """A model family key from a target's config.json (``qwen3``, ``llama``...)."""
    return _safe(str(raw_config.get("model_type") or "unknown").lower())


def memory_path(family: str, deployment: str, directory: Path | None = None) -> Path:
    return (directory or memory_dir()) / f"{_safe(family)}__{_safe(deployment)}.json"


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_EDGE = 1 << 20  # bytes hashed at each end of a weight file


def weights_fingerprint(*directories) -> str | None:
    """A cheap fingerprint of the weights in checkpoint ``directories`` (None entries skipped):
    sha256 over each one's config.json and, per weight file (safetensors, .bin, .pt; bf12's
    index), its name, size and first and last MiB. Retrained or re-packed weights differ there;
    hashing whole files would read gigabytes on every compile. None when no directory holds a
    weight file (a bare config.json: nothing to tell weights apart by)."""
    import hashlib

    digest, seen = hashlib.sha256(), False
    for d in directories:
        if d is None:
            continue
        d = Path(d)
        if not d.is_dir():
            continue
        files = sorted(f for f in d.iterdir() if f.is_file() and (
            f.suffix in WEIGHT_SUFFIXES or f.name in ("config.json", "bf12.json") or f.name.endswith(".index.json")))
        for f in files:
            size = f.stat().st_size
            digest.update(f"{d.name}/{f.name}:{size}".encode())
            with open(f, "rb") as fh:
                digest.update(fh.read(_EDGE))
                if size > 2 * _EDGE:
                    fh.seek(size - _EDGE)
                    digest.update(fh.read(_EDGE))
            seen = seen or f.suffix in WEIGHT_SUFFIXES
    return digest.hexdigest()[:16] if seen else None


def pair_weights(pair) -> str | None:
    """``memory.weights_fingerprint`` of a pair's target and drafter checkpoints (None for pairs
    without directories, e.g. traced from configs alone)."""
    drafter = getattr(pair, "drafter", None)
    return weights_fingerprint(getattr(getattr(pair, "target", None), "path", None),
                               getattr(drafter, "path", None) if drafter is not None else None)


@dataclasses.dataclass
class MemoryEntry:
    mechanism: str
    parameters: dict[str, Any]
    predicted_gain: float | None = None
    measured_gain: float | None = None
    validated: bool = False
    date: str = ""
    specc_version: str = ""
    model: str = ""
    drafter: str = ""
    method: str = ""
    deployment: str = ""
    prediction: dict[str, Any] = dataclasses.field(default_factory=dict)
    notes: str = ""
    #: sha256 of the source of every pass named by reference (``+path.py:Class`` / ``+module:Class``)
    pass_sources: dict[str, Any] = dataclasses.field(default_factory=dict)
    sandbox: dict[str, Any] = dataclasses.field(default_factory=dict)  # how a sandboxed check was confined

    def __post_init__(self):
        if not self.date:
            self.date = now()
        if not self.specc_version:
            from specc import __version__

            self.specc_version = __version__

    def key(self) -> str:
        return json.dumps(self.parameters, sort_keys=True)

    def untrusted_reason(self) -> str | None:
        """Why this entry's pass code cannot be trusted now (None: it can): every pass named by
        reference must have its source hash pinned, and the source must still have that hash."""
        passes = self.parameters.get("passes") or {}
        pipelines = [passes] if isinstance(passes, str) else list(passes.values()) if isinstance(passes, dict) else []
        now_hashes = pass_sources(p for p in pipelines if isinstance(p, str))
        for ref, digest in now_hashes.items():
            pinned = self.pass_sources.get(ref)
            if pinned is None:
                return f"pass {ref} has no pinned source hash"
            if digest is None:
                return f"pass {ref}: its source is gone"
            if digest != pinned:
                return f"pass {ref} changed since it was validated (sha256 {digest[:12]} != pinned {str(pinned)[:12]})"
        return None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str = "") -> "MemoryEntry":
        if not isinstance(data, dict) or "mechanism" not in data or not isinstance(data.get("parameters"), dict):
            raise UserError(f"{where}: a memory entry needs 'mechanism' and a 'parameters' object")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in fields}
        for k, v in kwargs.items():
            if k in ("predicted_gain", "measured_gain"):
                ok = v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))
            elif k == "validated":
                ok = isinstance(v, bool)
            elif k in ("parameters", "prediction", "pass_sources", "sandbox"):
                ok = isinstance(v, dict)
            else:
                ok = isinstance(v, str)
            if not ok:
                raise UserError(f"{where}: memory entry field {k} has the wrong type ({v!r})")
        return cls(**kwargs)


def pass_sources(pipelines: Iterable[str]) -> dict[str, str | None]:
    """``{ref: sha256 of its source file}`` of every pass named by reference (``+path.py:Class``,
    ``+module:Class``) in ``pipelines``; None where the source cannot be found. Never imports."""
    import hashlib
    import importlib.util

    out: dict[str, str | None] = {}
    for pipeline in pipelines:
        for item in (x.strip() for x in (pipeline or "").split(",")):
            if not item.startswith("+") or item[1:] in out:
                continue
            ref = item[1:]
            module = ref.rpartition(":")[0] or ref
            path: Path | None = None
            if module.endswith(".py") or "/" in module or os.sep in module:
                path = Path(module).expanduser()
            elif "." not in module:  # a top-level module: find it without importing it
                try:
                    spec = importlib.util.find_spec(module)
                except (ImportError, ValueError):
                    spec = None
                path = Path(spec.origin) if spec is not None and spec.origin and spec.has_location else None
            else:  # finding a dotted module would import its packages: hash the file it would be
                parts = module.split(".")
                try:
                    spec = importlib.util.find_spec(parts[0])
                except (ImportError, ValueError):
                    spec = None
                if spec is not None and spec.submodule_search_locations:
                    base = Path(list(spec.submodule_search_locations)[0]).joinpath(*parts[1:])
                    path = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
            try:
                out[ref] = hashlib.sha256(path.read_bytes()).hexdigest() if path is not None and path.is_file() else None
            except OSError:
                out[ref] = None
    return out


class Memory:
    """One memory file (family x deployment), plus read-only access to its siblings."""

    def __init__(self, path: Path, family: str, deployment: str, entries: list[MemoryEntry] | None = None,
                 acceptance: dict[str, Any] | None = None):
        self.path, self.family, self.deployment = Path(path), family, deployment
        self.entries: list[MemoryEntry] = list(entries or [])
        self.acceptance: dict[str, Any] = dict(acceptance or {})

    # ------------------------------------------------------------------ files

    @classmethod
    def open(cls, family: str, deployment: str, path: str | os.PathLike | None = None) -> "Memory":
        """Load (or start) the memory of ``family`` on ``deployment``. ``path``: a .json file to use
        instead of the default location, or a directory to put the default file name in."""
        if path is None:
            p = memory_path(family, deployment)
        else:
            p = Path(path).expanduser()
            if p.suffix != ".json":
                p = memory_path(family, deployment, p)
        return cls.load(p, family, deployment)

    @classmethod
    def load(cls, path: Path, family: str | None = None, deployment: str | None = None) -> "Memory":
        path = Path(path)
        if not path.is_file():
            return cls(path, family or "", deployment or "")
        try:
            data = json.loads(path.read_text())
        except UnicodeDecodeError as exc:
            raise UserError(f"{path}: the search memory is not UTF-8 text ({exc.reason})") from exc
        except OSError as exc:
            raise UserError(f"{path}: cannot read the search memory ({exc.strerror})") from exc
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}: the search memory is not valid JSON ({exc})") from exc
        if not isinstance(data, dict) or not isinstance(data.get("entries", []), list):
            raise UserError(f"{path}: not a specc search memory (expected an object with 'entries')")
        entries = [MemoryEntry.from_json(e, str(path)) for e in data.get("entries", [])]
        acceptance = data.get("acceptance") or {}
        if not isinstance(acceptance, dict) or not all(
                isinstance(v, dict) and isinstance(v.get("alphas"), list)
                and all(isinstance(a, (int, float)) and not isinstance(a, bool) and 0 <= a <= 1 for a in v["alphas"])
                for v in acceptance.values()):
            raise UserError(f"{path}: the search memory's 'acceptance' is not a map of acceptance models")
        for key in ("family", "deployment"):
            if not isinstance(data.get(key) or "", str):
                raise UserError(f"{path}: the search memory's {key} is not a string")
        return cls(path, data.get("family") or family or "", data.get("deployment") or deployment or "", entries,
                   data.get("acceptance") or {})

    def save(self) -> Path:
        """Write under a lock: re-read the file, merge (this memory's entries win over the same
        key; entries other writers added meanwhile are kept), write a unique temp file, fsync,
        rename. Two concurrent searches on one memory lose nothing."""
        from specc.fileio import atomic_write_text, file_lock

        with file_lock(self.path):
            if self.path.is_file():
                try:
                    disk = Memory.load(self.path, self.family, self.deployment)
                except UserError:
                    disk = None  # a corrupt file is replaced by this memory (it could not be read anyway)
                if disk is not None:
                    mine = list(self.entries)
                    merged = Memory(self.path, self.family, self.deployment, disk.entries, disk.acceptance)
                    for e in mine:
                        merged.add(e)
                    self.entries = merged.entries
                    self.acceptance = {**disk.acceptance, **self.acceptance}
            payload = {"format": FORMAT, "family": self.family, "deployment": self.deployment,
                       "entries": [e.to_json() for e in self.entries], "acceptance": self.acceptance}
            atomic_write_text(self.path, json.dumps(payload, indent=1) + "\n")
        return self.path

    def siblings(self) -> list["Memory"]:
        """Memories of the same family on other deployments (same directory)."""
        out = []
        if not self.path.parent.is_dir():
            return out
        for p in sorted(self.path.parent.glob(f"{_safe(self.family)}__*.json")):
            if p.resolve() == self.path.resolve():
                continue
            try:
                out.append(Memory.load(p))
            except UserError:
                continue  # a broken sibling does not stop this search
        return out

    # ------------------------------------------------------------------ entries

    def add(self, entry: MemoryEntry) -> MemoryEntry:
        """Insert, or replace the entry with the same parameters (the newer record wins)."""
        for i, e in enumerate(self.entries):
            if e.key() == entry.key() and e.model == entry.model and e.drafter == entry.drafter:
                self.entries[i] = entry
                return entry
        self.entries.append(entry)
        return entry

    def validated(self, model: str | None = None, drafter: str | None = None, method: str | None = None,
                  notes: list[str] | None = None) -> list[MemoryEntry]:
        """Validated entries, those for this exact model/drafter first, then by gain. Entries whose
        pass code changed since (or was never pinned) are skipped, with a note in ``notes``."""
        out = []
        for e in self.entries:
            if not e.validated or not (method is None or not e.method or e.method == method):
                continue
            why = e.untrusted_reason()
            if why is not None:
                if notes is not None:
                    notes.append(f"memory entry {e.mechanism!r} not trusted: {why}")
                continue
            out.append(e)

        def rank(e: MemoryEntry):
            same = (model is not None and e.model == model) + (drafter is not None and e.drafter == drafter)
            gain = e.measured_gain if e.measured_gain is not None else (e.predicted_gain or 0.0)
            return (-same, -(e.prediction.get("tokens_per_s") or 0.0), -gain)

        return sorted(out, key=rank)

    def __iter__(self) -> Iterable[MemoryEntry]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    # ------------------------------------------------------------------ acceptance

    @staticmethod
    def acceptance_key(model: str, drafter: str, method: str, k: int) -> str:
        return f"{model}|{drafter}|{method}|k={k}"

    def record_acceptance(self, model: str, drafter: str, method: str, k: int, acceptance,
                          weights: str | None = None) -> None:
        """Keep a measured acceptance; ``weights``: the pair's :func:`weights_fingerprint`."""
        record = dict(acceptance.to_json(), date=now())
        if weights:
            record["weights"] = weights
        self.acceptance[self.acceptance_key(model, drafter, method, k)] = record

    def find_acceptance(self, model: str, drafter: str, method: str, k: int | None = None,
                        weights: str | None = None):
        """The recorded AcceptanceModel for a pair (at k, else the largest k recorded), or None.
        ``weights``: the pair's :func:`weights_fingerprint`; when given, only records measured on
        those weights count (module docstring)."""
        from specc.search.acceptance import AcceptanceModel

        prefix = f"{model}|{drafter}|{method}|k="
        found = {int(key[len(prefix):]): v for key, v in self.acceptance.items() if key.startswith(prefix)
                 and (weights is None or v.get("weights") == weights)}
        if not found:
            return None
        k_use = k if k in found else max(found)
        data = found[k_use]
        return AcceptanceModel([float(a) for a in data["alphas"]], source=data.get("source", "memory"),
                               measured_k=data.get("measured_k") or k_use)
