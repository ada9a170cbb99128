"""pack_weights_12bit: fires on bf16 linears, keeps outputs bit-identical, cuts weight bytes,
and survives compile + token forcing on a bf16 deployment."""

import json

import pytest
import torch

from specc.ir import trace
from specc.models import load_model
from specc.passes.pack_weights_12bit import DEFAULT_PACK_VERSION
from specc.passes import PassManager


def _ir(path, dtype=torch.bfloat16):
    model = load_model(path, dtype=dtype).model
    model.setup_caches(1, 32)
    return trace(model, "verify")


def test_pack_fires_and_outputs_are_identical(checkpoints):
    ir = _ir(checkpoints["target"])
    inputs = ir.example_inputs({"B": 1, "Q": 5, "C": 0})
    before_bytes = ir.totals().evaluate({"B": 1, "Q": 1, "C": 0})["weight_bytes"]
    with torch.no_grad():
        ir.reset_caches()
        want = ir(*inputs)
        report = PassManager("fuse_qkv,fuse_gate_up,fuse_norm_linear,pack_weights_12bit,dce").run(ir)
        ir.reset_caches()
        got = ir(*inputs)
    stats = report.stats("pack_weights_12bit")
    assert stats["packed"] == ir.count("packed_linear") > 0
    assert ir.count("linear") == 0 and ir.count("norm_linear") == 0
    assert torch.equal(want, got)
    after_bytes = ir.totals().evaluate({"B": 1, "Q": 1, "C": 0})["weight_bytes"]
    assert after_bytes < before_bytes
    assert stats["bytes_after"] < 0.78 * stats["bytes_before"]  # 1.5 B/weight + bases + escapes


def test_pack_versions_agree_and_are_recorded(checkpoints):
    """Every bf12 layout (pack_version 1, 2, and 3: the default, layout 2 where a weight's shape
    does not tile) gives the unpacked outputs exactly; each packed_linear call carries its layout
    version and the stats record the requested one and the count per layout."""
    from specc.formats.bf12 import tileable
    from specc.passes import PassContext
    from specc.passes.pack_weights_12bit import PackWeights12bit

    outs, versions = [], []
    for version in (None, 1, 2, 3):
        ir = _ir(checkpoints["target"])
        inputs = ir.example_inputs({"B": 1, "Q": 3, "C": 0})
        with torch.no_grad():
            ir.reset_caches()
            want = ir(*inputs)
            opts = {} if version is None else {"pack_version": version}
            result = PackWeights12bit().run(ir, PassContext(options=opts))
            ir.reset_caches()
            outs.append((want, ir(*inputs)))
        calls = [n for n in ir.graph.nodes if n.op == "call_function" and "packed_linear" in str(n.target)]
        got = {n.kwargs["version"] for n in calls}
        requested = result.stats["format_version"]
        assert calls and got == {int(v) for v in result.stats["format_versions"]}
        if requested == 3:  # tiles where the weight's shape allows, layout 2 elsewhere
            for n in calls:
                shape = (n.args[6], n.args[7])
                assert n.kwargs["version"] == (3 if tileable(shape) else 2)
        else:
            assert got == {requested}
        versions.append(requested)
    assert versions == [DEFAULT_PACK_VERSION, 1, 2, 3] and DEFAULT_PACK_VERSION == 3
    for want, got in outs:
        assert torch.equal(want, got)


def test_layout_for_tiles_where_the_shape_allows():
    """The pass's per-weight layout (also what ``specc calibrate`` packs): 3 by default, 2 where
    the weight is not whole 16-row blocks of 64-weight tiles, the requested one otherwise."""
    from specc.passes.pack_weights_12bit import layout_for

    assert DEFAULT_PACK_VERSION == 3
    assert layout_for((4096, 4096)) == 3 and layout_for((151936, 4096)) == 3 and layout_for((48, 100)) == 3
    assert layout_for((40, 4096)) == 2 and layout_for((64, 96)) == 2  # 40 rows; Kp = 96
    assert layout_for((40, 4096), 3) == 2 and layout_for((4096, 4096), 2) == 2 and layout_for((40, 4096), 1) == 1


def test_pack_rejects_unknown_version(checkpoints):
    from specc.passes import PassContext
    from specc.passes.pack_weights_12bit import PackWeights12bit

    ir = _ir(checkpoints["target"])
    with pytest.raises(ValueError, match="pack_version"):
        PackWeights12bit().run(ir, PassContext(options={"pack_version": 4}))


def test_pack_subset_by_name(checkpoints):
    ir = _ir(checkpoints["target"])
    from specc.passes import PassContext
    from specc.passes.pack_weights_12bit import PackWeights12bit

    PassManager("fuse_gate_up").run(ir)
    ctx = PassContext(options={"pack_include": ["mlp"]})
    pack = PackWeights12bit()
    result = pack.run(ir, ctx)
    assert result.stats["packed"] == 2 * 4  # gate_up + down in each of 4 layers
    assert ir.count("linear") > 0
    assert pack.ensures(ir) is True  # the postcondition checks the selection it was given


def test_pack_skips_fp32(checkpoints):
    ir = _ir(checkpoints["target"], torch.float32)
    reason = __import__("specc.passes.pack_weights_12bit", fromlist=["x"]).PackWeights12bit().requires(ir)
    assert isinstance(reason, str) and "bfloat16" in reason


def test_compile_with_pack_on_bf16_cpu_deployment(checkpoints, tmp_path):
    from specc.compiler import compile_artifact
    from specc.runtime.engine import load

    dep = tmp_path / "cpu-bf16.json"
    dep.write_text(json.dumps({"base": "cpu", "name": "cpu-bf16", "dtype": "bfloat16"}))
    out = tmp_path / "packed.specc"
    result = compile_artifact(checkpoints["target"], checkpoints["pard_same"], deployment=str(dep), out=out,
                              passes="fuse_qkv,fuse_gate_up,fuse_norm_linear,pack_weights_12bit,fuse_residual_add,dce",
                              max_new_tokens=12)
    applied = {r["name"]: r for r in result.manifest["passes"]["applied"]["target"]}
    assert applied["pack_weights_12bit"]["changed"]
    assert applied["pack_weights_12bit"]["stats"]["format_version"] == DEFAULT_PACK_VERSION
    assert result.manifest["lowering"]["target"]["lowered"].get("packed_linear", 0) > 0
    assert applied["fuse_residual_add"]["stats"]["adds"] > 0  # folded into packed linears (their residual)
    verification = result.manifest["verification"]
    assert verification["passed"]  # bf16 vs HF eager: ties (margin < tolerance) are reported, none failed
    assert all(t["margin"] < verification["tolerance"] for t in verification["ties"])
    # Packing is exact: the packed engine's logits equal an unpacked bf16 engine's, bit for bit.
    plain = tmp_path / "plain.specc"
    compile_artifact(checkpoints["target"], checkpoints["pard_same"], deployment=str(dep), out=plain,
                     passes="fuse_qkv,fuse_gate_up,fuse_norm_linear,fuse_residual_add,dce", max_new_tokens=12)
    a, b = load(out), load(plain)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    pos = torch.arange(5)[None]
    for engine in (a, b):
        engine.steps["target"].setup_caches(1, 16)
    logits_a = a.steps["target"](ids, pos, torch.tensor([0]))
    logits_b = b.steps["target"](ids, pos, torch.tensor([0]))
    assert torch.equal(logits_a, logits_b)
