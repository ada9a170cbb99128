"""Speculative sampling under CUDA graphs (GPU only): compiled specc-tiny steps in the engine's
loop; a seed reproduces a run, chain and tree.

Alone vs as a row of a batch: equal only where the logits are the same bits. By default the
kernels pick their configurations from the launch's row count, so a row's logits differ from its
logits alone in the last bits and a draw near a boundary can flip (docs/sampling.md); with
batch-invariant kernels (``SPECC_BATCH_INVARIANT``, ``specc.codegen.kernels.batch_invariant``)
they are equal, and so are the tokens: the batch assertions run in that mode."""

from __future__ import annotations

import sys
import pathlib

import pytest
import torch

from specc.codegen.kernels.batch_invariant import batch_invariant
from specc.sampling.params import SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))


@pytest.mark.parametrize("budget", [0, 16])
def test_seeded_sampling_reproduces_under_graphs(budget):
    import bench_tree as B
    from specc.pairing import resolve_pair

    pair = resolve_pair("specc-tiny", "specc-tiny-dflash", "dflash")
    prompt = list(range(20, 52))
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=7)
    for invariant in (False, True):
        with batch_invariant(invariant):  # steps compiled and graphs captured in the mode
            steps, section = B.compiled_tree_steps(pair, torch.bfloat16, "cuda")
            loop = B.compiled_tree_system(steps, section, pair.impl.strategy, budget, 256)
            first = loop.generate(prompt, 48, (), params).tokens
            again = loop.generate(prompt, 48, (), params).tokens
            assert first == again and len(first) == 48
            rows = loop.generate_batch([prompt] * 3, 48, (), params, seeds=[7, 8, 7])
            assert rows[0].tokens == rows[2].tokens  # two rows of one batch: the same bits
            assert [r.tokens for r in loop.generate_batch([prompt] * 3, 48, (), params, seeds=[7, 8, 7])] == \
                [r.tokens for r in rows]
            if invariant:
                assert rows[0].tokens == first
            greedy = loop.generate(prompt, 48, ()).tokens
            assert greedy == loop.generate(prompt, 48, (), SamplingParams(temperature=0.0)).tokens


@pytest.mark.parametrize("budget", [0, 16])
def test_mixed_params_batch_equals_each_alone_under_graphs(budget):
    """Greedy and differently sampled requests in one batch of compiled steps (CUDA graphs), with
    batch-invariant kernels: each gives its tokens alone."""
    import bench_tree as B
    from specc.pairing import resolve_pair

    pair = resolve_pair("specc-tiny", "specc-tiny-dflash", "dflash")
    with batch_invariant():
        _check_mixed_batch(B, pair, budget)


def _check_mixed_batch(B, pair, budget):
    steps, section = B.compiled_tree_steps(pair, torch.bfloat16, "cuda")
    loop = B.compiled_tree_system(steps, section, pair.impl.strategy, budget, 256)
    prompts = [list(range(20, 52)), list(range(60, 70)), list(range(20, 52)), list(range(5, 45))]
    mixed = [SamplingParams(temperature=0.8, top_p=0.95, seed=7), None,
             SamplingParams(temperature=1.1, top_k=40, repetition_penalty=1.1, seed=8),
             SamplingParams(temperature=0.6, min_p=0.05, seed=9)]
    batched = loop.generate_batch(prompts, 48, (), mixed, batch_size=3)
    for prompt, params, got in zip(prompts, mixed, batched):
        assert got.tokens == loop.generate(prompt, 48, (), params).tokens
