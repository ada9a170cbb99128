"""Device time per part of the batched speculative step (CUDA events), to find the host gap."""
import json, os, sys, time
sys.path.insert(0, "examples")
import torch
import bench_batching as bb
from specc.bench.batched import drive

dep = sys.argv[1] if len(sys.argv) > 1 else "h100-bs1"
dev = torch.device("cuda")
opts = bb.pair_options(os.environ.get("SHAPES", "qwen3-8b"), 32, int(os.environ.get("TOK", 128)), dep)
pair = bb.shaped_pairs(opts, dev)[0]
out = {}
for system, loop in (("spec", pair.loop), ("ar", pair.ar)):
    for B in [int(b) for b in os.environ.get("BS", "16,32").split(",")]:
        prompts = pair.prompts[:B]
        loop.profile = False
        drive(loop, prompts, opts.tokens)  # warm: captures
        torch.cuda.synchronize()
        if hasattr(loop.verifier, "reset"):
            loop.verifier.reset()
        t0 = time.perf_counter()
        run = drive(loop, prompts, opts.tokens)
        torch.cuda.synchronize()
        wall = run.decode_seconds / run.decode_steps
        loop.profile = "events"
        if hasattr(loop.verifier, "reset"):
            loop.verifier.reset()
        run2 = drive(loop, prompts, opts.tokens)
        parts = {k: 1e3 * v / run2.decode_steps for k, v in loop.part_seconds.items()}
        loop.profile = False
        out[f"{system}-B{B}"] = {"step_ms_unprofiled": 1e3 * wall, "steps": run.decode_steps,
                                 "parts_ms_per_step": parts, "step_ms_profiled": 1e3 * run2.decode_seconds / run2.decode_steps}
        print(system, B, json.dumps(out[f"{system}-B{B}"]), flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "parts.json"), "w"), indent=1)
