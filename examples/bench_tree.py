"""Tree verification benchmark: acceptance, step times and end-to-end tokens/s, chain vs tree.

Three parts, each printed as a table and written to one JSON file:

1. ``acceptance`` (specc-tiny, real decoding): held-out-style prompts (files of this machine's
   Python stdlib whose sha256 falls in the training run's held-out bucket, 64-128 tokens at random
   offsets), greedy, block 16 (15 drafted positions); tokens committed per target step (pooled
   tau) for the chain and for trees of 8 / 16 / 32 / 64 drafted nodes, PARD and DFlash, through
   the production device loop over the model definitions. Every configuration's tokens are
   checked equal to the chain's and to the target's AR greedy (HF transformers, the stock AR
   loop); the JSON records where any difference starts, and the script then exits non-zero
   (for a difference from AR only in fp32: in bf16 the verify shapes round differently).
   ``--pair hybrid``: the same on ``specc-tiny-hybrid`` (gated DeltaNet + attention) with its
   DFlash drafter (acceptance only).
2. ``steps`` (random weights, Qwen3-8B shapes on a GPU; ``--tiny``: tiny shapes): the compiled
   target's chain verify step at Q = 16 / 32 / 64 / 128 query rows vs its tree verify step over
   a draft tree of the same number of nodes (ancestor mask, positions base + depth; timed with the
   kernel reading the packed mask words and again reading the byte mask), all
   CUDA-graphed on a GPU (median replay, CUDA events), plus the on-device tree work of a step
   (build_tree + mask + accept_tree + KV compaction) and the cost model's prediction of each step
   (deployment ``--deployment``).
3. ``e2e`` (specc-tiny): compiled chain vs compiled tree decoding (the generated steps, built in
   memory, under the engine's loop; CUDA graphs on a GPU): tokens/s after a warm-up pass, tau.
4. ``ranks`` (specc-tiny DFlash, real decoding): the per-rank tree acceptance model
   (``specc.search.measure_tree``) on the held-out-style prompts, written as the JSON that
   ``--acceptance ranks:FILE`` reads (``--ranks-out``; docs/benchmarks/tiny-dflash-ranks.json).

``--e2e-8b`` (one H200 call, a few minutes): Qwen3-8B-shaped target + DFlash-b16 drafter with
random bf16 weights (``specc.bench.shapes``), compiled (chain and tree verify steps) and run under
the engine's loop with CUDA graphs: compiled AR, the chain and trees of ``--budgets`` (default
15,31,63: N nodes verify N + 1 rows, on the linears' row-tile edges) drafted nodes, acceptance replayed from ``--acceptance`` (chain: ``ReplayVerifier`` on
rank 0; trees: ``TreeReplayVerifier`` on every rank; ``--acceptance`` repeatable, default: DFlash's
published GSM8K and MT-Bench tau for rank 0, each with the rest split as specc-tiny's DFlash
ranks split it; one build serves them all). Per row: tokens/s, tokens per step, step time (``step_ms``: the prefills' time
included, as tokens/s counts it; ``decode_step_ms``: without them; ``prefill_ms``), and the
cost model's prediction (``specc.search.tree_cost``) beside it; speedups over the chain and over
AR, measured and predicted. After each system's timed pass, one more pass with the loop's
per-part profile (ms per step of draft / plan / verify / accept / commit, synchronising) and
each CUDA-graphed step's captures, replays and eager calls with their reasons: where a step's
time goes beyond the cost model's figure. ``--kernels``: one more pass per system under
``torch.profiler`` (kernel time and launches per step, the largest kernels by name). Writes ``--out-dir``/tree-e2e-8b.json.
``--tiny-check`` runs the same path at tiny shapes on the CPU (a minute): the GPU run's smoke test.

    PYTHONPATH=. python3 examples/bench_tree.py --device cuda --out $OUT/tree.json     # on the H200
    PYTHONPATH=. python3 examples/bench_tree.py --e2e-8b --device cuda --out-dir $OUT  # 8B e2e, H200
    PYTHONPATH=. python3 examples/bench_tree.py --e2e-8b --tiny-check --out-dir /tmp/t # its CPU check
    PYTHONPATH=. python3 examples/bench_tree.py --tiny --device cpu                     # smoke (< 60 s)
    PYTHONPATH=. python3 examples/bench_tree.py --parts acceptance,e2e --device cpu     # CPU figures
    PYTHONPATH=. python3 examples/bench_tree.py --pair hybrid --parts acceptance --device cpu \
        --prompts 16 --new-tokens 64 --budgets 15,31,63                               # the hybrid pair
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import random
import sys
import sysconfig
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))

K = 15  # drafted positions at block 16


def heldout_prompts(tokenizer, count: int, seed: int = 0, lo: int = 64, hi: int = 128) -> list[list[int]]:
    """``count`` prompts of lo..hi tokens at random offsets of held-out-bucket stdlib files
    (``int(sha256[:8], 16) % 1000 < 20``, the rule examples/train_tiny.py holds files out by)."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    held = []
    for f in sorted(root.rglob("*.py")):
        try:
            data = f.read_bytes()
        except OSError:
            continue
        if "site-packages" not in f.parts and int(hashlib.sha256(data).hexdigest()[:8], 16) % 1000 < 20:
            held.append(data.decode("utf-8", "replace"))
    rng = random.Random(seed)
    prompts = []
    while len(prompts) < count and held:
        ids = tokenizer(rng.choice(held))["input_ids"]
        n = rng.randint(lo, hi)
        if len(ids) <= n:
            continue
        off = rng.randint(0, len(ids) - n)
        prompts.append(ids[off:off + n])
    return prompts


