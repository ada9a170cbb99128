"""Loading an artifact is running code: the checks that make the manifest a trust boundary.

An artifact is code, like a pickle: its step modules are Python that ``specc.load`` executes.
These checks do not make an untrusted artifact safe; they make sure that what runs is exactly what
the manifest (and, when pinned, the manifest's own hash) vouches for:

- every path the manifest names is a plain name confined to the artifact directory (no absolute
  paths, no ``..``, no symlink that leaves the directory);
- every file in the manifest's ``files`` list is present and matches its sha256;
- every step module is in that list, and is executed from the very bytes that were hashed
  (read once, hashed, ``exec(compile(bytes))``): nothing is imported through the file system, so
  no ``__pycache__``/``*.pyc`` is read or written;
- ``expect_hash`` pins the sha256 of manifest.json itself (``specc compile`` prints it), so an
  edited module with an edited hash in the manifest is refused too;
- plugin passes the artifact was compiled with (recorded under ``plugins``) must be present.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
from pathlib import Path

from specc.codegen.artifact import MANIFEST, ArtifactError

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
# target_tree: the tree verify step; target_ragged: the packed verify of rows with their own draft counts
STEP_ROLES = frozenset({"target", "drafter", "target_tree", "target_ragged"})
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_METHOD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # any registered method name (plugins too)


def manifest_hash(path: Path) -> str:
    """sha256 of the artifact's manifest.json bytes (what ``--expect-hash`` pins)."""
    try:
        data = (Path(path) / MANIFEST).read_bytes()
    except OSError as exc:
        raise ArtifactError(f"{path}: cannot read {MANIFEST} ({exc.strerror or exc})") from None
    return hashlib.sha256(data).hexdigest()


def read_manifest_pinned(path: Path, expect_hash: str | None = None) -> tuple[dict, str]:
    """Read manifest.json once, check its hash against ``expect_hash``, parse and validate it."""
    from specc.codegen.artifact import FORMAT_VERSION

    path = Path(path)
    if not path.is_dir():
        raise ArtifactError(f"{path}: no such artifact directory")
    mpath = path / MANIFEST
    if mpath.is_symlink():
        raise ArtifactError(f"{path}: {MANIFEST} is a symlink; refusing it")
    try:
        data = mpath.read_bytes()
    except FileNotFoundError:
        raise ArtifactError(f"{path}: not a specc artifact (no {MANIFEST})") from None
    except OSError as exc:
        raise ArtifactError(f"{path}: cannot read {MANIFEST} ({exc.strerror or exc})") from None
    digest = hashlib.sha256(data).hexdigest()
    if expect_hash is not None:
        want = str(expect_hash).strip().lower().removeprefix("sha256:")
        if not _HEX64.match(want):
            raise ArtifactError(f"expected hash {expect_hash!r} is not a sha256 (64 hex digits)")
        if digest != want:
            raise ArtifactError(f"{path}: manifest hash {digest[:16]}... is not the expected {want[:16]}... "
                                "(a different or modified artifact)")
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{path}: corrupt {MANIFEST} ({getattr(exc, 'msg', None) or exc.reason})") from None
    if not isinstance(manifest, dict):
        raise ArtifactError(f"{path}: corrupt {MANIFEST} (not a JSON object)")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(f"{path}: artifact format {manifest.get('format_version')!r} is not {FORMAT_VERSION}")
    validate_manifest(path, manifest)
    return manifest, digest


def _bad(path, what: str) -> ArtifactError:
    return ArtifactError(f"{path}: malformed {MANIFEST}: {what}")


def _validate_chunks(path: Path, chunks, files: dict) -> None:
    """``file_chunks``: per listed file, a chunk size, the file size and one sha256 per chunk,
    exactly as many as cover the size."""
    if not isinstance(chunks, dict):
        raise _bad(path, "'file_chunks' is not a mapping")
    for name, rec in chunks.items():
        if name not in files:
            raise _bad(path, f"file_chunks[{name!r}] names a file not in 'files'")
        ok = isinstance(rec, dict) and all(isinstance(rec.get(k), int) and not isinstance(rec.get(k), bool)
                                           for k in ("chunk_bytes", "size"))
        ok = ok and rec["chunk_bytes"] >= 4096 and rec["size"] >= 0 and isinstance(rec.get("sha256"), list)
        if not ok or len(rec["sha256"]) != -(-rec["size"] // rec["chunk_bytes"]) or not all(
                isinstance(d, str) and _HEX64.match(d) for d in rec["sha256"]):
            raise _bad(path, f"file_chunks[{name!r}] is not chunk_bytes / size / one sha256 per chunk")


