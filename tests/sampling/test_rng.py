"""The counter-based RNG: a pure function of (seed, position, draw), uniform, and the inverse-CDF
draw that never picks a token of mass 0."""

import pytest
import torch

from specc.sampling import rng


def _chi2_uniform(u, bins=64):
    counts = torch.histc(u.double(), bins=bins, min=0, max=1)
    expected = u.numel() / bins
    return float(((counts - expected) ** 2 / expected).sum())


def test_pure_function_of_its_counters():
    seeds = torch.tensor([0, 1, 2 ** 40 + 5])
    pos = torch.arange(6)[None].expand(3, 6)
    a, b = rng.uniform(seeds, pos, rng.TARGET), rng.uniform(seeds, pos, rng.TARGET)
    assert torch.equal(a, b)
    alone = rng.uniform(seeds[1:2], pos[1:2], rng.TARGET)  # a row's numbers do not depend on its batch
    assert torch.equal(alone[0], a[1])
    assert not torch.equal(rng.uniform(seeds, pos, rng.ACCEPT), a)
    assert a.min() >= 0 and a.max() < 1 and a.dtype == torch.float32


def test_uniform_and_decorrelated():
    """64-bin chi-square (63 dof: 1e-6 quantile ~ 140) over seeds, positions and draws, and no
    correlation between neighbouring positions or seeds."""
    seeds = torch.arange(2000)
    pos = torch.arange(50)[None].expand(2000, 50)
    for draw in (rng.DRAFT, rng.ACCEPT, rng.TARGET):
        u = rng.uniform(seeds, pos, draw)
        assert _chi2_uniform(u.flatten()) < 140
        x = u - 0.5
        assert abs(float((x[:, 1:] * x[:, :-1]).mean())) < 0.005  # positions
        assert abs(float((x[1:] * x[:-1]).mean())) < 0.005  # seeds
    v = rng.uniform(seeds, pos, rng.DRAFT) - 0.5
    assert abs(float((v * (rng.uniform(seeds, pos, rng.ACCEPT) - 0.5)).mean())) < 0.005  # draws


def test_sample_inverse_cdf():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]]).expand(4, 5)
    u = torch.tensor([0.0, 0.49, 0.5, 0.9999999])
    assert rng.sample(probs, u).tolist() == [1, 1, 3, 3]
    # frequencies follow the distribution; zero-mass tokens never come out
    p = torch.tensor([0.1, 0.0, 0.6, 0.3])
    u = rng.uniform(torch.arange(20000), torch.zeros(20000, dtype=torch.long), rng.TARGET)
    counts = torch.bincount(rng.sample(p.expand(20000, 4), u), minlength=4).double() / 20000
    assert counts[1] == 0 and torch.allclose(counts, p.double(), atol=0.015)


def _sequential_draw(probs, u):
    """The definition with one float64 running sum per row (what ``sample`` computed before it
    searched chunks): the first token whose cumulative mass exceeds u * total."""
    cdf = probs.double().cumsum(-1)
    index = (cdf <= u.double()[..., None] * cdf[..., -1:]).sum(-1)
    return index.clamp(max=probs.shape[-1] - 1)


@pytest.mark.parametrize("vocab", [151936, 4097, 60])
def test_sample_equals_one_running_sum(vocab):
    """The chunked exact draw picks the token a single float64 scan picks, on peaked and flat
    rows, with zero-mass tokens and rows, tiny masses and unnormalised rows."""
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(24, vocab, generator=g) * torch.tensor([0.5, 3.0, 8.0]).repeat(8)[:, None]
    logits[:, ::5] = float("-inf")
    probs = logits.softmax(-1)
    probs[3] = 0  # a row of total 0: its last token
    probs[4] *= 1e-30  # unnormalised
    probs[5] = 0
    probs[5, vocab // 2] = 1e-38
    u = torch.rand(24, generator=g)
    u[:2] = torch.tensor([0.0, 1 - 2 ** -24])
    drawn = rng.sample(probs, u)
    assert torch.equal(drawn, _sequential_draw(probs, u))
    mass = probs.gather(1, drawn[:, None])[:, 0]
    assert (mass > 0).sum() == 23 and drawn[3] == vocab - 1  # only the zero row lands on a zero
    # many uniforms on one row: every decision agrees (a boundary off by a rounding would show)
    n = 4000 if vocab < 5000 else 200
    row = probs[1].expand(n, vocab)
    many = rng.uniform(torch.arange(n), torch.zeros(n, dtype=torch.long), rng.TARGET)
    assert torch.equal(rng.sample(row, many), _sequential_draw(row, many))


def test_sample_is_per_row_and_leaves_its_input():
    g = torch.Generator().manual_seed(5)
    probs = torch.rand(3, 4, 2048, generator=g, dtype=torch.float64)
    kept = probs.clone()
    u = torch.rand(3, 4, generator=g)
    batched = rng.sample(probs, u)
    assert torch.equal(probs, kept)  # float64 input: not scaled in place
    for b in range(3):
        assert torch.equal(rng.sample(probs[b], u[b]), batched[b])
        assert torch.equal(rng.sample(probs[b, 1:2], u[b, 1:2]), batched[b, 1:2])
