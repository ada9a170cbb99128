"""`specc tp`: token forcing and speculative decoding with a sharded target on 2 gloo ranks,
from the command line; bad input is a one-line error with exit status 2."""

import json

import pytest
import torch
import torch.distributed as dist

from specc.cli import main

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="needs gloo")


def _run(capsys, *argv):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        code = main(list(argv))
    finally:
        torch.set_num_threads(before)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("compiled", [False, True])
def test_forcing(checkpoints, capsys, compiled):
    argv = ["tp", checkpoints["target"], "--world", "2", "--tokens", "8", "--json"] + (["--compiled"] if compiled else [])
    code, out, _ = _run(capsys, *argv)
    res = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and res["ok"] and res["mode"] == "forcing"
    assert res["mismatches"] == [] and len(res["argmax"]) == 2 and len(res["reference_argmax"]) == 8
    assert (res["step"] == "TargetStep") == compiled  # generated code, or the traced IR's GraphModule
    assert res["pass_stats"]["all_reduce"] == 2 * 4


@pytest.mark.parametrize("drafter,method", [("pard_same", "pard"), ("dflash", "dflash")])
def test_speculative(checkpoints, capsys, drafter, method):
    code, out, _ = _run(capsys, "tp", checkpoints["target"], "--drafter", checkpoints[drafter], "--world", "2",
                        "--tokens", "10", "--json")
    res = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and res["ok"] and res["method"] == method
    assert res["ranks"] == [res["reference"], res["reference"]] and len(res["reference"]) == 10
    assert res["target_all_reduce"] == 8


@pytest.mark.parametrize("case,fragment", [
    ("world1", "--world must be >= 2"),
    ("world3", "not divisible by --world 3"),
    ("heads", "not divisible by --world 4"),
    ("missing", "nope"),
])
def test_bad_input(checkpoints, tmp_path, capsys, case, fragment):
    t = checkpoints["target"]
    argv = {"world1": ["tp", t, "--world", "1"], "world3": ["tp", t, "--world", "3"],
            "heads": ["tp", t, "--world", "4"], "missing": ["tp", str(tmp_path / "nope")]}[case]
    code, _, err = _run(capsys, *argv)
    assert code == 2 and fragment in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("specc: error: ")
