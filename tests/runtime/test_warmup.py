"""Warm start: kernel cache keyed by the artifact, one-time work up front and timed per phase."""

import json
import os

from helpers import PROMPT

from specc.pairing import resolve_pair
from specc.runtime import warmup
from specc.runtime.engine import build_loop
from specc.runtime.eager import build_eager


def test_kernel_cache_dir_is_keyed_by_the_artifact(tmp_path, monkeypatch):
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.delenv("_SPECC_SET_TRITON_CACHE", raising=False)
    monkeypatch.setenv("SPECC_KERNEL_CACHE", str(tmp_path / "kc"))
    live = []
    monkeypatch.setattr(warmup, "_point_live_triton", live.append)  # leave this session's triton alone
    dirs = []
    for name in ("a", "b", "a"):
        art = tmp_path / name
        art.mkdir(exist_ok=True)
        (art / "manifest.json").write_text(json.dumps({"name": name}))
        dirs.append(warmup.kernel_cache_dir(art))
        assert os.environ["TRITON_CACHE_DIR"] == dirs[-1] and os.path.isdir(dirs[-1])
    assert dirs[0] == dirs[2] != dirs[1] and dirs[0].startswith(str(tmp_path / "kc")) and live == dirs
    monkeypatch.setenv("TRITON_CACHE_DIR", "/mine")  # the user's choice is kept
    monkeypatch.delenv("_SPECC_SET_TRITON_CACHE")
    assert warmup.kernel_cache_dir(tmp_path / "a") is None and os.environ["TRITON_CACHE_DIR"] == "/mine"


def test_warm_up_runs_the_loop_once_on_cpu(checkpoints):
    eager = build_eager(resolve_pair(checkpoints["target"], checkpoints["dflash"], "dflash"), 3, max_len=64)
    loop = build_loop({"target": eager.target, "drafter": eager.drafter.drafter}, "dflash", 3, 64)
    heard = []
    stats = warmup.warm_up(loop, 64, prompt_len=8, progress=lambda msg, s: heard.append(msg))
    assert stats["generations"] == 1 and stats["kernels"] > 0 and stats["graphs"] >= 0 and heard
    assert loop.generate(PROMPT, 8, ()).tokens == eager.generate(PROMPT, 8, ()).tokens


def test_warm_up_counts_and_resets_the_loops_own_graphed_functions():
    """The chain's accept + commit and the tree's functions are graphed by the loop itself, made at
    their first call: warm_up counts their captures and starts their replay counts at zero."""
    from types import SimpleNamespace

    from specc.runtime.graphs import GraphedStep
    from specc.runtime.warmup import warm_up

    chain, plan = GraphedStep(lambda x: x), GraphedStep(lambda x: x)
    chain.graphs[("k",)] = object()  # one captured shape each
    plan.graphs[("k",)] = object()
    chain.replays, plan.eager_calls = 5, 2

    def generate(prompt, new, eos):
        loop._chain_graph, loop._tree_graphs = chain, {"plan": plan, "accept": lambda *a: a}

    from specc.runtime.device_loop import DeviceSpeculativeDecoder

    loop = SimpleNamespace(num_draft=0, max_len=64, steps={}, generate=generate,
                           graphed_functions=lambda: DeviceSpeculativeDecoder.graphed_functions(loop))
    stats = warm_up(loop, vocab_size=50)
    assert stats["generations"] == 1 and stats["graphs_captured"] == 2
    assert chain.replays == chain.eager_calls == plan.replays == plan.eager_calls == 0


def test_prefill_lengths_reach_every_row_bucket_edge():
    lengths = warmup.prefill_lengths(40, skip=16)
    assert lengths == [1, 2, 3, 4, 5, 7, 8, 9, 15, 17, 31, 32, 33]
    # every bucket a prompt of at most 40 tokens can fall into is met at its edge, both ways
    for b in (16, 32):
        assert {b - 1, b + 1} <= set(lengths) | {16}
    assert max(warmup.prefill_lengths(1000)) == 257 and warmup.prefill_lengths(0) == []


def test_warm_up_on_cuda_also_prefills_each_bucket_edge(monkeypatch):
    """On CUDA the kernels phase runs a short generation per length of ``prefill_lengths`` (eager,
    no graphs), so the user's first prompt of a new length compiles nothing."""
    from types import SimpleNamespace

    import torch

    from specc.runtime.graphs import GraphedStep

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    step = GraphedStep(SimpleNamespace(device=torch.device("cuda")))
    seen = []

    def generate(prompt, new, eos):
        seen.append((len(prompt), new, step.max_tokens))

    loop = SimpleNamespace(num_draft=3, max_len=80, steps={"target": step}, generate=generate)
    stats = warmup.warm_up(loop, vocab_size=50, prompt_len=12)
    eager = [n for n, new, limit in seen if limit == -1]  # the kernels phase: graphs bypassed
    assert eager[0] == 12 and sorted(eager[1:]) == warmup.prefill_lengths(40, skip=12)
    assert all(new == 2 for n, new, limit in seen[1:len(eager)])
    assert [n for n, new, limit in seen if limit != -1] == [12]  # one graphed pass, as before
    assert stats["generations"] == len(seen)


def test_prefill_sweep_runs_once_per_kernel_cache(monkeypatch, tmp_path):
    """The sweep's kernels stay compiled in the artifact's kernel cache: a later load with the
    same cache directory skips it (a second load stays fast)."""
    from types import SimpleNamespace

    import torch

    from specc.runtime.graphs import GraphedStep

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    step = GraphedStep(SimpleNamespace(device=torch.device("cuda")))
    seen = []
    loop = SimpleNamespace(num_draft=0, max_len=40, steps={"target": step},
                           generate=lambda prompt, new, eos: seen.append(len(prompt)))
    first = warmup.warm_up(loop, vocab_size=50, prompt_len=4, cache_dir=str(tmp_path))
    assert (tmp_path / warmup.prefills_marker("cuda")).is_file()
    assert first["generations"] == 2 + len(warmup.prefill_lengths(20, skip=4))
    seen.clear()
    second = warmup.warm_up(loop, vocab_size=50, prompt_len=4, cache_dir=str(tmp_path))
    assert second["generations"] == 2 and seen == [4, 4]


def test_prefill_marker_names_the_launch_mode(monkeypatch):
    """Kernels built for programmatic dependent launch are other binaries: a cache swept with
    plain launches is swept again under PDL (and the other way round)."""
    import torch

    from specc.codegen.kernels import pdl

    assert warmup.prefills_marker("cpu") == warmup.PREFILLS_MARKER
    monkeypatch.setattr(pdl, "pdl_mode", lambda device: 2)
    assert warmup.prefills_marker(torch.device("cuda")) == warmup.PREFILLS_MARKER + "-pdl2"
    monkeypatch.setattr(pdl, "pdl_mode", lambda device: 0)
    assert warmup.prefills_marker("cuda") == warmup.PREFILLS_MARKER
