"""Residual-norm pairs (codegen/residual_norm.py): where a linear_add and the norm_linear after it
both lower to cuBLAS, lowering emits one kernel_abi.linear_add_norm_linear call; the step's
logits stay bit-identical (reference bodies, and the Triton rms_norm kernel with its fused
residual under the interpreter), and the cost model prices one kernel fewer per pair."""

from __future__ import annotations

import pytest
import torch

from specc.bench.shapes import QWEN3_8B, build_causal, tiny
from specc.codegen import residual_norm
from specc.codegen.build import build_step
from specc.codegen.linear_choice import LinearChoice
from specc.passes.pipelines import DEFAULT_PIPELINE
from specc.runtime.compiled import instantiate

CFG = tiny(QWEN3_8B, layers=2)
LAYERS = CFG["num_hidden_layers"]
QKV, O_PROJ, GATE_UP, DOWN, LM_HEAD = (128, 64), (64, 64), (256, 64), (64, 128), (512, 64)
EVERY = [QKV, O_PROJ, GATE_UP, DOWN, LM_HEAD]


@pytest.fixture(scope="module")
def model():
    m = build_causal(CFG, torch.float32, torch.device("cpu"), seed=1)
    m.setup_caches(1, 16)
    return m


def _pair_count(source: str) -> int:
    return source.count("linear_add_norm_linear(")


def test_a_decoder_has_two_pairs_a_layer(model):
    """o_proj -> the MLP's norm, down_proj -> the next layer's q/k/v norm (the last: the LM head's)."""
    step = build_step(model, "target", DEFAULT_PIPELINE)
    found = [(add.name, norm.name) for add, norm in residual_norm.pairs(step.ir.gm.graph)]
    assert found == [("layers_0_self_attn_o_proj_add", "norm_layers_0_mlp_gate_up_proj"),
                     ("layers_0_mlp_down_proj_add", "norm_layers_1_self_attn_qkv_proj"),
                     ("layers_1_self_attn_o_proj_add", "norm_layers_1_mlp_gate_up_proj"),
                     ("layers_1_mlp_down_proj_add", "norm_lm_head")]
    # the down projection's sum is also read for its shape before the norm: the pair's sum serves it
    down = next(n for n in step.ir.gm.graph.nodes if n.name == "layers_0_mlp_down_proj_add")
    assert len(down.users) == 3


@pytest.mark.parametrize("shapes,pairs", [(EVERY, 2 * LAYERS), ([O_PROJ, GATE_UP], LAYERS), ([O_PROJ], 0),
                                          ([DOWN, QKV], LAYERS - 1), ([DOWN, QKV, LM_HEAD], LAYERS)])
def test_pairs_only_where_both_linears_run_cublas(model, shapes, pairs):
    step = build_step(model, "target", DEFAULT_PIPELINE, linear_choice=LinearChoice.forced(shapes, rows=(3, 8)))
    assert _pair_count(step.emitted.source) == pairs
    from specc.codegen.lower import lower

    _, report = lower(step.ir.gm, LinearChoice.forced(shapes, rows=(3, 8)))
    assert report.residual_norm_pairs == pairs
    assert ("residual-norm pairs" in report.summary()) == bool(pairs)


def test_the_switch_turns_pairing_off(model, monkeypatch):
    monkeypatch.setenv("SPECC_RESIDUAL_NORM", "0")
    step = build_step(model, "target", DEFAULT_PIPELINE, linear_choice=LinearChoice.forced(EVERY, rows=(3, 8)))
    assert _pair_count(step.emitted.source) == 0
    assert step.emitted.source.count("cublas_rows = ((3, 8),)") == 4 * LAYERS + 1


def _logits_by_q(step, qs):
    out = {}
    for q in qs:
        ids = torch.randint(0, CFG["vocab_size"], (1, q), generator=torch.Generator().manual_seed(q))
        step.setup_caches(1, 16)
        out[q] = step(ids, torch.arange(q)[None], torch.zeros(1, dtype=torch.long))
    return out


