"""The per-block state audit finds where a hybrid target's GDN state first departs: none between
a compiled step and its model definition, and the first verify block's first GDN buffer when the
step is CUDA-graphed with warm-up calls (the protocol that broke chain forcing on the H200;
``cpu_graphs.CpuGraphedStep`` plays it on the CPU)."""

import pytest
import torch
from cpu_graphs import CpuGraphedStep
from hybrid_factory import random_hybrid_lm

from specc.codegen.build import build_step
from specc.runtime.compiled import instantiate
from specc.runtime.device_loop import DeviceSpeculativeDecoder
from specc.verify.state_audit import block_states, compare_blocks, divergence_line

K = 4


@pytest.fixture(scope="module")
def hybrid():
    model = random_hybrid_lm()
    model.setup_caches(1, 48, max_block=K + 1)
    return model, instantiate(build_step(model, "target", "").emitted)


def _forced(step):
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, 96, (9,), generator=g).tolist()
    tokens = torch.randint(0, 96, (16,), generator=g).tolist()  # blocks of 5, 5, 5
    return block_states(DeviceSpeculativeDecoder(step, None, K, 48), prompt, tokens)


def test_compiled_step_follows_its_model_definition(hybrid):
    model, step = hybrid
    got, ref = _forced(step), _forced(model)
    assert len(got) == 4  # the prefill and three blocks
    names = [n for n in ref[0] if n != "logits"]
    gdn = len(model.config.linear_layers)
    assert len(names) == 2 * gdn and all(n in got[0] for n in names)  # recurrent + conv per GDN layer
    assert float(ref[-1][names[0]].abs().max()) > 0  # the audit sees a live state
    cmp = compare_blocks(got, ref, 1e-4)
    assert cmp["first"] is None, divergence_line("compiled vs model", cmp)
    assert "no divergence" in divergence_line("compiled vs model", cmp)


def test_warmed_up_graphs_diverge_at_the_first_verify_block(hybrid):
    _, step = hybrid
    warmed = CpuGraphedStep(step, max_tokens=K + 1, warmup=2, eager_first=False)
    cmp = compare_blocks(_forced(warmed), _forced(step), 1e-4)
    assert cmp["first"]["block"] == 1 and cmp["first"]["buffer"].startswith("layers_0_linear_attn")
    assert max(cmp["blocks"][0].values()) == 0  # the prefill is not graphed (longer than a block)
    line = divergence_line("warmed vs eager", cmp)
    assert "first divergence at block 1 in layers_0_linear_attn" in line
    assert compare_blocks(_forced(CpuGraphedStep(step, max_tokens=K + 1)), _forced(step), 0)["first"] is None


def test_blocks_must_match():
    with pytest.raises(ValueError, match="2 blocks against 1"):
        compare_blocks([{"logits": torch.zeros(1)}] * 2, [{"logits": torch.zeros(1)}], 0.1)
