"""The artifact format: a directory written atomically, with a manifest that pins every file.

    NAME.specc/
      manifest.json         specc version, model/drafter identities + content hashes, method,
                            deployment, passes (+ parameters, stats), tolerances, verification,
                            steps (module file, class, inputs, weight map, caches), file sha256s
      target.py             generated step module of the target (prefill / ar / verify)
      drafter.py            generated draft step (when the method has a drafter)
      weights.safetensors   every weight once (shared tensors stored once, mapped per step)
      tokenizer files       copied from the target checkpoint when present

Written into a temporary sibling directory and renamed into place, so nothing partial is ever
left behind; ``artifact_trust.verify_artifact`` refuses a tampered or incomplete artifact with a
one-line reason.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import save_file

from specc.errors import UserError

if TYPE_CHECKING:
    from specc.codegen.emit import EmittedStep

MANIFEST = "manifest.json"
WEIGHTS = "weights.safetensors"
FORMAT_VERSION = 1
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "chat_template.jinja")


class ArtifactError(UserError, ValueError):
    """A corrupt, tampered or incomplete artifact (one-line message)."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# Files larger than this also get per-chunk digests (manifest ``file_chunks``): one sha256 over
# 16 GB of weights is ~10 s on one core at every load, while chunks verify on all cores at once.
CHUNK_BYTES = 64 << 20


def digests(path: Path, chunk_bytes: int = CHUNK_BYTES) -> tuple[str, list[str]]:
    """The whole file's sha256 and, for a file larger than one chunk, each chunk's (in order);
    one pass over the file."""
    whole, parts = hashlib.sha256(), []
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(chunk_bytes), b""):
            whole.update(chunk)
            parts.append(hashlib.sha256(chunk).hexdigest())
    return whole.hexdigest(), parts if len(parts) > 1 else []


def _storage_key(t: torch.Tensor):
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


def stage_artifact(out: Path, steps: dict[str, EmittedStep], manifest: dict, tokenizer_dir: Path | None) -> Path:
    """Write everything into a temporary directory next to ``out``; return it."""
    import tempfile

    out = Path(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private; the artifact gets the usual permissions
    try:
        stored: dict = {}
        tensors: dict[str, torch.Tensor] = {}
        manifest = dict(manifest, format_version=FORMAT_VERSION, steps={})
        for role, step in steps.items():
            (tmp / f"{role}.py").write_text(step.source)
            weight_map = {}
            for name, t in step.weights.items():
                key = _storage_key(t)
                if key not in stored:
                    stored[key] = f"{role}.{name}"
                    tensors[stored[key]] = t.detach().contiguous().cpu()
                weight_map[name] = stored[key]
            manifest["steps"][role] = {"module": f"{role}.py", "class": step.class_name, "inputs": step.inputs,
                                       "weights": weight_map, "caches": step.caches}
        save_file(tensors, str(tmp / WEIGHTS))
        if tokenizer_dir is not None:
            for name in TOKENIZER_FILES:
                if (Path(tokenizer_dir) / name).is_file():
                    shutil.copy2(Path(tokenizer_dir) / name, tmp / name)
        manifest["files"], manifest["file_chunks"] = {}, {}
        for p in sorted(tmp.iterdir()):
            if p.name != MANIFEST:
                manifest["files"][p.name], parts = digests(p, CHUNK_BYTES)
                if parts:
                    manifest["file_chunks"][p.name] = {"chunk_bytes": CHUNK_BYTES, "size": p.stat().st_size,
                                                       "sha256": parts}
        write_manifest(tmp, manifest)
        return tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_manifest(directory: Path, manifest: dict) -> None:
    path = Path(directory) / MANIFEST
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def is_specc_artifact(path: Path) -> bool:
    """A directory whose manifest.json names a specc_version and this format (what may be replaced)."""
    path = Path(path)
    if path.is_symlink() or not path.is_dir():
        return False
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and isinstance(manifest.get("specc_version"), str) \
        and manifest.get("format_version") == FORMAT_VERSION


def check_output_path(out: Path) -> Path:
    """Validate ``-o`` before any work: the parent exists and is writable; an existing path is
    replaced only when it is a specc artifact (or an empty directory)."""
    out = Path(out)
    if not out.name or out.name in (".", ".."):
        raise ArtifactError(f"{out}: not a valid artifact path")
    parent = out.parent
    if not parent.is_dir():
        raise ArtifactError(f"{parent}: no such directory (the output's parent must exist)")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ArtifactError(f"{parent}: not writable")
    if out.is_symlink():
        raise ArtifactError(f"{out} is a symlink; refusing to replace it")
    if out.exists():
        if not out.is_dir():
            raise ArtifactError(f"{out} exists and is not a directory; refusing to replace it")
        if not is_specc_artifact(out) and any(out.iterdir()):
            raise ArtifactError(f"{out} exists and is not a specc artifact; refusing to replace it")
    return out


@contextlib.contextmanager
def output_lock(out: Path, on_wait=None):
    """Hold the output path's lock (``.NAME.lock`` beside it) and clean up what killed runs left."""
    from specc.fileio import file_lock

    out = Path(out)
    with file_lock(out, on_wait):
        clean_stale(out)
        yield


def clean_stale(out: Path) -> list[Path]:
    """Remove ``.NAME.tmp-*`` / ``.NAME.old-*`` siblings (call with the output lock held: no live
    compile to this path owns them)."""
    out = Path(out)
    removed = []
    for pattern in (f".{out.name}.tmp-*", f".{out.name}.old-*"):
        for p in out.parent.glob(pattern):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    p.unlink()
            removed.append(p)
    return removed


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2 RENAME_EXCHANGE); False when unsupported."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    AT_FDCWD, RENAME_EXCHANGE = -100, 2
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    rc = renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE)
    return rc == 0


def publish(tmp: Path, out: Path, overwrite: bool = True) -> Path:
    """Put the staged directory in place. An existing artifact is swapped with it atomically
    (renameat2 exchange where available; else moved aside first) and removed only afterwards."""
    from specc.fileio import fsync_dir

    out, tmp = Path(out), Path(tmp)
    for f in tmp.iterdir():  # the new artifact is on disk before it becomes visible
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    fsync_dir(tmp)
    if out.exists() or out.is_symlink():
        if not overwrite:
            raise ArtifactError(f"{out} exists")
        if not is_specc_artifact(out) and not (out.is_dir() and not out.is_symlink() and not any(out.iterdir())):
            raise ArtifactError(f"{out} exists and is not a specc artifact; refusing to replace it")
        if _exchange(tmp, out):  # tmp now holds the old artifact
            shutil.rmtree(tmp, ignore_errors=True)
            fsync_dir(out.parent)
            return out
        backup = out.parent / f".{out.name}.old-{os.getpid()}-{os.urandom(4).hex()}"
        os.replace(out, backup)
        try:
            os.replace(tmp, out)
        except BaseException:
            os.replace(backup, out)  # put the old one back
            raise
        shutil.rmtree(backup, ignore_errors=True)
    else:
        os.replace(tmp, out)
    fsync_dir(out.parent)
    return out


def read_manifest(path: Path) -> dict:
    path = Path(path)
    if not path.is_dir():
        raise ArtifactError(f"{path}: no such artifact directory")
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        raise ArtifactError(f"{path}: not a specc artifact (no {MANIFEST})") from None
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{path}: corrupt {MANIFEST} ({exc.msg})") from None
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(f"{path}: artifact format {manifest.get('format_version')} is not {FORMAT_VERSION}")
    return manifest

