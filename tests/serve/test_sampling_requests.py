"""`specc serve` requests sample: temperature / top_p / top_k / min_p / repetition_penalty / seed
become the request's SamplingParams (absent temperature: greedy; absent seed: a random one), and
the scheduler runs them through the engine, equal to ``Engine.generate`` with the same params."""

from fastapi.testclient import TestClient
from serve_fakes import FakeBackend

from specc.sampling import SamplingParams
from specc.serve.app import create_app
from specc.serve.scheduler import SerialScheduler


def test_request_fields_become_sampling_params(fake_info):
    backend = FakeBackend(fake_info)
    client = TestClient(create_app(backend))
    body = {"prompt": [5, 6, 7], "max_tokens": 3, "temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.05,
            "repetition_penalty": 1.1, "seed": 4}
    assert client.post("/v1/completions", json=body).status_code == 200
    assert backend.submitted[-1].sampling == SamplingParams(temperature=0.7, top_p=0.9, top_k=20, min_p=0.05,
                                                            repetition_penalty=1.1, seed=4)
    chat = {"messages": [{"role": "user", "content": "hi"}], "temperature": 1.0, "seed": 2}
    client.post("/v1/chat/completions", json=chat)  # the fake tokenizer has no chat template: a 400, nothing submitted
    assert client.post("/v1/completions", json={"prompt": [5], "max_tokens": 2}).status_code == 200
    assert backend.submitted[-1].sampling is None  # greedy by default
    assert client.post("/v1/completions", json={"prompt": [5], "temperature": 0, "seed": 3}).status_code == 200
    assert backend.submitted[-1].sampling is None
    seeds = set()
    for _ in range(3):
        client.post("/v1/completions", json={"prompt": [5], "max_tokens": 2, "temperature": 1.0})
        seeds.add(backend.submitted[-1].sampling.seed)
    assert len(seeds) == 3  # no seed: a fresh random one per request


def test_scheduler_samples_like_engine_generate(tiny_artifact):
    from specc.runtime.engine import load

    engine = load(tiny_artifact)
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=7)
    s = SerialScheduler(engine)
    rid = s.submit([5, 6, 7, 8], 12, (), params)
    greedy = s.submit([5, 6, 7, 8], 12, ())
    outs = []
    while s.num_running + s.num_waiting:
        outs += s.step()
    tokens = {r: [t for o in outs if o.rid == r for t in o.tokens] for r in (rid, greedy)}
    assert tokens[rid] == engine.generate([5, 6, 7, 8], 12, eos_token_id=(), sampling=params).tokens
    assert tokens[greedy] == engine.generate([5, 6, 7, 8], 12, eos_token_id=()).tokens
    assert tokens[rid] != tokens[greedy]
