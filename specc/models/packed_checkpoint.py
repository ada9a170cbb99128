"""Checkpoints stored in the lossless 12-bit format (bf12), unpacked once into a plain cache.

Why: the embedded zoo must stay small (it ships inside the package), and bf16 weights stored as
bf12 take 1.5 bytes instead of 2, bit-exact. Everything that reads checkpoints -- specc's own
loader and transformers' ``from_pretrained`` in the stock loops -- wants a plain
``model.safetensors``, so :func:`unpacked_checkpoint` turns a packed directory into an ordinary
one under ``$SPECC_UNPACK_CACHE`` (default ``~/.cache/specc/unpacked``), keyed by the packed
files' content hash, and :func:`specc.models.loading.resolve_checkpoint` returns that directory.
Users see no difference apart from the first load's unpacking.

A packed directory holds ``bf12.json`` (the marker: format, shard names, packed tensor names),
shards ``bf12-NNNNN.safetensors`` and the other files of the checkpoint (config, tokenizer),
copied as they are. Each bf16 matrix (two or more dimensions) is stored as
:meth:`specc.formats.bf12.Packed12.to_state_dict` under ``NAME.bf12.``; other tensors (norm vectors: a
packed vector's bookkeeping outweighs its saving) are kept as they are. Only the format's public pack / unpack functions are used, so any layout version the
format reads works here.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specc.formats import Packed12, pack_bf16_12bit

MARKER = "bf12.json"
FORMAT = "specc-bf12-checkpoint"
SUFFIX = ".bf12."
DEFAULT_SHARD_BYTES = 15 * 2**20  # fits transfer limits of 16 MiB a file


def is_packed(path: Path) -> bool:
    return (Path(path) / MARKER).is_file()


def pack_checkpoint(src: Path, dst: Path, max_shard_bytes: int = DEFAULT_SHARD_BYTES) -> dict:
    """Write ``src`` (a plain checkpoint directory) to ``dst`` in bf12, split into shards of at
    most ``max_shard_bytes`` (a single tensor larger than that gets a shard of its own). Returns
    the marker's content. Raises ValueError if a bf16 tensor does not round-trip bit for bit."""
    src, dst = Path(src), Path(dst)
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{src}: no *.safetensors weights to pack")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for f in sorted(src.iterdir()):
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
            shutil.copy2(f, dst / f.name)
    groups: list[dict[str, torch.Tensor]] = []
    packed = []
    for name in sorted(state):
        tensor = state[name]
        if tensor.dtype == torch.bfloat16 and tensor.dim() >= 2:
            p = pack_bf16_12bit(tensor)
            if not torch.equal(p.unpack().view(torch.int16), tensor.view(torch.int16)):
                raise ValueError(f"bf12 does not round-trip {name}")
            part = p.to_state_dict(name + SUFFIX)
            packed.append(name)
        else:
            part = {name: tensor.contiguous()}
        size = sum(t.numel() * t.element_size() for t in part.values())
        if not groups or groups[-1]["bytes"] + size > max_shard_bytes:
            groups.append({"bytes": 0, "tensors": {}})
        groups[-1]["bytes"] += size
        groups[-1]["tensors"].update(part)
    shards = []
    for i, group in enumerate(groups):
        shard = f"bf12-{i + 1:05d}.safetensors"
        save_file(group["tensors"], str(dst / shard), metadata={"format": "pt"})
        shards.append(shard)
    marker = {"format": FORMAT, "shards": shards, "packed": packed,
              "tensors": len(state), "source_bytes": sum(t.numel() * t.element_size() for t in state.values())}
    (dst / MARKER).write_text(json.dumps(marker, indent=1) + "\n")
    return marker


def read_packed_state(path: Path) -> dict[str, torch.Tensor]:
    """The original tensors of a packed directory (bf16 ones bit-exact)."""
    path = Path(path)
    marker = json.loads((path / MARKER).read_text())
    if marker.get("format") != FORMAT:
        raise ValueError(f"{path / MARKER}: not a {FORMAT} marker")
    raw: dict[str, torch.Tensor] = {}
    for shard in marker["shards"]:
        raw.update(load_file(str(path / shard)))
    state = {}
    for name in marker["packed"]:
        prefix = name + SUFFIX
        sub = {k: raw.pop(k) for k in [k for k in raw if k.startswith(prefix)]}
        state[name] = Packed12.from_state_dict(sub, prefix).unpack()
    state.update(raw)
    return state


def _cache_root() -> Path:
    env = os.environ.get("SPECC_UNPACK_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specc" / "unpacked"


def _packed_hash(path: Path) -> str:
    digest = hashlib.sha256()
    for f in sorted(p for p in path.iterdir() if p.is_file()):
        digest.update(f.name.encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()[:20]


def unpacked_checkpoint(path: Path) -> Path:
    """``path`` itself when it is a plain checkpoint, else its unpacked copy in the cache
    (made on first use, atomically, so concurrent loaders never see half a directory)."""
    path = Path(path)
    if not is_packed(path):
        return path
    out = _cache_root() / f"{path.name}-{_packed_hash(path)}"
    if (out / "model.safetensors").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=out.parent))
    try:
        for f in sorted(path.iterdir()):
            if f.is_file() and f.name != MARKER and not f.name.endswith(".safetensors"):
                shutil.copy2(f, tmp / f.name)
        save_file(read_packed_state(path), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        try:
            tmp.rename(out)
        except OSError:  # another process finished first
            if not (out / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
