"""Tracing specc model definitions into step-function IRs, and building models without weights.

``trace(model, step)`` runs torch.fx symbolic tracing through the model's modules. The leaf ops
of ``specc.models.ops`` (wrapped with ``torch.fx.wrap``) stay single nodes; module structure
is flattened, and each node remembers the module path it came from (``specc_scope``) and gets a
readable name from it (``layers_3_self_attn_q_proj`` for the q projection's linear). Symbolic
tracing never executes an op, so a model on the ``meta`` device (no weight memory) traces the
same as a real one; shapes come from the op rules, evaluated on symbolic input shapes.

After tracing, duplicate size computations (``x.shape[0]`` asked four times) are merged, and
DFlash's context injection (``fc`` + ``hidden_norm``) is tagged with group ``dflash_context``.
"""

from __future__ import annotations

import builtins
import inspect
import json
import math
import operator
from pathlib import Path
from typing import Any, Mapping

import torch
import torch.fx
from torch import nn

from specc.ir.errors import IRError
from specc.ir.ir import GROUP_KEY, IR, SCOPE_KEY, InputSpec
from specc.ir.meta import TensorMeta
from specc.ir.symbols import B, C, N, Q, R, T
from specc.models import gdn, ops
from specc.models.decoder import CausalLM, Linear, RMSNorm
from specc.models.dflash import DFlashDraft, DFlashDrafter
from specc.models.hybrid import HybridLM, OffsetRMSNorm

STEPS: dict[str, str] = {
    "prefill": "target over the prompt: Q prompt tokens per row (C > 0 for chunked prefill)",
    "ar": "target, one new token per row (Q = 1): plain autoregressive decoding",
    "verify": "target over [last committed token, k drafts]: Q = k + 1",
    "tree_verify": "target over a draft tree of Q nodes (root = last committed token) with its ancestor mask",
    "ragged_verify": "target over R rows packed into T tokens, each row with its own token count, cache length and slot",
    "draft": "one drafter forward: PARD/AR drafters over Q tokens; DFlash over a block of Q with N injected context tokens",
}

# Leaf ops that get the name of the module that calls them (Linear -> linear, RMSNorm -> rms_norm).
_MODULE_LEAF = ((Linear, ops.linear), (RMSNorm, ops.rms_norm), (OffsetRMSNorm, gdn.rms_norm_offset))
# Call targets that get scoped names (others keep fx's short names: getattr_1, getitem_2, neg).
_SCOPED_TARGETS = {ops.embedding, ops.linear, ops.rms_norm, ops.silu_mul, ops.rope_tables, ops.rope, ops.attention,
                   ops.ragged_attention,
                   operator.add, operator.mul, torch.cat, torch.sigmoid,
                   gdn.rms_norm_offset, gdn.tree_parents, gdn.gdn_gates, gdn.conv_step, gdn.delta_rule_step,
                   gdn.gated_head_norm}
DFLASH_CONTEXT_MODULES = ("fc", "hidden_norm")
# Bound at import: while tracing, torch.fx patches the wrapped functions in specc.models.ops.
_ROPE_TABLES = ops.rope_tables


class _Tracer(torch.fx.Tracer):
    """fx tracer that records module scope on every node and names nodes after it."""

    def __init__(self):
        super().__init__(autowrap_modules=(math,))

    def create_node(self, kind, target, args, kwargs, name=None, type_expr=None):
        path = self.scope.module_path
        if (name is None and target is operator.getitem and isinstance(args[0], torch.fx.Node)
                and args[0].target is _ROPE_TABLES and args[1] in (0, 1)):
            name = ("rope_cos", "rope_sin")[args[1]]
        if name is None and path and (kind == "call_method" or (kind == "call_function" and target in _SCOPED_TARGETS)):
            prefix = path.replace(".", "_")
            mtype = self.scope.module_type
            if kind == "call_function" and isinstance(mtype, type) and any(
                    issubclass(mtype, cls) and target is fn for cls, fn in _MODULE_LEAF):
                name = prefix
            else:
                base = target if isinstance(target, str) else getattr(target, "__name__", "op")
                name = f"{prefix}_{base}"
        node = super().create_node(kind, target, args, kwargs, name, type_expr)
        node.meta[SCOPE_KEY] = path
        return node


def _caches_missing(model) -> bool:
    """Whether any state buffer the model declares is not allocated yet."""
    def missing(path):
        obj = model
        for part in path.split("."):
            obj = getattr(obj, part, None)
        return obj is None
    return any(missing(spec.name) for spec in model.state_specs())


def _on_meta(module: nn.Module) -> bool:
    p = next(iter(module.parameters()), None)
    return p is not None and p.device.type == "meta"


