"""Every `specc ...` command shown in README.md, docs/*.md and the --help examples parses with the
real argparse parser (synopsis lines: every flag they name exists on that subcommand); every
`python3 examples/...` line names a script that exists and takes the flags shown; the cheap
commands (passes, deployments, models, ir on configs or embedded models, cost) run and exit 0.
docs/writing-passes.md lists exactly the built-in passes of the registry."""

from __future__ import annotations

import argparse
import json
import re
import shlex
from pathlib import Path

import pytest

from specc.cli import build_parser, main
from tests.real_configs import QWEN3_8B, QWEN3_8B_DFLASH

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CHEAP = {"passes", "deployments", "models", "ir", "cost"}


def _shell_blocks(text: str) -> list[str]:
    return [body for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M)
            if lang in ("", "bash", "text", "sh", "console")]


def _logical_lines(body: str) -> list[str]:
    """Lines with `\\` continuations joined; indented lines continue a synopsis line."""
    out: list[str] = []
    pending = ""
    for raw in body.splitlines():
        line = raw.rstrip()
        if pending:
            line = pending + " " + line.strip()
            pending = ""
        if line.endswith("\\"):
            pending = line[:-1]
            continue
        if out and raw.startswith("    ") and out[-1].lstrip("$ ").startswith("specc ") and "[" in out[-1] \
                and raw.strip().startswith(("[", "(")):
            out[-1] += " " + raw.strip()
            continue
        out.append(line)
    return out


def _commands(text: str, source: str) -> list[tuple[str, str]]:
    """(source, command) for each specc / python3 examples/ command line in shell blocks of ``text``."""
    found = []
    for body in _shell_blocks(text):
        for line in _logical_lines(body):
            line = line.strip()
            if line.startswith("$ "):
                line = line[2:]
            for part in re.split(r"\s*&&\s*", line):
                words = part.split()
                env = []
                while words and re.match(r"^[A-Z_]+=\S*$", words[0]):  # ENV=value prefixes, kept apart
                    env.append(words.pop(0))
                if words and (words[0] == "specc" or (words[0] in ("python", "python3") and len(words) > 1
                                                      and words[1].startswith("examples/"))):
                    cmd = " ".join(words)
                    for one in re.split(r"\s\|\s(?=specc )", cmd):  # `specc passes | specc deployments [NAME]`
                        found.append((source, one + (f"  # env: {' '.join(env)}" if env else "")))
    return found


def doc_commands() -> list[tuple[str, str]]:
    cmds = []
    for path in DOCS:
        cmds += _commands(path.read_text(), path.relative_to(ROOT).as_posix())
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, p in sub.choices.items():
        if p.epilog:
            cmds += _commands("```\n" + p.epilog + "\n```\n", f"specc {name} --help")
    return cmds


COMMANDS = doc_commands()


def _argv(cmd: str) -> list[str]:
    return shlex.split(cmd, comments=True)[1:]


def _is_synopsis(argv: list[str]) -> bool:
    return any(w.startswith(("[", "(")) or w == "|" or w.endswith(("]", ")")) for w in argv) or any(
        re.fullmatch(r"[A-Z][A-Z0-9_.]*", w) and w not in ("NAME",) for w in argv[1:2])


def test_docs_show_commands():
    sources = {s for s, _ in COMMANDS}
    assert "README.md" in sources and "docs/ir.md" in sources and "specc ir --help" in sources
    assert len([c for _, c in COMMANDS if c.startswith("specc ")]) > 30
    ran = {_argv(c)[0] for _, c in COMMANDS if _cheap(c)}
    assert {"passes", "models", "ir", "cost"} <= ran


@pytest.mark.parametrize("source,cmd", [c for c in COMMANDS if c[1].startswith("specc ")],
                         ids=[f"{s}: {c[:60]}" for s, c in COMMANDS if c.startswith("specc ")])
def test_specc_command_parses(source, cmd, capsys):
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    argv = _argv(cmd)
    assert not argv or argv[0].startswith("-") or argv[0] in sub.choices, f"{source}: `{cmd}`: no subcommand"
    if argv and argv[0] in sub.choices and _is_synopsis(argv):
        options = {o for a in sub.choices[argv[0]]._actions for o in a.option_strings}
        for flag in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", " ".join(argv[1:])):
            assert flag in options, f"{source}: `{cmd}`: {argv[0]} has no option {flag}"
        return
    for arg in argv:  # models named by path must exist (embedded names and hub ids need nothing here)
        assert not arg.startswith("./") or (ROOT / arg).exists(), f"{source}: `{cmd}`: {arg} does not exist"
    try:
        parser.parse_args(argv)
    except SystemExit as exc:
        assert exc.code == 0, f"{source}: `{cmd}` does not parse: {capsys.readouterr().err.strip()}"


@pytest.mark.parametrize("source,cmd", [c for c in COMMANDS if not c[1].startswith("specc ")],
                         ids=[f"{s}: {c[:60]}" for s, c in COMMANDS if not c.startswith("specc ")])
def test_example_script_exists_and_takes_the_flags(source, cmd):
    words = shlex.split(cmd, comments=True)
    script = ROOT / words[1]
    assert script.is_file(), f"{source}: {words[1]} does not exist"
    text = script.read_text()
    for flag in (w.split("=")[0] for w in words[2:] if w.startswith("--")):
        assert f'"{flag}"' in text or f"'{flag}'" in text, f"{source}: {words[1]} takes no {flag}"


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cmds")
    for name, cfg in (("Qwen3-8B", QWEN3_8B), ("Qwen3-8B-DFlash", QWEN3_8B_DFLASH), ("dflash", QWEN3_8B_DFLASH)):
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(cfg))
    (root / "config.json").write_text(json.dumps(QWEN3_8B))
    (root / "acc.json").write_text(json.dumps({"tau": 2.5, "num_draft": 8}))
    return root


def _cheap(cmd: str) -> bool:
    argv = _argv(cmd)
    if not argv or argv[0] not in CHEAP or _is_synopsis(argv) or "|" in argv or "--help" in argv:
        return False
    if any(a.startswith("+") or ",+" in a for a in argv):  # user passes: tests/passes/test_docs.py
        return False
    # files the scratch directory holds: configs and an acceptance file (not calibration outputs)
    return not any(a.endswith(".json") and "config.json" not in a and a != "acc.json" for a in argv)


@pytest.mark.parametrize("cmd", sorted({c for _, c in COMMANDS if _cheap(c)}))
def test_cheap_command_runs(cmd, configs, monkeypatch, capsys):
    monkeypatch.chdir(configs)
    env = re.search(r"# env: (.*)$", cmd)
    for assignment in (env.group(1).split() if env else []):
        monkeypatch.setenv(*assignment.split("=", 1))
    assert main(_argv(cmd)) == 0, capsys.readouterr().err


def test_writing_passes_lists_every_builtin_pass():
    from specc.passes import available_passes

    builtin = {name for name, info in available_passes().items() if info.origin == "builtin"}
    text = (ROOT / "docs" / "writing-passes.md").read_text()
    section = text[text.index("- Built-in passes"):]
    listed = set(re.findall(r"^\s+- `(\w+)`:", section, flags=re.M))
    assert listed == builtin
    readme = (ROOT / "README.md").read_text()
    assert all(name in readme for name in builtin)


def test_ir_doc_does_not_call_collectives_unmodelled():
    text = (ROOT / "docs" / "ir.md").read_text()
    assert (ROOT / "specc" / "ir" / "collectives.py").is_file()
    assert not re.search(r"Not modelled yet:[^\n]*(\n[^\n]+)*collectives", text)
