"""Checkpoint tensor names of hybrid targets -> ``specc.models.hybrid.HybridLM`` parameter names.

- Qwen3.5 text checkpoints store the language model under ``model.``; multimodal Qwen3.5
  checkpoints under ``model.language_model.`` beside a vision tower (``model.visual.``), which
  is dropped. Multi-token-prediction heads (``mtp.``) are dropped too.
- Qwen3-Next fuses the GDN input projections per key-head group: ``in_proj_qkvz`` rows are
  [q (dk), k (dk), v (r dv), z (r dv)] for each of the Hk groups (r = Hv / Hk) and
  ``in_proj_ba`` rows [b (r), a (r)]. They are regrouped (a row permutation: exact) into
  Qwen3.5's ``in_proj_qkv`` (all q heads, all k heads, all v heads), ``in_proj_z``,
  ``in_proj_b`` and ``in_proj_a``.

Works on real tensors and on meta tensors alike (``check_checkpoint`` converts header shapes).
"""

from __future__ import annotations

import torch

from specc.models.hybrid_config import HybridConfig

DROPPED_PREFIXES = ("mtp.", "model.visual.", "visual.")


def _split_next(cfg: HybridConfig, qkvz: torch.Tensor, ba: torch.Tensor) -> dict[str, torch.Tensor]:
    hk, hv, dk, dv = cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    r = hv // hk
    cols = qkvz.shape[-1]
    groups = qkvz.reshape(hk, 2 * dk + 2 * r * dv, cols)
    q, k, v, z = torch.split(groups, [dk, dk, r * dv, r * dv], dim=1)
    ba_groups = ba.reshape(hk, 2 * r, ba.shape[-1])
    b, a = torch.split(ba_groups, [r, r], dim=1)
    flat = lambda t: t.reshape(-1, t.shape[-1])  # noqa: E731
    return {"in_proj_qkv.weight": torch.cat([flat(q), flat(k), flat(v)], dim=0), "in_proj_z.weight": flat(z),
            "in_proj_b.weight": flat(b), "in_proj_a.weight": flat(a)}


def to_specc_names(state: dict[str, torch.Tensor], cfg: HybridConfig) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors renamed (and, for Qwen3-Next, regrouped) for ``HybridLM``."""
    out: dict[str, torch.Tensor] = {}
    fused: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in state.items():
        if name.startswith(DROPPED_PREFIXES):
            continue
        for prefix in ("model.language_model.", cfg.weight_prefix, "model."):
            if name.startswith(prefix):
                name = name[len(prefix):]
                break
        owner, _, leaf = name.rpartition(".linear_attn.")
        if cfg.layout == "qwen3_next" and leaf in ("in_proj_qkvz.weight", "in_proj_ba.weight"):
            fused.setdefault(owner, {})[leaf] = tensor
            continue
        out[name] = tensor
    for owner, parts in fused.items():
        if set(parts) != {"in_proj_qkvz.weight", "in_proj_ba.weight"}:
            missing = ({"in_proj_qkvz.weight", "in_proj_ba.weight"} - set(parts)).pop()
            out[f"{owner}.linear_attn.{missing}"] = None  # reported as a missing weight
            continue
        for leaf, tensor in _split_next(cfg, parts["in_proj_qkvz.weight"], parts["in_proj_ba.weight"]).items():
            out[f"{owner}.linear_attn.{leaf}"] = tensor
    return {k: v for k, v in out.items() if v is not None}
