"""The compiled ragged verify step (role ``target_ragged``): the same logits and the same cache
contents as the model definition's ragged forward (fp32, CPU), for qwen3 and llama targets; the
emitted class says ``ragged_rows``; under the Triton interpreter the generated step drives the
ragged kernels. (The artifact round trip: tests/test_compile_ragged.py.)"""

from __future__ import annotations

import pytest
import torch

from specc.codegen.build import ROLE_CLASS, build_step
from specc.models.registry import load_model
from specc.passes.pipelines import DEFAULT_PIPELINE
from specc.runtime.compiled import instantiate

SLOTS, CAP = 4, 48


def _target(path):
    model = load_model(path, torch.float32, with_tokenizer=False).model
    model.setup_caches(SLOTS, CAP)
    return model


def _fill(step_caches, seed=0):
    g = torch.Generator().manual_seed(seed)
    for t in step_caches:
        t.copy_(torch.randn(t.shape, generator=g))


def _cache_names(module):
    return [spec.name for spec in module.state_specs()]


def _model_caches(model):
    return [t for layer in model.layers for t in (layer.self_attn.cache_k, layer.self_attn.cache_v)]


def _block(counts, slots, lens, vocab, seed=1):
    g = torch.Generator().manual_seed(seed)
    total = sum(counts)
    ids = torch.randint(0, vocab, (1, total), generator=g)
    positions = torch.cat([base + torch.arange(n) for n, base in zip(counts, lens)])[None]
    starts = torch.tensor([0] + torch.tensor(counts).cumsum(0).tolist())
    return ids, positions, torch.tensor(lens), torch.tensor(slots), starts


# (tokens per row, slots, cache lengths): a mix with an empty row and a one-token row; all slots
MIXES = [([3, 0, 1, 5], [2, 0, 3, 1], [4, 7, 0, 9]), ([2, 2, 2, 2], [0, 1, 2, 3], [10, 3, 25, 0])]


@pytest.mark.parametrize("mix", range(len(MIXES)))
def test_compiled_ragged_step_equals_definition(checkpoints, mix):
    model = _target(checkpoints["target"])
    built = build_step(model, "target_ragged", DEFAULT_PIPELINE)
    assert built.ir.step == "ragged_verify" and built.lowering["lowered"]["ragged_attention"] == model.config.num_layers
    assert f"class {ROLE_CLASS['target_ragged']}(CompiledStep):\n    ragged_rows = True" in built.emitted.source
    assert "row_slots" in built.emitted.inputs and "row_starts" in built.emitted.inputs
    applied = {r.name for r in built.report.records if r.changed}
    assert {"fuse_qkv", "fuse_gate_up", "fuse_norm_linear"} <= applied  # the linears fuse as in verify
    step = instantiate(built.emitted)
    assert step.ragged_rows is True
    step.setup_caches(SLOTS, CAP)
    _fill(_model_caches(model))
    for name, t in zip(_cache_names(step), _model_caches(model)):  # same committed caches
        getattr(step, name).copy_(t)
    counts, slots, lens = MIXES[mix]
    args = _block(counts, slots, lens, model.config.vocab_size, seed=mix)
    before = [t.clone() for t in _model_caches(model)]
    with torch.no_grad():
        want = model(*args[:3], row_slots=args[3], row_starts=args[4])
        got = step(*args)
    assert got.shape == want.shape == (1, sum(counts), model.config.vocab_size)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    for name, ref, old in zip(_cache_names(step), _model_caches(model), before):
        torch.testing.assert_close(getattr(step, name), ref, rtol=1e-6, atol=1e-6)
        for r, n in enumerate(counts):  # rows without tokens: their slot is untouched
            if n == 0:
                assert torch.equal(getattr(step, name)[slots[r]], old[slots[r]])


_TRITON_SCRIPT = r"""
import sys

import torch

from specc.codegen.build import build_step
from specc.codegen.kernels import ragged_attention as RA
from specc.models.registry import load_model
from specc.passes.pipelines import DEFAULT_PIPELINE
from specc.runtime.compiled import instantiate

calls = []
kernel = RA.ragged_attention
RA.ragged_attention = lambda *a, **kw: calls.append(1) or kernel(*a, **kw)
model = load_model(sys.argv[1], torch.float32, with_tokenizer=False).model
model.setup_caches(3, 32)
step = instantiate(build_step(model, "target_ragged", DEFAULT_PIPELINE).emitted)
step.setup_caches(3, 32)
g = torch.Generator().manual_seed(0)
for spec, t in zip(step.state_specs(), [t for l in model.layers for t in (l.self_attn.cache_k, l.self_attn.cache_v)]):
    t.copy_(torch.randn(t.shape, generator=g))
    getattr(step, spec.name).copy_(t)
ids = torch.randint(0, model.config.vocab_size, (1, 5), generator=g)
args = (ids, torch.tensor([[7, 8, 9, 3, 4]]), torch.tensor([7, 0, 3]), torch.tensor([2, 0, 1]), torch.tensor([0, 3, 3, 5]))
with torch.no_grad():
    want = model(*args[:3], row_slots=args[3], row_starts=args[4])
    got = step(*args)
torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
assert len(calls) == model.config.num_layers, calls
print("ragged kernels ran", len(calls))
"""


def test_generated_ragged_step_drives_the_triton_kernels(checkpoints, tmp_path):
    """Under the interpreter with the kernel ABI opted in to Triton (a subprocess: the mode is
    fixed at triton's import), the generated step runs the ragged kernels on the fused q/k/v
    views and still equals the definition."""
    import os
    import pathlib
    import subprocess
    import sys

    if "qwen3" not in checkpoints["target"]:
        return  # one family is enough: the kernels are the same
    root = pathlib.Path(__file__).resolve().parents[2]
    env = dict(os.environ, SPECC_KERNELS="triton", TRITON_INTERPRET="1", SPECC_THREADS="1",
               PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", _TRITON_SCRIPT, checkpoints["target"]], env=env, cwd=root,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "ragged kernels ran" in proc.stdout