def _loop(target: str, method: str, drafter: str, budget: int, max_len: int, dtype, device):
    from specc.pairing import resolve_pair
    from specc.runtime.device_loop import DeviceSpeculativeDecoder
    from specc.runtime.eager import build_eager

    eager = build_eager(resolve_pair(target, drafter, method), K, max_len, dtype, device)
    return DeviceSpeculativeDecoder(eager.target, eager.drafter, K, max_len, tree_budget=budget)


def _first_difference(outs, reference) -> dict | None:
    """Where two runs' tokens first part: prompt index, token index, the two tokens."""
    for i, (a, b) in enumerate(zip(outs, reference)):
        if a != b:
            pos = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            return {"prompt": i, "token": pos, "got": a[pos] if pos < len(a) else None,
                    "want": b[pos] if pos < len(b) else None, "differing_prompts": sum(x != y for x, y in zip(outs, reference))}
    return None


def acceptance(prompts, new_tokens: int, budgets, dtype, device, target: str = "specc-tiny",
               methods=None) -> list[dict]:
    """Tokens per target step of the chain and of each tree budget, per drafter of ``target``
    (``PAIRS``), through the device loop over the model definitions; every run's tokens are
    compared with the chain's and with the target's plain greedy decoding (HF transformers, the
    stock AR loop), and a difference is recorded with where it starts (``first_difference``)."""
    from specc.pairing import resolve_pair
    from specc.stock.runner import StockSystem

    methods = PAIRS["tiny"][1] if methods is None else methods
    ar_system = StockSystem(resolve_pair(target), dtype=dtype, device=device)
    ar_tokens = [ar_system.generate(p, new_tokens, ()).tokens for p in prompts]
    rows = []
    max_len = max(map(len, prompts)) + new_tokens + 2
    for method, drafter in methods:
        reference = None
        for budget in (0, *budgets):
            loop = _loop(target, method, drafter, budget, max_len, dtype, device)
            lengths, outs, t0 = [], [], time.perf_counter()
            for p in prompts:
                res = loop.generate(p, new_tokens, ())
                lengths += res.stats.accepted_lengths
                outs.append(res.tokens)
            seconds = time.perf_counter() - t0
            reference = outs if reference is None else reference
            row = {"target": target, "method": method, "drafter": drafter, "budget": budget,
                   "tau": sum(lengths) / len(lengths), "steps": len(lengths),
                   "lossless_vs_chain": outs == reference, "lossless_vs_ar": outs == ar_tokens, "seconds": seconds,
                   "tokens_per_s": new_tokens * len(prompts) / seconds}
            for key, want in (("first_difference_vs_chain", reference), ("first_difference_vs_ar", ar_tokens)):
                diff = _first_difference(outs, want)
                if diff is not None:
                    row[key] = diff
            rows.append(row)
            label = "chain" if budget == 0 else f"tree {budget}"
            print(f"[acceptance] {method:6s} {label:8s} tau {row['tau']:.3f}  ({row['steps']} steps, "
                  f"{row['tokens_per_s']:.1f} tok/s, lossless vs chain {row['lossless_vs_chain']}, "
                  f"vs AR {row['lossless_vs_ar']})", flush=True)
    for row in rows:
        chain = next(r for r in rows if r["method"] == row["method"] and r["budget"] == 0)
        row["tau_gain_vs_chain"] = row["tau"] / chain["tau"] - 1
    return rows


def acceptance_failures(rows, dtype) -> list[str]:
    """The rows that break exactness: any tree whose tokens differ from its chain's, and, in fp32,
    any run that differs from AR greedy (in bf16 the verify shapes round differently from AR's
    one-token steps, so a difference there is reported, not fatal)."""
    bad = []
    for r in rows:
        label = f"{r['target']} {r['method']} {'chain' if r['budget'] == 0 else 'tree ' + str(r['budget'])}"
        if not r["lossless_vs_chain"]:
            bad.append(f"{label}: tokens differ from the chain's at {r['first_difference_vs_chain']}")
        if not r["lossless_vs_ar"] and dtype == torch.float32:
            bad.append(f"{label}: tokens differ from AR greedy at {r['first_difference_vs_ar']}")
    return bad


def compiled_tree_steps(pair, dtype, device):
    """specc-tiny's compiled steps, the tree verify step included (built once per pair)."""
    from specc.codegen.build import build_steps
    from specc.passes.pipelines import DEFAULT_PIPELINE
    from specc.runtime.compiled import instantiate

    impl = pair.impl
    loaded = impl.load(pair, dtype, device)
    target, draft_module, spec = loaded.target, loaded.draft, loaded.draft_spec
    target.setup_caches(1, 16)
    draft_module.setup_caches(1, 16)
    built = build_steps(target, draft_module, DEFAULT_PIPELINE, spec, tree=True)
    steps = {role: instantiate(e, spec if role == "drafter" else None) for role, e in built.emitted.items()}
    return steps, impl.manifest_drafter(pair, loaded)


def compiled_tree_system(steps, section, strategy, budget: int, max_len: int, graphs: bool | None = None):
    """The engine's loop over the compiled steps: chain (budget 0) or tree of ``budget`` nodes."""
    from specc.runtime.engine import build_loop

    use = {role: step for role, step in steps.items() if budget or role != "target_tree"}
    return build_loop(use, strategy, K, max_len, drafter_section=section, graphs=graphs, tree_budget=budget)


METHODS = (("pard", "specc-tiny-pard"), ("dflash", "specc-tiny-dflash"))
# --pair: the target of the acceptance part and its (method, drafter) pairs
PAIRS = {"tiny": ("specc-tiny", METHODS),
         "hybrid": ("specc-tiny-hybrid", (("dflash", "specc-tiny-hybrid-dflash"),))}


