"""examples/bench_hybrid_steps.py in a CPU smoke setting (tiny shapes, bf16 through the compiled
steps' torch bodies): the precision probe puts the compiled step within stock's own bf16 noise of
stock, forcing passes with the fp32 audit on and says so (its real run is on a GPU: the command
in its docstring)."""

import importlib.util
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_hybrid_steps", ROOT / "examples" / "bench_hybrid_steps.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_bench_hybrid_steps_forcing_and_precision_smoke(tmp_path, capsys):
    bench = _bench()
    out = tmp_path / "hybrid.json"
    bench.main(["--tiny", "--device", "cpu", "--dtype", "bfloat16", "--skip-steps", "--cases", "chain",
                "--layers", "4", "--tokens", "8", "--out", str(out)])
    res = json.loads(out.read_text())
    forcing = res["forcing"]
    assert res["forcing_passed"] and forcing["chain k=7"]["passed"] and "tree 16 nodes" not in forcing
    assert forcing["layers"] == 4 and forcing["audit"].startswith("fp32 audit: on")
    assert forcing["chain k=7"]["audit"] == forcing["audit"]
    prec = forcing["precision"]
    noise = prec["stock_vs_fp32"]["max_abs"]
    assert noise > 0 and prec["stock_vs_fp32"]["positions"] == 2 * 8
    assert prec["compiled_vs_stock"]["max_abs"] <= 0.5 * noise  # the same roundings as HF's (torch bodies)
    assert prec["compiled_over_stock_error"] < 1.5
    printed = capsys.readouterr().out
    assert "[precision] compiled vs fp32: max |d|" in printed and "x stock's own" in printed


def test_bench_hybrid_steps_state_audit_smoke(tmp_path, capsys):
    """--state-audit in bf16 on the CPU (no graphs there: graphed = eager exactly): every GDN
    layer's recurrent state and conv window compared after the prefill and each block, the
    eager step within bf16 noise of the fp32 model definition but not equal to it."""
    out = tmp_path / "audit.json"
    _bench().main(["--tiny", "--device", "cpu", "--dtype", "bfloat16", "--state-audit", "--prompts", "1",
                   "--tokens", "17", "--out", str(out)])
    audit = json.loads(out.read_text())["state_audit"]
    assert audit["k"] == 7 and not audit["cuda_graphs"] and len(audit["prompts"]) == 1
    pair = audit["prompts"][0]
    blocks = pair["eager_vs_fp32"]["blocks"]
    assert len(blocks) == 3  # the prefill, then blocks of 8 and 8
    assert sum(name.endswith(("recurrent_state", "conv_state")) for name in blocks[0]) == 2 * 3  # 3 GDN layers
    assert pair["graphed_vs_eager"]["first"] is None and all(v == 0 for row in pair["graphed_vs_eager"]["blocks"]
                                                              for v in row.values())
    assert pair["eager_vs_fp32"]["first"] is None and 0 < max(blocks[-1].values()) < 0.1
    assert "[state audit] prompt 0: graphed vs eager: no divergence" in capsys.readouterr().out