def test_paired_step_runs_the_fused_residual_norm_kernel(model, monkeypatch):
    """With the Triton kernels (interpreter, fp32) the pair's rms_norm kernel adds the residual:
    the logits equal the same table's step with pairing off, bit for bit, at rows in range."""
    from specc.codegen.kernels import rmsnorm

    monkeypatch.setenv("SPECC_KERNELS", "triton")
    table = LinearChoice.forced(EVERY, rows=(3, 4))
    paired = instantiate(build_step(model, "target", DEFAULT_PIPELINE, linear_choice=table).emitted)
    monkeypatch.setenv("SPECC_RESIDUAL_NORM", "0")
    unpaired = instantiate(build_step(model, "target", DEFAULT_PIPELINE, linear_choice=table).emitted)
    calls: list[bool] = []
    real = rmsnorm.rms_norm

    def spying(x, weight, eps, residual=None, sum_out=None):
        calls.append(residual is not None)
        return real(x, weight, eps, residual=residual, sum_out=sum_out)

    monkeypatch.setattr(rmsnorm, "rms_norm", spying)
    want = _logits_by_q(unpaired, [3])[3]
    assert calls and not any(calls)
    calls.clear()
    got = _logits_by_q(paired, [3])[3]
    assert calls.count(True) == 2 * LAYERS  # every pair's norm took the residual
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_cost_model_prices_one_kernel_fewer_a_pair(monkeypatch):
    """h200-bs1 lowers with cuBLAS from 65 rows and has cuBLAS times for Qwen3-8B's shapes: a
    256-row verify step loses one launch a pair (two a layer) and gets cheaper; the AR step (one
    row, the Triton kernels) is priced as before."""
    from real_configs import QWEN3_8B as REAL

    from specc.search.cost_model import CostModel
    from specc.search.meta_pair import MetaPair

    ir = MetaPair({**REAL, "num_hidden_layers": LAYERS}, None, "ar", "bfloat16").irs(DEFAULT_PIPELINE)[0]
    cost = CostModel("h200-bs1")
    big, one = {"B": 16, "Q": 16, "C": 192}, {"B": 1, "Q": 1, "C": 192}
    on = cost.step(ir, big), cost.step(ir, one)
    monkeypatch.setenv("SPECC_RESIDUAL_NORM", "0")
    off = cost.step(ir, big), cost.step(ir, one)
    assert off[0].launches - on[0].launches == 2 * LAYERS
    assert on[0].time < off[0].time
    assert on[1].time == off[1].time and on[1].launches == off[1].launches
    sides = [cost.residual_norm_pair(ir, n, 256) for n in ir.graph.nodes]
    assert sides.count("add") == sides.count("norm") == 0  # the switch is off
    monkeypatch.delenv("SPECC_RESIDUAL_NORM")
    sides = [cost.residual_norm_pair(ir, n, 256) for n in ir.graph.nodes]
    assert sides.count("add") == sides.count("norm") == 2 * LAYERS
    assert not any(cost.residual_norm_pair(ir, n, 64) for n in ir.graph.nodes)  # Triton rows


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_paired_step_is_bit_identical_on_the_gpu(monkeypatch):
    """bf16 on the GPU, the H200's stated rule (cuBLAS from 65 rows): at 128 and 256 rows the
    paired step's logits equal the unpaired step's bit for bit; at 16 rows no pair runs."""
    from specc.codegen.linear_choice import builtin_choice

    m = build_causal(CFG, torch.bfloat16, torch.device("cuda"), seed=1)
    m.setup_caches(1, 16)
    rule = builtin_choice("NVIDIA H200")
    paired_src = build_step(m, "target", DEFAULT_PIPELINE, linear_choice=rule)
    monkeypatch.setenv("SPECC_RESIDUAL_NORM", "0")
    unpaired_src = build_step(m, "target", DEFAULT_PIPELINE, linear_choice=rule)
    assert _pair_count(paired_src.emitted.source) == 2 * LAYERS and _pair_count(unpaired_src.emitted.source) == 0
    steps = [instantiate(s.emitted) for s in (paired_src, unpaired_src)]
    for b, q in ((8, 16), (16, 16), (1, 16)):
        ids = torch.randint(0, CFG["vocab_size"], (b, q), generator=torch.Generator().manual_seed(b), device="cpu").cuda()
        pos = torch.arange(q, device="cuda")[None].expand(b, -1)
        outs = []
        for step in steps:
            step.setup_caches(b, 32)
            outs.append(step(ids, pos, torch.zeros(b, dtype=torch.long, device="cuda")))
        assert torch.equal(outs[0], outs[1]), (b, q)
