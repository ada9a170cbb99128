"""`specc generate/run --prompts FILE --batch-size N`: JSON lines, one object per prompt in input
order, each equal to that prompt run on its own."""

import json

import pytest

# specc modules that import triton are imported inside the tests (see test_run_timings.py)
from specc.cli import main

PROMPTS = [[5, 17, 33, 2, 8, 9, 41], [7, 3], [11, 4, 60, 2, 8, 31, 17, 5, 70, 44, 12, 3], [9]]


def _lines(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]


def _alone(argv_head, ids, capsys) -> dict:
    assert main(argv_head + ["--input-ids", ",".join(map(str, ids)), "--json"]) == 0
    (got,) = _lines(capsys)
    return got


@pytest.mark.parametrize("drafter_key", ["pard_same", "dflash"])
def test_generate_prompts_batched_equals_one_at_a_time(checkpoints, tmp_path, capsys, drafter_key):
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps(PROMPTS))
    head = ["generate", checkpoints["target"], "--drafter", checkpoints[drafter_key], "--max-new-tokens", "9"]
    assert main(head + ["--prompts", str(path), "--batch-size", "2", "--json"]) == 0
    rows = _lines(capsys)
    assert [r["index"] for r in rows] == [0, 1, 2, 3] and {r["engine"] for r in rows} == {"batched"}
    for ids, row in zip(PROMPTS, rows):
        alone = _alone(head, ids, capsys)  # the stock system, one prompt
        assert row["tokens"] == alone["tokens"] and row["finished_by"] == alone["finished_by"]
        assert row["stats"]["steps"] == len(row["stats"]["accepted_lengths"])
    assert main(head + ["--prompts", str(path), "--json"]) == 0  # no --batch-size: one at a time (stock)
    assert [r["tokens"] for r in _lines(capsys)] == [r["tokens"] for r in rows]


def test_run_prompts_batched_equals_one_at_a_time(checkpoints, tmp_path, capsys):
    from specc.compiler import compile_artifact

    out = tmp_path / "d.specc"
    compile_artifact(checkpoints["target"], checkpoints["dflash"], out=out, max_new_tokens=4)
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(json.dumps(p) for p in [PROMPTS]) + "\n")  # a JSON list, one line
    capsys.readouterr()
    assert main(["run", str(out), "--prompts", str(path), "--batch-size", "3", "--max-new-tokens", "10", "--json"]) == 0
    captured = capsys.readouterr()
    rows = [json.loads(line) for line in captured.out.splitlines()]
    assert "tok/s (batch size 3)" in captured.err
    assert [r["index"] for r in rows] == [0, 1, 2, 3] and rows[0]["batch_size"] == 3
    for ids, row in zip(PROMPTS, rows):
        alone = _alone(["run", str(out), "--max-new-tokens", "10"], ids, capsys)
        assert row["tokens"] == alone["tokens"] and row["finished_by"] == alone["finished_by"]


@pytest.mark.parametrize("extra,message", [
    (["--input-ids", "1,2", "--batch-size", "2"], "--batch-size needs --prompts"),
    (["--prompts", "P", "--batch-size", "0"], "--batch-size must be >= 1"),
    (["--prompts", "P", "--batch-size", "2", "--engine", "stock"], "--engine stock runs one prompt at a time"),
])
def test_generate_batch_flags_refused_in_one_line(checkpoints, tmp_path, capsys, extra, message):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(PROMPTS[:2]))
    argv = ["generate", checkpoints["target"]] + [str(path) if a == "P" else a for a in extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_run_prompts_refuses_stream_and_profile_before_loading(tmp_path, capsys):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(PROMPTS))
    for flag in ("--stream", "--profile"):
        assert main(["run", str(tmp_path / "missing.specc"), "--prompts", str(path), flag]) == 2
        err = capsys.readouterr().err
        assert "take one prompt" in err and len(err.strip().splitlines()) == 1
