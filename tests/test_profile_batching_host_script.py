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


def test_profile_batching_host_bs1_phases(tmp_path):
    """``--phases`` at batch 1: graphed steps emulated, the host gaps between the draft, verify
    and acceptance launches per step; with the draft launched ahead (``draft_ahead``) every step
    has all three gaps, and the gap on the critical path (copy_to_draft) is host time only."""
    from examples import profile_batching_host

    out = tmp_path / "bs1.json"
    profile_batching_host.main(["--batches", "1", "--phases", "--requests", "2", "--prompt-min", "20",
                                "--prompt-max", "30", "--tokens-min", "24", "--tokens-max", "32", "--repeat", "1",
                                "--out", str(out)])
    run = json.loads(out.read_text())
    row = run["rows"][0]
    assert run["phases"] and row["batch"] == 1 and row["decode_steps"] > 2
    for phase in ("copy_to_draft_ms", "draft_to_verify_ms", "verify_to_accept_ms"):
        assert 0 < row[phase] < row["step_ms"]
    assert row["copy_to_draft_ms"] + row["draft_to_verify_ms"] + row["verify_to_accept_ms"] < row["step_ms"]
    assert row["audit_forwards_per_step"] == 2.0 and row["audit_host_reads_per_step"] == 1.0


def test_profile_batching_host_bs1_whole_step_graphs(tmp_path):
    """``--phases --step-graphs``: batch-1 steps as whole-step graphs (a CPU stand-in) launched
    ahead; the critical gap is from reading a step's result to the next launch, and every decode
    step but each request's first is a whole step."""
    from examples import profile_batching_host

    out = tmp_path / "bs1-steps.json"
    profile_batching_host.main(["--batches", "1", "--phases", "--step-graphs", "--requests", "2", "--prompt-min",
                                "20", "--prompt-max", "30", "--tokens-min", "24", "--tokens-max", "32", "--repeat", "1",
                                "--out", str(out)])
    row = json.loads(out.read_text())["rows"][0]
    assert row["whole_steps"] >= row["decode_steps"] - 2 * 2 > 0
    assert row["host_critical_ms"] == row["result_to_step_ms"] and 0 < row["result_to_step_ms"] < row["step_ms"]
    assert row["audit_forwards_per_step"] == 2.0 and row["audit_host_reads_per_step"] == 1.0


def test_phase_clock_sums_the_gaps_between_launches():
    from examples.profile_batching_host import PhaseClock

    clock = PhaseClock()
    for role in ("draft", "verify", "accept", "draft", "verify", "accept"):
        clock.enter(role)
        clock.leave(role)
    assert clock.counts == {"copy_to_draft": 1, "draft_to_verify": 2, "verify_to_accept": 2, "result_to_step": 0}
    clock.boundary()  # an admission: the next draft's gap is no step's
    clock.enter("draft")
    assert clock.counts["copy_to_draft"] == 1
    clock.counting = False  # a prefill's calls count in no gap
    clock.enter("verify")
    clock.leave("verify")
    clock.counting = True
    clock.enter("accept")
    assert clock.counts["verify_to_accept"] == 2 and all(s >= 0 for s in clock.seconds.values())