def _margins(pair, prompt, chain_tokens, tree_tokens, pos, device) -> dict:
    """The target's (model definition, eager, one prefill) choice where chain and tree outputs first
    differ, in bf16 and fp32: top-2 logits and their margin. A margin of a few bf16 ulps is a
    numerical tie (the two verify shapes round differently); a wide one would be a bug."""
    out = {"chain_token": chain_tokens[pos], "tree_token": tree_tokens[pos]}
    if pos is None:
        return out
    ids = torch.tensor([list(prompt) + list(chain_tokens[:pos])], device=device)
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        target = pair.impl.load(pair, dtype, device).target
        target.setup_caches(1, ids.shape[1] + 8)
        with torch.inference_mode():
            res = target(ids, torch.arange(ids.shape[1], device=device)[None], torch.zeros(1, dtype=torch.long, device=device))
        logits = (res[0] if isinstance(res, tuple) else res)[0, -1].float()
        top = logits.topk(2)
        out[name] = {"top2_tokens": top.indices.tolist(), "top2_logits": top.values.tolist(),
                     "margin": float(top.values[0] - top.values[1]),
                     "chain_logit": float(logits[chain_tokens[pos]]), "tree_logit": float(logits[tree_tokens[pos]])}
    return out


def e2e(prompts, new_tokens: int, budgets, dtype, device, methods=METHODS) -> list[dict]:
    from specc.pairing import resolve_pair

    rows = []
    cuda = torch.device(device).type == "cuda"
    max_len = max(map(len, prompts)) + new_tokens + 2
    for method, drafter in methods:
        pair = resolve_pair("specc-tiny", drafter, method)
        steps, section = compiled_tree_steps(pair, dtype, device)
        reference = None
        for budget in (0, *budgets):
            system = compiled_tree_system(steps, section, pair.impl.strategy, budget, max_len)
            for p in prompts:  # warm-up: Triton compiles, graph captures
                system.generate(p, new_tokens, ())
            if cuda:
                torch.cuda.synchronize()
            outs, lengths, t0 = [], [], time.perf_counter()
            for p in prompts:
                res = system.generate(p, new_tokens, ())
                outs.append(res.tokens)
                lengths += res.stats.accepted_lengths
            if cuda:
                torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
            reference = outs if reference is None else reference
            system.profile = True  # one more pass, timed by part (synchronising): where a step goes
            system.generate(prompts[0], new_tokens, ())
            system.profile = False
            graphs = system.graph_stats()
            row = {"method": method, "budget": budget, "tokens_per_s": new_tokens * len(prompts) / seconds,
                   "tau": sum(lengths) / len(lengths), "lossless_vs_chain": outs == reference, "seconds": seconds,
                   "part_seconds_one_prompt": dict(system.part_seconds), "graphs": graphs}
            if outs != reference:  # where the first difference is (numerical ties in bf16 show up here)
                i = next(j for j, (a, b) in enumerate(zip(outs, reference)) if a != b)
                pos = next((j for j, (a, b) in enumerate(zip(outs[i], reference[i])) if a != b), None)
                row["first_difference"] = {"prompt": i, "token": pos, "differing_prompts": sum(a != b for a, b in zip(outs, reference)),
                                           **_margins(pair, prompts[i], reference[i], outs[i], pos, device)}
            rows.append(row)
            label = "chain" if budget == 0 else f"tree {budget}"
            print(f"[e2e] compiled {method:6s} {label:8s} {row['tokens_per_s']:8.1f} tok/s  tau {row['tau']:.2f}  "
                  f"lossless {row['lossless_vs_chain']}", flush=True)
    for row in rows:
        chain = next(r for r in rows if r["method"] == row["method"] and r["budget"] == 0)
        row["speedup_vs_chain"] = row["tokens_per_s"] / chain["tokens_per_s"]
    return rows


def steps(sizes, dtype, device, context: int, small: bool, deployment: str | None) -> list[dict]:
    from bench_steps import QWEN3_8B, build_causal, time_on, tiny

    from specc.codegen.build import build_steps
    from specc.codegen.kernels import attention as attn_kernel
    from specc.passes.pipelines import DEFAULT_PIPELINE
    from specc.runtime.compiled import instantiate
    from specc.runtime.state import DecodingState
    from specc.runtime.trees import accept_tree, build_tree

    dev = torch.device(device)
    cfg = tiny(QWEN3_8B) if small else QWEN3_8B
    target = build_causal(cfg, dtype, dev, seed=1)
    target.setup_caches(1, 16)
    built = build_steps(target, None, "" if small else DEFAULT_PIPELINE, tree=True)  # smoke: no passes
    chain_step, tree_step = instantiate(built.emitted["target"]), instantiate(built.emitted["target_tree"])
    state = chain_step.setup_caches(1, context + max(sizes) + 8)
    state.bind(tree_step)
    cost = None
    if deployment:
        from specc.search.cost_model import CostModel
        from specc.search.deployments import get_deployment

        cost = CostModel(get_deployment(deployment))
    cache_len = torch.tensor([context], device=dev)
    vocab = cfg["vocab_size"]
    rows = []
    for q in sizes:
        ids = torch.randint(0, vocab, (1, q), device=dev)
        pos = torch.arange(context, context + q, device=dev)[None]
        chain_ms = time_on(device, chain_step, (ids, pos, cache_len))
        gen = torch.Generator(device="cpu").manual_seed(q)
        logprobs = torch.randn(1, K, vocab, generator=gen).mul(3).log_softmax(-1).to(dev)
        tree = build_tree(logprobs, ids[:, 0], q - 1)
        mask = tree.ancestor_mask(K)
        tpos = tree.positions(cache_len)
        tree_ms = time_on(device, tree_step, (tree.tokens, tpos, cache_len, mask))
        prev = attn_kernel.set_tree_mask_format("bytes")  # the byte mask tiles, for comparison
        try:
            tree_bytes_ms = time_on(device, tree_step, (tree.tokens, tpos, cache_len, mask))
        finally:
            attn_kernel.set_tree_mask_format(prev)
        argmax = torch.randint(0, vocab, (1, q), device=dev)

        def tree_work():  # what a tree step adds on the device around the forward
            t = build_tree(logprobs, ids[:, 0], q - 1)
            m = t.ancestor_mask(K)
            accepted, path = accept_tree(t, argmax, K)
            return m, accepted, path

        work_ms = time_on(device, tree_work, ())
        _, accepted, path = tree_work()
        lengths = state.lengths

        def compact():
            DecodingState.commit(state, accepted + 1, path)
            state.lengths.copy_(lengths_before)

        lengths_before = lengths.clone()
        commit_ms = time_on(device, compact, ())
        row = {"q": q, "chain_verify_ms": chain_ms, "tree_verify_ms": tree_ms, "tree_verify_bytes_mask_ms": tree_bytes_ms,
               "tree_mask_format": attn_kernel.TREE_MASK_FORMAT, "tree_work_ms": work_ms,
               "kv_compact_ms": commit_ms, "tree_over_chain": tree_ms / chain_ms}
        if cost is not None:
            row["predicted_verify_ms"] = cost.step(built.irs["target"], {"B": 1, "Q": q, "C": context}, step="verify").time * 1e3
            row["predicted_tree_verify_ms"] = cost.step(built.irs["target_tree"], {"B": 1, "Q": q, "C": context},
                                                        step="verify").time * 1e3
        rows.append(row)
        print(f"[steps] Q={q:4d}: chain verify {chain_ms:8.3f} ms, tree verify {tree_ms:8.3f} ms "
              f"(x{row['tree_over_chain']:.3f}; byte mask {tree_bytes_ms:8.3f} ms), tree build+mask+accept {work_ms:.3f} ms, KV compaction "
              f"{commit_ms:.3f} ms" + (f", predicted {row['predicted_verify_ms']:.3f} / {row['predicted_tree_verify_ms']:.3f} ms"
                                       if cost is not None else ""), flush=True)
    return rows


