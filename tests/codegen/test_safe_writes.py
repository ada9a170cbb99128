"""Safe writes (issue 14, finding 3): `-o` checked before compiling and only an artifact replaced,
one compile per output path at a time, stale temporaries cleaned up; search memory and calibration
files written under a lock with a unique temp file, so concurrent writers lose nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from specc.cli import main
from specc.codegen.artifact import ArtifactError, is_specc_artifact
from specc.compiler import compile_artifact
from specc.errors import UserError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from model_factory import make_hf_model, save

    return str(save(make_hf_model("qwen3", seed=0), tmp_path_factory, "safe-target"))


@pytest.fixture
def no_loading(monkeypatch):
    """Fail the test if the compile gets as far as loading a model."""
    import specc.models.registry as registry

    def boom(*a, **k):
        raise AssertionError("compiled before validating -o")

    monkeypatch.setattr(registry, "load_model", boom)


def _one_line_error(capsys, fragment):
    err = capsys.readouterr().err
    assert err.startswith("specc: error:") and err.count("\n") == 1 and "Traceback" not in err, err
    assert fragment in err, err


def test_refuses_a_directory_with_a_foreign_manifest_before_compiling(ckpt, tmp_path, capsys, no_loading):
    precious = tmp_path / "project"
    precious.mkdir()
    (precious / "manifest.json").write_text('{"name": "my web app"}')
    (precious / "data.csv").write_text("1,2,3\n")
    assert main(["compile", ckpt, "-o", str(precious)]) == 2
    _one_line_error(capsys, "not a specc artifact")
    assert sorted(p.name for p in precious.iterdir()) == ["data.csv", "manifest.json"]
    with pytest.raises(ArtifactError):
        compile_artifact(ckpt, out=precious)


@pytest.mark.parametrize("case", ["file", "no-parent", "readonly-parent"])
def test_bad_output_paths_fail_before_compiling(ckpt, tmp_path, capsys, no_loading, case):
    out = tmp_path / "x.specc"
    if case == "file":
        out.write_text("keep me")
        fragment = "not a directory"
    elif case == "no-parent":
        out = tmp_path / "missing" / "x.specc"
        fragment = "no such directory"
    else:
        if os.geteuid() == 0:
            pytest.skip("root ignores directory permissions")
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        out = ro / "x.specc"
        fragment = "not writable"
    assert main(["compile", ckpt, "-o", str(out)]) == 2
    _one_line_error(capsys, fragment)
    if case == "file":
        assert out.read_text() == "keep me"


def test_replaces_an_artifact_and_cleans_stale_temporaries(ckpt, tmp_path):
    out = tmp_path / "a.specc"
    compile_artifact(ckpt, out=out, passes="", max_new_tokens=3)
    first = json.loads((out / "manifest.json").read_text())["created"]
    assert is_specc_artifact(out)
    # what a killed compile leaves behind
    (tmp_path / ".a.specc.tmp-12345").mkdir()
    (tmp_path / ".a.specc.tmp-12345" / "weights.safetensors").write_bytes(b"x" * 100)
    (tmp_path / ".a.specc.old-999").mkdir()
    (tmp_path / ".other.specc.tmp-1").mkdir()  # another output's: not ours to remove
    compile_artifact(ckpt, out=out, passes="fuse_qkv", max_new_tokens=3)
    assert is_specc_artifact(out) and json.loads((out / "manifest.json").read_text())["passes"]["pipeline"] == "fuse_qkv"
    assert first
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == [".other.specc.tmp-1", "a.specc"], left


def test_two_compiles_to_one_path_do_not_race(ckpt, tmp_path):
    out = tmp_path / "race.specc"
    code = ("import sys; from specc.cli import main; "
            f"sys.exit(main(['compile', {ckpt!r}, '-o', {str(out)!r}, '--passes', sys.argv[1], '--verify-tokens', '3']))")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "SPECC_MEMORY_DIR": str(tmp_path / "mem")}
    procs = [subprocess.Popen([sys.executable, "-c", code, p], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for p in ("fuse_qkv", "fuse_gate_up")]
    results = [p.communicate(timeout=300) + (p.returncode,) for p in procs]
    assert all(r[2] == 0 for r in results), results
    assert is_specc_artifact(out)
    from specc.runtime.engine import load

    load(out)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "mem") == ["race.specc"]


def test_concurrent_memory_writers_lose_nothing(tmp_path):
    from specc.search.memory import Memory, MemoryEntry

    path = tmp_path / "qwen3__cpu.json"
    errors = []

    def writer(w):
        try:
            for i in range(15):
                mem = Memory.open("qwen3", "cpu", path)  # each search loads, adds, saves
                mem.add(MemoryEntry("fuse", {"writer": w, "i": i}, validated=True))
                mem.record_acceptance("m", "d", "pard", w * 100 + i, _Acc())
                mem.save()
        except Exception as exc:  # noqa: BLE001
            errors.append(repr(exc))

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    final = Memory.load(path)
    assert sorted((e.parameters["writer"], e.parameters["i"]) for e in final) == [(w, i) for w in range(3) for i in range(15)]
    assert len(final.acceptance) == 45
    assert not [p.name for p in tmp_path.iterdir() if ".tmp" in p.name or ".lock" in p.name]


class _Acc:
    def to_json(self):
        return {"alphas": [0.5], "source": "test"}


def test_calibration_writes_are_atomic_under_concurrency(tmp_path):
    from specc.search.calibrate import Calibration, record_path, write_calibration
    from specc.search.deployments import BUILTIN

    dep = BUILTIN["cpu"]
    path = tmp_path / "dep.json"
    cal = Calibration(deployment=dep.name, device="cpu", kind_efficiency={"linear": {"bandwidth": 0.5}},
                      linear_flops_by_m={i: 0.5 for i in range(1, 400)})
    write_calibration(path, dep, cal)
    stop, errors = threading.Event(), []

    def reader():
        while not stop.is_set():
            for p in (path, record_path(path)):
                try:
                    json.loads(p.read_text())
                except (ValueError, OSError) as exc:
                    errors.append(f"{p.name}: {exc!r}")

    def writer():
        try:
            for _ in range(40):
                write_calibration(path, dep, cal)
        except Exception as exc:  # noqa: BLE001
            errors.append(repr(exc))

    r = threading.Thread(target=reader)
    r.start()
    ws = [threading.Thread(target=writer) for _ in range(2)]
    for w in ws:
        w.start()
    for w in ws:
        w.join()
    stop.set()
    r.join()
    assert not errors, errors[:3]
    assert not [p.name for p in tmp_path.iterdir() if ".tmp" in p.name or ".lock" in p.name]


def test_write_calibration_refuses_a_directory(tmp_path):
    from specc.search.calibrate import Calibration, write_calibration
    from specc.search.deployments import BUILTIN

    (tmp_path / "d.json").mkdir()
    with pytest.raises(UserError):
        write_calibration(tmp_path / "d.json", BUILTIN["cpu"], Calibration(deployment="cpu", device="cpu"))
