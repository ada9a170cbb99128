"""Load a running `specc serve` with concurrent streaming completions and report throughput,
time to first token and latency, plus the server's own figures from /metrics (tokens per
verification step, decode tokens/s while busy, queue depth).

    specc serve q8.specc --port 8000 --device cuda &
    python3 examples/bench_serve.py --url http://127.0.0.1:8000 --concurrency 8 --requests 64 --max-tokens 128

``--check`` first answers every prompt alone, then checks that each concurrent answer has the
same token ids (exactness under load). Standard library only, so it runs wherever Python does.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n\n", "class Stack:\n    def __init__(self):",
           "def quicksort(xs):", "# read a CSV file and print the sum of the second column\n",
           "def is_prime(n: int) -> bool:", "from dataclasses import dataclass\n\n@dataclass\nclass Point:",
           "def merge(a, b):"]


def stream_completion(url: str, prompt, max_tokens: int, timeout: float) -> dict:
    """One streaming request: its token ids, time to first token, latency and usage."""
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "stream": True, "return_token_ids": True,
                       "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", body, {"Content-Type": "application/json"})
    start = time.perf_counter()
    first, tokens, usage = None, [], None
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: "):])
            if "error" in event:
                raise RuntimeError(event["error"]["message"])
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices", []):
                if choice.get("token_ids") and first is None:
                    first = time.perf_counter() - start
                tokens += choice.get("token_ids", [])
    return {"tokens": tokens, "ttft_s": first, "latency_s": time.perf_counter() - start, "usage": usage}


def server_metrics(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    wanted = ("specc_accepted_tokens_per_step", "specc_generation_tokens_per_second", "specc_requests_waiting",
              "specc_generation_tokens_total", "specc_engine_busy_seconds_total")
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in wanted:
            out[name] = float(value)
    return out


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]


def run(url: str, concurrency: int, requests: int, max_tokens: int, check: bool, timeout: float = 600.0) -> dict:
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(requests)]
    alone = {}
    if check:  # each distinct prompt answered alone first
        for p in dict.fromkeys(prompts):
            alone[p] = stream_completion(url, p, max_tokens, timeout)["tokens"]
    before = server_metrics(url)
    lock, results = threading.Lock(), []

    def one(prompt):
        r = stream_completion(url, prompt, max_tokens, timeout)
        with lock:
            results.append((prompt, r))

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, prompts))
    wall = time.perf_counter() - start
    after = server_metrics(url)
    tokens = sum(len(r["tokens"]) for _, r in results)
    ttft = [r["ttft_s"] for _, r in results if r["ttft_s"] is not None]
    latency = [r["latency_s"] for _, r in results]
    busy = after.get("specc_engine_busy_seconds_total", 0) - before.get("specc_engine_busy_seconds_total", 0)
    generated = after.get("specc_generation_tokens_total", 0) - before.get("specc_generation_tokens_total", 0)
    report = {
        "url": url, "concurrency": concurrency, "requests": requests, "max_tokens": max_tokens,
        "wall_s": wall, "output_tokens": tokens, "output_tokens_per_s": tokens / wall, "requests_per_s": requests / wall,
        "ttft_p50_s": percentile(ttft, 50), "ttft_p95_s": percentile(ttft, 95),
        "latency_p50_s": percentile(latency, 50), "latency_p95_s": percentile(latency, 95),
        "server_tokens_per_busy_s": generated / busy if busy > 0 else 0.0,
        "server_accepted_tokens_per_step": after.get("specc_accepted_tokens_per_step", 0.0),
    }
    if check:
        report["mismatches"] = sum(1 for p, r in results if r["tokens"] != alone[p])
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="the server (default http://127.0.0.1:8000)")
    ap.add_argument("--concurrency", type=int, default=8, help="requests in flight at once (default 8)")
    ap.add_argument("--requests", type=int, default=32, help="requests in all (default 32)")
    ap.add_argument("--max-tokens", type=int, default=128, help="tokens per request (default 128)")
    ap.add_argument("--check", action="store_true", help="check every answer against the prompt answered alone")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    if min(args.concurrency, args.requests, args.max_tokens) < 1:
        ap.error("--concurrency, --requests and --max-tokens must be >= 1")
    try:
        report = run(args.url.rstrip("/"), args.concurrency, args.requests, args.max_tokens, args.check)
    except (urllib.error.URLError, ConnectionError) as exc:
        print(f"bench_serve: {args.url}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{report['requests']} requests x {report['max_tokens']} tokens, {report['concurrency']} at once: "
              f"{report['output_tokens_per_s']:,.1f} output tok/s, {report['requests_per_s']:.2f} req/s | "
              f"TTFT p50 {report['ttft_p50_s'] * 1e3:.1f} ms, p95 {report['ttft_p95_s'] * 1e3:.1f} ms | "
              f"latency p50 {report['latency_p50_s']:.2f} s, p95 {report['latency_p95_s']:.2f} s | server: "
              f"{report['server_tokens_per_busy_s']:,.1f} tok/s busy, "
              f"{report['server_accepted_tokens_per_step']:.2f} tokens/step")
        if args.check:
            print(f"exactness: {report['mismatches']} of {report['requests']} answers differ from the prompt alone")
    return 1 if args.check and report["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
