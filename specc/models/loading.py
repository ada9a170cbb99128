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

from specc.errors import UserError

ZOO_DIR = Path(__file__).resolve().parent.parent / "zoo"


class CheckpointError(UserError, ValueError):
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
        return _plain(path)
    if path.exists():
        raise CheckpointError(f"{path}: not a directory (give the checkpoint directory)")
    zoo = ZOO_DIR / text
    if (zoo / "config.json").is_file():
        return _plain(zoo)
    if text.startswith((".", "/", "~")) or text.count("/") != 1:
        raise CheckpointError(f"{text}: no such checkpoint directory, zoo model or hub id")
    return _resolve_hub_id(text)


def _plain(path: Path) -> Path:
    """A checkpoint stored in bf12 (the zoo's 12-bit format) resolves to its unpacked copy."""
    from specc.models.packed_checkpoint import unpacked_checkpoint

    try:
        return unpacked_checkpoint(path)
    except Exception as exc:
        raise CheckpointError(f"{path}: cannot unpack bf12 weights ({type(exc).__name__}: {exc})") from exc


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
        raw = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:  # ValueError: JSONDecodeError, UnicodeDecodeError
        raise CheckpointError(f"{path / 'config.json'}: unreadable ({exc})") from exc
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path / 'config.json'}: must hold one JSON object")
    return raw


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
        raise CheckpointError(f"{path}: cannot read weights ({type(exc).__name__}: {' '.join(str(exc).split())})") from exc


def load_tokenizer(path: Path):
    """The checkpoint's tokenizer, or None when it ships none: a ``FastTokenizer`` (encode and
    decode through the ``tokenizers`` library alone, the rest through transformers on first use)
    for a generic fast tokenizer, else transformers' ``AutoTokenizer``."""
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    from specc.models.fast_tokenizer import FastTokenizer, eligible

    if eligible(path):  # encode / decode without importing transformers (seconds on some machines)
        try:
            return FastTokenizer(path)
        except Exception as exc:
            raise CheckpointError(f"{path}: tokenizer unreadable ({type(exc).__name__}: {exc})") from exc
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


def available_memory_bytes(device: str | torch.device = "cpu") -> int | None:
    """Memory a new allocation can get on ``device`` (None when unknown)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(dev)[0])
        except Exception:  # noqa: BLE001
            return None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(nbytes: float, what: str, device: str | torch.device = "cpu", share: float = 0.9) -> None:
    """Refuse (one line) an allocation that cannot fit, before making it."""
    avail = available_memory_bytes(device)
    if avail is not None and nbytes > share * avail:
        raise CheckpointError(f"{what} needs about {nbytes / 1e9:,.2f} GB, more than the "
                              f"{avail / 1e9:,.2f} GB available on {torch.device(device).type}")


def weight_shapes(path: Path) -> dict[str, tuple[int, ...]] | None:
    """Names and shapes of a checkpoint's tensors from the safetensors headers (no data read);
    None when the directory has no weight files. Refuses unreadable or inconsistent files."""
    from safetensors import safe_open

    index = path / "model.safetensors.index.json"
    try:
        if index.is_file():
            data = json.loads(index.read_text())
            wm = data.get("weight_map") if isinstance(data, dict) else None
            if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
                raise CheckpointError(f"{index}: no weight_map of tensor -> file")
            files = []
            for name in sorted(set(wm.values())):
                if Path(name).is_absolute() or ".." in Path(name).parts or not (path / name).is_file():
                    raise CheckpointError(f"{index}: weight file {name!r} is missing or outside the checkpoint")
                files.append(path / name)
        else:
            files = sorted(path.glob("*.safetensors"))
        if not files:
            return None
        shapes: dict[str, tuple[int, ...]] = {}
        for f in files:
            with safe_open(str(f), framework="pt") as fh:
                for key in fh.keys():
                    shapes[key] = tuple(fh.get_slice(key).get_shape())
        return shapes
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 (safetensors raises its own error types)
        raise CheckpointError(f"{path}: cannot read weights ({type(exc).__name__}: {' '.join(str(exc).split())})") from exc
