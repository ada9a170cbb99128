"""specc/cli/progress.py: stages and per-prompt bars on a terminal, silent when piped or with --json;
the Python API only reports through a callback it is given."""

from __future__ import annotations

import io

from rich.console import Console

from specc.cli import main
from specc.cli.progress import Progress


def test_disabled_progress_is_a_no_op():
    p = Progress(enabled=False)
    with p:
        p("a stage")
        assert p.counter("items") is None
    assert p._rich is None


def test_enabled_progress_draws_stages_and_bars(monkeypatch):
    buf = io.StringIO()
    monkeypatch.setattr("rich.console.Console", lambda stderr=True: Console(file=buf, force_terminal=True, width=100))
    with Progress(enabled=True) as p:
        p("loading a model")
        tick = p.counter("stock")
        for i in range(3):
            tick(i + 1, 3)
        p.stage("emitting")
    out = buf.getvalue()
    assert "loading a model" in out and "emitting" in out and "3/3" in out


def test_for_args_is_quiet_with_json_or_when_piped(monkeypatch):
    class Args:
        json = True

    assert not Progress.for_args(Args()).enabled
    Args.json = False
    assert not Progress.for_args(Args()).enabled  # pytest captures stdout/stderr: not a terminal
    monkeypatch.setattr("specc.cli.progress.interactive", lambda: True)
    assert Progress.for_args(Args()).enabled


def test_forcing_reports_each_prompt(capsys):
    from specc.pairing import resolve_pair
    from specc.runtime.eager import build_eager
    from specc.verify import run_stock_reference, verify_system

    pair = resolve_pair("specc-tiny", "specc-tiny-pard")
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    seen = []
    runs = run_stock_reference(pair, prompts, 4, progress=lambda d, t: seen.append(("stock", d, t)))
    report = verify_system(build_eager(pair, max_len=32), runs, 1e-3, pair.eos_token_ids,
                           progress=lambda d, t: seen.append(("forced", d, t)))
    assert report.passed
    assert seen == [("stock", 1, 2), ("stock", 2, 2), ("forced", 1, 2), ("forced", 2, 2)]
    assert main(["generate", "specc-tiny", "--input-ids", "5,6,7", "--max-new-tokens", "2"]) == 0
    err = capsys.readouterr().err
    assert "loading" not in err and "generating" not in err  # piped: no progress


def test_compile_reports_stages_and_prompts(tmp_path):
    from specc.compiler import compile_artifact

    events = []

    class Recorder:
        def __call__(self, message):
            events.append(("stage", message.split()[0]))

        def counter(self, label):
            return lambda done, total: events.append((label, done, total))

    compile_artifact("specc-tiny", "specc-tiny-pard", out=tmp_path / "a.specc", prompts=[[5, 6, 7], [8, 9]],
                     max_new_tokens=3, progress=Recorder(), passes="fuse_qkv,dce")
    assert ("stage", "loading") in events and ("stage", "token") in events
    assert ("stock", 2, 2) in events and ("compiled, forced", 2, 2) in events
