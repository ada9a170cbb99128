"""specc.codegen.build: one pipeline for every role, or a role's own (``role_pipelines``)."""

import torch

from specc.bench.shapes import build_causal, drafter_config, target_config
from specc.codegen.build import build_steps
from specc.methods import get_method
from specc.passes.pipelines import DEFAULT_PIPELINE


def _pair():
    dev = torch.device("cpu")
    method, dcfg = drafter_config("tiny-qwen3", "pard")
    loaded = get_method(method).bind(build_causal(target_config("tiny-qwen3"), torch.float32, dev, 1),
                                     build_causal(dcfg, torch.float32, dev, 2))
    loaded.target.setup_caches(1, 16)
    loaded.draft.setup_caches(1, 16)
    return loaded


def _ran(built, role):
    return [r["name"] for r in built.pass_records[role]]


def test_a_role_runs_its_own_pipeline():
    loaded = _pair()
    every = build_steps(loaded.target, loaded.draft, DEFAULT_PIPELINE, loaded.draft_spec)
    assert _ran(every, "drafter") == _ran(every, "target") == DEFAULT_PIPELINE.split(",")
    own = build_steps(loaded.target, loaded.draft, DEFAULT_PIPELINE, loaded.draft_spec,
                      role_pipelines={"drafter": "fuse_qkv,dce"})
    assert _ran(own, "target") == DEFAULT_PIPELINE.split(",") and _ran(own, "drafter") == ["fuse_qkv", "dce"]
    # the emitted code follows: the drafter's gate and up projections stay two linears
    assert "gate_up" in every.emitted["drafter"].source and "gate_up" not in own.emitted["drafter"].source
    assert "gate_up" in own.emitted["target"].source
