"""Two ranks on CPU (gloo, 127.0.0.1): token forcing of the sharded target equals the 1-rank run,
for tiny Llama and Qwen3 checkpoints (4 q heads, 2 kv heads), and the bench's CPU smoke path."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from model_factory import make_hf_model, save

import torch.distributed as dist
from specc.parallel import COMPILED_PASSES, tp_forward_check_many

ROOT = Path(__file__).resolve().parents[2]
# (model, how each rank gets its weights): "sharded" = meta model -> shard -> load only its slices
# from the safetensors, then fuse; "full" = whole model on the rank, fuse, then shard
CASES = (("llama", "sharded"), ("qwen3", "sharded"), ("llama_bias", "sharded"), ("llama", "full"), ("qwen3", "full"))
IDS = [f"{m}-{load}" for m, load in CASES]
# this model's greedy continuation repeats one token: force a varied sequence instead
FORCED = {"llama_bias": [24, 68, 51, 56, 91, 12, 30, 7, 88, 3, 45, 19]}

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="needs gloo")


def _model(name: str):
    if name != "llama_bias":
        return make_hf_model(name, seed=0)
    # q/k/v/o and MLP biases: column biases are sliced, row biases added once (by rank 0)
    model = make_hf_model("llama", seed=0, attention_bias=True, mlp_bias=True)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("bias"):
                p.normal_(0, 0.1)
    return model


@pytest.fixture(scope="module")
def checks(tmp_path_factory):
    paths = {name: save(_model(name), tmp_path_factory, f"tp-{name}") for name in dict(CASES)}
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:  # one start of the 2 ranks runs every case
        results = tp_forward_check_many([paths[m] for m, _ in CASES], 2, num_tokens=12, block=4,
                                        tokens=[FORCED.get(m) for m, _ in CASES], load=[load for _, load in CASES])
    finally:
        torch.set_num_threads(before)
    return dict(zip(IDS, results))


@pytest.mark.parametrize("case", IDS)
def test_sharded_forcing_equals_one_rank(checks, case):
    family, load = case.split("-")
    check = checks[case]
    assert check.result.load == load
    print(check.summary())
    assert len(check.reference.tokens) == 12
    assert len(set(check.reference.tokens)) > 3, "forced tokens should vary"
    if family not in FORCED:
        assert check.reference.argmax == check.reference.tokens  # forcing reproduces greedy in fp32
    assert len(check.result.argmax) == 2
    assert check.result.rank_logit_diff[1] <= 1e-5  # replicated lm_head: ranks agree
    for rank_argmax in check.result.argmax:  # every rank, every position
        assert rank_argmax == check.reference.argmax
    assert check.argmax_equal and not check.ties
    assert check.logits_close, f"max |diff| {check.max_abs_diff}"
    assert torch.allclose(check.result.logits, check.reference.logits, atol=1e-4, rtol=1e-4)
    stats = check.result.pass_stats
    assert stats["all_reduce"] == 2 * 4 and stats["world_size"] == 2
    ref_w = check.reference.weights["layer_linear_weight_bytes"]
    for w in check.result.weights:
        assert w["layer_linear_weight_bytes"] * 2 == ref_w
        assert w["all_reduce"] == 8
        assert w["embedding_fingerprint"] == check.reference.weights["embedding_fingerprint"]
    if family == "llama_bias":  # q/k/v and gate/up biases sliced too
        assert stats["weights"] > checks["llama-sharded"].result.pass_stats["weights"]
    assert check.ok
    json.dumps(check.to_json())


@pytest.mark.parametrize("load", ["sharded", "full"])
def test_compiled_sharded_steps_equal_one_rank(tmp_path_factory, load):
    """Each rank runs specc's generated step of its shard (the compiler's default pipeline:
    fuse_rope_attention and fuse_residual_add after sharding, all_reduce calls in the emitted
    code) and token-forces the 1-rank run's tokens to the same argmax."""
    path = save(make_hf_model("qwen3", seed=0), tmp_path_factory, f"tp-compiled-{load}")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        check = tp_forward_check_many([path], 2, num_tokens=12, block=4, passes=COMPILED_PASSES, load=load,
                                      compiled=True)[0]
    finally:
        torch.set_num_threads(before)
    print(check.summary())
    assert check.result.step == "TargetStep"
    assert check.result.pass_stats["all_reduce"] == 8
    assert check.argmax_equal and not check.ties
    assert check.logits_close, f"max |diff| {check.max_abs_diff}"
    assert all(w["all_reduce"] == 8 for w in check.result.weights)


def test_bench_tp_cpu_tiny(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_tp", ROOT / "examples" / "bench_tp.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "tp.json"
    before = torch.get_num_threads()
    try:
        result = bench.main(["--device", "cpu", "--tiny", "--tokens", "8", "--qs", "1,4", "--repeats", "2",
                             "--warmup", "1", "--layers", "2", "--speculative", "3", "--out", str(out)])
    finally:
        torch.set_num_threads(before)
    assert json.loads(out.read_text())["models"].keys() == {"qwen3-8b", "qwen3-32b"}
    for name, m in result["models"].items():
        assert m["forcing"]["tokens_identical"], (name, m["forcing"])
        assert m["forcing"]["positions"] == 8
        assert m["same_weights_everywhere"]
        assert m["weights"]["layer_linear_ratio"] == [0.5, 0.5]
        assert set(m["steps"]) == {"1", "4"}
        assert all(s["tp_ms"] > 0 and s["one_device_ms"] > 0 for s in m["steps"].values())
        assert m["pass_stats"]["all_reduce"] == 4
        assert m["step_class"] == "TargetStep"  # the generated steps ran (--step compiled)
        sp = m["speculative"]  # fp32 on CPU: exactly the 1-device greedy tokens on both ranks
        assert sp["tokens_identical"] and sp["first_difference"] == [None, None], sp
        assert sp["target_all_reduce"] == 4 and len(sp["tokens_per_s"]) == 2


@pytest.mark.parametrize("method", ["ar-draft", "pard"])
def test_speculative_decoding_with_a_sharded_target(tmp_path_factory, method):
    """Each rank compiles its shard of the target and a whole drafter and runs the device loop:
    the tokens equal plain greedy decoding of the 1-rank model on every rank. The drafter is a
    perturbed copy of the target, so drafts are partly rejected (both paths of acceptance run)."""
    from model_factory import perturbed

    from specc.parallel import tp_speculative_check

    target = make_hf_model("qwen3", seed=0)
    extra = {"pard_token": 7} if method == "pard" else None
    drafter = perturbed(target, 0.3, seed=3)
    paths = (save(target, tmp_path_factory, f"tp-spec-target-{method}"),
             save(drafter, tmp_path_factory, f"tp-spec-drafter-{method}", extra_config=extra))
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        check = tp_speculative_check(*paths, 2, max_new_tokens=16, method=method, num_draft=3)
    finally:
        torch.set_num_threads(before)
    res = check["result"]
    print(check["reference"], check["ranks"], check["tau"])
    assert res.target_all_reduce == 8 and len(check["ranks"]) == 2
    assert check["equal"], (check["reference"], check["ranks"])
    assert len(set(check["reference"])) > 3
    assert res.steps[0] < 16  # more than one token per step on average: drafts were accepted