RANKS_FILE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "tiny-dflash-ranks.json"
# DFlash's published tau on Qwen3-8B for rank 0 (GSM8K: high acceptance; MT-Bench: the lowest
# published), ranks >= 1 split as specc-tiny's DFlash drafter splits them
DEFAULT_8B_ACCEPTANCE = [f"dflash-qwen3-8b:{bench}+ranks:{RANKS_FILE}" for bench in ("gsm8k", "mt-bench")]


def ranks(prompts, new_tokens: int, dtype, device, out: str | None) -> dict:
    """specc-tiny DFlash's per-rank acceptance (block 16, top 8 ranks), as a tree acceptance JSON."""
    from specc.pairing import resolve_pair
    from specc.search.measure_tree import measure_rank_acceptance

    pair = resolve_pair("specc-tiny", "specc-tiny-dflash", "dflash")
    model = measure_rank_acceptance(pair, prompts, new_tokens, K, ranks=8, dtype=dtype, device=device)
    data = model.to_json()
    data["source"] = (f"specc-tiny + specc-tiny-dflash, block 16: ranks of the target's greedy tokens among the "
                      f"drafter's candidates, {len(prompts)} held-out-style prompts x {new_tokens} tokens, top 8 ranks "
                      f"(examples/bench_tree.py --parts ranks)")
    print(f"[ranks] {model.describe()}", flush=True)
    if out:
        pathlib.Path(out).write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {out}")
    return data


def profiled_pass(system, prompt, new_tokens) -> dict:
    """Two more generations after the timed ones with the loop's per-part profile on: ms per
    step of each part (draft / verify / accept, and a tree step's plan / commit), the prefill
    apart. ``part_ms_per_step``: wall time, synchronising at every part boundary (so not the
    timed figure); ``device_part_ms_per_step``: device time between CUDA events recorded at the
    boundaries, no synchronisation (``EventTimer``: adds up to the wall time; ``between`` is the
    host's bookkeeping between steps while the GPU waits); in the events pass also each graph's
    own replays (``graph_replay_ms_per_step``: CUDA events around every replay, so a part minus
    its graph is the eager work and waits around it). Also what each graphed step did
    (``DeviceSpeculativeDecoder.graph_stats``: is some step running eagerly, and why)."""
    from specc.runtime.graphs import logging_replays, replay_seconds

    out = {}
    for mode, key in ((True, "part_ms_per_step"), ("events", "device_part_ms_per_step")):
        system.profile = mode
        try:
            with logging_replays() as log:
                res = system.generate(prompt, new_tokens, ())
        finally:
            system.profile = False
        steps = max(len(res.stats.accepted_lengths), 1)
        parts = dict(system.part_seconds)
        out["steps"] = steps
        out["prefill_ms" if mode is True else "device_prefill_ms"] = 1e3 * parts.pop("prefill", 0.0)
        out[key] = {name: 1e3 * sec / steps for name, sec in parts.items()}
        if mode == "events":  # each graph's own replays, inside its part
            names = {id(step): name for name, step in system.graphed_steps().items()}
            out["graph_replay_ms_per_step"] = {name: 1e3 * sec / steps
                                               for name, sec in replay_seconds(log, names).items()}
    out["graphs"] = system.graph_stats()
    return out


def _profiled_generation(system, prompt, new_tokens, cuda: bool, stack: bool = False):
    """One generation under ``torch.profiler``: (its Chrome trace as a dict, steps, wall seconds)."""
    from specc.bench.gaps import profiled

    res, trace, wall = profiled(lambda: system.generate(prompt, new_tokens, ()), cuda, stack)
    return trace, max(len(res.stats.accepted_lengths), 1), wall


