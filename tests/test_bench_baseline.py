"""The cuBLAS+SDPA baseline of examples/bench_steps.py computes the model's own function (fp32 CPU):
its timings are of the same step on the same weights."""

import sys
from pathlib import Path

import torch
from model_factory import make_hf_model, save

from specc.models import load_model


def test_baseline_equals_model(tmp_path_factory):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    from bench_steps import CublasBaseline

    path = save(make_hf_model("qwen3", seed=5), tmp_path_factory, "baseline-qwen3")
    model = load_model(path).model
    model.setup_caches(1, 32)
    baseline = CublasBaseline(model, 32)
    ids = torch.tensor([[5, 17, 33, 2, 8, 9]])
    with torch.no_grad():
        want = model(ids, torch.arange(6)[None], torch.tensor([0]))
        got = baseline(ids, torch.arange(6)[None], torch.tensor([0]))
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        step = torch.tensor([[40, 41]])
        want = model(step, torch.arange(6, 8)[None], torch.tensor([6]))
        got = baseline(step, torch.arange(6, 8)[None], torch.tensor([6]))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
