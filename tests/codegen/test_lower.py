"""Lowering with a linear choice: cuBLAS exactly in the measured row ranges of the measured shapes,
recorded in the report; without a table nothing changes."""

from __future__ import annotations

import pytest
import torch
from helpers import ancestor_mask

from specc.bench.shapes import QWEN3_8B, build_causal, tiny
from specc.codegen.build import build_step
from specc.codegen.kernels import linear_cublas
from specc.codegen.linear_choice import LinearChoice
from specc.passes.pipelines import DEFAULT_PIPELINE
from specc.runtime.compiled import instantiate

CFG = tiny(QWEN3_8B, layers=2)
# the tiny Qwen3's fused linears (N, K): qkv and gate_up carry the norm prologue (norm_linear),
# o and down the residual add (linear_add), lm_head the final norm
QKV, O_PROJ, GATE_UP, DOWN, LM_HEAD = (128, 64), (64, 64), (256, 64), (64, 128), (512, 64)


@pytest.fixture(scope="module")
def model():
    m = build_causal(CFG, torch.float32, torch.device("cpu"), seed=1)
    m.setup_caches(1, 16)
    return m


def _linear_calls(gm) -> dict[str, dict]:
    return {n.name: dict(n.kwargs) for n in gm.graph.nodes
            if n.op == "call_function" and n.target.__name__ in ("linear", "norm_linear", "linear_add")}


def test_no_table_lowers_as_before(model):
    step = build_step(model, "target", DEFAULT_PIPELINE)
    assert "linear_impl" not in step.lowering
    assert "cublas_rows" not in step.emitted.source


def test_cublas_rows_only_on_measured_shapes(model):
    table = LinearChoice.forced([O_PROJ, GATE_UP], rows=(3, 8))
    step = build_step(model, "target", DEFAULT_PIPELINE, linear_choice=table)
    records = {(r["N"], r["K"]): r for r in step.lowering["linear_impl"]}
    assert set(records) == {O_PROJ, GATE_UP}  # only the shapes the table covers are recorded
    o, gu = records[O_PROJ], records[GATE_UP]
    assert len(o["nodes"]) == len(gu["nodes"]) == CFG["num_hidden_layers"]  # one per layer
    assert [(r["rows"], r["impl"]) for r in o["ranges"]] == [([1, 2], "triton"), ([3, 8], "cublas"),
                                                             ([9, None], "triton")]
    assert step.emitted.source.count("cublas_rows = ((3, 8),)") == 2 * CFG["num_hidden_layers"]  # (norm_)cublas_rows
    # the kernel_abi calls carry the ranges exactly on the chosen nodes
    from specc.codegen.lower import lower

    gm, report = lower(step.ir.gm, table)
    calls = _linear_calls(gm)
    assert not any("cublas_rows" in kw for kw in calls.values())  # the unchosen linears: no ranges
    # each layer's o_proj (linear_add) and gate_up (norm_linear) are both cuBLAS in range: one
    # residual-norm pair call carries both ranges (codegen/residual_norm.py)
    pairs = [dict(n.kwargs) for n in gm.graph.nodes if n.op == "call_function"
             and n.target.__name__ == "linear_add_norm_linear"]
    assert pairs == [{"cublas_rows": ((3, 8),), "norm_cublas_rows": ((3, 8),)}] * CFG["num_hidden_layers"]
    assert report.residual_norm_pairs == CFG["num_hidden_layers"]
    assert report.linear_impl == step.lowering["linear_impl"]


def test_measured_triton_everywhere_is_recorded_without_cublas(model):
    table = LinearChoice.from_measurements(
        [{"impl": impl, "N": 512, "K": 64, "M": m, "seconds": t}
         for m in (1, 16) for impl, t in (("specc", 1.0), ("torch", 1.01))])
    step = build_step(model, "target", DEFAULT_PIPELINE, linear_choice=table)
    (record,) = step.lowering["linear_impl"]
    assert (record["N"], record["K"]) == LM_HEAD and [r["impl"] for r in record["ranges"]] == ["triton"]
    assert record["ranges"][0]["points"][0] == {"M": 1, "impl": "triton", "triton_s": 1.0, "cublas_s": 1.01}
    assert "cublas_rows" not in step.emitted.source