def kernel_pass(system, prompt, new_tokens, cuda: bool, top: int = 30) -> dict:
    """Two more generations under ``torch.profiler``, no synchronisation inside. The first: per
    kernel name (host ops on the CPU), calls and microseconds per decode step (the prefill's
    kernels included, spread over the steps), the ``top`` largest, the total kernel time and
    launches per step beside the wall time per step, and on a GPU the idle time between kernels
    (``specc.bench.gaps``: how much of it the host was late for). The second (GPU only, Python
    stacks on, so its times are inflated): the idle gaps grouped by the loop's line that launched
    the kernel after them (``gaps``). What a step's time beyond its kernels is made of; and from the
    first (``host_window``, ``specc.bench.gaps.host_windows``): the host's time per step from its
    blocking copy to the next graph launch, by host op."""
    import collections

    from specc.bench.gaps import host_windows, kernel_gaps

    trace, steps, wall = _profiled_generation(system, prompt, new_tokens, cuda)
    cat = "kernel" if cuda else "cpu_op"
    events = [e for e in trace.get("traceEvents", []) if e.get("cat") == cat]
    groups: dict = collections.defaultdict(lambda: [0, 0.0])
    for e in events:
        groups[e["name"][:90]][0] += 1
        groups[e["name"][:90]][1] += e.get("dur", 0.0)
    rows = sorted(({"kernel": name, "calls_per_step": c / steps, "us_per_step": t / steps}
                   for name, (c, t) in groups.items()), key=lambda r: -r["us_per_step"])
    out = {"steps": steps, "wall_ms_per_step": 1e3 * wall / steps, "what": cat,
           "kernel_us_per_step": sum(r["us_per_step"] for r in rows), "launches_per_step": len(events) / steps,
           "top": rows[:top]}
    if cuda:
        clean = kernel_gaps(trace, steps)
        out["idle_us_per_step"], out["host_late_us_per_step"] = clean["idle_us_per_step"], clean["host_late_us_per_step"]
        out["span_us_per_step"] = clean["span_us_per_step"]
        out["host_window"] = host_windows(trace, steps)
        trace, steps, _ = _profiled_generation(system, prompt, new_tokens, cuda, stack=True)
        out["gaps_with_stacks"] = kernel_gaps(trace, steps, top=15)
    return out


def _print_gaps(label: str, kp: dict) -> None:
    if "idle_us_per_step" not in kp:
        return
    print(f"[e2e-8b] {label:18s} GPU idle between kernels {kp['idle_us_per_step']:.0f} us/step (host late "
          f"{kp['host_late_us_per_step']:.0f}); kernels {kp['kernel_us_per_step']:.0f}, span {kp['span_us_per_step']:.0f}",
          flush=True)
    hw = kp.get("host_window")
    if hw:
        print(f"[e2e-8b] {label:18s} host from a blocking copy to the next graph launch: {hw['window_us_per_step']:.0f} "
              f"us/step in {hw['windows_per_step']:.2f} windows; ops: " + ", ".join(
                  f"{r['op']} {r['us_per_step']:.0f}" for r in hw["ops"][:8]), flush=True)
    for g in kp["gaps_with_stacks"]["gaps"][:8]:
        print(f"[e2e-8b]   {g['us_per_step']:7.1f} us/step ({g['count_per_step']:.1f}x, host late "
              f"{g['host_late_us_per_step']:.1f}) {g['launch']} at {g['frames'] or '?'}: {g['after'][:30]} -> "
              f"{g['before'][:30]}", flush=True)


def _print_profile(label: str, profile: dict) -> None:
    parts = ", ".join(f"{name} {ms:.3f}" for name, ms in profile["part_ms_per_step"].items())
    print(f"[e2e-8b] {label:9s} profile, ms/step (synchronising): {parts}; prefill {profile['prefill_ms']:.1f} ms",
          flush=True)
    parts = ", ".join(f"{name} {ms:.3f}" for name, ms in profile["device_part_ms_per_step"].items())
    total = sum(profile["device_part_ms_per_step"].values())
    print(f"[e2e-8b] {label:9s} device time per part, ms/step (CUDA events, no sync): {parts} (sum {total:.3f}); "
          f"prefill {profile['device_prefill_ms']:.1f} ms", flush=True)
    graphs = profile.get("graph_replay_ms_per_step")
    if graphs:
        print(f"[e2e-8b] {label:9s} graph replays inside those parts, ms/step: "
              + ", ".join(f"{name} {ms:.3f}" for name, ms in graphs.items()), flush=True)
    for role, st in profile["graphs"].items():
        if st["eager_calls"] or st["eager_reasons"]:
            print(f"[e2e-8b] {label:9s}   {role}: {st['captures']} graphs, {st['replays']} replays, "
                  f"{st['eager_calls']} eager calls {st['eager_reasons'] or ''}", flush=True)


def _timed(system, prompts, new_tokens, cuda) -> dict:
    """One warm-up pass (Triton compiles, graph captures), then every prompt once, timed.
    ``step_ms`` is the whole time (prefills included) per step, as tokens/s counts it;
    ``decode_step_ms`` leaves the prefills out: each prompt's prefill is timed to its first
    token, which the loop reads back to the host (a sync, so nothing of it is left queued), and
    ``prefill_ms`` is their mean. At 8 prompts x 256 tokens a prefill adds ~1 ms to every step."""
    from specc.runtime.loop import run_to_end

    system.generate(prompts[0], new_tokens, ())
    if cuda:
        torch.cuda.synchronize()
    lengths, prefill_s, t0 = [], 0.0, time.perf_counter()
    for p in prompts:
        start = time.perf_counter()
        stream = system.stream(p, new_tokens, ())
        next(stream)  # the prefill's token (read back by the prefill itself)
        prefill_s += time.perf_counter() - start
        lengths += run_to_end(stream).stats.accepted_lengths
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    return {"tokens_per_s": new_tokens * len(prompts) / seconds, "seconds": seconds, "steps": len(lengths),
            "tokens_per_step": sum(lengths) / len(lengths), "step_ms": 1e3 * seconds / len(lengths),
            "prefill_ms": 1e3 * prefill_s / len(prompts), "decode_step_ms": 1e3 * (seconds - prefill_s) / len(lengths)}


