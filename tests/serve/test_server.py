"""The real server: `specc serve` in a subprocess on 127.0.0.1 (a free port) answers concurrent
completions (streaming and not, token-id and text prompts) with exactly the one-at-a-time
Engine.generate output, survives bad requests; a client that disconnects cancels its request
(uvicorn in a thread over a slow fake backend)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from serve_fakes import FakeBackend

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # examples/


@pytest.fixture(scope="module")
def served(tiny_artifact):
    """(base URL, the subprocess) of `specc serve ARTIFACT --port 0 --max-len 256`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPECC_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "specc", "serve", str(tiny_artifact), "--port", "0",
                             "--max-len", "256"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=str(ROOT))
    try:
        line = proc.stdout.readline()  # printed once the server accepts connections
        match = re.search(r"http://127\.0\.0\.1:\d+", line)
        assert match, f"no URL in {line!r}; stderr: {proc.stderr.read() if proc.poll() is not None else ''}"
        yield match.group(0), proc
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def engine(tiny_artifact):
    from specc.runtime.engine import load

    return load(tiny_artifact)


def _stream_tokens(text: str) -> tuple[list[int], str, str]:
    """(token ids, text, finish_reason) of a completions SSE body."""
    events = [b[len("data: "):] for b in text.split("\n\n") if b.strip()]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e)["choices"][0] for e in events[:-1]]
    return ([t for c in chunks for t in c.get("token_ids", [])], "".join(c["text"] for c in chunks),
            chunks[-1]["finish_reason"])


REQUESTS = [  # (prompt, max_tokens, stream)
    ([5, 6, 7, 8], 12, False),
    ([5, 6, 7, 8], 12, True),
    ([300, 301, 302, 303, 304], 9, True),
    ([17] * 30, 16, False),
    ("def fibonacci(n):", 10, True),
    ("import os\n", 14, False),
    ([1], 1, False),
]


def test_concurrent_requests_equal_one_at_a_time_outputs(served, engine):
    url, _ = served

    async def one(client, prompt, n, stream):
        body = {"model": "specc-tiny", "prompt": prompt, "max_tokens": n, "stream": stream, "return_token_ids": True}
        r = await client.post(f"{url}/v1/completions", json=body)
        assert r.status_code == 200, r.text
        if stream:
            return _stream_tokens(r.text)
        c = r.json()["choices"][0]
        return c["token_ids"], c["text"], c["finish_reason"]

    async def main():
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.gather(*(one(client, *req) for req in REQUESTS))

    eos = set(engine.eos_token_ids)
    for (prompt, n, _), (tokens, text, reason) in zip(REQUESTS, asyncio.run(main())):
        ids = prompt if isinstance(prompt, list) else engine.tokenizer(prompt)["input_ids"]
        expected = engine.generate(ids, n)
        assert tokens == expected.tokens, (prompt, n)
        assert text == engine.tokenizer.decode([t for t in expected.tokens if t not in eos], skip_special_tokens=True)
        assert reason == ("stop" if expected.finished_by == "eos" else "length")


def test_bad_requests_do_not_kill_the_server(served, engine):
    url, proc = served
    with httpx.Client(base_url=url, timeout=60) as client:
        for kw in ({"content": b"{not json"}, {"json": {"prompt": [1] * 250, "max_tokens": 10}},
                   {"json": {"prompt": "x", "model": "nope"}}, {"json": {"prompt": "x", "temperature": 0.9, "top_k": -1}},
                   {"json": {"prompt": [1, -3]}}, {"content": b"\xff\xfe"}):
            r = client.post("/v1/completions", **kw)
            assert 400 <= r.status_code < 500 and set(r.json()["error"]) >= {"message", "type", "code"}, r.text
        assert client.get("/health").json() == {"status": "ok"} and proc.poll() is None
        r = client.post("/v1/completions", json={"prompt": [5, 6, 7, 8], "max_tokens": 5, "return_token_ids": True})
        assert r.json()["choices"][0]["token_ids"] == engine.generate([5, 6, 7, 8], 5).tokens
        assert client.get("/v1/models").json()["data"][0]["id"] == "specc-tiny"
        metrics = client.get("/metrics").text
        assert 'specc_http_requests_total{code="400",endpoint="/v1/completions"}' in metrics
        assert "specc_requests_waiting 0.0" in metrics


def _wait_for(predicate, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_client_that_disconnects_while_streaming_cancels_its_request(fake_info, thread_server):
    from specc.serve.app import create_app

    backend = FakeBackend(fake_info, delay=0.05)
    server = thread_server(create_app(backend))
    with httpx.Client(base_url=server.url, timeout=30) as client:
        with client.stream("POST", "/v1/completions", json={"prompt": [5], "max_tokens": 60, "stream": True}) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
        _wait_for(lambda: backend.cancelled == [backend.submitted[0].id])
        assert backend.finished == []
        assert client.get("/health").status_code == 200


def test_a_client_that_disconnects_while_waiting_cancels_its_request(fake_info, thread_server):
    from specc.serve.app import create_app

    backend = FakeBackend(fake_info, delay=0.05)
    server = thread_server(create_app(backend))
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", json={"prompt": [5], "max_tokens": 60}, timeout=0.3)
    _wait_for(lambda: len(backend.cancelled) == 1)
    assert backend.finished == [] and backend.cancelled == [backend.submitted[0].id]


def test_the_cli_refuses_a_max_len_beyond_the_model(tiny_artifact, capsys):
    from specc.cli import main

    assert main(["serve", str(tiny_artifact), "--port", "0", "--max-len", "100000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specc: error: ") and "512 positions" in err and err.count("\n") == 1


def test_the_load_script_reports_and_checks_exactness(fake_info, thread_server, capsys):
    """examples/bench_serve.py (the GPU measurement's client) against a fake backend."""
    from examples.bench_serve import main

    from specc.serve.app import create_app

    server = thread_server(create_app(FakeBackend(fake_info)))
    assert main(["--url", server.url, "--concurrency", "3", "--requests", "6", "--max-tokens", "5",
                 "--check", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["mismatches"] == 0 and report["output_tokens"] == 6 * 5 and report["output_tokens_per_s"] > 0
    assert 0 < report["ttft_p50_s"] <= report["latency_p95_s"]
    assert report["server_accepted_tokens_per_step"] == 2.5  # the fake's stats, read from /metrics


def test_ctrl_c_stops_the_server_gracefully(served):
    """Last in this module: it stops the module's server."""
    import signal

    _, proc = served
    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) == 0
    assert "specc serve: stopped" in proc.stderr.read()
