"""The methods registry: built-ins, user registration, entry points, and the invariant that no
code outside specc/methods dispatches on method names."""

from __future__ import annotations

import ast
import importlib
import sys
import textwrap
from pathlib import Path

import pytest

import specc
from specc.errors import UserError
from specc.methods import (DraftShape, Method, UnknownMethod, available_methods, default_method, get_method,
                           method_names, methods_for_kind, register_method)
from specc.methods import registry as method_registry

BUILTIN = ("ar", "ar-draft", "pard", "dflash")


def test_builtins_registered_in_order():
    assert method_names()[:4] == BUILTIN
    for name in BUILTIN:
        assert get_method(name).name == name


def test_unknown_method_is_one_line_user_error():
    with pytest.raises(UnknownMethod) as info:
        get_method("medusa")
    assert isinstance(info.value, UserError)
    assert "\n" not in str(info.value) and "ar-draft" in str(info.value)


def test_defaults_by_drafter_kind():
    assert default_method(None).name == "ar"
    assert default_method("causal_lm").name == "ar-draft"
    assert default_method("pard").name == "pard"
    assert default_method("dflash").name == "dflash"
    assert methods_for_kind("pard") == ("pard", "ar-draft")


def test_num_draft_defaults_and_limits():
    dflash_raw = {"block_size": 16, "dflash_config": {"mask_token_id": 5, "target_layer_ids": [1]}}
    assert get_method("dflash").num_draft(None, dflash_raw) == 15
    assert get_method("pard").num_draft(None, {"pard_token": 3}) == 8
    assert get_method("ar-draft").num_draft(None, {}) == 4
    assert get_method("ar").num_draft(7, None) == 0
    with pytest.raises(UserError, match="--num-draft 16"):
        get_method("dflash").num_draft(16, dflash_raw)
    with pytest.raises(UserError):
        get_method("pard").num_draft(-1, {"pard_token": 3})
    assert get_method("dflash").search_k_choices(dflash_raw, 15)[-1] == 15
    assert max(get_method("dflash").search_k_choices(dflash_raw, 7)) == 15
    assert get_method("ar").search_k_choices(None, 0) == []


def test_draft_shapes_per_method():
    assert get_method("ar").draft_shapes(4, 2) == []
    assert get_method("ar-draft").draft_shapes(4, 2) == [DraftShape({"Q": 1}, 4)]
    assert get_method("pard").draft_shapes(8, 3) == [DraftShape({"Q": 10}, 1)]
    assert get_method("dflash").draft_shapes(15, 3) == [DraftShape({"Q": 16, "N": 3}, 1)]


@pytest.fixture
def restore_registry():
    saved = dict(method_registry._REGISTRY)
    yield
    method_registry._REGISTRY.clear()
    method_registry._REGISTRY.update(saved)


def test_user_method_is_selectable_everywhere(restore_registry, checkpoints):
    from specc.cli import build_parser
    from specc.pairing import resolve_pair

    @register_method
    class EveryOther(Method):
        name = "ar-draft-every-other"
        description = "a test method"
        drafter_kinds = ("causal_lm",)
        k_choices = (2,)

        def default_num_draft(self, drafter_raw):
            return 2

    assert "ar-draft-every-other" in method_names()
    pair = resolve_pair(str(checkpoints["target"]), str(checkpoints["ar_same"]), "ar-draft-every-other")
    assert pair.method == "ar-draft-every-other" and isinstance(pair.impl, EveryOther)
    args = build_parser().parse_args(["generate", "m", "--drafter", "d", "--method", "ar-draft-every-other",
                                      "--input-ids", "1"])
    assert args.method == "ar-draft-every-other"
    with pytest.raises(UserError, match="does not fit"):
        resolve_pair(str(checkpoints["target"]), str(checkpoints["dflash"]), "ar-draft-every-other")


def test_register_rejects_non_methods_and_builtin_clash(restore_registry):
    with pytest.raises(TypeError):
        register_method(object)  # type: ignore[arg-type]

    class Clash(Method):
        name = "pard"

    with pytest.raises(ValueError, match="already registered"):
        register_method(Clash)


def test_entry_point_plugin(restore_registry, tmp_path, monkeypatch):
    (tmp_path / "specc_plugin_method.py").write_text(textwrap.dedent('''
        from specc.methods import Method

        class PluginMethod(Method):
            name = "plugin-chain"
            description = "from an entry point"
            drafter_kinds = ("causal_lm",)
    '''))
    dist = tmp_path / "specc_plugin_method-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: specc-plugin-method\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[specc.methods]\nplugin-chain = specc_plugin_method:PluginMethod\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    monkeypatch.setattr(method_registry, "_PLUGINS_LOADED", False)
    assert get_method("plugin-chain").description == "from an entry point"
    sys.modules.pop("specc_plugin_method", None)


METHOD_NAMES = set(BUILTIN)


def _method_name_comparisons(path: Path) -> list[str]:
    """Comparisons of an expression mentioning 'method' with a method-name string literal."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        literals = set()
        for side in sides:
            for sub in ast.walk(side):
                if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                    literals.add(sub.value)
        mentions = any("method" in ast.unparse(side) for side in sides
                       if not isinstance(side, (ast.Constant, ast.Tuple, ast.List, ast.Set)))
        if mentions and literals & METHOD_NAMES:
            found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_method_name_dispatch_outside_methods():
    root = Path(specc.__file__).parent
    hits = []
    for path in sorted(root.rglob("*.py")):
        if root / "methods" in path.parents:
            continue
        hits += _method_name_comparisons(path)
    assert not hits, "compare method names only inside specc/methods:\n" + "\n".join(hits)
