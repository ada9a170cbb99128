"""Where a tree verify step spends more than a chain verify step of the same size, per tree mask format.

Builds the compiled target (random weights, Qwen3-8B shapes or ``--tiny``) with its chain and tree
verify steps. At each node count of ``--q`` it profiles CUDA-graph replays of the chain step and of
the tree step once per tree mask format of ``--masks`` (``words``: the packed bit words the
generated tree step builds once per step; ``bytes``: the byte mask tile loads;
``attention.set_tree_mask_format``, a fresh graph capture each) with ``torch.profiler`` (device
time per kernel, ``examples/profile_step.kernel_profile``), and prints per step the attention
kernels' time (split + merge kernels, per step and per layer), the whole step's kernel time and the
kernels whose time differs most between the tree and the chain. The tree step's logits under each
format are compared with the first format's (max abs difference: fp rounding of the split layout,
which differs between the formats; a wide difference would be a bug).

On the CPU (``--device cpu``; with ``--tiny`` it is the script's smoke check) the kernels run
under the Triton interpreter and the times are host times of the attention launcher: they check
the script, not the kernel's speed.

``--loop`` (Qwen3-8B + DFlash-b16 shapes, random weights; ``--tiny``: tiny shapes): why the tree
verify costs more inside the engine's loop than alone. At each tree budget N of ``--budgets`` it
runs the engine's loop (``engine.build_loop``: CUDA graphs on a GPU, acceptance replayed from
DFlash's published GSM8K tau with specc-tiny's rank split) and times, in one process:

- ``loop``: the verify part of the loop's per-part profile (``PartTimer``, ms per step), the
  verify call's input signatures over every step (one: one graph), the graph stats, the loop's
  glue outside its steps per step (``specc.bench.step_audit.StepAudit``: eager ops, host reads)
  and the kernels of the in-loop verify calls (``torch.profiler``; each call in a synchronised
  range);
- ``alone``: the same graphed tree step called with the inputs the loop gave it at one step
  (recorded by a spy on the loop's tree step; CUDA events, median), and its kernels; the recorded
  call is re-run at once and its logits must equal the loop's (``rerun_max_abs_diff``: 0);
- ``chain``: the compiled chain verify step at the tree's row count N + 1 and at N rows (the
  linears' row buckets change between them), timed and profiled the same way;
- ``linears``: per linear weight shape at N and N + 1 rows, the config, how often it reads its
  weight (``kernels.linear.weight_passes``) and its time (graph replays; beside it at 16 < rows
  < 64 the 64 bucket's tuned config and at 16 < rows <= 32 the 16 bucket's widened to one 32-row
  tile, the data behind the tuned 32 bucket; at rows > 64 one 128-row tile that reads each
  weight once, ``ONE_TILE_CONFIG``, beside the default two 64-row tiles).

Per budget it prints the three times and the kernels whose time differs most between the loop
and alone, and alone and the chain. On the CPU it is the script's check: host times, host ops
instead of kernels, reference bodies (no interpreter).

    PYTHONPATH=. python3 examples/profile_tree.py --q 16,32,64,128 --out $OUT/profile_tree.json
    PYTHONPATH=. python3 examples/profile_tree.py --device cpu --tiny --q 4,40 --context 16 --out /tmp/p.json
    PYTHONPATH=. python3 examples/profile_tree.py --loop --out $OUT/tree-loop.json            # H200, ~2 min
    PYTHONPATH=. python3 examples/profile_tree.py --loop --tiny --device cpu --budgets 4 --out /tmp/l.json
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

ATTENTION_KERNELS = ("_attn_split_kernel", "_attn_merge_kernel")


def host_profile(step, args, reps: int = 2) -> dict:
    """CPU: host time of the step and of its attention launches (interpreted kernels)."""
    from specc.codegen.kernels import attention as A

    real, spent = A.attention, [0.0, 0]

    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return real(*a, **k)
        finally:
            spent[0] += time.perf_counter() - t
            spent[1] += 1

    A.attention = timed
    try:
        with torch.inference_mode():
            step(*args)
            spent[:] = [0.0, 0]
            t0 = time.perf_counter()
            for _ in range(reps):
                step(*args)
            total = time.perf_counter() - t0
    finally:
        A.attention = real
    return {"kernels": [{"kernel": "_attn_split_kernel (host time, interpreted)", "calls_per_step": spent[1] / reps,
                         "us_per_step": spent[0] / reps * 1e6}],
            "kernel_us_per_step": total / reps * 1e6, "span_us_per_step": total / reps * 1e6,
            "launches_per_step": None}


def attention_us(prof: dict) -> tuple[float, float]:
    """(us per step, split-kernel calls per step) of the attention kernels in a profile."""
    rows = [r for r in prof["kernels"] if r["kernel"].startswith(ATTENTION_KERNELS)]
    calls = sum(r["calls_per_step"] for r in rows if r["kernel"].startswith(ATTENTION_KERNELS[0]))
    return sum(r["us_per_step"] for r in rows), calls


def by_name(prof: dict) -> dict[str, float]:
    """Kernel time per step by kernel name (launch grid dropped)."""
    out: dict[str, float] = {}
    for r in prof["kernels"]:
        name = r["kernel"].split(" grid=")[0]
        out[name] = out.get(name, 0.0) + r["us_per_step"]
    return out


def logits_of(step, args) -> torch.Tensor:
    with torch.inference_mode():
        out = step(*args)
    return (out[0] if isinstance(out, tuple) else out).float()


WINDOW = "specc.verify_call"  # the profiler range around each timed verify call
# an alternative for rows 65..128: one 128-row tile that reads each weight once (measured slower than the
# default two 64-row tiles at 65 rows on the H200, docs/benchmarks/h200-run6.md)
ONE_TILE_CONFIG = dict(kind="dot", block_m=128, block_n=64, block_k=64, split_k=0, num_warps=4, num_stages=4,
                       swap_ab=True)


def signature(args) -> str:
    """A call's input signature as a graphed step keys it (shapes and dtypes; other values)."""
    return ", ".join(f"{tuple(a.shape)} {str(a.dtype).replace('torch.', '')}" if torch.is_tensor(a) else repr(a)
                     for a in args)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _logits(out) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out


