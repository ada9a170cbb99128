"""`specc serve` refuses bad input with one line and exit status 2, before loading anything."""

from __future__ import annotations

import socket

import pytest

from specc.cli import main


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("specc: error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("argv,words", [
    (["--port", "70000"], "--port must be 0..65535"),
    (["--port", "-1"], "--port must be 0..65535"),
    (["--max-len", "0"], "--max-len must be >= 1"),
    (["--batch-size", "0"], "--batch-size must be >= 1"),
    (["--port", "0", "--host", "no.such.host.invalid"], "--host"),
])
def test_bad_flags(argv, words, capsys, tmp_path):
    assert main(["serve", str(tmp_path / "a.specc"), *argv]) == 2
    assert words in _one_line_error(capsys)


def test_a_busy_port_fails_before_loading(capsys, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        assert main(["serve", str(tmp_path / "missing.specc"), "--port", str(port)]) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in _one_line_error(capsys)


def test_a_missing_artifact(capsys, tmp_path):
    assert main(["serve", str(tmp_path / "missing.specc"), "--port", "0"]) == 2
    assert "missing.specc" in _one_line_error(capsys)


def test_help_names_the_endpoints(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    assert "/v1/completions" in out and "/metrics" in out and "--max-len" in out


def test_batch_invariant_flag_switches_the_kernel_mode_for_the_command(monkeypatch):
    """--batch-invariant is on while the command runs (before it loads or captures anything) and
    off again after; without it the mode stays as the environment set it."""
    from specc import cli
    from specc.cli import serve_cmd
    from specc.codegen.kernels import batch_invariant as BI

    seen = []
    monkeypatch.setattr(serve_cmd, "run", lambda args: seen.append(BI.enabled()) or 0)
    before = BI.enabled()
    assert cli.main(["serve", "model.specc", "--batch-invariant"]) == 0
    assert cli.main(["serve", "model.specc"]) == 0
    assert seen == [True, before] and BI.enabled() == before
