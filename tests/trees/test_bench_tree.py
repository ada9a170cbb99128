"""examples/bench_tree.py runs in its CPU smoke mode (tiny shapes, one prompt) and writes its JSON."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_bench_tree_smoke(tmp_path):
    out = tmp_path / "tree.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("TRITON_INTERPRET", None)  # the reference bodies on CPU: a smoke run, not a kernel test
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "bench_tree.py"), "--tiny", "--device", "cpu",
                           "--out", str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert {r["budget"] for r in result["acceptance"]} == {0, 8}
    assert all(r["lossless_vs_chain"] for r in result["acceptance"] + result["e2e"])
    assert [r["q"] for r in result["steps"]["rows"]] == [4, 8]


def test_bench_tree_e2e_8b_tiny_check(tmp_path):
    """The H200 --e2e-8b path end to end at tiny shapes on the CPU: AR, chain and a tree, replayed
    acceptance (the default: DFlash's published tau + specc-tiny's measured rank split)."""
    from specc.bench.acceptance import parse_tree_acceptance

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "bench_tree.py"), "--e2e-8b", "--tiny-check",
                           "--budgets", "16", "--new-tokens", "10", "--kernels", "--out-dir", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "tree-e2e-8b.json").read_text())
    assert result["num_draft"] == 15 and result["ar"]["tokens_per_step"] == 1.0 and result["ar"]["tokens_per_s"] > 0
    assert result["ar"]["profile"]["part_ms_per_step"]["verify"] > 0
    assert result["ar"]["step_graphs"]["tokens_per_s"] > 0 and result["ar"]["step_graphs"]["speedup_vs_ar"] > 0
    assert [run["spec"].split("+")[0] for run in result["runs"]] == ["dflash-qwen3-8b:gsm8k", "dflash-qwen3-8b:mt-bench"]
    for run in result["runs"]:
        rows = {r["system"]: r for r in run["rows"]}
        assert set(rows) == {"chain", "chain, draft ahead", "chain, step graphs", "tree 16", "tree 16, step graphs"}
        assert rows["tree 16, step graphs"]["tokens_per_step"] == rows["tree 16"]["tokens_per_step"]
        # drafting ahead launches the same drafts earlier, whole-step graphs run the same step (on the
        # CPU: unfused, no CUDA graphs): the same replayed acceptance, step for step
        assert rows["chain, draft ahead"]["draft_ahead"] and not rows["chain"]["draft_ahead"]
        assert rows["chain, step graphs"]["step_graphs"] and not rows["chain"]["step_graphs"]
        for variant in ("chain, draft ahead", "chain, step graphs"):
            assert rows[variant]["tokens_per_step"] == rows["chain"]["tokens_per_step"]
        assert rows["chain, step graphs"]["graphs"] is None
        assert "tiny-dflash-ranks.json" in run["spec"] and "assumed" in run["tree_source"]
        model = parse_tree_acceptance(run["spec"], 15)
        assert rows["tree 16"]["predicted"]["tokens_per_step"] == model.expected_tokens(16, 15)
        assert rows["chain"]["predicted"]["tokens_per_step"] == pytest.approx(model.chain_expected_tokens(15))
        # the profiled pass after the timed one: ms per step by part (a tree step splits plan and commit off)
        assert {"draft", "verify", "accept"} <= set(rows["chain"]["profile"]["part_ms_per_step"])
        assert {"draft", "plan", "verify", "accept", "commit"} == set(rows["tree 16"]["profile"]["part_ms_per_step"])
        assert rows["chain"]["profile"]["graphs"] == {}  # nothing is graphed on the CPU
        # the unsynchronised profile (EventTimer): the same parts plus the host's time between steps
        assert set(rows["tree 16"]["profile"]["device_part_ms_per_step"]) == {
            "draft", "plan", "verify", "accept", "commit", "between"}
        # --kernels: host ops per step on the CPU (kernels on a GPU), largest first
        kernels = rows["tree 16"]["kernels"]
        assert kernels["what"] == "cpu_op" and kernels["launches_per_step"] > 0 and kernels["top"]
        assert [r["us_per_step"] for r in kernels["top"]] == sorted((r["us_per_step"] for r in kernels["top"]),
                                                                     reverse=True)
        for r in rows.values():
            assert r["profile"]["steps"] >= 1 and all(ms >= 0 for ms in r["profile"]["part_ms_per_step"].values())
            assert r["tokens_per_s"] > 0 and r["tokens_per_step"] >= 1.0
            # the prefills' time apart: each prompt's, and the steps' without it
            assert r["prefill_ms"] > 0 and 0 < r["decode_step_ms"] < r["step_ms"]
            assert r["decode_step_ms"] * r["steps"] + r["prefill_ms"] * result["prompts"] == \
                pytest.approx(1e3 * r["seconds"])
            assert r["speedup_vs_chain"]["predicted"] > 0 and r["speedup_vs_ar"]["measured"] > 0


def test_bench_tree_hybrid_pair_smoke(tmp_path):
    """``--pair hybrid``: the acceptance part on the shipped specc-tiny-hybrid + its DFlash drafter
    (one prompt, 8 tokens, chain and a tree of 8): every run equals the chain and AR greedy."""
    from specc.models.loading import ZOO_DIR

    if not (ZOO_DIR / "specc-tiny-hybrid" / "config.json").is_file():
        pytest.skip("hybrid zoo models not shipped")
    out = tmp_path / "tree.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "bench_tree.py"), "--tiny", "--device", "cpu",
                           "--pair", "hybrid", "--parts", "acceptance", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["target"] == "specc-tiny-hybrid"
    rows = result["acceptance"]
    assert [(r["drafter"], r["budget"]) for r in rows] == [("specc-tiny-hybrid-dflash", 0), ("specc-tiny-hybrid-dflash", 8)]
    assert all(r["lossless_vs_chain"] and r["lossless_vs_ar"] and r["tau"] >= 1.0 for r in rows)


def test_bench_tree_pair_refuses_other_parts():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "bench_tree.py"), "--pair", "hybrid",
                           "--parts", "acceptance,e2e"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--parts acceptance" in proc.stderr


def test_acceptance_failures_say_where_tokens_part():
    """A tree that parts from its chain is fatal in any dtype; a run that parts from AR greedy is
    fatal in fp32 and only reported in bf16; the message names the prompt and token."""
    sys.path.insert(0, str(ROOT / "examples"))
    import torch

    import bench_tree as B

    chain, ar = [[5, 6, 7], [1, 2]], [[5, 6, 7], [1, 2]]
    tree = [[5, 6, 7], [1, 3]]
    diff = B._first_difference(tree, chain)
    assert diff == {"prompt": 1, "token": 1, "got": 3, "want": 2, "differing_prompts": 1}
    assert B._first_difference(chain, ar) is None
    row = {"target": "t", "method": "dflash", "budget": 15, "lossless_vs_chain": False, "lossless_vs_ar": False,
           "first_difference_vs_chain": diff, "first_difference_vs_ar": diff}
    fp32 = B.acceptance_failures([row], torch.float32)
    assert len(fp32) == 2 and all("t dflash tree 15" in m and "'token': 1" in m for m in fp32)
    assert B.acceptance_failures([row], torch.bfloat16) == fp32[:1]
    assert B.acceptance_failures([dict(row, lossless_vs_chain=True, lossless_vs_ar=True)], torch.float32) == []