class VerifySpy:
    """Stands in for a loop's tree verify step (``loop.tree_target``): counts each call's input
    signature; with ``record`` set, keeps the inputs of the ``record``-th call (clones) and re-runs
    that call at once with them, keeping the max abs difference of the logits (0: the step alone
    with these inputs is the step the loop ran); with ``windowed``, brackets every call in a
    synchronised profiler range so its kernels can be picked out of a trace."""

    def __init__(self, step, device: torch.device):
        self.step, self.device = step, device
        self.signatures: dict[str, int] = {}
        self.record, self.calls, self.windowed = 0, 0, False
        self.inputs, self.rerun_diff = None, None

    def __getattr__(self, name):
        return getattr(self.__dict__["step"], name)

    def __call__(self, *args):
        from torch.profiler import record_function

        key = signature(args)
        self.signatures[key] = self.signatures.get(key, 0) + 1
        self.calls += 1
        if self.windowed:
            _sync(self.device)
            with record_function(WINDOW):
                out = self.step(*args)
                _sync(self.device)
        else:
            out = self.step(*args)
        if self.record and self.calls == self.record and self.inputs is None:
            first = _logits(out).float().clone()
            self.inputs = tuple(a.clone() if torch.is_tensor(a) else a for a in args)
            again = _logits(self.step(*self.inputs)).float()  # same inputs, same cache slots: same values
            self.rerun_diff = float((again - first).abs().max())
        return out


def time_calls(device: torch.device, fn, args, reps: int) -> float:
    """Median ms of ``fn(*args)``, each call on its own (CUDA events around it; CPU: perf_counter),
    after two warm-up calls: what one call costs the loop, launch and input copies included."""
    with torch.inference_mode():
        for _ in range(2):
            fn(*args)
        _sync(device)
        times = []
        for _ in range(reps):
            if device.type == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn(*args)
                b.record()
                torch.cuda.synchronize(device)
                times.append(a.elapsed_time(b))
            else:
                t0 = time.perf_counter()
                fn(*args)
                times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