def _ensure_caches(model: nn.Module, owner) -> None:
    if not _caches_missing(model):
        return
    if _on_meta(model):
        owner.setup_caches(1, 64)
        return
    raise IRError("KV caches are not allocated: call model.setup_caches(batch, max_len) before tracing "
                  "(the step writes its cache in place and the IR refers to those buffers)")


def _describe(cfg, role: str) -> str:
    return (f"{cfg.family} {role}, {cfg.num_layers} layers, hidden {cfg.hidden_size}, "
            f"heads {cfg.num_heads}/{cfg.num_kv_heads}x{cfg.head_dim}, vocab {cfg.vocab_size}")


def trace(model: Any, step: str, *, title: str | None = None, defaults: Mapping[str, int] | None = None) -> IR:
    """Trace one step function of ``model`` into an :class:`IR` with metadata on every node.

    model: a ``CausalLM`` (steps prefill / ar / verify as a target; draft as a PARD or AR
      drafter), a ``DFlashDrafter`` (step draft), or a ``specc.models.Loaded`` of either.
      Caches must be allocated (``setup_caches``) unless the model is on the meta device. For a
      DFlash target, set ``model.capture_layers`` first: the step then returns (logits, hidden).
    step: "prefill" | "ar" | "draft" | "verify" (see ``STEPS``). The graph is the same forward
      for the target steps; what differs is the symbolic input shapes (Q = 1 for ar).
    defaults: values of B, Q, C, N (T, R for ragged_verify) used when printing evaluated costs.
    """
    if step not in STEPS:
        raise IRError(f"unknown step {step!r} (steps: {', '.join(STEPS)})")
    model = getattr(model, "model", model) if not isinstance(model, nn.Module) else model
    if isinstance(model, DFlashDraft):
        raise IRError("a DFlashDraft has no embedding or LM head: trace DFlashDrafter(draft, target.embed_tokens, "
                      "target.lm_head) (see specc.ir.bind_dflash)")
    long = torch.long
    if isinstance(model, DFlashDrafter):
        if step != "draft":
            raise IRError(f"a DFlash drafter has only the draft step, not {step!r}")
        draft = model.draft
        _ensure_caches(model, draft)
        cfg, spec = draft.config, draft.spec
        dtype = draft.fc.weight.dtype
        n_hidden = len(spec.target_layer_ids) * cfg.hidden_size
        inputs = [
            InputSpec("block_ids", TensorMeta((B, Q), long), "token_ids", "[last committed token, mask x (Q - 1)]"),
            InputSpec("target_hidden", TensorMeta((B, N, n_hidden), dtype), "hidden",
                      f"target hidden states of layers {list(spec.target_layer_ids)} for N newly committed tokens"),
            InputSpec("positions", TensorMeta((B, N + Q), long), "positions", "positions of [context; block]"),
            InputSpec("cache_len", TensorMeta((B,), long, value=C), "cache_len", "drafter cache length per row (= C)"),
        ]
        model_kind = "dflash"
        title = title or _describe(cfg, "DFlash drafter") + f", block {spec.block_size}"
        dflt = {"B": 1, "Q": spec.block_size, "C": 1024, "N": 4}
    elif isinstance(model, CausalLM) and step == "ragged_verify":
        _ensure_caches(model, model)
        cfg = model.config
        inputs = [
            InputSpec("input_ids", TensorMeta((1, T), long), "token_ids", "the rows' new tokens, back to back"),
            InputSpec("positions", TensorMeta((1, T), long), "positions", "each token's position in its row"),
            InputSpec("cache_len", TensorMeta((R,), long, value=C), "cache_len", "tokens already cached per row (= C)"),
            InputSpec("row_slots", TensorMeta((R,), long), "row_slots", "the cache slot of each row (distinct)"),
            InputSpec("row_starts", TensorMeta((R + 1,), long), "row_starts",
                      "cumulative token offsets: row r is tokens row_starts[r]:row_starts[r + 1]"),
        ]
        model_kind = "causal_lm"
        title = title or _describe(cfg, "target") + (f", captures layers {list(model.capture_layers)}"
                                                     if model.capture_layers else "")
        dflt = {"T": 32, "R": 4, "C": 1024}
    elif step == "ragged_verify":
        raise IRError(f"only a CausalLM target has the ragged_verify step, not {type(model).__name__}")
    elif isinstance(model, (CausalLM, HybridLM)):
        _ensure_caches(model, model)
        cfg = model.config
        q = 1 if step == "ar" else Q
        tree = step == "tree_verify"
        inputs = [
            InputSpec("input_ids", TensorMeta((B, q), long), "token_ids", "tree nodes" if tree else "new tokens"),
            InputSpec("positions", TensorMeta((B, q), long), "positions",
                      "C + node depth" if tree else "their positions (C, C + 1, ...)"),
            InputSpec("cache_len", TensorMeta((B,), long, value=C), "cache_len", "tokens already cached per row (= C)"),
        ]
        if tree:
            inputs.append(InputSpec("tree_mask", TensorMeta((B, q, q), torch.bool), "tree_mask",
                                    "ancestor mask of the draft tree (node i sees node j)"))
        model_kind = "causal_lm"
        role = "drafter" if step == "draft" else "target"
        title = title or _describe(cfg, role) + (f", captures layers {list(model.capture_layers)}" if model.capture_layers else "")
        dflt = {"prefill": {"B": 1, "Q": 128, "C": 0}, "ar": {"B": 1, "C": 1024},
                "verify": {"B": 1, "Q": 8, "C": 1024}, "tree_verify": {"B": 1, "Q": 32, "C": 1024},
                "draft": {"B": 1, "Q": 8, "C": 1024}}[step]
    else:
        raise IRError(f"cannot trace {type(model).__name__}: expected a specc CausalLM, HybridLM or DFlashDrafter")
    dflt = {**dflt, **(defaults or {})}

    tracer = _Tracer()
    if model_kind == "causal_lm":
        # chain steps: tree_mask is None, so the graph has no trace of it (no input, no mask load);
        # dense steps: no ragged row descriptor (CausalLM's row_slots / row_starts)
        params = inspect.signature(type(model).forward).parameters
        concrete = {} if step == "ragged_verify" else {
            name: None for name in ("row_slots", "row_starts") if name in params}
        if step != "tree_verify":
            concrete["tree_mask"] = None
        graph = tracer.trace(model, concrete_args=concrete)
        _drop_specialized_inputs(graph)
    else:
        graph = tracer.trace(model)
    gm = torch.fx.GraphModule(model, graph, class_name=f"{step.capitalize()}Step")
    names = [n.target for n in gm.graph.nodes if n.op == "placeholder"]
    if names != [s.name for s in inputs]:
        raise IRError(f"{type(model).__name__}.forward takes {names}, expected {[s.name for s in inputs]}")
    _merge_size_nodes(gm.graph)
    _mark_state(gm.graph, model)
    if model_kind == "dflash":
        scopes = {f"draft.{m}" for m in DFLASH_CONTEXT_MODULES}
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.meta.get(SCOPE_KEY) in scopes:
                node.meta[GROUP_KEY] = "dflash_context"
    gm.recompile()
    ir = IR(gm, step, inputs, model_kind=model_kind, title=title, defaults=dflt)
    ir.refresh()
    return ir


