"""The LLM proposer against a local OpenAI-compatible stub (http.server on 127.0.0.1, a bounded
number of canned replies): a valid pass plan is accepted, a broken pass (run in a sandboxed
subprocess) is rejected by token forcing, both outcomes land in the memory."""

from __future__ import annotations

import http.server
import json
import threading

import pytest
from broken_passes import negate_logits_source

from specc.search.driver import Search
from specc.search.llm_proposer import LLMProposer, parse_reply, plan_candidate, source_candidate
from specc.search.memory import Memory
from specc.search.proposers import Candidate

PLAN = """Fusing removes launches, which lead the gap report.
```json
{"plan": ["fuse_qkv", "fuse_gate_up", "fuse_norm_linear", "dce"], "why": "fewer launches"}
```"""

BROKEN_SOURCE = ('Here is a pass that "simplifies" the LM head:\n```python'
                 + negate_logits_source("llm_negate_logits") + "```")


class Stub:
    """An OpenAI-compatible chat endpoint that serves ``replies`` in order, then 503s."""

    def __init__(self, replies: list[str]):
        self.replies, self.requests = list(replies), []
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append({"path": self.path, "body": body})
                if not stub.replies:
                    self.send_response(503)
                    self.end_headers()
                    return
                content = stub.replies.pop(0)
                data = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_parse_reply():
    assert parse_reply(PLAN)[0] == "plan"
    assert parse_reply('["fuse_qkv", "dce"]') == ("plan", {"plan": ["fuse_qkv", "dce"]})
    kind, source = parse_reply(BROKEN_SOURCE)
    assert kind == "source" and "class NegateLogits(Pass)" in source
    assert parse_reply("I would fuse things.")[0] == "error"


def test_plan_and_source_candidates(tmp_path):
    best = Candidate({"target": "", "drafter": ""}, 8)
    c = plan_candidate({"plan": ["fuse_qkv", {"name": "pack_weights_12bit", "params": {"pack_exclude": ["lm_head"]}}],
                        "roles": ["target"], "num_draft": 4}, best, ("target", "drafter"))
    assert c.passes == {"target": "fuse_qkv,pack_weights_12bit", "drafter": ""}
    assert c.options == {"target": {"pack_exclude": ["lm_head"]}} and c.num_draft == 4 and c.origin == "llm"
    s = source_candidate(parse_reply(BROKEN_SOURCE)[1], Candidate({"target": "fuse_qkv,dce"}, 0), ("target",), tmp_path)
    assert s.sandbox and s.passes["target"].startswith("fuse_qkv,+") and s.passes["target"].endswith(",dce")
    assert len(list(tmp_path.glob("llm_NegateLogits_*.py"))) == 1
    from specc.errors import UserError

    with pytest.raises(UserError, match="does not parse"):
        source_candidate("class X(Pass):\n  def run(self", best, ("target",), tmp_path)
    with pytest.raises(UserError, match="no subclass of Pass"):
        source_candidate("x = 1\n", best, ("target",), tmp_path)


def test_llm_search_accepts_the_plan_and_rejects_the_broken_pass(tiny, tmp_path):
    with Stub([PLAN, BROKEN_SOURCE]) as stub:
        proposer = LLMProposer(stub.url, "canned-model", max_requests=2, timeout=30)
        s = Search(tiny["target"], None, deployment="h200-bs1", memory=tmp_path, start_pipeline="",
                   proposers=[proposer], num_prompts=2, max_new_tokens=8, sandbox_timeout=240)
        result = s.run(rounds=3)
    # bounded: two requests, both chat completions for the named model with the gap report and the guide
    assert len(stub.requests) == 2
    for req in stub.requests:
        assert req["path"] == "/v1/chat/completions" and req["body"]["model"] == "canned-model"
        user = req["body"]["messages"][-1]["content"]
        assert "Gap report" in user and "target launch overhead" in user and "Writing passes" in user
    r1, r2 = result.rounds[0], result.rounds[1]
    (plan,) = r1["candidates"]
    assert plan["origin"] == "llm" and plan["verified"] and r1["improved"]
    assert result.best.candidate.passes["target"] == "fuse_qkv,fuse_gate_up,fuse_norm_linear,dce"
    (broken,) = r2["candidates"]
    assert broken["status"] == "rejected: token forcing failed" and not r2["improved"]
    assert broken["forcing"]["mismatches"] > 0
    assert len(result.rounds) == 3 and result.rounds[2]["new"] == 0  # no third request
    memory = Memory.load(tmp_path / "qwen3__h200-bs1.json")
    by_origin = {e.mechanism: e for e in memory.entries}
    assert by_origin["llm plan [fuse_qkv,fuse_gate_up,fuse_norm_linear,dce]"].validated
    bad = [e for e in memory.entries if e.mechanism.startswith("llm pass NegateLogits")]
    assert bad and not bad[0].validated and "mismatch" in bad[0].notes
    assert list((tmp_path / "llm_passes").glob("llm_NegateLogits_*.py"))


def test_unreachable_endpoint_is_a_note_not_a_crash(tiny):
    import types

    proposer = LLMProposer("http://127.0.0.1:9/v1", "m", timeout=2)
    ctx = types.SimpleNamespace(round=1, notes=[], best=types.SimpleNamespace(candidate=Candidate({"target": ""}, 0)),
                                deployment=types.SimpleNamespace(name="cpu", gpu="cpu", batch_size=1), method="ar",
                                gap_report=None, ir_summary=lambda: "", passes={}, roles=("target",), memory=None)
    assert proposer.propose(ctx) == []
    assert ctx.notes and "cannot reach" in ctx.notes[0]
