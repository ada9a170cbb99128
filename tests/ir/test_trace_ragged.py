"""The ragged_verify step of CausalLM targets: its inputs and symbols (T packed tokens of R rows,
C cached per row), ragged attention in every layer, example inputs that are a valid packed block,
and costs in T, R and C that agree with the dense verify step at equal rows."""

from __future__ import annotations

import pytest
import torch

from specc.ir import IRError, evaluate
from specc.ir.trace import trace
from specc.models.registry import load_model


def _target(path):
    model = load_model(path, torch.float32, with_tokenizer=False).model
    model.setup_caches(4, 48)
    return model


def test_ragged_verify_is_a_causal_lm_step(checkpoints):
    model = _target(checkpoints["target"])
    ir = trace(model, "ragged_verify")
    assert [s.name for s in ir.inputs] == ["input_ids", "positions", "cache_len", "row_slots", "row_starts"]
    assert [str(s) for s in ir.symbols] == ["C", "T", "R"]
    assert ir.count("ragged_attention") == model.config.num_layers and not ir.count("attention")
    # dense steps keep no trace of the descriptor
    assert not trace(model, "verify").count("ragged_attention")
    with pytest.raises(IRError, match="only a CausalLM target has the ragged_verify step"):
        trace(object(), "ragged_verify")
    # the example inputs are a valid packed block: rows of T / R tokens, positions from C in each
    inputs = ir.example_inputs({"T": 6, "R": 3, "C": 5})
    assert inputs[4].tolist() == [0, 2, 4, 6] and inputs[1].tolist() == [[5, 6, 5, 6, 5, 6]]


def test_ragged_cost_grows_with_rows_and_context(checkpoints):
    """Costs from T, R and C: at the same T, more rows read more cache (R * C positions) and
    score fewer in-block keys; the dense verify of B rows of Q tokens equals R = B, T = B * Q."""
    model = _target(checkpoints["target"])
    ragged, dense = trace(model, "ragged_verify").totals(), trace(model, "verify").totals()
    at = lambda e, **v: evaluate(e, v)  # noqa: E731
    assert at(ragged.cache_read, T=16, R=4, C=100) > at(ragged.cache_read, T=16, R=2, C=100)
    assert at(ragged.cache_read, T=16, R=4, C=200) > at(ragged.cache_read, T=16, R=4, C=100)
    assert at(ragged.cache_read, T=8, R=2, C=100) == at(dense.cache_read, B=2, Q=4, C=100)
    assert at(ragged.cache_written, T=8, R=2, C=100) == at(dense.cache_written, B=2, Q=4, C=100)
    assert at(ragged.weight_bytes, T=8, R=2, C=0) == at(dense.weight_bytes, B=2, Q=4, C=0)


def test_specc_ir_prints_the_ragged_step(checkpoints, capsys):
    import json

    from specc.cli import main

    assert main(["ir", checkpoints["target"], "--step", "ragged_verify", "--json", "-T", "12", "-R", "3",
                 "--after", "fuse_qkv"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["step"] == "ragged_verify" and d["values"]["T"] == 12 and d["values"]["R"] == 3
    assert "ragged_attention" in {n["kind"] for n in d["nodes"]}
    assert main(["ir", checkpoints["target"], "--step", "verify", "-T", "12"]) == 2
    assert "--packed-tokens and --rows size the ragged_verify step only" in capsys.readouterr().err
