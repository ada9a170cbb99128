"""The compiled engine samples: ``specc.load(...).generate(temperature=...)`` (compiled steps
return logits; the loop samples), equal token for token to the eager reference loop running the
same policy on the model definitions, greedy at temperature 0, and reachable from the CLI
(`specc run` / `specc generate` sampling flags, echoed in the JSON)."""

from __future__ import annotations

import json

import pytest
from helpers import PROMPT, hf_greedy, hf_model

from specc.cli import main
from specc.compiler import compile_artifact
from specc.pairing import resolve_pair
from specc.runtime.eager import build_eager
from specc.runtime.engine import load
from specc.sampling import SamplingParams

IDS = ",".join(map(str, PROMPT))


@pytest.fixture(scope="module")
def artifact(checkpoints, tmp_path_factory):
    if "qwen3" not in checkpoints["target"]:
        pytest.skip("one family is enough for the plumbing")
    out = tmp_path_factory.mktemp("sampling") / "tree.specc"
    compile_artifact(checkpoints["target"], checkpoints["pard_same"], out=out, max_new_tokens=8, tree=4)
    return out


def test_compiled_engine_samples_like_the_eager_loop(checkpoints, artifact):
    engine = load(artifact)
    assert engine.loop.tree_budget == 4
    eager = build_eager(resolve_pair(checkpoints["target"], checkpoints["pard_same"], "pard"), engine.num_draft,
                        max_len=len(PROMPT) + 16, tree_budget=4)
    for seed in range(3):
        params = SamplingParams(temperature=0.8, top_p=0.95, repetition_penalty=1.1, seed=seed)
        got = engine.generate(PROMPT, 16, eos_token_id=(), temperature=0.8, top_p=0.95, repetition_penalty=1.1,
                              seed=seed)
        assert got.tokens == eager.generate(PROMPT, 16, (), params).tokens
        assert list(engine.stream(PROMPT, 16, (), sampling=params)) == got.tokens
    runs = {tuple(engine.generate(PROMPT, 16, eos_token_id=(), temperature=1.0, seed=s).tokens) for s in range(4)}
    assert len(runs) > 1
    greedy = hf_greedy(hf_model(checkpoints["target"]), PROMPT, 16)
    assert engine.generate(PROMPT, 16, eos_token_id=(), temperature=0.0, seed=5).tokens == greedy
    assert engine.generate(PROMPT, 16, eos_token_id=()).tokens == greedy
    with pytest.raises(ValueError, match="top_p"):
        engine.generate(PROMPT, 4, temperature=1.0, top_p=0.0)


def test_cli_sampling_flags(checkpoints, artifact, capsys):
    flags = ["--temperature", "0.8", "--top-p", "0.95", "--top-k", "40", "--seed", "2"]
    assert main(["run", str(artifact), "--input-ids", IDS, "--max-new-tokens", "12", "--json", *flags]) == 0
    ran = json.loads(capsys.readouterr().out)
    assert ran["sampling"] == {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.0,
                               "repetition_penalty": 1.0, "seed": 2}
    engine = load(artifact)
    expect = engine.generate(PROMPT, 12, temperature=0.8, top_p=0.95, top_k=40, seed=2).tokens
    assert ran["tokens"] == expect
    assert main(["generate", checkpoints["target"], "--drafter", checkpoints["pard_same"], "--engine", "eager",
                 "--input-ids", IDS, "--max-new-tokens", "12", "--json", *flags]) == 0
    eager = json.loads(capsys.readouterr().out)
    assert eager["sampling"]["seed"] == 2 and (len(eager["tokens"]) == 12 or eager["finished_by"] == "eos")
    assert main(["generate", checkpoints["target"], "--input-ids", IDS, "--max-new-tokens", "12", "--json",
                 "--temperature", "0"]) == 0
    assert json.loads(capsys.readouterr().out)["sampling"] == {"temperature": 0.0}
    assert main(["run", str(artifact), "--input-ids", IDS, "--seed", "-3", "--temperature", "1"]) == 2
    assert "--seed" in capsys.readouterr().err
