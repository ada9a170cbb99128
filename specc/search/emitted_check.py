"""Is an emitted step module only kernel-ABI code? A static check of its source (``ast``, never run).

What :func:`specc.codegen.emit.emit_step` generates: a docstring; ``import torch`` and a few torch
helper modules; ``from specc.codegen.kernel_abi import K as alias``; ``from specc.runtime.compiled
import CompiledStep``; module-level constants (``inf = float('inf')``, ``NoneType = type(None)``,
``x = 'torch.Tensor'``, a dtype); one ``CompiledStep`` subclass whose only method ``forward`` is a
straight line of assignments of calls on those names. Anything else is refused: other imports,
other statements (loops, with, try, lambdas, comprehensions, nested defs...), names that are neither
imported, assigned nor safe builtins, dunder or private attributes, attribute chains on a module
that reach another module outside the allowed ones or a denied torch entry (``torch.load``,
``torch.ops``, ``torch.hub``...), and ``exec``/``eval``/``open``/``__import__``/``getattr``....
"""

from __future__ import annotations

import ast
import importlib
import types

ALLOWED_MODULES = {"torch", "torch.fx._pytree", "torch.utils._pytree", "math", "operator",
                   "specc.codegen.kernel_abi"}
#: modules an attribute chain may pass through (``torch.functional.split``, ``torch.nn.functional.x``)
PASS_THROUGH = {"torch", "torch.functional", "torch.nn", "torch.nn.functional", "torch.linalg", "torch.special",
                "math", "operator", "torch.fx._pytree", "torch.utils._pytree", "specc.codegen.kernel_abi"}
FROM_IMPORTS = {"specc.runtime.compiled": {"CompiledStep"}}
DENIED = {"load", "save", "from_file", "hub", "ops", "classes", "library", "jit", "compile", "compiler", "utils",
          "autograd", "cuda", "backends", "distributed", "multiprocessing", "package", "export", "onnx",
          "set_default_device", "set_default_dtype", "set_default_tensor_type", "use_deterministic_algorithms",
          "set_printoptions", "storage", "UntypedStorage", "TypedStorage", "Storage", "serialization", "sys", "os",
          "fx", "set_grad_enabled", "manual_seed", "seed", "random", "get_rng_state", "set_rng_state",
          "tofile", "numpy", "register_hook", "untyped_storage", "storage_offset", "data_ptr", "record_stream"}
SAFE_BUILTINS = {"float", "int", "bool", "type", "slice", "range", "len", "tuple", "list", "dict", "min", "max",
                 "abs", "None", "True", "False"}
_EXPR = (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant, ast.Tuple, ast.List, ast.Dict, ast.Slice,
         ast.UnaryOp, ast.BinOp, ast.Compare, ast.BoolOp, ast.IfExp, ast.Starred, ast.keyword, ast.Load, ast.Store,
         ast.Del, ast.operator, ast.unaryop, ast.cmpop, ast.boolop, ast.expr_context)


class EmittedCodeError(ValueError):
    """An emitted module references something beyond the kernel ABI."""


def _resolve(module: str, chain: list[str], where: str) -> None:
    obj: object = importlib.import_module(module)
    name = module
    for part in chain:
        if part.startswith("_") or part in DENIED:
            raise EmittedCodeError(f"{where}: {name}.{part} is not part of the kernel ABI")
        if not (isinstance(obj, types.ModuleType) and obj.__name__ in PASS_THROUGH):
            return  # past the module: attributes of a value (dtype, function) are checked by name only
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise EmittedCodeError(f"{where}: {name}.{part} does not exist") from exc
        name = f"{name}.{part}"
    if isinstance(obj, types.ModuleType):
        raise EmittedCodeError(f"{where}: module {name} used as a value")


def _chain(node: ast.AST) -> tuple[ast.AST, list[str]]:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return node, parts[::-1]