def test_generated_step_calls_cublas_exactly_in_range(model, monkeypatch):
    """Run the emitted step at Q = 1..6 (rows = B x Q): the cuBLAS path runs for rows 3..4 only,
    and the logits equal the step without a table bit for bit, with every residual add paired
    with the norm after it (codegen/residual_norm.py: both linears are cuBLAS in range)."""
    table = LinearChoice.forced([QKV, O_PROJ, GATE_UP, DOWN, LM_HEAD], rows=(3, 4))
    plain = instantiate(build_step(model, "target", DEFAULT_PIPELINE).emitted)
    built = build_step(model, "target", DEFAULT_PIPELINE, linear_choice=table)
    assert built.emitted.source.count("linear_add_norm_linear(") == 2 * CFG["num_hidden_layers"]
    chosen = instantiate(built.emitted)
    seen: list[int] = []
    real = linear_cublas.linear_cublas

    def counting(x, *args, **kwargs):
        seen.append(x.numel() // x.shape[-1])
        return real(x, *args, **kwargs)

    monkeypatch.setattr(linear_cublas, "linear_cublas", counting)
    per_step = 4 * CFG["num_hidden_layers"] + 1  # qkv, o, gate_up, down per layer + lm_head
    for q in range(1, 7):
        seen.clear()
        ids = torch.randint(0, CFG["vocab_size"], (1, q), generator=torch.Generator().manual_seed(q))
        pos = torch.arange(q)[None]
        outs = []
        for step in (plain, chosen):
            step.setup_caches(1, 16)
            outs.append(step(ids, pos, torch.zeros(1, dtype=torch.long)))
        assert seen == ([q] * per_step if 3 <= q <= 4 else []), q
        torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=0)


def test_tree_step_packs_the_mask_once_and_matches_the_model(model):
    """The tree step packs its mask input once (kernel_abi.tree_mask_words) and passes the words to
    every layer's attention; run on CPU (the reference bodies read the unpacked words) it gives the
    model definition's logits for a random tree."""
    step = build_step(model, "target_tree", DEFAULT_PIPELINE)
    src = step.emitted.source
    assert src.count("tree_mask_words(") == 1
    assert src.count("tree_words = ") == CFG["num_hidden_layers"]
    assert step.lowering["lowered"]["tree_mask_words"] == 1
    g = torch.Generator().manual_seed(3)
    num_q = 9
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, num_q)]
    mask = ancestor_mask(parents)[None]
    depth = [0] * num_q
    for i in range(num_q):
        depth[i] = depth[parents[i]] + 1 if parents[i] >= 0 else 0
    ids = torch.randint(0, CFG["vocab_size"], (1, num_q), generator=g)
    pos = 3 + torch.tensor([depth])
    cache_len = torch.tensor([3])
    compiled = instantiate(step.emitted)
    compiled.setup_caches(1, 16)
    model.setup_caches(1, 16)
    got = compiled(ids, pos, cache_len, mask)
    want = model(ids, pos, cache_len, tree_mask=mask)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not torch.equal(got, model(ids, pos, cache_len, tree_mask=torch.tril(torch.ones_like(mask))))


def test_a_row_rule_covers_every_shape(model):
    """A GPU's stated rule (``RowRule``, what a built-in H200 deployment lowers with): every linear
    of every shape gets the same cuBLAS range, recorded per shape."""
    from specc.codegen.linear_choice import builtin_choice

    rule = builtin_choice("NVIDIA H200")
    step = build_step(model, "target", DEFAULT_PIPELINE, linear_choice=rule)
    records = {(r["N"], r["K"]): r for r in step.lowering["linear_impl"]}
    assert set(records) == {QKV, O_PROJ, GATE_UP, DOWN, LM_HEAD}
    assert all([(x["rows"], x["impl"]) for x in r["ranges"]] == [([1, 64], "triton"), ([65, None], "cublas")]
               for r in records.values())
    assert step.emitted.source.count("cublas_rows = ((65, None),)") == 4 * CFG["num_hidden_layers"] + 1
