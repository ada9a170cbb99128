"""Packaging: README's test command works in a fresh virtualenv (finding 5 of issue 14).

Every third-party module the tests (or the example scripts they run) import is either installed
by ``pip install -e ".[test]"`` or guarded by ``pytest.importorskip`` with a reason; `.ci/run`
installs into a fresh virtual environment so nothing of the CI machine's own packages leaks in.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Import names provided by the core dependencies + the `test` extra (and what they pull in:
# transformers requires numpy, tokenizers, huggingface_hub, packaging, ...).
_DIST_TO_IMPORTS = {"torch": {"torch"}, "triton": {"triton"}, "transformers": {"transformers", "numpy", "tokenizers"},
                    "safetensors": {"safetensors"}, "huggingface_hub": {"huggingface_hub"}, "sympy": {"sympy"},
                    "networkx": {"networkx"}, "rich": {"rich"}, "pytest": {"pytest", "_pytest"},
                    "hypothesis": {"hypothesis"}}


def _installed_by_test_extra() -> set[str]:
    text = (ROOT / "pyproject.toml").read_text()
    deps = re.search(r"^dependencies = \[(.*?)\]", text, re.S | re.M).group(1)
    test = re.search(r"^test = \[(.*?)\]", text, re.M).group(1)
    names = set()
    for spec in re.findall(r'"([^"]+)"', deps + test):
        dist = re.split(r"[<>=!~\[ ;]", spec, maxsplit=1)[0].replace("-", "_").lower()
        names |= _DIST_TO_IMPORTS.get(dist, {dist})
    return names


def _third_party_imports(path: Path) -> set[str]:
    local = {"specc", "tests", "examples"} | {p.stem for p in (ROOT / "tests").rglob("*.py")} \
        | {p.stem for p in (ROOT / "examples").rglob("*.py")}
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            mods = [node.module]
        else:
            continue
        for mod in mods:
            top = mod.split(".")[0]
            if top not in sys.stdlib_module_names and top not in local:
                found.add(top)
    return found


def test_test_imports_are_installed_or_skipped():
    allowed = _installed_by_test_extra()
    problems = []
    tests = sorted((ROOT / "tests").rglob("*.py"))
    for t in tests:
        text = t.read_text()
        for mod in sorted(_third_party_imports(t) - allowed):
            if f'importorskip("{mod}"' not in text:
                problems.append(f"{t.relative_to(ROOT)} imports {mod}")
    for ex in sorted((ROOT / "examples").rglob("*.py")):
        missing = _third_party_imports(ex) - allowed
        for t in tests:
            text = t.read_text()
            runs = f'"{ex.name}"' in text or f"examples.{ex.stem}" in text  # a path built to it, or an import
            if runs and t.name != Path(__file__).name:
                for mod in sorted(missing):
                    if f'importorskip("{mod}"' not in text:
                        problems.append(f"{t.relative_to(ROOT)} runs {ex.relative_to(ROOT)}, which imports {mod}")
    assert not problems, "not installed by the test extra and not skipped:\n" + "\n".join(problems)


def test_ci_installs_into_a_fresh_venv_as_readme_says():
    ci = (ROOT / ".ci" / "run").read_text()
    readme_cmd = (ROOT / "README.md").read_text().splitlines()[4]
    assert readme_cmd == 'pip install torch==2.13.0 && pip install -e ".[test]" && python3 -m pytest -q -n auto'
    assert "-m venv" in ci and "--system-site-packages" not in ci.replace("no --system-site-packages", "")
    assert "bin/activate" in ci
    assert readme_cmd in ci.splitlines()  # run verbatim, inside the venv
    assert ci.index("bin/activate") < ci.rindex(readme_cmd)