def windowed_kernels(device: torch.device, run) -> dict:
    """``run()`` makes calls through a windowed ``VerifySpy``; returns the device kernels (CPU: the
    host ops, nested ones included) inside those ranges, per call: name (with grid), calls, us."""
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch.inference_mode(), profile(activities=activities) as prof:
        run()
        _sync(device)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f).get("traceEvents", [])

    def ranges(cat):
        return [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == WINDOW and e.get("cat") == cat
                and "dur" in e]

    calls = len(ranges("user_annotation"))
    # on a GPU the ranges as the device ran them (the span of the kernels each range launched, graph
    # replays included) where the profiler gives them, else the host ranges (synchronised at both ends)
    windows = ranges("gpu_user_annotation") if cuda else []
    windows = windows or ranges("user_annotation")
    kind = "kernel" if cuda else "cpu_op"
    groups: dict[str, list] = {}
    for e in events:
        if e.get("cat") != kind or "dur" not in e or e.get("name") == WINDOW:
            continue
        if any(lo <= e["ts"] and e["ts"] + e["dur"] <= hi for lo, hi in windows):
            key = e["name"][:60] + (f" grid={e.get('args', {}).get('grid')}" if cuda else "")
            g = groups.setdefault(key, [0, 0.0])
            g[0] += 1
            g[1] += e["dur"]
    n = max(calls, 1)
    rows = sorted(({"kernel": k, "calls_per_call": c / n, "us_per_call": t / n} for k, (c, t) in groups.items()),
                  key=lambda r: -r["us_per_call"])
    if calls and not rows:
        print(f"[loop] warning: no {kind} events inside the {calls} profiled calls' ranges", flush=True)
    return {"calls": calls, "what": "device kernels" if cuda else "host ops (nested, CPU check)",
            "us_per_call": sum(r["us_per_call"] for r in rows), "kernels": rows}


def kernel_diff(a: dict, b: dict, top: int = 8) -> list[dict]:
    """Kernels (grid dropped) whose us per call differ most between profiles ``a`` and ``b`` (a - b)."""
    def names(p):
        out: dict[str, float] = {}
        for r in p["kernels"]:
            name = r["kernel"].split(" grid=")[0]
            out[name] = out.get(name, 0.0) + r["us_per_call"]
        return out

    x, y = names(a), names(b)
    diff = sorted(((x.get(k, 0.0) - y.get(k, 0.0), k) for k in set(x) | set(y)), key=lambda t: -abs(t[0]))
    return [{"kernel": k, "us": d} for d, k in diff[:top]]


def _tensors(step) -> dict[str, torch.Tensor]:
    """A compiled step's weights (parameters) and other tensor attributes, by flat name."""
    found = {name: t for name, t in vars(step).items() if torch.is_tensor(t)}
    found.update(dict(step.named_parameters()))
    return found


def linear_shapes(step) -> dict[tuple[int, int], int]:
    """(N, K) -> count of the compiled step's linear weights (2-D weights but the embedding)."""
    shapes: dict[tuple[int, int], int] = {}
    for name, value in _tensors(step).items():
        if value.dim() == 2 and name.endswith("_weight") and "embed" not in name:
            key = (int(value.shape[0]), int(value.shape[1]))
            shapes[key] = shapes.get(key, 0) + 1
    return shapes