def validate_manifest(path: Path, m: dict) -> None:
    """The fields the runtime reads have the right types (one-line ArtifactError otherwise)."""
    files = m.get("files")
    if not isinstance(files, dict) or not files:
        raise _bad(path, "no 'files' list")
    for name, digest in files.items():
        confined(path, name)
        if not isinstance(digest, str) or not _HEX64.match(digest):
            raise _bad(path, f"files[{name!r}] is not a sha256")
    _validate_chunks(path, m.get("file_chunks", {}), files)
    if not isinstance(m.get("method"), str) or not _METHOD_NAME.match(m["method"]):
        raise _bad(path, f"method {m.get('method')!r} is not a method name")
    nd = m.get("num_draft", 0)
    if nd is not None and (not isinstance(nd, int) or isinstance(nd, bool) or not 0 <= nd <= 4096):
        raise _bad(path, f"num_draft {nd!r} is not a small non-negative integer")
    model = m.get("model")
    if not isinstance(model, dict):
        raise _bad(path, "no 'model' section")
    vocab = model.get("vocab_size")
    if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 1:
        raise _bad(path, f"model.vocab_size {vocab!r} is not a positive integer")
    eos = model.get("eos_token_ids", [])
    if not isinstance(eos, list) or not all(isinstance(e, int) and not isinstance(e, bool) for e in eos):
        raise _bad(path, "model.eos_token_ids is not a list of integers")
    dep = m.get("deployment")
    if not isinstance(dep, dict) or not isinstance(dep.get("dtype", "float32"), str) \
            or dep.get("dtype", "float32") not in ("float32", "bfloat16", "float16") \
            or not isinstance(dep.get("device", "cpu"), str):
        raise _bad(path, "deployment lacks a valid dtype/device")
    tol = m.get("tolerances")
    if not isinstance(tol, dict) or not isinstance(tol.get("tie_margin"), (int, float)) \
            or isinstance(tol.get("tie_margin"), bool):
        raise _bad(path, "tolerances.tie_margin is not a number")
    steps = m.get("steps")
    if not isinstance(steps, dict) or "target" not in steps or set(steps) - STEP_ROLES:
        raise _bad(path, "'steps' must name a target step (and optionally a drafter, a target_tree and a "
                         "target_ragged step)")
    if "target_tree" in steps and "drafter" not in steps:
        raise _bad(path, "a target_tree step without a drafter step")
    drafter = m.get("drafter")
    if "drafter" in steps:
        # what the drafting strategy reads from its section (the runtime checks it needs them)
        if not isinstance(drafter, dict):
            raise _bad(path, f"method {m['method']} has a drafter step but no 'drafter' section")
        pt = drafter.get("pard_token")
        if pt is not None and (not isinstance(pt, int) or isinstance(pt, bool) or not 0 <= pt < vocab):
            raise _bad(path, f"drafter.pard_token {pt!r} is not a token id")
        d = drafter.get("dflash")
        if d is not None:
            ok = isinstance(d, dict) and all(isinstance(d.get(k), int) and not isinstance(d.get(k), bool)
                                             for k in ("block_size", "mask_token_id")) \
                and isinstance(d.get("target_layer_ids"), list) \
                and all(isinstance(i, int) for i in d["target_layer_ids"]) and d["block_size"] >= 2
            if not ok:
                raise _bad(path, "drafter.dflash lacks block_size/mask_token_id/target_layer_ids")
        strategy = drafter.get("strategy")
        if strategy is not None and not isinstance(strategy, str):
            raise _bad(path, "drafter.strategy is not a name")
    for role, info in steps.items():
        if not isinstance(info, dict):
            raise _bad(path, f"steps.{role} is not an object")
        module, cls = info.get("module"), info.get("class")
        if not isinstance(module, str) or not module.endswith(".py"):
            raise _bad(path, f"steps.{role}.module is not a .py file name")
        confined(path, module)
        if module not in files:
            raise ArtifactError(f"{path}: step module {module} is not in the manifest's file list; refusing to run it")
        if not isinstance(cls, str) or not _IDENT.match(cls):
            raise _bad(path, f"steps.{role}.class is not an identifier")
        w = info.get("weights")
        if not isinstance(w, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in w.items()):
            raise _bad(path, f"steps.{role}.weights is not a name -> tensor map")
        caches = info.get("caches")
        if not isinstance(caches, dict):
            raise _bad(path, f"steps.{role}.caches is not an object")
        for cname, c in caches.items():
            if not _valid_state_entry(c):
                raise _bad(path, f"steps.{role}.caches.{cname} is not a valid state entry (kind, shape, dtype)")
    plugins = m.get("plugins", [])
    if not isinstance(plugins, list) or not all(isinstance(p, dict) for p in plugins):
        raise _bad(path, "'plugins' is not a list")


def _small_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 1 << 16


def _valid_state_entry(c) -> bool:
    """A manifest ``caches`` entry: a known state kind (``specc.models.state.LAYOUTS``), a
    per-slot shape of small positive ints (KV entries of older manifests: ``heads`` and
    ``head_dim``), a float dtype and a small ``extra_len``."""
    from specc.models.state import LAYOUTS

    if not isinstance(c, dict):
        return False
    kind = c.get("kind", "kv")
    shape = c.get("shape")
    if shape is None and kind == "kv":
        shape = [c.get("heads"), c.get("head_dim")]
    extra = c.get("extra_len", 0)
    return (isinstance(kind, str) and kind in LAYOUTS and isinstance(shape, list) and bool(shape)
            and all(_small_int(d) for d in shape) and c.get("dtype") in ("float32", "bfloat16", "float16")
            and isinstance(extra, int) and not isinstance(extra, bool) and 0 <= extra <= 1 << 16)


