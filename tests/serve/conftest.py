"""Serve fixtures: one tiny compiled artifact with a tokenizer per session, the facts of a fake
model (tests/serve_fakes.py), and uvicorn servers in threads on free ports of 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

import pytest
from serve_fakes import ThreadServer

ZOO = Path(__file__).resolve().parents[2] / "specc" / "zoo"


@pytest.fixture(scope="session")
def tiny_artifact(tmp_path_factory):
    """specc-tiny + its PARD drafter, compiled for the cpu deployment (its tokenizer included)."""
    from specc.compiler import compile_artifact

    out = tmp_path_factory.mktemp("serve") / "tiny.specc"
    compile_artifact("specc-tiny", "specc-tiny-pard", deployment="cpu", out=out, max_new_tokens=4,
                     prompts=[[5, 6, 7]])
    return out


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from specc.models.loading import load_tokenizer

    return load_tokenizer(ZOO / "specc-tiny")


@pytest.fixture
def fake_info(tiny_tokenizer):
    from specc.serve.backend import ModelInfo

    return ModelInfo(name="fake", max_len=64, vocab_size=8192, eos_token_ids=(0,), tokenizer=tiny_tokenizer)


@pytest.fixture
def thread_server():
    servers = []

    def start(app):
        servers.append(ThreadServer(app))
        return servers[-1]

    yield start
    for s in servers:
        s.stop()