def linear_rows(step, rows: int, device: torch.device, reps: int) -> dict:
    """The linears of ``step`` at ``rows`` rows: per weight shape the config, its weight passes and
    the time of one call (at 16 < rows < 64 also with the 64 bucket's config, at 16 < rows <= 32
    with the 16 bucket's widened to 32 rows, at rows > 64 with ``ONE_TILE_CONFIG``); the weight
    traffic factor (bytes read / weight bytes) over the step's linears."""
    from specc.codegen.kernels import linear as L
    from specc.search.calibrate import Timer

    # one launch alone is shorter than its host launch cost: replays of a captured graph (CUDA events)
    timer = Timer(device.type, reps=reps)

    def us(fn, x, w):
        with torch.inference_mode():
            return 1e6 * timer(lambda: fn(x, w))

    shapes = linear_shapes(step)
    weight = next(t for t in _tensors(step).values() if t.dim() == 2)
    out, read, total = [], 0, 0
    for (n, k), count in sorted(shapes.items()):
        cfg = L.get_config(rows, n, k)
        passes = L.weight_passes(rows, n, k)
        read, total = read + passes * n * k * count, total + n * k * count
        x = torch.randn(rows, k, device=device, dtype=weight.dtype)
        w = torch.randn(n, k, device=device, dtype=weight.dtype) * 0.02
        row = {"N": n, "K": k, "count": count, "bucket": L.m_bucket(rows), "kind": cfg.kind, "block_m": cfg.block_m,
               "swap_ab": cfg.swap_ab, "weight_passes": passes, "us": us(L.linear, x, w)}
        if 16 < rows < 64:  # the 64 bucket's winners (one tile) beside it
            row["bucket64_us"] = us(lambda a, b: L.linear(a, b, config=L.get_config(64, n, k)), x, w)
        if 16 < rows <= 32:  # and the 16 bucket's winners widened to one 32-row tile
            wide = L.get_config(16, n, k).replace(block_m=32)
            row["bucket16_wide_us"] = us(lambda a, b: L.linear(a, b, config=wide), x, w)
        if rows > 64:
            one = L.LinearConfig(**ONE_TILE_CONFIG)
            row["one_tile_us"] = us(lambda a, b: L.linear(a, b, config=one), x, w)
            row["one_tile_weight_passes"] = L.weight_passes(rows, n, k, one)
        out.append(row)
    sums = {key + "_per_step": sum(r[key] * r["count"] for r in out)
            for key in ("us", "bucket64_us", "bucket16_wide_us", "one_tile_us") if out and all(key in r for r in out)}
    return {"rows": rows, "weight_read_factor": read / total if total else None, **sums, "shapes": out}


def budget_gap(system, budget: int, model, chain_model, prompt: list[int], new_tokens: int, dev: torch.device,
               reps: int) -> dict:
    """One tree budget of ``--loop`` (module doc): the loop over ``system``'s compiled steps, the
    tree step alone with the loop's inputs, the chain at the same rows and one fewer, the linears."""
    from specc.bench.step_audit import StepAudit
    from specc.runtime.engine import build_loop
    from specc.runtime.graphs import GraphedStep
    from specc.runtime.replay import ReplayVerifier
    from specc.runtime.tree_replay import TreeReplayVerifier

    cuda = dev.type == "cuda"
    loop = build_loop(system.steps, system.impl.strategy, system.k, len(prompt) + new_tokens + 2,
                      drafter_section=system.section, tree_budget=budget)
    loop.use_verifiers(chain=ReplayVerifier(chain_model.alphas, seed=0), tree=TreeReplayVerifier.from_model(model, seed=0))
    loop.generate(prompt, new_tokens, ())  # warm-up: kernels compile, graphs are captured
    spy = VerifySpy(loop.tree_target, dev)
    loop.tree_target, spy.record = spy, 2  # the second step's inputs: a context the loop really has
    loop.generate(prompt, new_tokens, ())
    if spy.inputs is None:
        raise SystemExit(f"budget {budget}: the loop made {spy.calls} tree verify call(s), fewer than 2")
    loop.profile = True  # a pass of its own: the recorded call's re-run is not in it
    res = loop.generate(prompt, new_tokens, ())
    loop.profile = False
    steps, parts = max(len(res.stats.accepted_lengths), 1), dict(loop.part_seconds)
    spy.windowed = True
    in_loop = windowed_kernels(dev, lambda: loop.generate(prompt, min(new_tokens, 24), ()))
    spy.windowed = False
    with StepAudit(loop) as audit:  # what the loop runs outside its (graphed) steps, per step
        audited = max(len(loop.generate(prompt, min(new_tokens, 24), ()).stats.accepted_lengths), 1)
    signatures = dict(spy.signatures)  # every in-loop call of the four passes
    inputs, rows = spy.inputs, spy.inputs[0].shape[1]
    alone_ms = time_calls(dev, spy.step, inputs, reps)
    spy.windowed = True
    alone = windowed_kernels(dev, lambda: [spy(*inputs) for _ in range(3)])
    entry = {"budget": budget, "rows": rows, "context": int(inputs[2][0]),
             "loop": {"verify_ms_per_step": 1e3 * parts.get("verify", 0.0) / steps,
                      "part_ms_per_step": {p: 1e3 * sec / steps for p, sec in parts.items() if p != "prefill"},
                      "steps": steps, "signatures": signatures,
                      "audit_per_step": {name: n / audited for name, n in audit.counts().items()},
                      "glue_ops_by_name": dict(audit.ops_by.most_common(12)),
                      "host_reads_by_name": dict(audit.reads_by), "audited_steps": audited,
                      "graphs": loop.graph_stats(), "profile": in_loop},
             "alone": {"ms": alone_ms, "rerun_max_abs_diff": spy.rerun_diff, "profile": alone},
             "chain": {}, "linears": {}}
    tokens, lengths = inputs[0], inputs[2]
    for n_rows in (rows, rows - 1):
        chain = GraphedStep(system.steps["target"], max_tokens=n_rows) if cuda else system.steps["target"]
        chain_spy = VerifySpy(chain, dev)
        chain_spy.windowed = True
        chain_args = (tokens[:, :n_rows].clone(), lengths[:, None] + torch.arange(n_rows, device=dev)[None],
                      lengths.clone())
        entry["chain"][str(n_rows)] = {
            "ms": time_calls(dev, chain, chain_args, reps),
            "profile": windowed_kernels(dev, lambda: [chain_spy(*chain_args) for _ in range(3)])}
        entry["linears"][str(n_rows)] = linear_rows(spy.step.step if cuda else spy.step, n_rows, dev, reps)
    entry["diff_us"] = {"loop_minus_alone": kernel_diff(in_loop, alone),
                        "alone_minus_chain_same_rows": kernel_diff(alone, entry["chain"][str(rows)]["profile"])}
    return entry