def dflash_num_draft(shapes: str) -> int:
    """Drafted positions per step of the DFlash-b16 drafter at ``shapes``."""
    from specc.bench.shapes import drafter_config
    from specc.methods import get_method

    return get_method("dflash").num_draft(None, drafter_config(shapes, "dflash-b16")[1])


def build_dflash_system(shapes: str, dtype, dev, cost):
    """``shapes`` (qwen3-8b, or tiny-qwen3: no passes) + DFlash-b16 with random weights, compiled
    with the tree verify step and the cost model's linear choice (as compile does). Returns a
    namespace: steps (role -> compiled step), section (the manifest's drafter section), impl (the
    method), k, target_config, built (``build_steps``' result), pipeline."""
    import types

    from specc.bench.shapes import build_causal, build_dflash, drafter_config, target_config
    from specc.codegen.build import build_steps
    from specc.methods import get_method
    from specc.passes.pipelines import DEFAULT_PIPELINE
    from specc.runtime.compiled import instantiate

    tcfg = target_config(shapes)
    _, dcfg = drafter_config(shapes, "dflash-b16")
    impl = get_method("dflash")
    target = build_causal(tcfg, dtype, dev, seed=1)
    draft = build_dflash(dcfg, dtype, dev, seed=3)
    loaded = impl.bind(target, draft)
    section = impl.manifest_drafter(types.SimpleNamespace(drafter=types.SimpleNamespace(raw=dcfg)), loaded)
    loaded.target.setup_caches(1, 16)
    loaded.draft.setup_caches(1, 16)
    pipeline = "" if shapes.startswith("tiny") else DEFAULT_PIPELINE
    built = build_steps(loaded.target, loaded.draft, pipeline, loaded.draft_spec, tree=True,
                        linear_choice=cost.linear_choice)  # the linears the cost model prices, as compile does
    steps = {role: instantiate(e, loaded.draft_spec if role == "drafter" else None) for role, e in built.emitted.items()}
    return types.SimpleNamespace(steps=steps, section=section, impl=impl, k=impl.num_draft(None, dcfg),
                                 target_config=tcfg, built=built, pipeline=pipeline)


