"""The counter-based RNG: a pure function of (seed, position, draw), uniform, and the inverse-CDF
draw that never picks a token of mass 0."""

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