def print_gap(entry: dict) -> None:
    """The lines ``--loop`` prints for one budget."""
    budget, rows, lin = entry["budget"], entry["rows"], entry["linears"]
    same, fewer = entry["chain"][str(rows)], entry["chain"][str(rows - 1)]
    print(f"[loop] tree {budget:3d} ({rows} rows, context {entry['context']}): verify in the loop "
          f"{entry['loop']['verify_ms_per_step']:.3f} ms/step, alone {entry['alone']['ms']:.3f} ms (rerun diff "
          f"{entry['alone']['rerun_max_abs_diff']:.3g}), chain at {rows} rows {same['ms']:.3f} ms, at {rows - 1} rows "
          f"{fewer['ms']:.3f} ms; linears read their weights {lin[str(rows)]['weight_read_factor']:.2f}x at {rows} "
          f"rows, {lin[str(rows - 1)]['weight_read_factor']:.2f}x at {rows - 1}; input signatures "
          f"{len(entry['loop']['signatures'])}", flush=True)
    for n_rows, li in lin.items():
        alts = ", ".join(f"{key[:-len('_us_per_step')]} config {li[key]:.1f}" for key in li
                         if key.endswith("_us_per_step") and key != "us_per_step")
        print(f"[loop]   linears alone at {n_rows} rows: {li['us_per_step']:.1f} us per step"
              + (f" ({alts})" if alts else ""), flush=True)
    a = entry["loop"]["audit_per_step"]
    print(f"[loop]   per step outside the steps: {a['glue_ops']:.1f} glue ops, {a['host_reads']:.1f} host reads, "
          f"{a['blocking_uploads']:.1f} blocking uploads, {a['forwards']:.1f} step forwards", flush=True)
    in_loop, alone = entry["loop"]["profile"], entry["alone"]["profile"]
    print(f"[loop]   kernels per call ({in_loop['what']}): loop {in_loop['us_per_call']:.1f} us "
          f"({in_loop['calls']} calls), alone {alone['us_per_call']:.1f} us, chain "
          f"{same['profile']['us_per_call']:.1f} us", flush=True)
    for label, top in entry["diff_us"].items():
        print(f"[loop]   {label}: " + ", ".join(f"{r['kernel']} {r['us']:+.1f}" for r in top[:4]), flush=True)


