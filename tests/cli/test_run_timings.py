"""`specc run` reports the one-time work (load) apart from time to first token and steady decode."""

import json

# specc modules that import triton are imported inside the tests: collecting this file must not
# import triton before tests/codegen/kernels/conftest.py sets TRITON_INTERPRET
from specc.cli import main


def test_run_json_separates_load_first_token_and_decode(checkpoints, tmp_path, capsys):
    from specc.compiler import compile_artifact

    out = tmp_path / "t.specc"
    compile_artifact(checkpoints["target"], checkpoints["pard_same"], out=out, max_new_tokens=4)
    capsys.readouterr()
    assert main(["run", str(out), "--input-ids", "5,6,7,8", "--max-new-tokens", "12", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    from specc.cli.compile_cmd import LOAD_PHASES

    phases = got["load_phases_s"]
    assert got["load_seconds"] > 0 and set(phases) == set(LOAD_PHASES)
    assert got["launch"] == "plain"  # programmatic dependent launch is for sm_90+ GPUs
    assert got["step_graphs"] is False  # whole-step graphs are CUDA graphs (none on the CPU)
    # the phases are disjoint and cover the load but for bookkeeping between them
    assert 0 < sum(phases.values()) <= got["load_seconds"]
    assert phases["device_init"] < 0.01  # on a CPU there is no driver context to make
    assert 0 < got["time_to_first_token_s"] and got["decode_tokens_per_s"] > 0
    steps = got["stats"]["steps"]
    assert got["decode_steps"] == steps and abs(got["tokens_per_step"] - (len(got["tokens"]) - 1) / steps) < 1e-9
    assert abs(got["decode_step_s"] * steps - got["decode_seconds"]) < 1e-9
    # decode tokens/s = tokens after the first / time after the first token = tokens per step / step time
    assert abs(got["decode_tokens_per_s"] - got["tokens_per_step"] / got["decode_step_s"]) < 1e-6 * got["decode_tokens_per_s"]
    assert main(["run", str(out), "--input-ids", "5,6,7,8", "--max-new-tokens", "12"]) == 0
    err = capsys.readouterr().err
    assert "one-time" in err and "first token" in err and "steady" in err


def test_load_without_warmup_and_with_progress(checkpoints, tmp_path):
    from specc.compiler import compile_artifact
    from specc.runtime.engine import load

    out = tmp_path / "t.specc"
    compile_artifact(checkpoints["target"], out=out, max_new_tokens=4)
    cold = load(out, warmup=False)
    assert "kernels" not in cold.load_stats and cold.load_stats["read"] > 0
    heard = []
    warm = load(out, progress=lambda msg, s: heard.append((msg, s)))
    assert warm.load_stats["generations"] == 1 and len(heard) == 2
    assert warm.generate([5, 6, 7], 6).tokens == cold.generate([5, 6, 7], 6).tokens


def test_run_profile_sync_and_events(checkpoints, tmp_path, capsys):
    """`--profile` (synchronised) and `--profile events` time the same parts, events adding the
    host's time between steps, and change no token."""
    from specc.compiler import compile_artifact

    out = tmp_path / "t.specc"
    compile_artifact(checkpoints["target"], checkpoints["pard_same"], out=out, max_new_tokens=4)
    capsys.readouterr()
    runs = {}
    for flags in ((), ("--profile",), ("--profile", "events")):
        assert main(["run", str(out), "--input-ids", "5,6,7,8", "--max-new-tokens", "12", "--json", *flags]) == 0
        runs[flags] = json.loads(capsys.readouterr().out)
    tokens = {tuple(r["tokens"]) for r in runs.values()}
    assert len(tokens) == 1
    synced, evented = runs[("--profile",)]["part_seconds"], runs[("--profile", "events")]["part_seconds"]
    assert {"prefill", "draft", "verify", "accept"} <= set(synced) and "between" not in synced
    assert set(evented) == set(synced) | {"between"}
    assert main(["run", str(out), "--input-ids", "5,6,7,8", "--max-new-tokens", "12", "--profile", "events"]) == 0
    assert "time per part (events, not synchronised)" in capsys.readouterr().err
