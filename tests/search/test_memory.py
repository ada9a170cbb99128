"""The search memory: files per family x deployment, entries, siblings, acceptance records."""

from __future__ import annotations

import json

import pytest

from specc.errors import UserError
from specc.search.acceptance import AcceptanceModel
from specc.search.memory import Memory, MemoryEntry, family_of, memory_dir, memory_path


def test_default_location_and_roundtrip(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECC_MEMORY_DIR", str(tmp_path / "m"))
    assert memory_dir() == tmp_path / "m"
    mem = Memory.open("qwen3", "h200-bs1")
    assert mem.path == tmp_path / "m" / "qwen3__h200-bs1.json" and len(mem) == 0
    params = {"passes": {"target": "fuse_qkv,dce"}, "num_draft": 7, "options": {}}
    mem.add(MemoryEntry("fuse_qkv on", params, predicted_gain=1.05, validated=True, model="m", drafter="d",
                        method="pard", deployment="h200-bs1"))
    mem.add(MemoryEntry("broken", {"passes": {"target": "x"}, "num_draft": 7}, validated=False, model="m"))
    mem.record_acceptance("m", "d", "pard", 7, AcceptanceModel([0.9, 0.5]))
    mem.save()
    data = json.loads(mem.path.read_text())
    assert data["format"] == "specc-memory/1" and data["family"] == "qwen3" and len(data["entries"]) == 2
    entry = data["entries"][0]
    for key in ("mechanism", "parameters", "predicted_gain", "measured_gain", "date", "specc_version", "validated"):
        assert key in entry
    again = Memory.open("qwen3", "h200-bs1")
    assert [e.mechanism for e in again.validated("m", "d", "pard")] == ["fuse_qkv on"]
    assert again.find_acceptance("m", "d", "pard", 7).alphas == [0.9, 0.5]
    assert again.find_acceptance("m", "d", "pard", 3).alphas == [0.9, 0.5]  # the largest k recorded
    assert again.find_acceptance("m", "other", "pard") is None
    # same parameters replace the entry
    again.add(MemoryEntry("fuse_qkv on", params, predicted_gain=1.2, validated=True, model="m", drafter="d"))
    assert len(again) == 2 and again.entries[0].predicted_gain == 1.2


def test_explicit_file_directory_and_siblings(tmp_path):
    a = Memory.open("llama", "h100-bs1", tmp_path / "custom.json")
    assert a.path == tmp_path / "custom.json"
    b = Memory.open("llama", "h100-bs8", tmp_path)
    assert b.path == memory_path("llama", "h100-bs8", tmp_path)
    b.add(MemoryEntry("k", {"passes": {}, "num_draft": 3}, validated=True))
    b.save()
    c = Memory.open("llama", "h100-bs16", tmp_path)
    assert [m.deployment for m in c.siblings()] == ["h100-bs8"]
    (tmp_path / "llama__broken.json").write_text("{not json")
    assert [m.deployment for m in c.siblings()] == ["h100-bs8"]  # a broken sibling is skipped
    with pytest.raises(UserError, match="not valid JSON"):
        Memory.load(tmp_path / "llama__broken.json")
    (tmp_path / "bad.json").write_text(json.dumps({"entries": [{"no": "mechanism"}]}))
    with pytest.raises(UserError, match="mechanism"):
        Memory.load(tmp_path / "bad.json")


def test_family_key():
    assert family_of({"model_type": "Qwen3"}) == "qwen3"
    assert family_of({}) == "unknown"


def test_acceptance_records_are_matched_by_weights(tmp_path):
    from specc.search.acceptance import AcceptanceModel
    from specc.search.memory import Memory, weights_fingerprint

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    assert weights_fingerprint(ckpt) is None  # a bare config.json: nothing to tell weights apart by
    (ckpt / "model.safetensors").write_bytes(b"a" * (3 << 20))
    fp = weights_fingerprint(ckpt, None)
    assert fp and fp == weights_fingerprint(ckpt)
    (ckpt / "model.safetensors").write_bytes(b"a" * (3 << 20) + b"b")  # retrained: size and tail differ
    assert weights_fingerprint(ckpt) != fp

    mem = Memory.open("qwen3", "cpu", tmp_path / "mem")
    acc = AcceptanceModel([0.8, 0.5], source="measured", measured_k=2)
    mem.record_acceptance("t", "d", "dflash", 2, acc, weights="aaaa")
    mem.record_acceptance("t", "d", "pard", 2, acc)  # an older record: no fingerprint
    mem.save()
    again = Memory.open("qwen3", "cpu", tmp_path / "mem")
    assert again.find_acceptance("t", "d", "dflash", 2, "aaaa").alphas == [0.8, 0.5]
    assert again.find_acceptance("t", "d", "dflash", 2, "bbbb") is None  # other weights
    assert again.find_acceptance("t", "d", "dflash", 2) is not None  # weights unknown (a bare config)
    assert again.find_acceptance("t", "d", "pard", 2, "aaaa") is None