def check_emitted_source(source: str, class_name: str, where: str = "emitted module") -> None:
    """Raise :class:`EmittedCodeError` unless ``source`` is kernel-ABI code (see the module docstring)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise EmittedCodeError(f"{where}: does not parse (line {exc.lineno})") from exc
    modules: dict[str, str] = {}  # alias -> module
    names: set[str] = set(SAFE_BUILTINS)
    classes = []
    for i, stmt in enumerate(tree.body):
        at = f"{where}:{stmt.lineno}"
        if i == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue
        if isinstance(stmt, ast.Import):
            for a in stmt.names:
                if a.name not in ALLOWED_MODULES:
                    raise EmittedCodeError(f"{at}: import {a.name} is not allowed")
                if a.asname is None and "." in a.name:
                    raise EmittedCodeError(f"{at}: import {a.name} without an alias is not allowed")
                modules[a.asname or a.name] = a.name
            continue
        if isinstance(stmt, ast.ImportFrom):
            mod = stmt.module or ""
            if stmt.level or not (mod in ALLOWED_MODULES or mod in FROM_IMPORTS):
                raise EmittedCodeError(f"{at}: from {mod} import is not allowed")
            for a in stmt.names:
                if a.name == "*" or (mod in FROM_IMPORTS and a.name not in FROM_IMPORTS[mod]):
                    raise EmittedCodeError(f"{at}: from {mod} import {a.name} is not allowed")
                if mod in ALLOWED_MODULES:
                    _resolve(mod, [a.name], at)
                names.add(a.asname or a.name)
            continue
        if isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets):
            _check_expr(stmt.value, modules, names, at)
            names.update(t.id for t in stmt.targets)
            continue
        if isinstance(stmt, ast.ClassDef):
            classes.append(stmt)
            continue
        raise EmittedCodeError(f"{at}: a {type(stmt).__name__} statement is not allowed at module level")
    if len(classes) != 1 or classes[0].name != class_name:
        raise EmittedCodeError(f"{where}: expected exactly one class {class_name}")
    cls = classes[0]
    if cls.decorator_list or cls.keywords or not (len(cls.bases) == 1 and isinstance(cls.bases[0], ast.Name)
                                                          and cls.bases[0].id == "CompiledStep") \
            or "CompiledStep" not in names - SAFE_BUILTINS:
        raise EmittedCodeError(f"{where}: {class_name} must subclass CompiledStep only")
    for stmt in cls.body:
        if not (isinstance(stmt, ast.FunctionDef) and stmt.name == "forward" and not stmt.decorator_list):
            raise EmittedCodeError(f"{where}:{stmt.lineno}: only a plain forward method is allowed in {class_name}")
        _check_function(stmt, modules, set(names), f"{where}:{class_name}.forward")


def _check_function(fn: ast.FunctionDef, modules: dict[str, str], names: set[str], where: str) -> None:
    a = fn.args
    if a.vararg or a.kwarg or a.kw_defaults or a.kwonlyargs or a.posonlyargs \
            or not all(isinstance(d, ast.Constant) for d in a.defaults):
        raise EmittedCodeError(f"{where}: only plain positional parameters (constant defaults) are allowed")
    local = set(names) | {arg.arg for arg in a.args}
    for arg in a.args:
        if arg.annotation is not None:
            _check_expr(arg.annotation, modules, local, where)
    if fn.returns is not None:
        _check_expr(fn.returns, modules, local, where)
    for stmt in fn.body:
        at = f"{where}:{stmt.lineno}"
        if isinstance(stmt, ast.Assign):
            _check_expr(stmt.value, modules, local, at)
            for t in stmt.targets:
                for n in ast.walk(t):
                    if not isinstance(n, (ast.Name, ast.Tuple, ast.List, ast.Store, ast.Starred)):
                        raise EmittedCodeError(f"{at}: assignment to {type(n).__name__} is not allowed")
                    if isinstance(n, ast.Name):
                        if n.id in modules or n.id == "self":
                            raise EmittedCodeError(f"{at}: rebinding {n.id} is not allowed")
                        local.add(n.id)
        elif isinstance(stmt, ast.Return):
            if stmt.value is not None:
                _check_expr(stmt.value, modules, local, at)
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue
        elif isinstance(stmt, ast.Pass):
            continue
        else:
            raise EmittedCodeError(f"{at}: a {type(stmt).__name__} statement is not allowed")


def _check_expr(expr: ast.AST, modules: dict[str, str], names: set[str], where: str) -> None:
    todo = [expr]
    while todo:
        n = todo.pop()
        if not isinstance(n, _EXPR):
            raise EmittedCodeError(f"{where}: {type(n).__name__} is not allowed in an emitted module")
        if isinstance(n, ast.Name) and n.id not in names and n.id not in modules and n.id != "self":
            raise EmittedCodeError(f"{where}: name {n.id!r} is not defined by the emitted module")
        if isinstance(n, ast.Attribute):  # the whole chain at once: a.b.c
            base, chain = _chain(n)
            for part in chain:
                if part.startswith("__") or part in DENIED:
                    raise EmittedCodeError(f"{where}: attribute {part!r} is not allowed")
            if isinstance(base, ast.Name) and base.id in modules:
                _resolve(modules[base.id], chain, where)
            elif isinstance(base, ast.Name) and base.id == "self":
                if len(chain) > 1 and chain[0].startswith("_"):
                    raise EmittedCodeError(f"{where}: self.{'.'.join(chain)} is not allowed")
            elif any(part.startswith("_") for part in chain):
                raise EmittedCodeError(f"{where}: private attribute in {'.'.join(chain)} is not allowed")
            todo.append(base)
            continue
        todo.extend(ast.iter_child_nodes(n))
