"""Emission: a lowered GraphModule -> readable Python source + named tensors.

The source is torch.fx's own code generation of the graph, wrapped in a class with explicit
imports, so a compiled step is a plain importable module that a user can read and diff. Weights
become flat attributes (``layers_0_self_attn_q_proj_weight``) loaded from the artifact's
safetensors; state buffers (KV caches) are flat attributes the runtime allocates: emission
knows them by the ``StateSpec`` tracing put on their get_attr node (``node.meta["state"]``,
declared by the model), never by name, and records the spec (kind, per-slot shape, dtype,
extra_len) in ``EmittedStep.caches``. Nothing here knows about kernels: lowering already chose the call targets.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types

import torch
import torch.fx

from specc import __version__


class EmitError(RuntimeError):
    pass


@dataclasses.dataclass
class EmittedStep:
    class_name: str
    source: str
    weights: dict[str, torch.Tensor]  # flat attribute name -> tensor
    caches: dict[str, dict]  # flat attribute name -> StateSpec.to_manifest(): {"kind", "shape", "dtype", "extra_len", ...}
    inputs: list[str]


def _flat(name: str) -> str:
    return re.sub(r"\W", "_", name)


def _resolve(gm: torch.nn.Module, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _import_line(name: str, obj) -> str:
    if isinstance(obj, types.ModuleType):
        return f"import {obj.__name__} as {name}" if obj.__name__ != name else f"import {name}"
    if isinstance(obj, str):  # fx names type annotations by string
        return f"{name} = {obj!r}"
    if obj is math.inf or (isinstance(obj, float) and math.isinf(obj)):
        return f"{name} = float('inf')"
    if isinstance(obj, float) and math.isnan(obj):
        return f"{name} = float('nan')"
    if obj is type(None):
        return f"{name} = type(None)"
    if isinstance(obj, (torch.dtype, torch.device)):
        return f"{name} = {obj!r}".replace("device(", "torch.device(") if isinstance(obj, torch.device) else f"{name} = {obj}"
    module, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if module and qual and "<" not in qual:
        if module == "builtins":
            return "" if name == qual else f"{name} = {qual}"
        head = qual.split(".")[0]
        if head == qual:
            return f"from {module} import {qual} as {name}" if name != qual else f"from {module} import {qual}"
        return f"from {module} import {head} as _{head}\n{name} = _{head}.{qual.split('.', 1)[1]}"
    raise EmitError(f"cannot emit an import for global {name!r} ({obj!r})")


def emit_step(gm: torch.fx.GraphModule, class_name: str, cache_extra_len: int | None = None,
              class_attrs: dict | None = None) -> EmittedStep:
    """Flatten attribute references and generate the step's source.

    ``class_attrs``: constant class attributes of the emitted class (``ragged_rows = True`` for a
    step that takes the ragged row descriptor), written at the top of its body.

    ``cache_extra_len``: deprecated (the model's StateSpec carries ``extra_len``); when given it
    overrides the declared value, as callers before StateSpec passed it."""
    from specc.models.state import layout

    graph = gm.graph
    weights: dict[str, torch.Tensor] = {}
    caches: dict[str, dict] = {}
    root = torch.nn.Module()
    for node in graph.nodes:
        if node.op == "get_attr":
            value = _resolve(gm, node.target)
            flat = _flat(node.target)
            if not torch.is_tensor(value):
                raise EmitError(f"get_attr {node.target} is not a tensor")
            spec = node.meta.get("state")
            if spec is not None:
                # shape and dtype from the buffer itself: passes may have resliced it (tensor parallel)
                spec = dataclasses.replace(spec, name=flat, shape=layout(spec.kind).slot_shape(value),
                                           dtype=str(value.dtype).replace("torch.", ""))
                if cache_extra_len is not None and spec.kind == "kv":  # snapshot kinds keep their capacity
                    spec = dataclasses.replace(spec, extra_len=cache_extra_len)
                caches[flat] = spec.to_manifest()
            else:
                weights[flat] = value
            node.target = flat
            root.register_buffer(flat, value, persistent=False)
        elif node.op in ("call_module",):
            raise EmitError(f"node {node.name} calls a module ({node.target}); trace with leaf functions only")
    flat_gm = torch.fx.GraphModule(root, graph, class_name=class_name)
    code = flat_gm.graph.python_code(root_module="self")
    imports = sorted({line for name, obj in code.globals.items() if (line := _import_line(name, obj))})
    # fx prefixes its source with `torch.fx._symbolic_trace.wrap(...)` registrations for wrapped
    # functions: meaningful when re-tracing, noise in an emitted module.
    lines = [ln for ln in code.src.strip("\n").splitlines() if not ln.startswith("torch.fx._symbolic_trace.wrap(")]
    body = "\n".join("    " + line if line.strip() else "" for line in lines).lstrip("\n")
    inputs = [n.target for n in graph.nodes if n.op == "placeholder"]
    header = (f'"""Generated by specc {__version__}: step {class_name}. Do not edit; recompile instead.\n\n'
              f"Inputs: {', '.join(inputs)}. Weights and caches are attributes set by specc.runtime.\n\"\"\"\n")
    imports = [line for line in imports if line != "import torch"]
    attrs = "".join(f"    {name} = {value!r}\n" for name, value in (class_attrs or {}).items())
    source = (header + "\nimport torch\n" + "\n".join(imports) + "\n\nfrom specc.runtime.compiled import CompiledStep\n\n\n"
              f"class {class_name}(CompiledStep):\n{attrs + chr(10) if attrs else ''}{body}\n")
    return EmittedStep(class_name, source, weights, caches, inputs)