STATE_KEY = "state"


def _drop_specialized_inputs(graph: torch.fx.Graph) -> None:
    """Remove the placeholders fx makes for arguments specialised to None (and their asserts)."""
    for node in list(graph.nodes):
        if node.op == "call_function" and getattr(node.target, "__name__", "") == "_assert_is_none":
            graph.erase_node(node)
    for node in list(graph.nodes):
        if node.op == "placeholder" and not node.users and node.kwargs == {} and node.args == (None,):
            graph.erase_node(node)


def _mark_state(graph: torch.fx.Graph, model: nn.Module) -> None:
    """Put the model's declared state (``model.state_specs()``, ``specc.models.state.StateSpec``)
    on the get_attr nodes of those buffers: ``node.meta["state"]``. Emission reads it."""
    declared = {spec.name: spec for spec in model.state_specs()} if hasattr(model, "state_specs") else {}
    for node in graph.nodes:
        if node.op == "get_attr" and node.target in declared:
            node.meta[STATE_KEY] = declared[node.target]


def _merge_size_nodes(graph: torch.fx.Graph) -> int:
    """Common-subexpression elimination of size arithmetic (x.shape, x.shape[i], -n)."""

    def is_size_op(node) -> bool:
        if node.op != "call_function":
            return False
        if node.target is builtins.getattr:
            return True
        if node.target is operator.neg:
            return True
        if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
            src = node.args[0]
            return src.op == "call_function" and src.target is builtins.getattr and isinstance(node.args[1], int)
        return False

    seen: dict[tuple, torch.fx.Node] = {}
    merged = 0
    for node in list(graph.nodes):
        if not is_size_op(node):
            continue
        key = (node.target, node.args, tuple(sorted(node.kwargs.items())))
        if key in seen:
            node.replace_all_uses_with(seen[key])
            graph.erase_node(node)
            merged += 1
        else:
            seen[key] = node
    return merged


# --------------------------------------------------------------------------- models without weights

_DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
           "half": torch.float16, "float32": torch.float32, "fp32": torch.float32, "float": torch.float32}


