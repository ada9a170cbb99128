"""The kernel shapes a model's compiled steps run: what ``specc calibrate --model`` measures.

The built-in calibration times the linears and attention of one reference size (Qwen3-8B on
CUDA, a small decoder on CPU). A model of another size runs other shapes, in another regime: on
the H200 every linear of specc-tiny (hidden 512) is one short wave of programs, latency-bound
where Qwen3-8B's stream weights at 0.7-0.9 of HBM speed, and the 8B-fitted efficiencies priced
its verify and batched steps 24-58% too fast (docs/benchmarks/cost-model-small-h200.md). Timing
the model's own shapes lets the cost model price each of its linears from a measured time (the
calibration's per-shape linear table on CUDA) and fit attention on its own head layout.

The shapes come from the same weightless IRs the cost model prices (:class:`MetaPair`, after the
compile pipeline), so fused projections (q/k/v, gate/up) are measured as the kernels run them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping

from specc.codegen.linear_choice import KINDS as LINEAR_KINDS

ATTENTION_KINDS = ("attention", "rope_attention", "ragged_attention")


@dataclasses.dataclass(frozen=True)
class ModelShapes:
    """A model's linear weight shapes ``(K, N)`` (as ``calibrate.measure_linear`` takes them) and
    attention head layouts ``(heads, kv_heads, head_dim)``; ``positions`` caps the contexts
    attention is timed at (the model's max_position_embeddings, None: no cap)."""

    label: str
    linears: tuple[tuple[int, int], ...]
    attention_heads: tuple[tuple[int, int, int], ...]
    positions: int | None = None
    norm_widths: tuple[int, ...] = ()  # the rows' widths its RMSNorms run at (short kernels' sizes)
    # weight elements its steps' linears read per round of steps (each linear node once; 0:
    # unknown): the working set the L2 sees step after step (``calibrate.resident_cache_bytes``)
    weight_elements: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "linears": [list(s) for s in self.linears],
                "attention_heads": [list(h) for h in self.attention_heads], "positions": self.positions,
                "norm_widths": list(self.norm_widths), "weight_elements": self.weight_elements}

    def describe(self) -> str:
        heads = ", ".join(f"{h}/{kv} heads of {d}" for h, kv, d in self.attention_heads) or "no attention"
        return f"{self.label}: {len(self.linears)} linear shapes, attention {heads}"


def shapes_of_irs(label: str, irs: Iterable[Any], positions: int | None = None) -> ModelShapes:
    """The linear and attention shapes of post-pass step IRs (None entries skipped), in order of
    first appearance."""
    linears: dict[tuple[int, int], None] = {}
    heads: dict[tuple[int, int, int], None] = {}
    widths: dict[int, None] = {}
    elements = 0
    for ir in irs:
        if ir is None:
            continue
        for node in ir.nodes:
            meta = ir.meta(node)
            attrs = meta.attrs
            try:
                if meta.kind in LINEAR_KINDS:
                    k, n = int(attrs["in_features"]), int(attrs["out_features"])
                    linears[(k, n)] = None
                    elements += k * n
                    if meta.kind == "norm_linear":
                        widths[int(attrs["in_features"])] = None
                elif meta.kind == "rms_norm" and getattr(meta.out, "shape", None):
                    widths[int(meta.out.shape[-1])] = None
                elif meta.kind in ATTENTION_KINDS:
                    heads[(int(attrs["num_heads"]), int(attrs["num_kv_heads"]), int(attrs["head_dim"]))] = None
            except (KeyError, TypeError, ValueError):
                continue
    return ModelShapes(label, tuple(linears), tuple(heads), positions, tuple(widths), elements)


def model_shapes(model: str | Mapping[str, Any], drafter: str | Mapping[str, Any] | None = None, *,
                 method: str | None = None, dtype: str | None = None, pipeline: str | None = None,
                 label: str | None = None) -> ModelShapes:
    """The shapes of a target's steps (and its drafter's): ``model`` / ``drafter`` are config
    dicts or references ``read_config`` resolves (config.json, checkpoint directory, zoo name,
    hub id); ``method`` defaults to the drafter kind's default method, ``pipeline`` to the compile
    default. Raises UserError for what cannot be read or traced."""
    from specc.errors import UserError
    from specc.ir import IRError
    from specc.ir.trace import read_user_config
    from specc.methods import default_method, get_method
    from specc.models.config import ConfigError
    from specc.models.registry import classify
    from specc.search.cost_model import positions_of
    from specc.search.defaults import default_pipeline
    from specc.search.meta_pair import MetaPair

    def config(ref):
        if ref is None or isinstance(ref, Mapping):
            return None if ref is None else dict(ref)
        return dict(read_user_config(ref))

    raw_t, raw_d = config(model), config(drafter)
    try:
        impl = get_method(method) if method else default_method(classify(raw_d) if raw_d is not None else None)
        if impl.uses_drafter and raw_d is None:
            raise UserError(f"method {impl.name} needs a drafter")
        pair = MetaPair(raw_t, raw_d if impl.uses_drafter else None, impl.name, dtype)
        irs = pair.irs(default_pipeline() if pipeline is None else pipeline)
    except (IRError, ConfigError, KeyError, ValueError) as exc:
        raise UserError(f"cannot trace {label or model}: {exc}") from exc
    if label is None:
        label = " + ".join(str(r) for r in (model, drafter) if r is not None and not isinstance(r, Mapping)) \
            or str(raw_t.get("model_type", "model"))
    limits = [n for n in (positions_of(raw_t), positions_of(raw_d)) if n is not None]
    return shapes_of_irs(label, irs, min(limits) if limits else None)


def unmeasured_small_linears(cost_model, irs: Iterable[Any]) -> list[tuple[int, int]]:
    """The small linear shapes ``(K, N)`` of ``irs`` that a CUDA cost model prices from the
    reference shapes' efficiencies rather than from a time measured at that shape: neither in
    its calibration's per-shape table nor among the reference sizes, and with fewer than a
    quarter of the smallest reference weight's elements (4096 x 4096): the latency-bound kernels
    those efficiencies misprice (a large unmeasured shape, such as DFlash's context projection at
    8B sizes, streams like the reference ones). Empty on CPU (one efficiency table there by
    design). What `specc cost` names when it suggests ``specc calibrate --model``."""
    if cost_model.deployment.device != "cuda":
        return []
    from specc.search.calibrate import _sizes
    from specc.codegen.linear_choice import RowRule

    reference = {tuple(s) for s in _sizes("cuda", quick=False)["linear_shapes"]}
    small = min(k * n for k, n in reference) // 4
    table = cost_model.linear_choice
    measured = table is not None and not isinstance(table, RowRule)  # a stated rule has no times
    return [(k, n) for k, n in shapes_of_irs("", irs).linears
            if k * n < small and (k, n) not in reference and not (measured and table.shape(n, k) is not None)]
