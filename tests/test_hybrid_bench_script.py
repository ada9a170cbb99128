"""examples/bench_hybrid_steps.py in a CPU smoke setting (tiny shapes, bf16 through the compiled
steps' torch bodies): the precision probe puts the compiled step within stock's own bf16 noise of
stock, forcing passes with the fp32 audit on and says so (its real run is on a GPU: the command
in its docstring)."""

import importlib.util
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_bench_hybrid_steps_forcing_and_precision_smoke(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("bench_hybrid_steps", ROOT / "examples" / "bench_hybrid_steps.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
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
