"""Finding and reading checkpoints: local directories, hub ids, the embedded zoo.

A name resolves, in order, to: a directory on disk; a model of the embedded zoo
(``specc-tiny``...); a hub id looked up in the huggingface_hub cache first (so it works offline
once cached) and downloaded only when ``HF_HUB_OFFLINE`` is unset. Weights come from
``model.safetensors`` or a sharded ``model.safetensors.index.json``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

ZOO_DIR = Path(__file__).resolve().parent.parent / "zoo"


class CheckpointError(ValueError):
    """A checkpoint that cannot be found or read. The message is one line, meant for users."""


def zoo_names() -> list[str]:
    if not ZOO_DIR.is_dir():
        return []
    return sorted(p.name for p in ZOO_DIR.iterdir() if (p / "config.json").is_file())


def resolve_checkpoint(name_or_path: str | os.PathLike) -> Path:
    """Return a local directory holding config.json for a path, zoo name or hub id."""
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise CheckpointError(f"{path}: no config.json in this directory")
        return path
    if path.exists():
        raise CheckpointError(f"{path}: not a directory (give the checkpoint directory)")
    zoo = ZOO_DIR / text
    if (zoo / "config.json").is_file():
        return zoo
    if text.startswith((".", "/", "~")) or text.count("/") != 1:
        raise CheckpointError(f"{text}: no such checkpoint directory, zoo model or hub id")
    return _resolve_hub_id(text)


def _resolve_hub_id(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:  # pragma: no cover - huggingface_hub is a transformers dependency
        raise CheckpointError(f"{repo_id}: huggingface_hub is not installed") from exc
    patterns = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt"]
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns, local_files_only=True))
    except Exception:
        pass
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise CheckpointError(f"{repo_id}: not in the local hub cache and HF_HUB_OFFLINE=1")
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns))
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{repo_id}: cannot fetch from the hub ({reason})") from exc


def load_config(path: Path) -> dict[str, Any]:
    try:
        return json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path / 'config.json'}: unreadable ({exc})") from exc


def load_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory (single file or sharded)."""
    index = path / "model.safetensors.index.json"
    try:
        if index.is_file():
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            state: dict[str, torch.Tensor] = {}
            for shard in shards:
                state.update(load_file(str(path / shard)))
            return state
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"{path}: no *.safetensors weights")
        state = {}
        for f in files:
            state.update(load_file(str(f)))
        return state
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(f"{path}: cannot read weights ({type(exc).__name__}: {exc})") from exc


def load_tokenizer(path: Path):
    """The checkpoint's tokenizer, or None when it ships none."""
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as exc:
        raise CheckpointError(f"{path}: tokenizer unreadable ({type(exc).__name__}: {exc})") from exc


def content_hash(path: Path) -> str:
    """sha256 over config.json and the weight files: the identity recorded in artifacts."""
    import hashlib

    digest = hashlib.sha256()
    for f in sorted(path.glob("config.json")) + sorted(path.glob("*.safetensors")):
        digest.update(f.name.encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()