def parse_dtype(name: str | torch.dtype | None, default: torch.dtype = torch.float32) -> torch.dtype:
    if name is None:
        return default
    if isinstance(name, torch.dtype):
        return name
    key = str(name).replace("torch.", "")
    if key not in _DTYPES:
        raise IRError(f"unknown dtype {name!r} (use bfloat16, float16 or float32)")
    return _DTYPES[key]


def read_config(config: Any) -> tuple[dict, Path]:
    """A config.json dict from a dict, a .json file, or a checkpoint dir / zoo name / hub id."""
    if isinstance(config, dict):
        return config, Path("<config>")
    path = Path(str(config)).expanduser()
    if path.is_file():
        try:
            return json.loads(path.read_text()), path.parent
        except (OSError, json.JSONDecodeError) as exc:
            raise IRError(f"{path}: unreadable config ({exc})") from exc
    from specc.models.loading import ZOO_DIR, load_config, resolve_checkpoint

    text = str(config)
    is_hub_id = (not path.exists() and not (ZOO_DIR / text / "config.json").is_file()
                 and text.count("/") == 1 and not text.startswith((".", "/", "~")))
    if is_hub_id:  # fetch config.json only: resolve_checkpoint would download the weights too
        cfg_path = _hub_config(text)
        return json.loads(cfg_path.read_text()), cfg_path.parent
    resolved = resolve_checkpoint(config)
    return load_config(resolved), resolved


def read_user_config(config: Any) -> dict:
    """``read_config``'s config.json dict, for a reference a user gave: every failure to read it
    is a UserError (its message one line for the CLI; checkpoint and config errors already are)."""
    from specc.errors import UserError

    try:
        return read_config(config)[0]
    except (IRError, OSError) as exc:
        raise UserError(str(exc)) from exc


def _hub_config(repo_id: str) -> Path:
    import os

    try:
        from huggingface_hub import hf_hub_download
    except ImportError as exc:  # pragma: no cover - a transformers dependency
        raise IRError(f"{repo_id}: huggingface_hub is not installed") from exc
    try:
        return Path(hf_hub_download(repo_id, "config.json", local_files_only=True))
    except Exception:
        pass
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise IRError(f"{repo_id}: config.json is not in the local hub cache and HF_HUB_OFFLINE=1")
    try:
        return Path(hf_hub_download(repo_id, "config.json"))
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise IRError(f"{repo_id}: cannot fetch config.json from the hub ({reason})") from exc


def meta_model(config: Any, *, dtype: str | torch.dtype | None = None, max_len: int = 64):
    """Build a model from its config alone on the ``meta`` device: real shapes, no weight memory.

    Returns a ``specc.models.Loaded`` (kind, model, config, raw_config, path) whose tensors are all
    meta, with KV caches for 1 row of ``max_len`` allocated (also meta). dtype defaults to the
    config's ``torch_dtype``/``dtype`` (bf16 for released checkpoints).
    """
    from specc.models.config import ConfigError, model_config_from_hf
    from specc.models.registry import Loaded, classify

    raw, path = read_config(config)
    try:
        kind = classify(raw)
    except ConfigError as exc:
        raise IRError(f"{path}: {exc}") from exc
    dt = parse_dtype(dtype or raw.get("dtype") or raw.get("torch_dtype"), torch.bfloat16)
    with torch.device("meta"):
        if kind == "dflash":
            model: nn.Module = DFlashDraft.from_hf_config(raw)
            cfg = model.config
        elif kind == "hybrid":
            from specc.models.hybrid_config import hybrid_config_from_hf

            cfg = hybrid_config_from_hf(raw)
            model = HybridLM(cfg)
        else:
            cfg = model_config_from_hf(raw)
            model = CausalLM(cfg)
        model = model.to(dt)
        model.inv_freq = cfg.rope.inv_freq(getattr(cfg, "rotary_dim", 0) or cfg.head_dim)  # fp32, as load_model keeps it
        model.setup_caches(1, max_len)
    return Loaded(kind=kind, model=model.eval(), config=cfg, raw_config=raw, path=path)


def bind_dflash(target: CausalLM, draft: DFlashDraft) -> DFlashDrafter:
    """The DFlash draft step function: the drafter with the target's embedding and LM head."""
    tcfg, dcfg = target.config, draft.config
    if tcfg.hidden_size != dcfg.hidden_size:
        raise IRError(f"DFlash drafter hidden size {dcfg.hidden_size} != target hidden size {tcfg.hidden_size}")
    bad = [i for i in draft.spec.target_layer_ids if not 0 <= i < tcfg.num_layers]
    if bad:
        raise IRError(f"DFlash drafter reads target layers {bad}, the target has {tcfg.num_layers}")
    return DFlashDrafter(draft, target.embed_tokens, target.lm_head)
