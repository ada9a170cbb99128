"""The HTTP layer (specc.serve.app) on a fake backend whose tokens are known in advance, and on
the real engine worker over a tiny compiled artifact: OpenAI shapes, streaming equal to the
whole answer, stop strings, EOS, echo, chat templates, metrics, and a 4xx JSON error for every
bad request with the server still serving afterwards."""

from __future__ import annotations

import copy
import json

import pytest
from fastapi.testclient import TestClient
from serve_fakes import FakeBackend

from specc.serve.app import create_app


def _client(backend, **kw):
    return TestClient(create_app(backend), **kw)


def _events(text: str) -> list:
    """The SSE ``data:`` payloads of a response body ("[DONE]" kept as a string)."""
    out = []
    for block in text.split("\n\n"):
        if block.strip():
            assert block.startswith("data: "), block
            data = block[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_completion_shape_text_and_usage(fake_info, tiny_tokenizer):
    backend = FakeBackend(fake_info)
    r = _client(backend).post("/v1/completions", json={"model": "fake", "prompt": [5, 6, 7], "max_tokens": 6,
                                                        "return_token_ids": True})
    assert r.status_code == 200, r.text
    body = r.json()
    expected = backend.tokens_for(backend.submitted[0])[:6]
    choice = body["choices"][0]
    assert choice["token_ids"] == expected and choice["prompt_token_ids"] == [5, 6, 7]
    assert choice["text"] == tiny_tokenizer.decode(expected) and choice["finish_reason"] == "length"
    assert body["object"] == "text_completion" and body["model"] == "fake" and body["id"].startswith("cmpl-")
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 6, "total_tokens": 9}
    assert backend.submitted[0].prompt_ids == (5, 6, 7) and backend.submitted[0].max_new_tokens == 6


def test_text_prompt_is_tokenized_and_default_max_tokens_is_16(fake_info, tiny_tokenizer):
    backend = FakeBackend(fake_info)
    r = _client(backend).post("/v1/completions", json={"prompt": "def fibonacci(n):"})
    assert r.status_code == 200, r.text
    assert list(backend.submitted[0].prompt_ids) == tiny_tokenizer("def fibonacci(n):")["input_ids"]
    assert backend.submitted[0].max_new_tokens == 16 and "token_ids" not in r.json()["choices"][0]
    nulls = {"max_tokens": None, "stream": None, "echo": None, "stop": None, "temperature": None, "n": None,
             "tools": None}
    assert _client(backend).post("/v1/completions", json={"prompt": [5], **nulls}).status_code == 200
    assert backend.submitted[-1].max_new_tokens == 16  # null means the default


def test_eos_finishes_with_stop_and_is_not_text(fake_info, tiny_tokenizer):
    backend = FakeBackend(fake_info, script=lambda r: [400, 401, 0, 402])
    body = _client(backend).post("/v1/completions", json={"prompt": [5], "max_tokens": 8,
                                                           "return_token_ids": True}).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["token_ids"] == [400, 401, 0]
    assert choice["text"] == tiny_tokenizer.decode([400, 401]) and body["usage"]["completion_tokens"] == 3


def test_stop_string_cuts_the_text_and_cancels_the_rest(fake_info, tiny_tokenizer):
    script = tiny_tokenizer("x = 1\n\ny = 2\n\nz = 3")["input_ids"]
    backend = FakeBackend(fake_info, script=lambda r: script)
    client = _client(backend)
    body = client.post("/v1/completions", json={"prompt": [5], "max_tokens": len(script), "stop": "\n\n"}).json()
    assert body["choices"][0] == {"text": "x = 1", "index": 0, "logprobs": None, "finish_reason": "stop"}
    assert backend.cancelled == [backend.submitted[0].id]  # the backend was told to stop generating
    events = _events(client.post("/v1/completions", json={"prompt": [5], "max_tokens": len(script),
                                                          "stop": ["y =", "\n\n"], "stream": True}).text)
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == "x = 1"
    assert events[-2]["choices"][0]["finish_reason"] == "stop" and events[-1] == "[DONE]"


