"""Every python block of README.md and docs/*.md runs (docs/ir.md and docs/writing-passes.md in
tests/passes/test_docs.py, the others here), in a scratch directory that holds what the docs
assume: `tiny.specc` (the README's first command line: specc-tiny + its DFlash drafter, cpu) and
`Qwen3-8B/config.json`, `Qwen3-8B-DFlash/config.json` (real configs, no weights). The README's
blocks run on specc-tiny, the embedded model."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest

from tests.real_configs import QWEN3_8B, QWEN3_8B_DFLASH

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ELSEWHERE = {"ir.md", "writing-passes.md"}  # tests/passes/test_docs.py (isolated pass registries)
HERE = ["README.md", "runtime.md", "cost-model.md", "search.md", "tensor-parallel.md", "batching.md", "sampling.md"]


def blocks(path: Path, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", path.read_text(), flags=re.S | re.M)


def test_every_doc_with_python_is_run():
    with_python = {p.name for p in DOCS if blocks(p, "python")}
    assert with_python <= set(HERE) | ELSEWHERE, f"python blocks no test runs: {with_python - set(HERE) - ELSEWHERE}"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    from specc.compiler import compile_artifact

    root = tmp_path_factory.mktemp("docs")
    compile_artifact("specc-tiny", "specc-tiny-dflash", deployment="cpu", out=root / "tiny.specc", max_new_tokens=8)
    for name, cfg in (("Qwen3-8B", QWEN3_8B), ("Qwen3-8B-DFlash", QWEN3_8B_DFLASH)):
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(cfg))
    return root


@pytest.mark.parametrize("doc", HERE)
def test_python_blocks_run(doc, scratch, monkeypatch, capsys):
    path = ROOT / doc if doc == "README.md" else ROOT / "docs" / doc
    code = "\n\n".join(blocks(path, "python"))
    assert code, f"no python blocks in {doc}"
    monkeypatch.chdir(scratch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(code, str(path), "exec"), {"__name__": "doc_" + re.sub(r"\W", "_", doc)})
    assert capsys.readouterr().out  # every doc's blocks print something


def test_json_blocks_parse():
    for path in DOCS:
        for block in blocks(path, "json"):
            json.loads(block)
