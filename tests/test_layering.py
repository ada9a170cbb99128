"""specc's import graph: no cycles, layers point one way, and loading an artifact stays light.

The graph is built from the source with ``ast``: every ``import`` / ``from ... import`` of a specc
module, module-level or inside a function (lazy imports count), except under
``if TYPE_CHECKING:``. ``from pkg import name`` is an edge to ``pkg.name`` when that is a module,
else to ``pkg`` (its ``__init__``). Importing a submodule does not count as importing its parent
package's ``__init__`` (Python runs it first, but that is not a dependency the code chose).
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
SPECC = ROOT / "specc"

# Layer order (docs/architecture.md): a module may import from its own package and from any
# package of a lower layer, never from a higher one.
#   cli -> compiler -> {search, methods, pairing, parallel} -> verify -> serve -> runtime -> codegen
#   -> passes -> ir -> stock -> models -> formats -> errors / result / the package root
# runtime is further restricted (RUNTIME_MAY_IMPORT); stock -> models; verify may import runtime
# and stock. The package root (specc/__init__.py) is a leaf: it holds __version__ and resolves
# `specc.load` / `specc.compile_artifact` through importlib on first use.
LAYERS = {
    "__main__": 100,
    "cli": 100,
    "compiler": 90,
    "bench": 90,  # `specc bench`: builds and times systems (compiler level)
    "search": 80,
    "methods": 80,  # the speculation methods: one module each, and their registry
    "pairing": 80,  # checkpoints -> a checked (target, drafter, method) Pair: asks the methods
    "parallel": 80,  # tensor parallelism: builds steps, loads through the methods
    "verify": 60,
    "serve": 57,  # `specc serve`: the HTTP layer over the runtime's engine (never the compiler)
    "runtime": 55,
    "codegen": 50,
    "passes": 40,
    "ir": 30,
    "stock": 25,
    "models": 20,
    "formats": 15,
    "errors": 0,
    "result": 0,
    "threads": 0,
    "switches": 0,  # the environment's on/off switches: a leaf utility (os only)
    "fileio": 0,  # locks and atomic writes: a leaf utility  # CPU thread defaults: a leaf utility (os only)
    "sampling": 0,  # sampling params, logits processors, counter-based RNG (torch only): stock and runtime share them
    "": 0,  # the package root
}

# What the runtime may import besides itself: codegen's ABI (what generated steps call, the
# kernels, the artifact format), models' small pieces, the leaf utilities.
RUNTIME_MAY_IMPORT = (
    "specc", "specc.errors", "specc.result", "specc.threads", "specc.switches", "specc.sampling",
    "specc.codegen.kernel_abi", "specc.codegen.artifact", "specc.codegen.artifact_trust", "specc.codegen.kernels",
    "specc.models.config", "specc.models.ops", "specc.models.state", "specc.models.fused_ops", "specc.models.dflash", "specc.models.loading",
)
# Never loaded by `specc.load` + generation (checked statically here and in a subprocess below).
HEAVY = ("specc.ir", "specc.passes", "specc.search", "specc.compiler", "specc.parallel", "specc.verify")


def _modname(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(mod: str, path: Path, modules: dict[str, Path]):
    """(imported specc module, line) for every import statement of ``path``."""
    out: list[tuple[str, int]] = []
    is_pkg = path.name == "__init__.py"

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for c in child.orelse:
                    visit_one(c)
                continue
            visit_one(child)

    def visit_one(node):
        if isinstance(node, ast.Import):
            out.extend((a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "specc")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "specc":
                return
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.append((sub if sub in modules else target, node.lineno))
        else:
            visit(node)

    visit(ast.parse(path.read_text(), str(path)))
    return out


def import_graph() -> nx.DiGraph:
    modules = {_modname(p): p for p in SPECC.rglob("*.py")}
    graph = nx.DiGraph()
    for mod, path in modules.items():
        graph.add_node(mod)
        for target, line in _imports(mod, path, modules):
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]
            if target != mod and target in modules:
                graph.add_edge(mod, target, where=f"{path.relative_to(ROOT)}:{line}")
    return graph


def _package(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else ""


def _allowed_for_runtime(target: str) -> bool:
    return target.startswith("specc.runtime") or any(
        target == a or target.startswith(a + ".") for a in RUNTIME_MAY_IMPORT if a != "specc") or target == "specc"


@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_no_import_cycles(graph):
    cycles = sorted((sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1), key=len)
    lines = []
    for comp in cycles:
        sub = graph.subgraph(comp)
        lines.append(f"cycle among {comp}:")
        lines += [f"    {a} -> {b}  ({sub.edges[a, b]['where']})" for a, b in sorted(sub.edges)]
    assert not cycles, "import cycles between specc modules:\n" + "\n".join(lines)


def test_every_package_has_a_layer(graph):
    unknown = sorted({_package(m) for m in graph} - set(LAYERS))
    assert not unknown, f"packages missing from LAYERS in tests/test_layering.py: {unknown}"


def test_layers_point_one_way(graph):
    upward = []
    for a, b in graph.edges:
        pa, pb = _package(a), _package(b)
        if pa != pb and LAYERS.get(pb, 0) > LAYERS.get(pa, 0):
            upward.append(f"{a} -> {b}  ({graph.edges[a, b]['where']}): {pa or 'specc'} may not import {pb}")
    assert not upward, "imports against the layer order:\n" + "\n".join(sorted(upward))


def test_runtime_imports_only_codegen_abi_and_small_model_pieces(graph):
    bad = [f"{a} -> {b}  ({graph.edges[a, b]['where']})" for a, b in graph.edges
           if a.startswith("specc.runtime") and not _allowed_for_runtime(b)]
    assert not bad, "the runtime imports beyond codegen's ABI:\n" + "\n".join(sorted(bad))


def test_runtime_never_reaches_the_compiler(graph):
    """Statically: nothing the runtime imports (transitively) is the IR, passes, search, ..."""
    reached = set()
    for mod in (m for m in graph if m.startswith("specc.runtime")):
        reached |= nx.descendants(graph, mod)
    bad = sorted(m for m in reached if m.startswith(HEAVY))
    paths = [" -> ".join(nx.shortest_path(graph, "specc.runtime.engine", m)) for m in bad
             if nx.has_path(graph, "specc.runtime.engine", m)]
    assert not bad, f"the runtime reaches {bad}:\n" + "\n".join(paths)


def test_serve_never_reaches_the_compiler(graph):
    """`specc serve` runs an artifact: nothing it imports (transitively) is the IR, passes, search..."""
    serve = [m for m in graph if m.startswith("specc.serve")]
    assert "specc.serve.app" in serve and "specc.serve.worker" in serve
    reached = set().union(*(nx.descendants(graph, m) for m in serve))
    assert not sorted(m for m in reached if m.startswith(HEAVY))


def test_loading_an_artifact_imports_no_compiler(checkpoints, tmp_path):
    from specc.compiler import compile_artifact

    out = tmp_path / "tiny.specc"
    compile_artifact(checkpoints["target"], checkpoints["pard_same"], out=out, max_new_tokens=4)
    code = textwrap.dedent(f"""
        import sys
        import specc
        engine = specc.load({str(out)!r})
        engine.generate([1, 2, 3], max_new_tokens=4)
        heavy = sorted(m for m in sys.modules if m == "sympy" or m.startswith({HEAVY!r}))
        print("HEAVY", heavy)
        sys.exit(1 if heavy else 0)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT),
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