def test_stream_pieces_add_up_to_the_whole_answer(fake_info):
    backend = FakeBackend(fake_info)
    client = _client(backend)
    whole = client.post("/v1/completions", json={"prompt": [9, 9], "max_tokens": 12}).json()
    r = client.post("/v1/completions", json={"prompt": [9, 9], "max_tokens": 12, "stream": True,
                                              "stream_options": {"include_usage": True}, "return_token_ids": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = _events(r.text)
    assert events[-1] == "[DONE]" and events[-2]["choices"] == [] and events[-2]["usage"] == whole["usage"]
    chunks = events[:-2]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert [t for c in chunks for t in c["choices"][0].get("token_ids", [])] == backend.tokens_for(backend.submitted[0])
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
    assert all(c["object"] == "text_completion" and c["id"] == chunks[0]["id"] for c in chunks)


def test_echo_prepends_the_prompt(fake_info, tiny_tokenizer):
    backend = FakeBackend(fake_info)
    client = _client(backend)
    plain = client.post("/v1/completions", json={"prompt": "def f(", "max_tokens": 3}).json()["choices"][0]["text"]
    echoed = client.post("/v1/completions", json={"prompt": "def f(", "max_tokens": 3, "echo": True}).json()
    assert echoed["choices"][0]["text"] == "def f(" + plain
    ids = tiny_tokenizer("import os")["input_ids"]
    streamed = _events(client.post("/v1/completions", json={"prompt": ids, "max_tokens": 3, "echo": True,
                                                            "stream": True}).text)
    assert streamed[0]["choices"][0]["text"].startswith(tiny_tokenizer.decode(ids))


TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def test_chat_renders_the_template_and_answers_in_chat_shape(fake_info, tiny_tokenizer):
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = TEMPLATE
    info = type(fake_info)(**{**fake_info.__dict__, "tokenizer": tok})
    backend = FakeBackend(info)
    client = _client(backend)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    r = client.post("/v1/chat/completions", json={"model": "fake", "messages": messages, "max_tokens": 4})
    assert r.status_code == 200, r.text
    body = r.json()
    rendered = "<system>be brief\n<user>hi\n<assistant>"
    assert list(backend.submitted[0].prompt_ids) == tok(rendered, add_special_tokens=False)["input_ids"]
    msg = body["choices"][0]["message"]
    assert body["object"] == "chat.completion" and msg["role"] == "assistant"
    assert msg["content"] == tok.decode(backend.tokens_for(backend.submitted[0])[:4])
    events = _events(client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 4,
                                                               "stream": True}).text)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant" and events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1]) == msg["content"]
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    # no max_tokens: the rest of the server's maximum length
    client.post("/v1/chat/completions", json={"messages": messages})
    assert backend.submitted[-1].max_new_tokens == info.max_len - len(backend.submitted[0].prompt_ids)


def test_chat_without_a_template_is_a_400(fake_info):
    r = _client(FakeBackend(fake_info)).post("/v1/chat/completions",
                                             json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "chat_template_missing"
    assert "/v1/completions" in r.json()["error"]["message"]


BAD = [  # (body, status, param, words in the message)
    ('{"prompt": "x", ', 400, None, "not valid JSON"),
    ("", 400, None, "empty"),
    ("[1, 2]", 400, None, "JSON object"),
    ({}, 400, "prompt", "required"),
    ({"prompt": 5}, 400, "prompt", "string or a list of token ids"),
    ({"prompt": [1, True]}, 400, "prompt", "token ids"),
    ({"prompt": []}, 400, "prompt", "empty"),
    ({"prompt": ["a", "b"]}, 400, "prompt", "one prompt per request"),
    ({"prompt": [1, 9000]}, 400, "prompt", "outside the vocabulary"),
    ({"prompt": "x", "max_tokens": "7"}, 400, "max_tokens", "valid integer"),
    ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens", "greater than or equal to 1"),
    ({"prompt": [1] * 60, "max_tokens": 10}, 400, "max_tokens", "maximum length is 64"),
    ({"prompt": [1] * 70, "max_tokens": 1}, 400, "prompt", "maximum length is 64"),
    ({"prompt": "x", "model": "gpt-4"}, 404, "model", "does not exist"),
    ({"prompt": "x", "temperature": 0.7, "top_p": 0}, 400, "top_p", "top_p must be in (0, 1]"),
    ({"prompt": "x", "temperature": 0.7, "seed": -1}, 400, "seed", "greater than or equal to 0"),
    ({"prompt": "x", "temperature": 5}, 400, "temperature", "less than or equal to 2"),
    ({"prompt": "x", "n": 2}, 400, "n", "n must be 1"),
    ({"prompt": "x", "logprobs": 0}, 400, "logprobs", "not supported"),
    ({"prompt": "x", "best_of": 3}, 400, "best_of", "best_of"),
    ({"prompt": "x", "frequency_penalty": 0.5}, 400, "frequency_penalty", "not supported"),
    ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", "at most 4"),
    ({"prompt": "x", "tools": []}, 400, "tools", "unknown field"),
    ({"prompt": "x", "stream": "yes"}, 400, "stream", "valid boolean"),
]


@pytest.mark.parametrize("body,status,param,words", BAD, ids=[str(b)[:40] for b, *_ in BAD])
def test_bad_completion_requests_get_a_4xx_json_error(fake_info, body, status, param, words):
    backend = FakeBackend(fake_info)
    client = _client(backend)
    kw = {"content": body} if isinstance(body, str) else {"json": body}
    r = client.post("/v1/completions", **kw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert err["param"] == param and words in err["message"] and "\n" not in err["message"]
    assert backend.submitted == []  # refused before the backend saw it
    assert client.get("/health").json() == {"status": "ok"}
    assert client.post("/v1/completions", json={"prompt": [3], "max_tokens": 2}).status_code == 200


@pytest.mark.parametrize("body,param", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
    ({"messages": [{"role": "user"}]}, "messages.0.content"),
    ({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}}, "response_format"),
    ({"messages": [{"role": "user", "content": "hi"}], "logprobs": True}, "logprobs"),
])
def test_bad_chat_requests_get_a_400(fake_info, body, param):
    r = _client(FakeBackend(fake_info)).post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_unknown_routes_and_methods_answer_json(fake_info):
    client = _client(FakeBackend(fake_info))
    r = client.get("/v1/nothing")
    assert r.status_code == 404 and "/v1/nothing" in r.json()["error"]["message"]
    r = client.get("/v1/completions")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"


