"""GDN step kernels (delta rule with per-node states, conv with its window) against the model
ops they replace: outputs and every state entry, chain and tree, fresh and continuing rows,
a prefill longer than the snapshot capacity; fp32 under the interpreter, bf16 on a GPU."""

from __future__ import annotations

import pytest
import torch

from specc.codegen.kernels import gated_delta as K
from specc.models import gdn

B, HK, HV, DK, DV, CONV_K = 2, 2, 4, 8, 6, 4
SLOTS = 5
TREE = [[-1, 0, 0, 1, 2], [-1, 0, 1, 1, 3]]  # two rows, branching differently


def _state(dev, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    rec = torch.randn(B + 1, 2 + SLOTS, HV, DK, DV, generator=g) * 0.3
    conv = torch.randn(B + 1, 2 + SLOTS, HK * DK * 2 + HV * DV, CONV_K - 1, generator=g)
    return rec.to(dev), conv.to(dtype).to(dev)


def _block(dev, q, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    mixed = torch.randn(B, q, 2 * HK * DK + HV * DV, generator=g).to(dtype).to(dev)
    decay = (-torch.rand(B, q, HV, generator=g) * 2.0).to(dev)
    beta = torch.rand(B, q, HV, generator=g).to(dtype).to(dev)
    weight = (torch.randn(mixed.shape[-1], 1, CONV_K, generator=g) * 0.5).to(dtype).to(dev)
    return mixed, decay, beta, weight


def _parents(kind, q, dev):
    return None if kind == "chain" else torch.tensor(TREE, device=dev)[:, :q]


CASES = [("chain", 1, [3, 4]), ("chain", 5, [3, 0]), ("chain", 9, [7, 2]), ("tree", 5, [6, 0])]


@pytest.mark.parametrize("kind, q, cache_len", CASES)
def test_delta_rule_step_matches_the_model_op(dev, kind, q, cache_len):
    rec, _ = _state(dev, 1)
    mixed, decay, beta, _ = _block(dev, q, 2)
    lens = torch.tensor(cache_len, device=dev)
    parents = _parents(kind, q, dev)
    ref_state = rec.clone().cpu()  # the reference updates it in place (on the GPU, .cpu() would copy)
    ref = gdn.delta_rule_step(mixed.cpu(), decay.cpu(), beta.cpu(), ref_state, lens.cpu(), HK,
                              None if parents is None else parents.cpu())
    out = K.delta_rule_step(mixed, decay, beta, rec, lens, HK, parents)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-5)
    # chunked prefill (q > slots) and the recurrence agree to fp32 rounding only
    torch.testing.assert_close(rec.cpu(), ref_state.cpu(), rtol=1e-4, atol=1e-5)
    if kind == "tree":
        assert not torch.equal(rec[0, 2 + 2], rec[1, 2 + 2])  # node 2 has another parent in each row


@pytest.mark.parametrize("kind, q, cache_len", CASES)
def test_conv_step_matches_the_model_op(dev, kind, q, cache_len):
    _, conv = _state(dev, 3)
    mixed, _, _, weight = _block(dev, q, 4)
    lens = torch.tensor(cache_len, device=dev)
    parents = _parents(kind, q, dev)
    ref_state = conv.clone().cpu()
    ref = gdn.conv_step(mixed.cpu(), ref_state, weight.cpu(), lens.cpu(), None if parents is None else parents.cpu())
    out = K.conv_step(mixed, conv, weight, lens, parents)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(conv.cpu(), ref_state, rtol=0, atol=0)  # windows are copies of inputs


def test_errors(dev):
    rec, conv = _state(dev, 5)
    mixed, decay, beta, weight = _block(dev, 7, 6)
    with pytest.raises(RuntimeError, match="exceeds the GDN state"):
        K.delta_rule_step(mixed, decay, beta, rec, torch.tensor([1, 1], device=dev), HK,
                          torch.tensor([list(range(-1, 6))] * 2, device=dev))
    with pytest.raises(TypeError, match="float32"):
        K.delta_rule_step(mixed, decay, beta, rec.double(), torch.tensor([1, 1], device=dev), HK)
    with pytest.raises(ValueError, match="do not fit"):
        K.conv_step(mixed, conv, weight[:, :, :3], torch.tensor([1, 1], device=dev))


@pytest.mark.gpu
@pytest.mark.parametrize("kind, q, cache_len", CASES)
def test_bf16_gpu(kind, q, cache_len):
    rec, conv = _state("cuda", 7, torch.bfloat16)
    mixed, decay, beta, weight = _block("cuda", q, 8, torch.bfloat16)
    lens = torch.tensor(cache_len, device="cuda")
    parents = _parents(kind, q, "cuda")
    ref_rec, ref_conv = rec.clone(), conv.clone()
    ref_mixed = gdn.conv_step(mixed, ref_conv, weight, lens, parents)
    got_mixed = K.conv_step(mixed, conv, weight, lens, parents)
    assert (got_mixed != ref_mixed).float().mean().item() < 0.005
    torch.testing.assert_close(got_mixed, ref_mixed, rtol=2e-2, atol=2e-2)
    assert torch.equal(conv, ref_conv)
    ref = gdn.delta_rule_step(ref_mixed, decay, beta, ref_rec, lens, HK, parents)
    out = K.delta_rule_step(ref_mixed, decay, beta, rec, lens, HK, parents)
    torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(rec, ref_rec, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind, q, cache_len", [("chain", 5, [3, 0]), ("tree", 5, [6, 0])])
def test_bf16_inputs_match_the_model_op(dev, kind, q, cache_len):
    """bf16 activations and conv window (fp32 state): the kernels widen every load to fp32 and
    round where the reference rounds (the conv: once, after an fp32 sum of its taps), so they
    agree with it (interpreted or compiled)."""
    rec, conv = _state(dev, 9, torch.bfloat16)
    mixed, decay, beta, weight = _block(dev, q, 10, torch.bfloat16)
    lens = torch.tensor(cache_len, device=dev)
    parents = _parents(kind, q, dev)
    ref_rec, ref_conv = rec.clone().cpu(), conv.clone().cpu()
    cpu_parents = None if parents is None else parents.cpu()
    ref_mixed = gdn.conv_step(mixed.cpu(), ref_conv, weight.cpu(), lens.cpu(), cpu_parents)
    got_mixed = K.conv_step(mixed, conv, weight, lens, parents)
    # both sum the taps in fp32 and round once (as F.conv1d): only summation order may differ
    assert (got_mixed.cpu() != ref_mixed).float().mean().item() < 0.005
    torch.testing.assert_close(got_mixed.cpu(), ref_mixed, rtol=2e-2, atol=2e-2)
    assert torch.equal(conv.cpu(), ref_conv)
    ref = gdn.delta_rule_step(ref_mixed, decay.cpu(), beta.cpu(), ref_rec, lens.cpu(), HK, cpu_parents)
    out = K.delta_rule_step(ref_mixed.to(dev), decay, beta, rec, lens, HK, parents)
    assert (out.cpu() != ref).float().mean().item() < 0.05
    torch.testing.assert_close(out.cpu(), ref, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(rec.cpu(), ref_rec, rtol=1e-4, atol=1e-5)