def loop_gap(args) -> dict:
    """The ``--loop`` measurement (module doc)."""
    from examples.bench_tree import DEFAULT_8B_ACCEPTANCE, build_dflash_system, dflash_num_draft
    from specc.bench.acceptance import parse_tree_acceptance
    from specc.search.acceptance import AcceptanceModel
    from specc.search.cost_model import CostModel
    from specc.search.deployments import get_deployment

    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    shapes = "tiny-qwen3" if args.tiny else "qwen3-8b"
    t0 = time.perf_counter()
    k = dflash_num_draft(shapes)
    model = parse_tree_acceptance(DEFAULT_8B_ACCEPTANCE[0], k)
    chain_model = AcceptanceModel([model.prob(d, 0) for d in range(1, k + 1)], source="rank 0", measured_k=k)
    system = build_dflash_system(shapes, dtype, dev, CostModel(get_deployment("h200-bs1" if cuda else "cpu")))
    prompt_len = args.prompt_len or (16 if args.tiny else 128)
    new_tokens = args.new_tokens or (24 if args.tiny else 64)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(10, system.target_config["vocab_size"] - 10, (prompt_len,), generator=g).tolist()
    result = {"device": torch.cuda.get_device_name() if cuda else "cpu (reference bodies, host times)",
              "shapes": f"{shapes} + dflash-b16, random weights", "dtype": str(dtype), "num_draft": k,
              "acceptance": DEFAULT_8B_ACCEPTANCE[0], "prompt_len": prompt_len, "new_tokens": new_tokens,
              "build_s": time.perf_counter() - t0, "budgets": []}
    print(f"[loop] {shapes} + dflash-b16 built in {result['build_s']:.1f} s", flush=True)
    for budget in (int(x) for x in args.budgets.split(",")):
        entry = budget_gap(system, budget, model, chain_model, prompt, new_tokens, dev, reps=20 if cuda else 2)
        result["budgets"].append(entry)
        print_gap(entry)
        if cuda:
            torch.cuda.empty_cache()  # the budget's loop and graphs are gone with budget_gap's frame
    result["total_s"] = time.perf_counter() - t0
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loop", action="store_true", help="the tree verify inside the engine's loop vs alone vs the "
                    "chain at the same rows, at each of --budgets (DFlash-b16 drafter; module doc)")
    ap.add_argument("--budgets", default="15,16,31,32,63,64",
                    help="with --loop: tree budgets (drafted nodes; N + 1 rows are verified)")
    ap.add_argument("--prompt-len", type=int, default=None, help="with --loop: prompt tokens (default 128; --tiny 16)")
    ap.add_argument("--new-tokens", type=int, default=None, help="with --loop: tokens per pass (default 64; --tiny 24)")
    ap.add_argument("--q", default="16,32,64,128", help="node counts (query rows), comma-separated")
    ap.add_argument("--masks", default="words,bytes", help="tree mask formats to profile (words, bytes)")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--out", default="profile_tree.json")
    args = ap.parse_args()
    cuda = args.device.startswith("cuda")
    if args.loop:
        if not cuda:
            torch.set_num_threads(1)
        result = loop_gap(args)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.out} ({result['total_s']:.0f} s)")
        return
    if not cuda:  # run the Triton kernels interpreted (before triton is first imported)
        os.environ.setdefault("TRITON_INTERPRET", "1")
        os.environ["SPECC_KERNELS"] = "triton"
        torch.set_num_threads(1)

    from examples.bench_steps import QWEN3_8B, build_causal, tiny
    from examples.profile_step import kernel_profile
    from specc.codegen.build import build_steps
    from specc.codegen.kernels import attention as A
    from specc.passes.pipelines import DEFAULT_PIPELINE
    from specc.runtime.compiled import instantiate
    from specc.runtime.trees import build_tree

    sizes = [int(x) for x in args.q.split(",")]
    masks = args.masks.split(",")
    for fmt in masks:
        if fmt not in A.TREE_MASK_FORMATS:
            raise SystemExit(f"--masks: unknown format {fmt!r} (known: {', '.join(A.TREE_MASK_FORMATS)})")
    profile = kernel_profile if cuda else host_profile
    dev = torch.device(args.device)
    cfg = tiny(QWEN3_8B) if args.tiny else QWEN3_8B
    layers = cfg["num_hidden_layers"]
    dtype = torch.bfloat16 if cuda else torch.float32
    target = build_causal(cfg, dtype, dev, seed=1)
    target.setup_caches(1, 16)
    built = build_steps(target, None, DEFAULT_PIPELINE, tree=True)
    chain, tree_step = instantiate(built.emitted["target"]), instantiate(built.emitted["target_tree"])
    state = chain.setup_caches(1, args.context + max(sizes) + 8)
    state.bind(tree_step)
    c = args.context
    cache_len = torch.tensor([c], device=dev)
    result = {"device": torch.cuda.get_device_name() if cuda else "cpu (interpreted kernels, host times)",
              "shapes": "tiny Qwen3" if args.tiny else "Qwen3-8B", "dtype": str(dtype), "context": c,
              "layers": layers, "rows": []}
    previous = A.TREE_MASK_FORMAT
    for q in sizes:
        ids = torch.randint(0, cfg["vocab_size"], (1, q), device=dev)
        pos = torch.arange(c, c + q, device=dev)[None]
        gen = torch.Generator().manual_seed(q)
        lp = torch.randn(1, 15, cfg["vocab_size"], generator=gen).mul(3).log_softmax(-1).to(dev)
        tree = build_tree(lp, ids[:, 0], q - 1)
        tree_args = (tree.tokens, tree.positions(cache_len), cache_len, tree.ancestor_mask(15))
        profs = {"chain": profile(chain, (ids, pos, cache_len))}
        logits = {}
        try:
            for fmt in masks:
                A.set_tree_mask_format(fmt)
                profs[f"tree {fmt}"] = profile(tree_step, tree_args)
                logits[fmt] = logits_of(tree_step, tree_args)
        finally:
            A.set_tree_mask_format(previous)
        row = {"q": q, "steps": {}}
        for name, p in profs.items():
            att, calls = attention_us(p)
            row["steps"][name] = {"kernel_us_per_step": p["kernel_us_per_step"], "attention_us_per_step": att,
                                  "attention_us_per_layer": att / layers, "attention_calls_per_step": calls,
                                  "kernels": p["kernels"]}
            print(f"[Q={q:4d}] {name:11s} step {p['kernel_us_per_step']:9.1f} us, attention {att:8.1f} us/step "
                  f"= {att / layers:7.2f} us/layer ({calls:.0f} calls)", flush=True)
        chain_att = row["steps"]["chain"]["attention_us_per_step"]
        for fmt in masks:
            s = row["steps"][f"tree {fmt}"]
            s["attention_over_chain"] = s["attention_us_per_step"] / chain_att if chain_att else None
            s["step_over_chain"] = s["kernel_us_per_step"] / row["steps"]["chain"]["kernel_us_per_step"]
            s["max_abs_logit_diff_vs_" + masks[0]] = float((logits[fmt] - logits[masks[0]]).abs().max())
            print(f"[Q={q:4d}] tree {fmt:6s} / chain: step x{s['step_over_chain']:.3f}, attention "
                  f"x{s['attention_over_chain'] or float('nan'):.3f}; logits vs {masks[0]}: max abs diff "
                  f"{s['max_abs_logit_diff_vs_' + masks[0]]:.3g}", flush=True)
        a, b = by_name(profs["chain"]), by_name(profs[f"tree {masks[0]}"])
        diff = sorted(((b.get(k, 0.0) - a.get(k, 0.0), k) for k in set(a) | set(b)), reverse=True)
        print(f"[Q={q:4d}] tree {masks[0]} - chain, us per step:")
        for d, k in diff[:6]:
            print(f"    {d:+9.1f}  {k}")
        row["diff_us"] = {k: d for d, k in diff}
        result["rows"].append(row)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