def e2e_8b(specs, budgets, n_prompts: int, prompt_len: int, new_tokens: int, device: str, small: bool,
           deployment: str, seed: int = 0, kernels: bool = False) -> dict:
    """Compiled AR, then per acceptance spec of ``specs`` the chain and trees, at Qwen3-8B +
    DFlash-b16 shapes (random weights), acceptance replayed (see the module doc); each row with
    the cost model's prediction. One build serves every spec."""
    from specc.bench.acceptance import parse_tree_acceptance
    from specc.runtime.engine import build_loop
    from specc.runtime.replay import REPLAY_NOTICE, TREE_REPLAY_NOTICE, ReplayVerifier
    from specc.runtime.tree_replay import TreeReplayVerifier
    from specc.search.acceptance import AcceptanceModel
    from specc.search.cost_model import CostModel
    from specc.search.deployments import get_deployment
    from specc.search.tree_cost import predict_tree

    shapes = "tiny-qwen3" if small else "qwen3-8b"
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    t_start = time.perf_counter()
    k = dflash_num_draft(shapes)
    models = [parse_tree_acceptance(spec, k) for spec in specs]  # bad specs fail before the build
    cost = CostModel(get_deployment(deployment))
    b = build_dflash_system(shapes, dtype, dev, cost)
    steps, section, impl, tcfg, built, pipeline = b.steps, b.section, b.impl, b.target_config, b.built, b.pipeline
    build_s = time.perf_counter() - t_start
    print(f"[e2e-8b] {shapes} + dflash-b16 built and compiled in {build_s:.1f} s (k = {k})", flush=True)

    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(10, tcfg["vocab_size"] - 10, (prompt_len,), generator=g).tolist() for _ in range(n_prompts)]
    max_len = prompt_len + new_tokens + 2
    context = int(prompt_len + new_tokens / 2)
    t_ir, d_ir = built.irs["target"], built.irs["drafter"]

    ar_loop = build_loop({"target": steps["target"]}, None, 0, max_len)  # the same compiled target step, no drafter
    ar_loop.step_graphs = False  # first the unfused loop (whole-step graphs are the engine's default: below)
    ar_pred = cost.predict(t_ir, None, method="ar", context=context, batch_size=1)
    ar = {"system": "ar", **_timed(ar_loop, prompts, new_tokens, cuda),
          "predicted": {"tokens_per_s": ar_pred.tokens_per_s, "step_ms": ar_pred.step_time * 1e3, "tokens_per_step": 1.0}}
    print(f"[e2e-8b] AR        {ar['tokens_per_s']:8.1f} tok/s (predicted {ar['predicted']['tokens_per_s']:.1f}), "
          f"{ar['step_ms']:.2f} ms/step, {ar['decode_step_ms']:.2f} without the prefills ({ar['prefill_ms']:.1f} ms each)",
          flush=True)
    ar["profile"] = profiled_pass(ar_loop, prompts[0], new_tokens)
    _print_profile("AR", ar["profile"])
    if kernels:
        ar["kernels"] = kernel_pass(ar_loop, prompts[0], new_tokens, cuda)
        _print_gaps("AR", ar["kernels"])
    # the same AR loop with each step one CUDA graph launched ahead (``step_graphs``, the engine's default)
    ar_loop.step_graphs = True
    ar_whole = {"system": "ar, step graphs", **_timed(ar_loop, prompts, new_tokens, cuda),
                "graphs": ar_loop.graph_stats().get("step")}
    ar_whole["speedup_vs_ar"] = ar_whole["tokens_per_s"] / ar["tokens_per_s"]
    ar["step_graphs"] = ar_whole
    print(f"[e2e-8b] AR, step graphs {ar_whole['tokens_per_s']:8.1f} tok/s, {ar_whole['decode_step_ms']:.2f} ms/step "
          f"without the prefills ({ar_whole['speedup_vs_ar']:.3f}x AR; graphs {ar_whole['graphs']})", flush=True)
    del ar_loop
    runs = []
    for spec, tree_model in zip(specs, models):
        chain_model = AcceptanceModel([tree_model.prob(d, 0) for d in range(1, k + 1)],
                                      source=f"rank 0 of {tree_model.source}", measured_k=k)
        chain_pred = cost.predict(t_ir, d_ir, method="dflash", num_draft=k, acceptance=chain_model, context=context,
                                  batch_size=1)
        print(f"[e2e-8b] acceptance {spec}: {tree_model.describe()}", flush=True)
        rows = []
        # the chain three times: as the engine runs it, with its next draft launched ahead of the host's
        # bookkeeping (``DeviceSpeculativeDecoder.draft_ahead``), and with each step one CUDA graph
        # launched ahead (``step_graphs``, the engine's default on CUDA; draft ahead is opt-in)
        for budget, ahead in ((0, False), (0, True), (0, "step"), *((b, v) for b in budgets for v in (False, "step"))):
            use = {role: step for role, step in steps.items() if budget or role != "target_tree"}
            system = build_loop(use, impl.strategy, k, max_len, drafter_section=section, tree_budget=budget)
            system.draft_ahead = ahead is True
            system.step_graphs = ahead == "step"
            system.use_verifiers(chain=ReplayVerifier(chain_model.alphas, seed=seed),
                                 tree=TreeReplayVerifier.from_model(tree_model, seed=seed))
            measured = _timed(system, prompts, new_tokens, cuda)
            if budget:
                pred = predict_tree(cost, t_ir, d_ir, impl, tree_model, k, budget, context=context, batch_size=1)
                predicted = {"tokens_per_s": pred.tokens_per_s, "step_ms": pred.step_time * 1e3,
                             "tokens_per_step": pred.system.expected_tokens, "tree_work_ms": pred.build_s * 1e3,
                             "verify_rows_ms": pred.rows_s * 1e3}
            else:
                predicted = {"tokens_per_s": chain_pred.tokens_per_s, "step_ms": chain_pred.step_time * 1e3,
                             "tokens_per_step": chain_pred.expected_tokens}
            name = {False: "chain", True: "chain, draft ahead", "step": "chain, step graphs"}[ahead]
            tree_name = f"tree {budget}" + (", step graphs" if ahead == "step" else "")
            row = {"system": tree_name if budget else name, "budget": budget, "draft_ahead": ahead is True,
                   "step_graphs": ahead == "step", **measured, "predicted": predicted}
            if ahead == "step":
                row["graphs"] = system.graph_stats().get("step")
            rows.append(row)
            print(f"[e2e-8b] {row['system']:18s} {row['tokens_per_s']:8.1f} tok/s, {row['tokens_per_step']:.2f} "
                  f"tokens/step, {row['step_ms']:.2f} ms/step, {row['decode_step_ms']:.2f} without the prefills "
                  f"({row['prefill_ms']:.1f} ms each) (predicted {predicted['tokens_per_s']:.1f} tok/s, "
                  f"{predicted['tokens_per_step']:.2f} tokens/step, {predicted['step_ms']:.2f} ms/step)", flush=True)
            row["profile"] = profiled_pass(system, prompts[0], new_tokens)
            _print_profile(row["system"], row["profile"])
            if kernels:
                row["kernels"] = kernel_pass(system, prompts[0], new_tokens, cuda)
                kp = row["kernels"]
                print(f"[e2e-8b] {row['system']:18s} kernels: {kp['kernel_us_per_step']:.0f} us, "
                      f"{kp['launches_per_step']:.0f} launches per step (wall {kp['wall_ms_per_step']:.2f} ms); "
                      + "; ".join(f"{r['kernel'][:40]} {r['us_per_step']:.0f}" for r in kp["top"][:8]), flush=True)
                _print_gaps(row["system"], kp)
            del system
            if cuda:
                torch.cuda.empty_cache()
        chain_row = rows[0]
        for row in rows:
            for base, key in ((ar, "speedup_vs_ar"), (chain_row, "speedup_vs_chain")):
                row[key] = {"measured": row["tokens_per_s"] / base["tokens_per_s"],
                            "predicted": row["predicted"]["tokens_per_s"] / base["predicted"]["tokens_per_s"]}
        print("[e2e-8b] speedup vs chain (measured / predicted): " + ", ".join(
            f"{r['system']} {r['speedup_vs_chain']['measured']:.3f} / {r['speedup_vs_chain']['predicted']:.3f}"
            for r in rows[1:]), flush=True)
        runs.append({"spec": spec, "tree": tree_model.to_json(), "tree_source": tree_model.source,
                     "chain": chain_model.to_json(), "rows": rows})
    return {"shapes": f"{shapes} + dflash-b16, random weights", "num_draft": k, "prompts": n_prompts,
            "prompt_len": prompt_len, "new_tokens": new_tokens, "deployment": deployment,
            "context_for_prediction": context, "pipeline": pipeline, "build_s": build_s,
            "total_s": time.perf_counter() - t_start, "notice": REPLAY_NOTICE, "tree_notice": TREE_REPLAY_NOTICE,
            "ar": ar, "runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="smoke run: tiny shapes, few prompts and tokens")
    ap.add_argument("--parts", default="acceptance,steps,e2e")
    ap.add_argument("--pair", default="tiny", choices=sorted(PAIRS), help="the acceptance part's target and "
                    "drafters: tiny (specc-tiny + PARD + DFlash, default) or hybrid (specc-tiny-hybrid + its DFlash; "
                    "acceptance only)")
    ap.add_argument("--prompts", type=int, default=None, help="held-out-style prompts (default 32; --tiny 1)")
    ap.add_argument("--new-tokens", type=int, default=None, help="tokens per prompt (default 128; --tiny 8)")
    ap.add_argument("--budgets", default=None, help="tree budgets (default 8,16,32,64; --e2e-8b 15,31,63; --tiny 8)")
    ap.add_argument("--sizes", default=None, help="step query rows (default 16,32,64,128; --tiny 4,8)")
    ap.add_argument("--context", type=int, default=None, help="KV context of the step timings (default 1024)")
    ap.add_argument("--deployment", default=None, help="cost model deployment for predictions (default h200-bs1 on "
                    "CUDA, none on CPU)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--fp32", action="store_true", help="fp32 on the GPU too (bf16 by default there)")
    ap.add_argument("--out", default="tree.json")
    ap.add_argument("--ranks-out", default=None, help="with --parts ranks: write the tree acceptance JSON here")
    ap.add_argument("--e2e-8b", action="store_true", help="chain vs trees end to end at Qwen3-8B + DFlash-b16 shapes "
                    "(random weights, replayed acceptance); writes --out-dir/tree-e2e-8b.json")
    ap.add_argument("--tiny-check", action="store_true", help="with --e2e-8b: tiny shapes on the CPU (smoke test)")
    ap.add_argument("--acceptance", action="append", help="with --e2e-8b, repeatable: an acceptance to replay "
                    "(specc bench --acceptance forms; default: DFlash's published GSM8K and MT-Bench tau, each with "
                    "specc-tiny's rank split)")
    ap.add_argument("--prompt-len", type=int, default=None, help="with --e2e-8b: prompt tokens (default 128; check 16)")
    ap.add_argument("--out-dir", default=".", help="with --e2e-8b: directory of the JSON (default .)")
    ap.add_argument("--kernels", action="store_true", help="with --e2e-8b: one more pass per system under "
                    "torch.profiler: kernel time and launches per step, the largest kernels (``kernel_pass``)")
    args = ap.parse_args()
    if args.e2e_8b:
        small = args.tiny_check
        device = "cpu" if small else args.device
        if device == "cpu":
            torch.set_num_threads(args.threads)
        budgets = [int(x) for x in (args.budgets or "15,31,63").split(",")]
        result = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name() if device.startswith("cuda")
                  else "cpu", "torch": torch.__version__, "python": sys.version.split()[0]}
        result.update(e2e_8b(args.acceptance or DEFAULT_8B_ACCEPTANCE, budgets, args.prompts or (1 if small else 8),
                             args.prompt_len or (16 if small else 128), args.new_tokens or (12 if small else 256),
                             device, small, args.deployment or ("cpu" if small else "h200-bs1"),
                             kernels=args.kernels))
        out = pathlib.Path(args.out_dir) / "tree-e2e-8b.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {out}")
        return

    from specc.models.loading import load_tokenizer
    from specc.pairing import resolve_pair

    cuda = args.device.startswith("cuda")
    dtype = torch.float32 if args.fp32 or not cuda else torch.bfloat16
    if not cuda:
        torch.set_num_threads(args.threads)  # small matmuls: thread start-up costs more than it gains
    small = args.tiny
    n_prompts = args.prompts or (1 if small else 32)
    new_tokens = args.new_tokens or (8 if small else 128)
    budgets = [int(x) for x in (args.budgets or ("8" if small else "8,16,32,64")).split(",")]
    sizes = [int(x) for x in (args.sizes or ("4,8" if small else "16,32,64,128")).split(",")]
    context = args.context or (32 if small else 1024)
    deployment = args.deployment or ("h200-bs1" if cuda else None)
    parts = set(args.parts.split(","))
    if args.pair != "tiny" and parts != {"acceptance"}:
        ap.error(f"--pair {args.pair} measures the acceptance part only (--parts acceptance)")
    target_name, pair_methods = PAIRS[args.pair]
    torch.manual_seed(0)
    result = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name() if cuda else "cpu",
              "torch": torch.__version__, "python": sys.version.split()[0], "dtype": str(dtype), "tiny": small,
              "block": K + 1}
    try:
        import triton

        result["triton"] = triton.__version__
    except ImportError:
        pass
    tok = load_tokenizer(resolve_pair(target_name).target.path)
    prompts = heldout_prompts(tok, n_prompts, lo=16 if small else 64, hi=24 if small else 128)
    result["prompts"] = len(prompts)
    result["new_tokens"] = new_tokens
    if "acceptance" in parts:
        result["target"] = target_name
        result["acceptance"] = acceptance(prompts, new_tokens, budgets, dtype, args.device, target_name, pair_methods)
    if "steps" in parts:
        result["steps"] = {"context": context, "shapes": "tiny" if small else "Qwen3-8B", "deployment": deployment,
                           "rows": steps(sizes, dtype, args.device, context, small, deployment)}
    if "ranks" in parts:
        result["ranks"] = ranks(prompts, new_tokens, dtype, args.device, args.ranks_out)
    if "e2e" in parts:
        result["e2e"] = e2e(prompts[: max(1, min(len(prompts), 8))], new_tokens, budgets, dtype, args.device,
                            METHODS[1:] if small else METHODS)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")
    failures = acceptance_failures(result.get("acceptance", []), dtype)
    if failures:  # written first: the JSON says where the tokens part
        raise SystemExit("not lossless:\n" + "\n".join(failures))


if __name__ == "__main__":
    main()
