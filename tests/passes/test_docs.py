"""The python code blocks of docs/ir.md and docs/writing-passes.md run, in order, from the repo
root, each doc in a fresh namespace; the pass and op registries are restored afterwards so the
docs neither leak into nor depend on the rest of the session. The walkthrough's code must also be
the example's code."""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


@pytest.fixture
def isolated_registries(monkeypatch):
    from specc.ir import rules
    from specc.passes import registry

    saved = (dict(registry._REGISTRY), dict(rules._BY_FUNCTION), dict(rules._BY_METHOD), dict(rules.KINDS))
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT))
    yield
    registry._REGISTRY.clear(), registry._REGISTRY.update(saved[0])
    rules._BY_FUNCTION.clear(), rules._BY_FUNCTION.update(saved[1])
    rules._BY_METHOD.clear(), rules._BY_METHOD.update(saved[2])
    rules.KINDS.clear(), rules.KINDS.update(saved[3])
    sys.modules.pop("specc_user_pass_custom_pass", None)


@pytest.mark.parametrize("doc", ["ir.md", "writing-passes.md"])
def test_doc_code_blocks_run(doc, isolated_registries, capsys):
    code = "\n\n".join(python_blocks(ROOT / "docs" / doc))
    assert code, f"no python blocks in {doc}"
    name = "doc_" + re.sub(r"\W", "_", doc)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the doc re-registers the example's pass
        exec(compile(code, str(ROOT / "docs" / doc), "exec"), {"__name__": name})
    out = capsys.readouterr().out
    if doc == "writing-passes.md":
        assert "first bad pass application #2 swap_gate_up_demo" in out


def test_walkthrough_matches_the_example():
    example = (ROOT / "examples" / "custom_pass.py").read_text()
    blocks = python_blocks(ROOT / "docs" / "writing-passes.md")
    shown = [b for b in blocks if "def silu_mul_linear" in b or "class FuseSiluMulDown" in b]
    assert len(shown) == 2
    for block in shown:
        for chunk in re.split(r"\n\n\n", block.strip()):
            if chunk.startswith(("def ", "@", "class ")):
                assert chunk.strip() in example, f"docs show code that examples/custom_pass.py lacks:\n{chunk[:200]}"
