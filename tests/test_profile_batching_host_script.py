"""examples/profile_batching_host.py: the batched step's host time on the CPU. Its smoke run
writes one row per B with the step audit beside the timing, and shows the property the script
is there to watch: requests joining a running batch draft in the batch's one drafting forward
(two forwards per decode step: the draft and the verify)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def test_profile_batching_host_cpu_smoke(tmp_path):
    from examples import profile_batching_host

    out = tmp_path / "host.json"
    profile_batching_host.main(["--batches", "3", "--requests", "7", "--prompt-min", "20", "--prompt-max", "40",
                                "--tokens-min", "4", "--tokens-max", "12", "--repeat", "1", "--out", str(out)])
    run = json.loads(out.read_text())
    assert run["drafter_shapes"] == "dflash-b16" and len(run["rows"]) == 1
    row = run["rows"][0]
    assert row["batch"] == 3 and row["requests"] == 7 and row["joins"] == 7
    assert row["decode_steps"] > 0 and row["step_ms"] > 0
    assert 0 < row["host_ms_per_step"] < row["step_ms"] and row["forward_ms_per_step"] > 0
    assert row["audit_forwards_per_step"] == 2.0  # joining rows drafted in the batch, none alone
    assert row["audit_host_reads_per_step"] == 1.0 and row["audit_blocking_uploads_per_step"] == 0.0
    assert row["audit_glue_ops_per_step"] > 0
