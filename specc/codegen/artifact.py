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
left behind; ``check_files`` refuses a tampered or incomplete artifact with a one-line reason.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import save_file

if TYPE_CHECKING:
    from specc.codegen.emit import EmittedStep

MANIFEST = "manifest.json"
WEIGHTS = "weights.safetensors"
FORMAT_VERSION = 1
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "chat_template.jinja")


class ArtifactError(ValueError):
    """A corrupt, tampered or incomplete artifact (one-line message)."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _storage_key(t: torch.Tensor):
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


def stage_artifact(out: Path, steps: dict[str, EmittedStep], manifest: dict, tokenizer_dir: Path | None) -> Path:
    """Write everything into a temporary directory next to ``out``; return it."""
    out = Path(out)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
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
        manifest["files"] = {p.name: sha256(p) for p in sorted(tmp.iterdir()) if p.name != MANIFEST}
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


def publish(tmp: Path, out: Path, overwrite: bool = True) -> Path:
    """Rename the staged directory into place (replacing an existing artifact atomically enough:
    the old one is moved aside first and removed only after the new one is in place)."""
    out = Path(out)
    backup = None
    if out.exists():
        if not overwrite:
            raise ArtifactError(f"{out} exists")
        if not (out / MANIFEST).is_file():
            raise ArtifactError(f"{out} exists and is not a specc artifact; refusing to replace it")
        backup = out.parent / f".{out.name}.old-{os.getpid()}"
        os.replace(out, backup)
    os.replace(tmp, out)
    if backup is not None:
        shutil.rmtree(backup, ignore_errors=True)
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


def check_files(path: Path, manifest: dict) -> None:
    for name, digest in manifest.get("files", {}).items():
        f = Path(path) / name
        if not f.is_file():
            raise ArtifactError(f"{path}: missing file {name}")
        if sha256(f) != digest:
            raise ArtifactError(f"{path}: {name} does not match its manifest hash (modified or corrupt)")
