"""Artifacts as a trust boundary (issue 14, finding 2): each tampering variant that used to run
foreign code with exit 0 is refused, and nothing but the hashed bytes ever runs."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import PROMPT

from specc.cli import main
from specc.codegen.artifact import ArtifactError
from specc.codegen.artifact_trust import manifest_hash
from specc.compiler import compile_artifact
from specc.runtime.engine import load

IDS = ",".join(map(str, PROMPT))
ROOT = Path(__file__).resolve().parents[2]
# What foreign code does when it runs: leave a mark we can look for.
PAYLOAD = "\nimport pathlib as _p; _p.Path({mark!r}).write_text('pwned')\n"


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    from model_factory import make_hf_model, save

    ckpt = save(make_hf_model("qwen3", seed=0), tmp_path_factory, "trust-target")
    out = tmp_path_factory.mktemp("trust") / "a.specc"
    result = compile_artifact(str(ckpt), out=out, passes="fuse_qkv", max_new_tokens=4)
    return out, result, ckpt


@pytest.fixture
def copy(artifact, tmp_path):
    out = tmp_path / "c.specc"
    shutil.copytree(artifact[0], out)
    return out


def _rewrite_manifest(path: Path, edit) -> None:
    m = json.loads((path / "manifest.json").read_text())
    edit(m)
    (path / "manifest.json").write_text(json.dumps(m))


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_compile_prints_and_returns_the_manifest_hash(artifact):
    out, result, _ = artifact
    assert result.manifest_hash == manifest_hash(out) == _sha(out / "manifest.json")
    assert any(result.manifest_hash in line and "--expect-hash" in line for line in result.summary_lines)
    load(out, expect_hash=result.manifest_hash)
    load(out, expect_hash="sha256:" + result.manifest_hash.upper())


def test_edited_source_with_edited_hash_is_refused_when_pinned(artifact, copy, tmp_path, capsys):
    pinned = artifact[1].manifest_hash
    mark = tmp_path / "mark"
    (copy / "target.py").write_text((copy / "target.py").read_text() + PAYLOAD.format(mark=str(mark)))
    _rewrite_manifest(copy, lambda m: m["files"].__setitem__("target.py", _sha(copy / "target.py")))
    with pytest.raises(ArtifactError, match="not the expected"):
        load(copy, expect_hash=pinned)
    assert main(["run", str(copy), "--input-ids", IDS, "--expect-hash", pinned]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specc: error:") and err.count("\n") == 1 and "Traceback" not in err
    assert not mark.exists()
    assert main(["run", str(copy), "--input-ids", IDS, "--expect-hash", "nothex"]) == 2
    assert not mark.exists()


def test_module_dropped_from_the_file_list_is_refused(copy, tmp_path):
    mark = tmp_path / "mark"
    (copy / "target.py").write_text((copy / "target.py").read_text() + PAYLOAD.format(mark=str(mark)))
    _rewrite_manifest(copy, lambda m: m["files"].pop("target.py"))
    with pytest.raises(ArtifactError, match="not in the manifest's file list"):
        load(copy)
    assert not mark.exists()


@pytest.mark.parametrize("how", ["absolute", "dotdot", "symlink-file", "symlink-dir"])
def test_step_module_outside_the_artifact_is_refused(copy, tmp_path, how):
    mark = tmp_path / "mark"
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "target.py").write_text((copy / "target.py").read_text() + PAYLOAD.format(mark=str(mark)))
    digest = _sha(evil / "target.py")
    if how == "absolute":
        name = str(evil / "target.py")
    elif how == "dotdot":
        name = os.path.relpath(evil / "target.py", copy)
    elif how == "symlink-file":
        name = "target.py"
        (copy / "target.py").unlink()
        (copy / "target.py").symlink_to(evil / "target.py")
    else:
        name = "sub/target.py"
        (copy / "sub").symlink_to(evil, target_is_directory=True)

    def edit(m):
        m["files"].pop("target.py")
        m["files"][name] = digest
        m["steps"]["target"]["module"] = name

    _rewrite_manifest(copy, edit)
    with pytest.raises(ArtifactError, match="leaves the artifact|leaving the artifact"):
        load(copy)
    assert not mark.exists()


def test_other_manifest_paths_are_confined_too(copy):
    _rewrite_manifest(copy, lambda m: m["files"].__setitem__("../../etc/passwd", "0" * 64))
    with pytest.raises(ArtifactError, match="leaves the artifact"):
        load(copy)


def test_planted_pyc_never_runs_and_none_is_written(copy, tmp_path):
    """A __pycache__/*.pyc next to an untouched source: the loader runs the hashed bytes, not it."""
    mark = tmp_path / "mark"
    evil_src = tmp_path / "target.py"
    evil_src.write_text((copy / "target.py").read_text() + PAYLOAD.format(mark=str(mark)))
    st = (copy / "target.py").stat()
    os.utime(evil_src, ns=(st.st_atime_ns, st.st_mtime_ns))
    import py_compile

    for tag in {sys.implementation.cache_tag}:
        pyc = copy / "__pycache__" / f"target.{tag}.pyc"
        pyc.parent.mkdir(exist_ok=True)
        # a pyc whose header matches target.py's mtime and size (what the import system checks)
        py_compile.compile(str(evil_src), cfile=str(pyc), dfile=str(copy / "target.py"))
        data = bytearray(pyc.read_bytes())
        data[12:16] = (st.st_size & 0xFFFFFFFF).to_bytes(4, "little")
        pyc.write_bytes(bytes(data))
    engine = load(copy)
    engine.generate(PROMPT, 2)
    assert not mark.exists()
    # nothing compiled to bytecode beside the artifact's files
    assert sorted(p.name for p in (copy / "__pycache__").iterdir()) == [f"target.{sys.implementation.cache_tag}.pyc"]
    assert not (copy / "drafter.py").exists()


def test_loading_writes_no_bytecode(artifact, tmp_path):
    out = tmp_path / "clean.specc"
    shutil.copytree(artifact[0], out)
    code = (f"import sys; sys.dont_write_bytecode=False; from specc.runtime.engine import load; "
            f"load({str(out)!r})")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": ""})
    assert not (out / "__pycache__").exists()


def test_missing_plugin_pass_is_named_in_one_line(artifact, tmp_path, capsys):
    plugin = tmp_path / "my_plugin.py"
    plugin.write_text("from specc.passes import Pass, PassResult\n\n\nclass NoOp(Pass):\n    name = 'no_op_plugin'\n\n"
                      "    def run(self, ir, ctx):\n        return PassResult(False)\n")
    out = tmp_path / "p.specc"
    result = compile_artifact(str(artifact[2]), out=out, passes=f"fuse_qkv,+{plugin}:NoOp", max_new_tokens=4)
    assert [p["ref"] for p in result.manifest["plugins"]] == [f"{plugin}:NoOp"]
    load(out)
    plugin.unlink()
    with pytest.raises(ArtifactError, match=r"plugin pass \+.*my_plugin.py:NoOp"):
        load(out)
    assert main(["run", str(out), "--input-ids", IDS]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "my_plugin.py" in err


def _chunk(copy: Path, chunk_bytes: int = 4096) -> dict:
    """Give weights.safetensors per-chunk digests (as compile does for files over CHUNK_BYTES)."""
    from specc.codegen.artifact import digests

    f = copy / "weights.safetensors"
    whole, parts = digests(f, chunk_bytes)
    assert len(parts) > 2
    rec = {"chunk_bytes": chunk_bytes, "size": f.stat().st_size, "sha256": parts}
    _rewrite_manifest(copy, lambda m: m.setdefault("file_chunks", {}).update({"weights.safetensors": rec}))
    return rec


def test_large_files_are_checked_by_chunks_every_byte_counts(copy):
    """Chunk digests verify in parallel and still refuse any changed byte, a truncated or grown
    file, and a malformed chunk list."""
    rec = _chunk(copy)
    load(copy, device="cpu", warmup=False)  # intact: loads
    f = copy / "weights.safetensors"
    data = bytearray(f.read_bytes())
    for where in (0, len(data) // 2, len(data) - 1):  # first, a middle and the last chunk
        changed = bytearray(data)
        changed[where] ^= 1
        f.write_bytes(changed)
        with pytest.raises(ArtifactError, match="does not match its manifest hash"):
            load(copy, device="cpu", warmup=False)
    for wrong in (data[:-1], data + b"\0"):
        f.write_bytes(wrong)
        with pytest.raises(ArtifactError, match="bytes, its manifest says"):
            load(copy, device="cpu", warmup=False)
    f.write_bytes(data)
    for bad in ({**rec, "sha256": rec["sha256"][:-1]}, {**rec, "chunk_bytes": 16}, {**rec, "size": "big"}):
        _rewrite_manifest(copy, lambda m, bad=bad: m["file_chunks"].update({"weights.safetensors": bad}))
        with pytest.raises(ArtifactError, match="file_chunks"):
            load(copy, device="cpu", warmup=False)
    _rewrite_manifest(copy, lambda m: m.update(file_chunks={"nope.bin": rec}))
    with pytest.raises(ArtifactError, match="not in 'files'"):
        load(copy, device="cpu", warmup=False)


def test_compile_records_chunks_for_files_over_the_chunk_size(tmp_path, monkeypatch):
    from model_factory import make_hf_model

    import specc.codegen.artifact as artifact_mod

    monkeypatch.setattr(artifact_mod, "CHUNK_BYTES", 4096)
    ckpt = tmp_path / "ckpt"
    make_hf_model("qwen3", seed=0).save_pretrained(ckpt)
    out = tmp_path / "a.specc"
    compile_artifact(str(ckpt), out=out, passes="fuse_qkv", max_new_tokens=2)
    m = json.loads((out / "manifest.json").read_text())
    rec = m["file_chunks"]["weights.safetensors"]
    size = (out / "weights.safetensors").stat().st_size
    assert rec["chunk_bytes"] == 4096 and rec["size"] == size and len(rec["sha256"]) == -(-size // 4096)
    assert m["files"]["weights.safetensors"] == _sha(out / "weights.safetensors")  # the whole-file hash stays
    assert "target.py" not in m["file_chunks"] or len(m["file_chunks"]["target.py"]["sha256"]) > 1
    load(out, device="cpu", warmup=False)