def confined(root: Path, name) -> Path:
    """``root / name`` for a manifest-named file, refusing anything that leaves ``root``."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise ArtifactError(f"{root}: manifest names an invalid file {name!r}")
    p = Path(name)
    if p.is_absolute() or name.startswith(("/", "\\")) or ".." in p.parts or "\\" in name or ":" in name:
        raise ArtifactError(f"{root}: manifest path {name!r} leaves the artifact directory; refusing it")
    full = Path(root) / p
    try:
        real_root = Path(root).resolve(strict=True)
        real = full.resolve()
    except (OSError, RuntimeError) as exc:
        raise ArtifactError(f"{root}: cannot resolve {name!r} ({exc})") from None
    if real != real_root and real_root not in real.parents:
        raise ArtifactError(f"{root}: {name!r} is a link leaving the artifact directory; refusing it")
    return full


def _read_checked(root: Path, name: str, digest: str, chunks: dict | None = None) -> bytes | None:
    """Hash a file; return its bytes when small enough to keep (modules), else None. A file with
    per-chunk digests (``file_chunks``) is checked chunk by chunk on several threads instead."""
    f = confined(root, name)
    if not f.is_file():
        raise ArtifactError(f"{root}: missing file {name}")
    keep = name.endswith(".py")
    if chunks and not keep:
        _check_chunks(root, name, f, chunks)
        return None
    h = hashlib.sha256()
    parts = []
    try:
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
                if keep:
                    parts.append(chunk)
    except OSError as exc:
        raise ArtifactError(f"{root}: cannot read {name} ({exc.strerror or exc})") from None
    if h.hexdigest() != digest:
        raise ArtifactError(f"{root}: {name} does not match its manifest hash (modified or corrupt)")
    return b"".join(parts) if keep else None


def _check_chunks(root: Path, name: str, f: Path, chunks: dict) -> None:
    """Size, then every chunk's sha256, hashed in parallel (hashlib releases the GIL on large
    buffers): the chunks cover every byte, so this vouches for the file as the whole-file hash does."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    size, step, expected = chunks["size"], chunks["chunk_bytes"], chunks["sha256"]
    try:
        actual = f.stat().st_size
        if actual != size:
            raise ArtifactError(f"{root}: {name} is {actual} bytes, its manifest says {size} (modified or corrupt)")
        fd = os.open(f, os.O_RDONLY)
    except OSError as exc:
        raise ArtifactError(f"{root}: cannot read {name} ({exc.strerror or exc})") from None

    def chunk_ok(i: int) -> bool:
        return hashlib.sha256(os.pread(fd, step, i * step)).hexdigest() == expected[i]

    try:
        with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
            ok = all(pool.map(chunk_ok, range(len(expected))))
    except OSError as exc:
        raise ArtifactError(f"{root}: cannot read {name} ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if not ok:
        raise ArtifactError(f"{root}: {name} does not match its manifest hash (modified or corrupt)")


def verify_artifact(path: Path, manifest: dict, check: bool = True) -> dict[str, bytes]:
    """Check every listed file (when ``check``) and every recorded plugin; return the step
    modules' verified bytes by file name (always hashed: these are what will run)."""
    path = Path(path)
    modules = {info["module"] for info in manifest["steps"].values()}
    sources: dict[str, bytes] = {}
    chunked = manifest.get("file_chunks") or {}
    for name, digest in manifest["files"].items():
        if check or name in modules:
            data = _read_checked(path, name, digest, chunked.get(name))
            if name in modules:
                sources[name] = data
    check_plugins(path, manifest)
    return sources


# ---- plugin passes ----------------------------------------------------------------------------

def check_plugins(path: Path, manifest: dict) -> None:
    """Every plugin pass recorded at compile time must be present (and, for files, unchanged);
    importing it (its kernels or eager ops) is what the generated modules may rely on."""
    for rec in manifest.get("plugins", []):
        ref = rec.get("ref", "?")
        where = rec.get("file")
        if where:
            f = Path(where)
            if not f.is_file():
                raise ArtifactError(f"{path}: compiled with plugin pass +{ref}, but {f} is missing")
            if rec.get("sha256") and hashlib.sha256(f.read_bytes()).hexdigest() != rec["sha256"]:
                raise ArtifactError(f"{path}: plugin pass file {f} changed since compile (+{ref})")
            continue
        module = rec.get("module")
        if module in (None, "__main__"):
            continue
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError, AttributeError):
            found = False
        if not found:  # `+pkg.mod:Class` from the working directory (how the registry imports it)
            rel = Path.cwd().joinpath(*module.split("."))
            found = rel.with_suffix(".py").is_file() or (rel / "__init__.py").is_file()
        if not found:
            what = f"plugin pass {rec.get('pass')} ({rec.get('origin')})" if rec.get("pass") else f"plugin pass +{ref}"
            raise ArtifactError(f"{path}: compiled with {what}; module {module} is not installed here")
