"""CPU thread defaults (specc/threads.py): SPECC_THREADS, --threads, and a default that never
exceeds 4 or the idle physical cores."""

from __future__ import annotations

import os

import pytest
import torch

from specc.cli import main
from specc.errors import UserError
from specc.threads import MAX_DEFAULT, configure_threads, default_threads, physical_cores


@pytest.fixture(autouse=True)
def _restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_default_is_bounded(monkeypatch):
    monkeypatch.delenv("SPECC_THREADS", raising=False)
    n = default_threads()
    assert 1 <= n <= min(MAX_DEFAULT, physical_cores())
    monkeypatch.setattr(os, "getloadavg", lambda: (64.0, 64.0, 64.0))  # a busy machine: one thread
    assert default_threads() == 1
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert default_threads() == min(MAX_DEFAULT, physical_cores())


def test_env_and_flag_override(monkeypatch, capsys):
    monkeypatch.setenv("SPECC_THREADS", "3")
    assert default_threads() == 3 and configure_threads() == 3 and torch.get_num_threads() == 3
    assert configure_threads(1) == 1 and torch.get_num_threads() == 1
    assert main(["passes", "--threads", "2"]) == 0 and torch.get_num_threads() == 2
    monkeypatch.setenv("SPECC_THREADS", "zero")
    with pytest.raises(UserError):
        default_threads()
    assert main(["passes"]) == 2
    assert "SPECC_THREADS" in capsys.readouterr().err
    assert main(["passes", "--threads", "0"]) == 2
