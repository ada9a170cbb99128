"""`specc run` reports the one-time work (load) apart from time to first token and steady decode."""

import json

from specc.cli import main
from specc.compiler import compile_artifact
from specc.runtime.engine import load


def test_run_json_separates_load_first_token_and_decode(checkpoints, tmp_path, capsys):
    out = tmp_path / "t.specc"
    compile_artifact(checkpoints["target"], checkpoints["pard_same"], out=out, max_new_tokens=4)
    capsys.readouterr()
    assert main(["run", str(out), "--input-ids", "5,6,7,8", "--max-new-tokens", "12", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["load_seconds"] > 0 and set(got["load_phases_s"]) == {"read", "kernels", "graphs"}
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
    out = tmp_path / "t.specc"
    compile_artifact(checkpoints["target"], out=out, max_new_tokens=4)
    cold = load(out, warmup=False)
    assert "kernels" not in cold.load_stats and cold.load_stats["read"] > 0
    heard = []
    warm = load(out, progress=lambda msg, s: heard.append((msg, s)))
    assert warm.load_stats["generations"] == 1 and len(heard) == 2
    assert warm.generate([5, 6, 7], 6).tokens == cold.generate([5, 6, 7], 6).tokens