def test_a_failing_generation_is_a_500_for_that_request_only(fake_info):
    backend = FakeBackend(fake_info, fail=RuntimeError("CUDA error: device-side assert"), fail_after=0)
    client = _client(backend)
    r = client.post("/v1/completions", json={"prompt": [1], "max_tokens": 4})
    assert r.status_code == 500 and r.json()["error"]["code"] == "generation_failed"
    assert "device-side assert" in r.json()["error"]["message"]
    r = client.post("/v1/completions", json={"prompt": [1], "max_tokens": 4, "stream": True})
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"  # before any token: plain JSON
    backend.fail_after = 2  # after two tokens: the stream is open, an error event ends it
    events = _events(client.post("/v1/completions", json={"prompt": [1], "max_tokens": 4, "stream": True}).text)
    assert len(events) == 4 and events[2]["error"]["code"] == "generation_failed" and events[3] == "[DONE]"
    backend.fail = None
    assert client.post("/v1/completions", json={"prompt": [1], "max_tokens": 4}).status_code == 200


def test_models_health_and_metrics(fake_info):
    backend = FakeBackend(fake_info)
    client = _client(backend)
    assert client.get("/v1/models").json()["data"][0] | {"created": 0} == {
        "id": "fake", "object": "model", "created": 0, "owned_by": "specc", "max_model_len": 64}
    client.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 3})
    client.post("/v1/completions", json={"prompt": "x", "temperature": 1, "top_p": 0})
    text = client.get("/metrics").text
    for line in ('specc_http_requests_total{code="200",endpoint="/v1/completions"} 1.0',
                 'specc_http_requests_total{code="400",endpoint="/v1/completions"} 1.0',
                 "specc_prompt_tokens_total 2.0", "specc_completion_tokens_total 3.0",
                 "specc_time_to_first_token_seconds_count 1.0",
                 "specc_requests_waiting 1.0",  # the fake's stats: 1 submitted -> 1 waiting
                 "specc_generation_tokens_per_second 5.5", "specc_accepted_tokens_per_step 2.5",
                 "specc_generation_tokens_total 11.0"):
        assert line in text.splitlines(), line
    backend._alive = False
    assert client.get("/health").status_code == 503


# -- the real engine worker, in process --------------------------------------------------------


@pytest.fixture(scope="module")
def engine_client(tiny_artifact):
    from specc.runtime.engine import load
    from specc.serve.worker import EngineWorker

    worker = EngineWorker(lambda: load(tiny_artifact), max_len=96)
    worker.start()
    with TestClient(create_app(worker)) as client:
        yield client, load(tiny_artifact)
    worker.close()


def test_engine_completions_equal_generate(engine_client):
    client, engine = engine_client
    for prompt, n in (([5, 6, 7, 8], 9), ("def fibonacci(n):", 12)):
        r = client.post("/v1/completions", json={"model": "specc-tiny", "prompt": prompt, "max_tokens": n,
                                                 "return_token_ids": True})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        ids = prompt if isinstance(prompt, list) else engine.tokenizer(prompt)["input_ids"]
        expected = engine.generate(ids, n).tokens
        assert choice["prompt_token_ids"] == ids and choice["token_ids"] == expected
        eos = set(engine.eos_token_ids)
        assert choice["text"] == engine.tokenizer.decode([t for t in expected if t not in eos], skip_special_tokens=True)
    streamed = _events(client.post("/v1/completions", json={"prompt": [5, 6, 7, 8], "max_tokens": 9, "stream": True,
                                                            "return_token_ids": True}).text)
    assert [t for e in streamed[:-1] for t in e["choices"][0].get("token_ids", [])] == engine.generate([5, 6, 7, 8], 9).tokens
    metrics = client.get("/metrics").text
    assert "specc_requests_finished_total 3.0" in metrics and "specc_requests_running 0.0" in metrics
    tau = next(float(line.split()[1]) for line in metrics.splitlines()
               if line.startswith("specc_accepted_tokens_per_step "))
    assert tau >= 1.0  # from the engine's per-step stats


def test_engine_refuses_what_exceeds_max_len(engine_client):
    client, _ = engine_client
    r = client.post("/v1/completions", json={"prompt": [5] * 90, "max_tokens": 7})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert client.get("/health").status_code == 200
