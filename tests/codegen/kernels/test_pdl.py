"""Programmatic dependent launch switches (``specc.codegen.kernels.pdl``): the mode parsed from
``SPECC_PDL``, and launches on CPU tensors never asking for PDL. That PDL kernels compile for
sm_90 with griddepcontrol is checked by compile_sm90.py; that they compute the same bits and
time faster on the H200, by examples/bench_pdl.py (docs/benchmarks/h200-run12.md)."""

from __future__ import annotations

import pytest
import torch

from specc.codegen.kernels import pdl as _pdl


@pytest.mark.parametrize("raw, mode", [("0", 0), ("off", 0), ("1", 1), ("wait", 1), ("2", 2), ("on", 2),
                                       ("first-tile", 2), (" ON ", 2)])
def test_mode_from_env(monkeypatch, raw, mode):
    monkeypatch.setenv("SPECC_PDL", raw)
    assert _pdl._mode_from_env() == mode


def test_default_mode_is_first_tile(monkeypatch):
    monkeypatch.delenv("SPECC_PDL", raising=False)
    assert _pdl._mode_from_env() == 2
    assert _pdl.PDL_MODES[2] == "first tile"


@pytest.mark.parametrize("raw", ["3", "prefetch", "-1", "maybe"])
def test_bad_mode_is_an_error_that_lists_the_choices(monkeypatch, raw):
    monkeypatch.setenv("SPECC_PDL", raw)
    with pytest.raises(ValueError, match="SPECC_PDL") as e:
        _pdl._mode_from_env()
    assert "first tile" in str(e.value)


def test_cpu_launches_never_use_pdl(monkeypatch):
    monkeypatch.setattr(_pdl, "PDL_MODE", 2)
    t = torch.zeros(2)
    assert _pdl.pdl_mode(t) == 0
    assert _pdl.pdl_args(t, "silu_mul") == {"PDL": 0}
    assert _pdl.pdl_launch(0) == {}
    assert _pdl.pdl_launch(2) == {"launch_pdl": True}


def test_skip_names_kernel_families(monkeypatch):
    monkeypatch.setenv("SPECC_PDL_SKIP", "attention, linear_dot")
    assert _pdl._skip_from_env() == {"attention", "linear_dot"}
    monkeypatch.setenv("SPECC_PDL_SKIP", "attention,gemm")
    with pytest.raises(ValueError, match="gemm"):
        _pdl._skip_from_env()
    monkeypatch.delenv("SPECC_PDL_SKIP")
    assert _pdl._skip_from_env() == frozenset()


def test_every_launcher_names_a_known_family():
    """A family typo in a launcher would never be skippable: every name used is declared."""
    import pathlib
    import re

    used = set()
    for f in pathlib.Path(_pdl.__file__).parent.glob("*.py"):
        text = f.read_text()
        used |= set(re.findall(r'pdl_args\([^,()]+, "(\w+)"\)', text))
        used |= set(re.findall(r'pdl_mode\([^,()]+, "(\w+)"\)', text))
    assert used and used <= set(_pdl.PDL_FAMILIES), used - set(_pdl.PDL_FAMILIES)
    assert {"linear", "linear_dot", "attention"} <= used


def test_mode_off_is_off_everywhere(monkeypatch):
    monkeypatch.setattr(_pdl, "PDL_MODE", 0)
    assert _pdl.pdl_mode(torch.zeros(1)) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_pdl_linear_gives_the_same_bits_on_gpu(monkeypatch):
    """Every mode computes the same values: PDL only moves when a kernel starts."""
    from specc.codegen.kernels import linear as L

    def inputs(m, n, k):
        g = torch.Generator(device="cuda").manual_seed(m * n + k)
        x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
        w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).bfloat16()
        return x, w, (torch.rand(k, device="cuda", generator=g) + 0.5).bfloat16()

    outs = {}
    for mode in (0, 1, 2):
        monkeypatch.setattr(_pdl, "PDL_MODE", mode)
        for m, n, k in ((1, 4096, 4096), (1, 640, 4000), (16, 4096, 4096)):
            x, w, nw = inputs(m, n, k)
            outs.setdefault((m, n, k), []).append(L.linear(x, w, None, nw))
    for key, ys in outs.items():
        assert all(torch.equal(ys[0], y) for y in ys[1:]), key


def test_launch_mode_for_reports(monkeypatch):
    assert _pdl.launch_mode("cpu") == "plain"
    monkeypatch.setattr(_pdl, "pdl_mode", lambda device, family=None: 2)
    assert _pdl.launch_mode("cuda") == "pdl 2 (first tile)"
    monkeypatch.setattr(_pdl, "PDL_SKIP", frozenset({"attention", "linear_dot"}))
    assert _pdl.launch_mode("cuda") == "pdl 2 (first tile, plain: attention, linear_dot)"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("target, drafter, budget", [("specc-tiny", "specc-tiny-dflash", 16),
                                                     ("specc-tiny-hybrid", "specc-tiny-hybrid-dflash", 0),
                                                     ("specc-tiny-hybrid", "specc-tiny-hybrid-dflash", 16)])
def test_pdl_loops_give_the_same_tokens_on_gpu(monkeypatch, target, drafter, budget):
    """Whole speculative loops of compiled steps under CUDA graphs give the same tokens with PDL off
    and on, alone and in a batch: the kernels beyond the plain step's (the tree steps' beam, cache
    compaction and acceptance; a hybrid target's Gated DeltaNet kernels) wait like the others."""
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "examples"))
    import bench_tree as B
    from specc.models.loading import ZOO_DIR
    from specc.pairing import resolve_pair

    if not all((ZOO_DIR / name / "config.json").is_file() for name in (target, drafter)):
        pytest.skip(f"{target} / {drafter} not in the zoo here")
    pair = resolve_pair(target, drafter, "dflash")
    prompts = [list(range(20, 52)), list(range(60, 70)), list(range(5, 45))]
    runs = []
    for mode in (0, 2):
        monkeypatch.setattr(_pdl, "PDL_MODE", mode)  # steps compiled and graphs captured in the mode
        steps, section = B.compiled_tree_steps(pair, torch.bfloat16, "cuda")
        loop = B.compiled_tree_system(steps, section, pair.impl.strategy, budget, 256)
        runs.append([loop.generate(p, 32, ()).tokens for p in prompts]
                    + [r.tokens for r in loop.generate_batch(prompts, 32, ())])
    assert runs[0] == runs[1]
