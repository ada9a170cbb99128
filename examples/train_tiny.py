#!/usr/bin/env python3
"""Train specc's small real model families: a Qwen3 target with a PARD and a DFlash drafter
(specc-tiny), or a hybrid Qwen3.5-style target with a DFlash drafter (specc-tiny-hybrid).

Everything is made here from Python source code found on the machine (the interpreter's standard
library and installed site-packages), reproducibly from one seed:

  corpus     find *.py files, deduplicate by content hash, hold out ~2% of files (by hash) that
             training never sees, cap the training text
  tokenizer  byte-level BPE (``tokenizers``), <|endoftext|> (eos) and <|mask|> (PARD's pard_token,
             DFlash's mask_token_id); encode the corpus
  target     Qwen3ForCausalLM trained from scratch (AdamW, bf16 autocast on a GPU)
  pard       a smaller Qwen3 causal LM trained for PARD mask-token parallel drafting (k up to 16,
             "conditional drop token" sampling), half on corpus text and half on the target's own
             greedy continuations
  dflash     a DFlash drafter (z-lab checkpoint format) conditioned on target hidden states,
             trained on the target's greedy predictions (distillation)
  eval       held-out perplexity; acceptance length tau and per-position acceptance of
             AR-draft / PARD / DFlash at blocks 8 and 16 through specc's stock loops (fp32);
             greedy samples of the built-in and held-out prompts (eval/samples.json)

The hybrid family (``--preset hybrid``, Config.family "hybrid"; examples/train_tiny_hybrid.sh runs
it in one GPU call) takes the same corpus and tokenizer stages; its target is a transformers
Qwen3_5ForCausalLM (gated DeltaNet layers, gated attention every 4th layer) trained through HF's
own forward, there is no PARD stage, and eval runs the stock DFlash loop (chain verification)
against plain AR; the models land in WORKDIR/models/{specc-tiny-hybrid,specc-tiny-hybrid-dflash}.

and, to split a run over machines (examples/train_tiny_v2.sh runs --preset v2 in two GPU calls):

  distill    the target's greedy continuations on their own (else PARD / DFlash make them)
  export     the results, models in bf12, as tiny-export.tar.part-NN files in --export-dir
  restore    an export's models and distillation data into this workdir (after corpus and
             tokenizer rebuilt it; the tokenizer must come out the same)

Usage:
  PYTHONPATH=. python examples/train_tiny.py --workdir /tmp/tiny --stage all
  PYTHONPATH=. python examples/train_tiny.py --workdir /tmp/toy --stage all --preset toy \\
      --source-dir some/dir/with/py/files

--stage takes one stage, a comma-separated list, or all (every stage but restore and export). Each stage reads the previous stages'
outputs from --workdir and writes its own there; the models land in
WORKDIR/models/{specc-tiny,specc-tiny-pard,specc-tiny-dflash} with WORKDIR/models/MANIFEST.json
(ship them by copying those into specc/zoo/); eval writes WORKDIR/eval/metrics.json and
tiny_acceptance.png. Stages with a time budget (``*_seconds``) shrink their step count
to fit after timing their first steps; the step counts actually used are recorded, and passing
them back (``--set target_steps=N``) with the same seed reproduces the run's data order.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import json
import math
import os
import platform
import shutil
import site
import sys
import sysconfig
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo's specc, also in workers
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

EOS, MASK = "<|endoftext|>", "<|mask|>"
NAMES = {"target": "specc-tiny", "pard": "specc-tiny-pard", "dflash": "specc-tiny-dflash"}
# the hybrid family (Config.family "hybrid"): a Qwen3.5-style target and its DFlash drafter
HYBRID_NAMES = {"target": "specc-tiny-hybrid", "dflash": "specc-tiny-hybrid-dflash"}
STAGES = ("corpus", "tokenizer", "restore", "target", "distill", "pard", "dflash", "eval", "export")
MAX_ZOO_BYTES = 30_000_000  # above this the models are saved in bf16 instead of fp32
MAX_PACKED_ZOO_BYTES = 60_000_000  # the shipped family in bf12 (1.5 bytes a weight) must fit this
EXPORT_PART_BYTES = 15 * 2**20  # export archives are split into parts of this size


@dataclasses.dataclass
class Config:
    seed: int = 0
    family: str = "qwen3"  # qwen3: specc-tiny (+ PARD, DFlash); hybrid: specc-tiny-hybrid (+ DFlash)
    # corpus
    source_dirs: list = dataclasses.field(default_factory=list)  # empty: stdlib + site-packages
    heldout_permille: int = 20
    max_file_kb: int = 512
    max_corpus_mb: float = 300.0
    # tokenizer
    vocab_size: int = 8192
    tokenizer_mb: float = 32.0
    # target (Qwen3)
    hidden: int = 256
    layers: int = 8
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    intermediate: int = 768
    context: int = 512
    rope_theta: float = 10000.0
    # hybrid target (family "hybrid"): gated DeltaNet layers, gated attention every 4th layer
    linear_key_heads: int = 4
    linear_value_heads: int = 8
    linear_key_dim: int = 32
    linear_value_dim: int = 32
    linear_conv_kernel: int = 4
    target_batch: int = 128
    target_seq: int = 512
    target_lr: float = 2e-3
    target_warmup: int = 150
    target_steps: int = 4000
    target_seconds: float = 110.0
    # target-generated (distillation) sequences shared by the drafters
    distill_batch: int = 2048
    distill_len: int = 384
    distill_prompt_min: int = 16
    distill_prompt_max: int = 128
    distill_max_seqs: int = 32768
    distill_seconds: float = 12.0
    distill_fraction: float = 0.5  # share of drafter training samples taken from target generations
    # PARD drafter (Qwen3 causal LM)
    pard_hidden: int = 256
    pard_layers: int = 3
    pard_heads: int = 4
    pard_kv_heads: int = 2
    pard_intermediate: int = 512
    pard_k: int = 16  # drafts per forward it is trained for (1 real + up to k-1 mask slots)
    pard_seq: int = 256
    pard_ratio: float = 0.7  # COD: keep ratio**d of the positions at mask depth d ...
    pard_min_ratio: float = 0.2  # ... but at least this share
    pard_batch: int = 64
    pard_lr: float = 2e-3
    pard_warmup: int = 100
    pard_steps: int = 4000
    pard_seconds: float = 40.0
    # DFlash drafter
    dflash_layers: int = 2
    dflash_intermediate: int = 768
    dflash_block: int = 16
    dflash_layer_ids: list = dataclasses.field(default_factory=list)  # empty: [1, L/2, L-2]
    dflash_seq: int = 384
    dflash_anchors: int = 32
    dflash_batch: int = 64
    dflash_lr: float = 2e-3
    dflash_warmup: int = 100
    dflash_steps: int = 4000
    dflash_seconds: float = 65.0
    dflash_gamma: float = 7.0  # loss weight exp(-(i - 1) / gamma) at block slot i
    dflash_short_blocks: float = 0.25  # share of training blocks cut to a random shorter length
    dflash_consistent_labels: bool = False  # train a slot only where the text before it is the target's greedy choice
    dflash_init_from_target: bool = True  # start the drafter layers as copies of the target's last layers
    dflash_resume: bool = False  # start from the workdir's DFlash drafter instead (a new LR schedule)
    # eval
    eval_prompts: int = 32
    eval_prompt_min: int = 64
    eval_prompt_max: int = 128
    eval_new_tokens: int = 128
    eval_blocks: list = dataclasses.field(default_factory=lambda: [8, 16])
    eval_workers: int = -1  # -1: one per CPU core (up to 15) on a multi-core machine, else 0
    ppl_tokens: int = 262144
    sample_tokens: int = 64  # greedy samples of the eval stage (eval/samples.json)
    sample_heldout: int = 4
    log_every: int = 50
    # export / restore (moving a workdir's results between machines)
    save_bf16: bool = False  # save in bf16 even when fp32 fits (what the bf12 zoo format stores losslessly)
    export_distill: bool = True  # include the distillation sequences (the next call's drafters need them)


PRESETS = {
    "full": {},
    # v2: a ~26M-parameter target (the largest of this architecture whose family, with a 2-layer
    # DFlash at the target's width, stays under 60 MB in bf12) trained in two 10-minute GPU calls:
    # call 1 corpus,tokenizer,target,distill; call 2 corpus,tokenizer,restore,pard,dflash,eval
    # (examples/train_tiny_v2.sh). Budgets: docs/benchmarks/tiny.md "specc-tiny v2".
    "v2": dict(
        hidden=512, layers=8, heads=8, kv_heads=4, intermediate=1280,
        target_lr=1.5e-3, target_warmup=200, target_steps=100000, target_seconds=320.0,
        # the first H200 run (docs/benchmarks/tiny.md) fit one 28 s batch of 1024 sequences in 45 s and
        # its DFlash (190 s on them) reached tau 2.72: three batches, and DFlash gets PARD's spare time
        distill_batch=1024, distill_max_seqs=16384, distill_seconds=95.0,
        pard_hidden=256, pard_layers=4, pard_heads=4, pard_kv_heads=2, pard_intermediate=768,
        pard_steps=100000, pard_seconds=95.0,
        dflash_layers=2, dflash_intermediate=1280, dflash_steps=100000, dflash_seconds=230.0,
        eval_blocks=[16],
    ),
    "toy": dict(
        max_corpus_mb=2.0, tokenizer_mb=1.0, vocab_size=300, heldout_permille=200,
        hidden=32, layers=3, heads=2, kv_heads=1, head_dim=16, intermediate=64, context=128,
        target_batch=4, target_seq=64, target_steps=4, target_warmup=2, target_seconds=20,
        distill_batch=8, distill_len=48, distill_prompt_min=8, distill_prompt_max=16, distill_max_seqs=8,
        distill_seconds=10,
        pard_hidden=32, pard_layers=1, pard_heads=2, pard_kv_heads=1, pard_intermediate=64, pard_k=6,
        pard_seq=24, pard_batch=4, pard_steps=3, pard_warmup=1,
        dflash_layers=1, dflash_intermediate=64, dflash_block=8, dflash_seq=40, dflash_anchors=4,
        dflash_batch=4, dflash_steps=3, dflash_warmup=1,
        eval_prompts=2, eval_prompt_min=8, eval_prompt_max=12, eval_new_tokens=12, eval_blocks=[4, 8],
        eval_workers=0, ppl_tokens=2048, sample_tokens=8, sample_heldout=1, log_every=1,
    ),
}

# v2's model shapes (and block 16) on toy data and step counts: the v2 code paths on a CPU in a minute
PRESETS["v2-smoke"] = {**PRESETS["toy"], **{k: v for k, v in PRESETS["v2"].items() if not k.endswith(
    ("_steps", "_seconds", "_warmup", "_lr")) and not k.startswith("distill_")},
    "head_dim": 64, "eval_new_tokens": 24, "dflash_block": 16, "pard_k": 16, "pard_seq": 32, "dflash_seq": 48, "eval_blocks": [16], "save_bf16": True}

# specc-tiny-hybrid (issue #18): a 15.8M-parameter Qwen3.5-style target (6 gated DeltaNet layers,
# gated attention at layers 3 and 7) and a 3.1M 2-layer DFlash drafter, 28.3 MB in bf12 (<= 30 MB),
# on the same corpus and tokenizer settings as specc-tiny (the same recipe builds the same
# tokenizer), in ONE 10-minute GPU call (examples/train_tiny_hybrid.sh): corpus, tokenizer,
# target, distill, dflash, eval. Budgets and the shipped run: docs/benchmarks/tiny.md "specc-tiny-hybrid".
PRESETS["hybrid"] = dict(
    family="hybrid",
    hidden=384, layers=8, heads=4, kv_heads=2, head_dim=64, intermediate=896,
    linear_key_heads=4, linear_value_heads=8, linear_key_dim=48, linear_value_dim=48,
    target_batch=64, target_seq=512, target_lr=2e-3, target_warmup=150, target_steps=100000, target_seconds=190.0,
    distill_batch=1024, distill_max_seqs=8192, distill_seconds=25.0,
    dflash_layers=2, dflash_intermediate=896, dflash_steps=100000, dflash_seconds=130.0,
    eval_blocks=[16], save_bf16=True,
)
# the hybrid preset's model shapes (and block 16) on toy data and step counts: its code paths on a CPU
PRESETS["hybrid-smoke"] = {**PRESETS["toy"], **{k: v for k, v in PRESETS["hybrid"].items() if not k.endswith(
    ("_steps", "_seconds", "_warmup", "_lr", "_batch", "_seq")) and not k.startswith("distill_")},
    "head_dim": 64, "eval_new_tokens": 24, "dflash_block": 16, "dflash_seq": 48, "eval_blocks": [16]}
# the hybrid family at toy scale: every stage on a CPU in ~20 s
# (enough target and DFlash steps that the drafter is accepted on some prompts and rejected on others)
PRESETS["hybrid-toy"] = {**PRESETS["toy"], "family": "hybrid", "layers": 4, "linear_key_heads": 2,
                         "linear_value_heads": 4, "linear_key_dim": 8, "linear_value_dim": 8,
                         "target_steps": 20, "dflash_steps": 40, "save_bf16": True}


# ----------------------------------------------------------------------------------------------
# small utilities


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n")


def read_json(path: Path):
    return json.loads(path.read_text())


def device():
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def seeded(cfg: Config, salt: str):
    """A numpy generator and a torch seed derived from the run seed and a stage name."""
    import torch

    value = int(hashlib.sha256(f"{cfg.seed}:{salt}".encode()).hexdigest()[:8], 16)
    torch.manual_seed(value)
    return np.random.default_rng(value)


def versions() -> dict:
    import tokenizers
    import torch
    import transformers

    out = {"python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__, "tokenizers": tokenizers.__version__}
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
    return out


def names(cfg: Config) -> dict:
    """The family's model names by role (target, drafters)."""
    if cfg.family not in ("qwen3", "hybrid"):
        raise SystemExit(f"unknown family {cfg.family!r} (choose qwen3 or hybrid)")
    return HYBRID_NAMES if cfg.family == "hybrid" else NAMES


def workdir_names(work: Path) -> dict:
    """The model names of the family a workdir was set up for (its config.json)."""
    saved = work / "config.json"
    return names(Config(family=read_json(saved).get("family", "qwen3") if saved.is_file() else "qwen3"))


def param_count(kind: str, cfg: Config) -> int:
    """Parameters of each model as configured (tied embeddings counted once)."""
    if kind == "target" and cfg.family == "hybrid":
        import torch
        from transformers import Qwen3_5ForCausalLM

        with torch.device("meta"):  # exact, and nothing allocated
            return sum(p.numel() for p in Qwen3_5ForCausalLM(hybrid_config(cfg)).parameters())

    def block(h, heads, kv, hd, inter):
        return h * heads * hd * 2 + h * kv * hd * 2 + 2 * hd + 3 * h * inter + 2 * h

    if kind == "target":
        return cfg.layers * block(cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.intermediate) \
            + cfg.vocab_size * cfg.hidden + cfg.hidden
    if kind == "pard":
        return cfg.pard_layers * block(cfg.pard_hidden, cfg.pard_heads, cfg.pard_kv_heads, cfg.head_dim,
                                       cfg.pard_intermediate) + cfg.vocab_size * cfg.pard_hidden + cfg.pard_hidden
    ids = layer_ids(cfg)
    return cfg.dflash_layers * block(cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.dflash_intermediate) \
        + len(ids) * cfg.hidden * cfg.hidden + 2 * cfg.hidden


def save_dtype(cfg: Config):
    """fp32 when the three models fit the zoo budget in fp32 (and bf16 is not asked for), else bf16."""
    import torch

    total = sum(param_count(k, cfg) for k in names(cfg))
    return torch.float32 if 4 * total <= MAX_ZOO_BYTES - 2_000_000 and not cfg.save_bf16 else torch.bfloat16


def layer_ids(cfg: Config) -> list[int]:
    """DFlash target layers: spread over the target, never its last layer (whose HF hidden
    state is the final-normed one)."""
    if cfg.dflash_layer_ids:
        return [int(i) for i in cfg.dflash_layer_ids]
    top = max(cfg.layers - 2, 0)
    return sorted({min(max(i, 0), top) for i in (1, cfg.layers // 2, cfg.layers - 2)})


class Budget:
    """Step count for a stage with a wall-clock budget: time steps [5, 25), then cap the total."""

    def __init__(self, max_steps: int, seconds: float):
        self.total, self.seconds = max_steps, seconds
        self.t0 = time.time()
        self.t5 = None
        self.capped = False

    def update(self, step: int) -> None:
        if step in (5, 25):
            import torch

            if torch.cuda.is_available():
                torch.cuda.synchronize()
        if step == 5:
            self.t5 = time.time()
        if step == 25 and self.t5 is not None:
            per = (time.time() - self.t5) / 20
            fit = 25 + int((self.seconds - (time.time() - self.t0)) / max(per, 1e-6))
            if fit < self.total:
                self.total, self.capped = max(fit, 26), True

    def over(self) -> bool:  # hard stop, should the estimate be off
        return time.time() - self.t0 > 1.15 * self.seconds + 5


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    warmup = max(1, min(warmup, total // 10 or 1))
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def make_optimizer(params, lr: float):
    import torch

    params = [p for p in params if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    other = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}]
    fused = all(p.is_cuda for p in params)
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=fused)


def autocast(dev):
    import contextlib

    import torch

    if dev.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


# ----------------------------------------------------------------------------------------------
# model forwards used for training (HF modules, our own attention so masks are explicit)


def _rotate_half(x):
    half = x.shape[-1] // 2
    import torch

    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope(x, cos, sin):
    """x [B, heads, T, D]; cos/sin [B, T, D]."""
    cos, sin = cos.unsqueeze(1).to(x.dtype), sin.unsqueeze(1).to(x.dtype)
    return x * cos + _rotate_half(x) * sin


def _heads(x, head_dim):
    b, t, _ = x.shape
    return x.view(b, t, -1, head_dim)


def _attend(q, k, v, mask=None, causal=False):
    """SDPA with grouped kv heads. ``enable_gqa`` lets SDPA share each kv head across its query
    heads instead of materialising repeated k/v: during cached decoding the repeat copied the
    whole cache every step (a quarter of the distillation generator's CPU time)."""
    import torch.nn.functional as F

    gqa = q.shape[1] != k.shape[1]
    if mask is not None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)


def lm_hidden(model, ids, positions, mask=None, capture=(), cache=None, start=0):
    """Final-normed hidden states of an HF Qwen3/Llama causal LM and the outputs of the layers in
    ``capture`` (HF's hidden_states[i + 1]). ``mask``: boolean [B, 1, T, T] visibility, else
    causal. ``cache``: per-layer [k, v] buffers for incremental decoding (positions start..)."""
    inner = model.model
    x = inner.embed_tokens(ids)
    cos, sin = inner.rotary_emb(x, positions)
    captured = {}
    q_len = ids.shape[1]
    for i, layer in enumerate(inner.layers):
        attn = layer.self_attn
        hd = attn.head_dim
        h = layer.input_layernorm(x)
        q = _rope(attn.q_norm(_heads(attn.q_proj(h), hd)).transpose(1, 2), cos, sin)
        k = _rope(attn.k_norm(_heads(attn.k_proj(h), hd)).transpose(1, 2), cos, sin)
        v = _heads(attn.v_proj(h), hd).transpose(1, 2)
        if cache is not None:
            ck, cv = cache[i]
            ck[:, :, start:start + q_len] = k.to(ck.dtype)
            cv[:, :, start:start + q_len] = v.to(cv.dtype)
            k, v = ck[:, :, :start + q_len], cv[:, :, :start + q_len]
            out = _attend(q.to(k.dtype), k, v, causal=q_len > 1 and start == 0)
        else:
            out = _attend(q, k, v, mask=mask, causal=mask is None)
        x = x + attn.o_proj(out.transpose(1, 2).reshape(x.shape[0], q_len, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        if i in capture:
            captured[i] = x
    return inner.norm(x), captured


def is_hybrid(model) -> bool:
    """Whether an HF causal LM has gated DeltaNet (linear attention) layers: a Qwen3.5-style target."""
    return "linear_attention" in (getattr(model.config, "layer_types", None) or ())


def target_hidden(model, ids, positions, capture=()):
    """``lm_hidden`` for any target: Qwen3 through the explicit forward above, a hybrid
    (Qwen3.5-style) target through HF's own forward (causal; its gated DeltaNet layers run HF's
    chunked form), capturing HF's hidden_states[i + 1] as the stock DFlash loop reads them."""
    if not is_hybrid(model):
        return lm_hidden(model, ids, positions, capture=capture)
    out = model.model(input_ids=ids, position_ids=positions, output_hidden_states=bool(capture))
    captured = {i: out.hidden_states[i + 1] for i in capture}
    return out.last_hidden_state, captured


def dflash_hidden(draft, noise, ctx_features, positions, mask):
    """Training forward of a ``DFlashReference``: every block of every row at once.

    noise [B, Q, H] (embedded blocks), ctx_features [B, C, n*H] (target hidden states of all C
    context positions), positions [B, C + Q], mask boolean [B, 1, Q, C + Q]. Returns the
    drafter's normed hidden states [B, Q, H]; same computation as ``DFlashReference.forward``
    with the context limited by the mask."""
    import torch

    ctx = draft.hidden_norm(draft.fc(ctx_features))
    cos, sin = draft.rotary_emb(noise, positions)
    q_len = noise.shape[1]
    x = noise
    for layer in draft.layers:
        attn = layer.self_attn
        hd = attn.head_dim
        h = layer.input_layernorm(x)
        kv_in = torch.cat([ctx, h], dim=1)
        q = _rope(attn.q_norm(_heads(attn.q_proj(h), hd)).transpose(1, 2), cos[:, -q_len:], sin[:, -q_len:])
        k = _rope(attn.k_norm(_heads(attn.k_proj(kv_in), hd)).transpose(1, 2), cos, sin)
        v = _heads(attn.v_proj(kv_in), hd).transpose(1, 2)
        out = _attend(q, k.to(q.dtype), v.to(q.dtype), mask=mask)
        x = x + attn.o_proj(out.transpose(1, 2).reshape(x.shape[0], q_len, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return draft.norm(x)


# ----------------------------------------------------------------------------------------------
# stage: corpus


def source_roots(cfg: Config) -> list[Path]:
    if cfg.source_dirs:
        roots = [Path(d).resolve() for d in cfg.source_dirs]
    else:
        paths = sysconfig.get_paths()
        cands = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
        cands |= set(site.getsitepackages())
        user = site.getusersitepackages()
        if isinstance(user, str):
            cands.add(user)
        roots = sorted({Path(c).resolve() for c in cands if Path(c).is_dir()})
    # drop roots nested inside another root (walked once)
    keep = [r for r in roots if not any(o != r and o in r.parents for o in roots)]
    return sorted(set(keep))


def stage_corpus(cfg: Config, work: Path) -> dict:
    roots = source_roots(cfg)
    log(f"corpus: scanning {[str(r) for r in roots]}")
    seen: dict[str, tuple[str, str]] = {}
    n_files = n_dup = n_skip = 0
    total_bytes = 0
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                if not name.endswith(".py"):
                    continue
                path = Path(dirpath) / name
                try:
                    if path.is_symlink() or path.stat().st_size > cfg.max_file_kb * 1024:
                        n_skip += 1
                        continue
                    data = path.read_bytes()
                except OSError:
                    n_skip += 1
                    continue
                n_files += 1
                digest = hashlib.sha256(data).hexdigest()
                if digest in seen:
                    n_dup += 1
                    continue
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError:
                    n_skip += 1
                    continue
                if not text.strip():
                    n_skip += 1
                    continue
                # the special tokens must never occur inside documents
                text = text.replace(EOS, "<|endoftext_|>").replace(MASK, "<|mask_|>")
                seen[digest] = (str(path.relative_to(root)), text)
                total_bytes += len(data)
    digests = sorted(seen)
    held = [d for d in digests if int(d[:8], 16) % 1000 < cfg.heldout_permille]
    if not held:  # tiny corpora: still hold out one file
        held = [digests[0]]
    held_set = set(held)
    train_all = [d for d in digests if d not in held_set]
    if not train_all:
        raise SystemExit("corpus: need at least two distinct .py files")
    order = sorted(train_all, key=lambda d: hashlib.sha256(f"{cfg.seed}:{d}".encode()).hexdigest())
    cap = int(cfg.max_corpus_mb * 1e6)
    train, used = [], 0
    for d in order:
        if used >= cap:
            break
        train.append(d)
        used += len(seen[d][1].encode())
    out = work / "corpus"
    out.mkdir(parents=True, exist_ok=True)
    for split, ds in (("train", train), ("heldout", held)):
        with open(out / f"{split}.jsonl", "w") as fh:
            for d in ds:
                fh.write(json.dumps({"sha256": d, "path": seen[d][0], "text": seen[d][1]}) + "\n")
    manifest = {
        "roots": [str(r) for r in roots], "py_files_seen": n_files, "duplicates": n_dup, "skipped": n_skip,
        "unique_files": len(digests), "unique_bytes": total_bytes,
        "heldout_files": len(held), "heldout_bytes": sum(len(seen[d][1].encode()) for d in held),
        "train_files": len(train), "train_bytes": used, "train_files_available": len(train_all),
        "heldout_rule": f"int(sha256(content)[:8], 16) % 1000 < {cfg.heldout_permille}",
        "max_file_kb": cfg.max_file_kb, "max_corpus_mb": cfg.max_corpus_mb,
    }
    write_json(out / "manifest.json", manifest)
    log(f"corpus: {n_files} .py files, {len(digests)} unique ({total_bytes / 1e6:.1f} MB); "
        f"train {len(train)} files ({used / 1e6:.1f} MB), held out {len(held)}")
    return manifest


def read_texts(work: Path, split: str) -> list[str]:
    with open(work / "corpus" / f"{split}.jsonl") as fh:
        return [json.loads(line)["text"] for line in fh]


# ----------------------------------------------------------------------------------------------
# stage: tokenizer


def stage_tokenizer(cfg: Config, work: Path) -> dict:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    train_texts = read_texts(work, "train")
    sample, size = [], 0
    for t in train_texts:
        if size >= cfg.tokenizer_mb * 1e6:
            break
        sample.append(t)
        size += len(t)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=cfg.vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=[EOS, MASK], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    t0 = time.time()
    tok.train_from_iterator(sample, trainer)
    log(f"tokenizer: BPE on {size / 1e6:.1f} MB in {time.time() - t0:.1f}s, vocab {tok.get_vocab_size()}")
    out = work / "tokenizer"
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS, mask_token=MASK,
                                   model_max_length=cfg.context)
    fast.save_pretrained(str(out))
    eos_id, mask_id = tok.token_to_id(EOS), tok.token_to_id(MASK)
    assert (eos_id, mask_id) == (0, 1), (eos_id, mask_id)

    def encode(texts):
        fn = getattr(tok, "encode_batch_fast", tok.encode_batch)
        arrays = []
        for i in range(0, len(texts), 2000):
            for enc in fn(texts[i:i + 2000]):
                arrays.append(np.asarray(enc.ids + [eos_id], dtype=np.uint16))
        return arrays

    t0 = time.time()
    train_ids = np.concatenate(encode(train_texts))
    held_docs = encode(read_texts(work, "heldout"))
    tokens = work / "tokens"
    tokens.mkdir(parents=True, exist_ok=True)
    train_ids.tofile(tokens / "train.bin")
    offsets = np.cumsum([0] + [len(a) for a in held_docs]).astype(np.int64)
    np.savez(tokens / "heldout.npz", ids=np.concatenate(held_docs), offsets=offsets)
    info = {"vocab_size": tok.get_vocab_size(), "eos_token_id": eos_id, "mask_token_id": mask_id,
            "train_tokens": int(train_ids.size), "heldout_tokens": int(offsets[-1]),
            "heldout_docs": len(held_docs),
            "bytes_per_token": round(sum(len(t.encode()) for t in train_texts) / max(1, train_ids.size), 3)}
    write_json(tokens / "info.json", info)
    log(f"tokenizer: encoded {train_ids.size / 1e6:.2f}M train / {offsets[-1] / 1e6:.3f}M held-out tokens "
        f"in {time.time() - t0:.1f}s ({info['bytes_per_token']} bytes/token)")
    return info


def load_train_tokens(work: Path) -> np.ndarray:
    return np.fromfile(work / "tokens" / "train.bin", dtype=np.uint16)


def load_heldout(work: Path) -> list[np.ndarray]:
    data = np.load(work / "tokens" / "heldout.npz")
    ids, off = data["ids"], data["offsets"]
    return [ids[off[i]:off[i + 1]] for i in range(len(off) - 1)]


def windows(tokens: np.ndarray, batch: int, length: int, rng) -> np.ndarray:
    starts = rng.integers(0, tokens.size - length, size=batch)
    return tokens[starts[:, None] + np.arange(length)[None, :]].astype(np.int64)


# ----------------------------------------------------------------------------------------------
# stage: target


def qwen3_config(cfg: Config, hidden, layers, heads, kv_heads, intermediate, extra=None):
    from transformers import Qwen3Config

    conf = Qwen3Config(
        vocab_size=cfg.vocab_size, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=cfg.head_dim,
        max_position_embeddings=cfg.context, tie_word_embeddings=True, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta}, rope_theta=cfg.rope_theta,
        # no pad_token_id: HF would make the (eos) padding row of the tied embedding untrainable
        bos_token_id=None, eos_token_id=0, pad_token_id=None, initializer_range=0.02,
    )
    for k, v in (extra or {}).items():
        setattr(conf, k, v)
    return conf


def hybrid_config(cfg: Config):
    """The hybrid target's HF config: Qwen3.5 text, gated attention every 4th layer (HF's
    default layer_types), gated DeltaNet elsewhere; tokens and context as qwen3_config."""
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden, intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.head_dim, linear_num_key_heads=cfg.linear_key_heads, linear_num_value_heads=cfg.linear_value_heads,
        linear_key_head_dim=cfg.linear_key_dim, linear_value_head_dim=cfg.linear_value_dim,
        linear_conv_kernel_dim=cfg.linear_conv_kernel, max_position_embeddings=cfg.context, tie_word_embeddings=True,
        rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=0, pad_token_id=None, initializer_range=0.02,
    )


def new_target(cfg: Config):
    """A freshly initialised target of the configured family."""
    if cfg.family == "hybrid":
        from transformers import Qwen3_5ForCausalLM

        return Qwen3_5ForCausalLM(hybrid_config(cfg))
    from transformers import Qwen3ForCausalLM

    return Qwen3ForCausalLM(qwen3_config(cfg, cfg.hidden, cfg.layers, cfg.heads, cfg.kv_heads, cfg.intermediate))


def save_hf(model, path: Path, cfg: Config, work: Path, extra: dict | None = None) -> None:
    import copy

    from transformers import PreTrainedTokenizerFast

    if path.exists():
        shutil.rmtree(path)
    clone = copy.deepcopy(model).to("cpu", dtype=save_dtype(cfg))
    clone.save_pretrained(str(path))
    raw = read_json(path / "config.json")
    raw.update(extra or {})
    write_json(path / "config.json", raw)
    PreTrainedTokenizerFast.from_pretrained(str(work / "tokenizer")).save_pretrained(str(path))
    tok_cfg = read_json(path / "tokenizer_config.json")
    tok_cfg["tokenizer_class"] = "PreTrainedTokenizerFast"  # transformers 5 writes its own alias; 4.x knows this
    write_json(path / "tokenizer_config.json", tok_cfg)


def load_target(work: Path, dev, dtype=None):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(work / "models" / workdir_names(work)["target"]),
                                                 dtype=dtype or torch.float32)
    return model.to(dev).eval()


def heldout_loss(model, held: list[np.ndarray], seq: int, max_tokens: int, dev, batch: int = 32) -> tuple[float, int]:
    """Mean next-token NLL of the model over non-overlapping windows of the held-out stream."""
    import torch
    import torch.nn.functional as F

    stream = np.concatenate(held).astype(np.int64)
    n = min(stream.size - 1, max_tokens) // seq
    if n == 0:
        seq, n = stream.size - 1, 1
    rows = [stream[i * seq:i * seq + seq + 1] for i in range(n)]
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, n, batch):
            x = torch.tensor(np.stack(rows[i:i + batch]), device=dev)
            pos = torch.arange(seq, device=dev)[None].expand(x.shape[0], -1)
            h, _ = target_hidden(model, x[:, :-1], pos)
            logits = model.lm_head(h).float()
            total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum"))
            count += x[:, 1:].numel()
    return total / count, count


def stage_target(cfg: Config, work: Path) -> dict:
    import torch
    import torch.nn.functional as F

    dev = device()
    rng = seeded(cfg, "target")
    tokens = load_train_tokens(work)
    model = new_target(cfg)
    model.to(dev).train()
    nparams = sum(p.numel() for p in model.parameters())
    log(f"target: {nparams / 1e6:.2f}M params, batch {cfg.target_batch}x{cfg.target_seq}, device {dev}")
    opt = make_optimizer(model.parameters(), cfg.target_lr)
    budget = Budget(cfg.target_steps, cfg.target_seconds)
    pos = torch.arange(cfg.target_seq, device=dev)[None].expand(cfg.target_batch, -1)
    step, losses, t0 = 0, [], time.time()
    while step < budget.total and not budget.over():
        lr = lr_at(step, budget.total, cfg.target_lr, cfg.target_warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        x = torch.from_numpy(windows(tokens, cfg.target_batch, cfg.target_seq + 1, rng)).to(dev, non_blocking=True)
        with autocast(dev):
            h, _ = target_hidden(model, x[:, :-1], pos)
            logits = model.lm_head(h)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        budget.update(step)
        if step % cfg.log_every == 0 or step == budget.total:
            losses.append((step, loss.item()))
            el = time.time() - t0
            log(f"target: step {step}/{budget.total} loss {loss.item():.4f} lr {lr:.2e} "
                f"{step * cfg.target_batch * cfg.target_seq / el / 1e6:.2f}M tok/s {el:.0f}s")
    seconds = time.time() - t0
    model.eval()
    save_hf(model, work / "models" / names(cfg)["target"], cfg, work)
    shutil.rmtree(work / "distill", ignore_errors=True)  # generations of an older target
    saved = load_target(work, dev)
    held_nll, held_n = heldout_loss(saved, load_heldout(work), cfg.target_seq, min(cfg.ppl_tokens, 65536), dev)
    metrics = {"params": nparams, "steps": step, "steps_capped_by_time": budget.capped,
               "tokens_seen": step * cfg.target_batch * cfg.target_seq, "seconds": round(seconds, 1),
               "final_train_loss": losses[-1][1] if losses else None, "loss_curve": losses,
               "heldout_loss_quick": held_nll, "heldout_ppl_quick": math.exp(held_nll), "heldout_tokens_quick": held_n}
    write_json(work / "metrics" / "target.json", metrics)
    log(f"target: {step} steps in {seconds:.0f}s, held-out ppl {math.exp(held_nll):.3f}")
    return metrics


# ----------------------------------------------------------------------------------------------
# target greedy continuations (distillation data for both drafters)


def generate_batch(model, prompts, total_len: int, dev):
    """Greedy continuation of equal-length prompts to ``total_len`` tokens, own KV cache."""
    import torch

    if is_hybrid(model):
        return generate_batch_hf(model, prompts, total_len, dev)
    bsz, plen = prompts.shape
    conf = model.config
    cache_dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    shape = (bsz, conf.num_key_value_heads, total_len, conf.head_dim)
    cache = [[torch.zeros(shape, dtype=cache_dtype, device=dev), torch.zeros(shape, dtype=cache_dtype, device=dev)]
             for _ in range(conf.num_hidden_layers)]
    out = torch.empty(bsz, total_len, dtype=torch.long, device=dev)
    out[:, :plen] = prompts
    ids, start = prompts, 0
    with torch.no_grad(), autocast(dev):
        while start + ids.shape[1] < total_len:
            q = ids.shape[1]
            pos = torch.arange(start, start + q, device=dev)[None].expand(bsz, -1)
            h, _ = lm_hidden(model, ids, pos, cache=cache, start=start)
            nxt = model.lm_head(h[:, -1]).argmax(-1)
            start += q
            out[:, start] = nxt
            ids = nxt[:, None]
    return out


def generate_batch_hf(model, prompts, total_len: int, dev):
    """``generate_batch`` through HF's own forward and cache (the hybrid target's recurrent
    gated DeltaNet states and attention KV): prefill, then one token a step."""
    import torch

    from specc.stock import hf as stock_hf

    bsz, plen = prompts.shape
    cache = stock_hf.new_cache(model)
    out = torch.empty(bsz, total_len, dtype=torch.long, device=dev)
    out[:, :plen] = prompts
    ids, start = prompts, 0
    with torch.no_grad(), autocast(dev):
        while start + ids.shape[1] < total_len:
            pos = torch.arange(start, start + ids.shape[1], device=dev)[None].expand(bsz, -1)
            with warnings.catch_warnings():  # transformers >= 5.2x renames past_key_values -> cache
                warnings.simplefilter("ignore", FutureWarning)
                logits = model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True).logits
            nxt = logits[:, -1].argmax(-1)
            start += ids.shape[1]
            out[:, start] = nxt
            ids = nxt[:, None]
    return out


def ensure_distill(cfg: Config, work: Path) -> np.ndarray:
    import torch

    path = work / "distill" / "generated.npy"
    if path.is_file():
        return np.load(path)
    dev = device()
    rng = seeded(cfg, "distill")
    target = load_target(work, dev)
    tokens = load_train_tokens(work)
    chunks, n, t0, per_batch = [], 0, time.time(), 0.0
    # another batch only while it is expected to end inside the budget (always at least one)
    while n < cfg.distill_max_seqs and (n == 0 or time.time() - t0 + per_batch < cfg.distill_seconds):
        plen = int(rng.integers(cfg.distill_prompt_min, cfg.distill_prompt_max + 1))
        bsz = min(cfg.distill_batch, cfg.distill_max_seqs - n)
        prompts = torch.from_numpy(windows(tokens, bsz, plen, rng)).to(dev)
        tb = time.time()
        chunks.append(generate_batch(target, prompts, cfg.distill_len, dev).cpu().numpy().astype(np.uint16))
        per_batch = time.time() - tb
        n += bsz
        log(f"distill: {n} sequences, {per_batch:.1f}s for a batch of {bsz} "
            f"({1e3 * per_batch / max(1, cfg.distill_len - plen):.1f} ms a decode step)")
    data = np.concatenate(chunks)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, data)
    info = {"sequences": int(data.shape[0]), "length": int(data.shape[1]), "seconds": round(time.time() - t0, 1),
            "batch": cfg.distill_batch, "seconds_last_batch": round(per_batch, 2),
            "prompt_len_range": [cfg.distill_prompt_min, cfg.distill_prompt_max]}
    write_json(work / "distill" / "info.json", info)
    log(f"distill: {data.shape[0]} greedy target continuations of {data.shape[1]} tokens in {time.time() - t0:.1f}s")
    return data


def drafter_batch(tokens, generated, batch: int, length: int, fraction: float, rng) -> np.ndarray:
    """[batch, length] rows: a ``fraction`` from target generations, the rest corpus windows."""
    n_gen = int(rng.binomial(batch, fraction)) if generated is not None and generated.shape[1] >= length else 0
    rows = []
    if n_gen:
        pick = rng.integers(0, generated.shape[0], size=n_gen)
        off = rng.integers(0, generated.shape[1] - length + 1, size=n_gen)
        rows.append(generated[pick[:, None], off[:, None] + np.arange(length)[None]].astype(np.int64))
    if batch - n_gen:
        rows.append(windows(tokens, batch - n_gen, length, rng))
    out = np.concatenate(rows)
    return out[rng.permutation(batch)]


# ----------------------------------------------------------------------------------------------
# stage: PARD


def pard_layout(seq: int, k: int, ratio: float, min_ratio: float, rng, rows: int = 1, pad_to: int = 16):
    """Conditional-drop-token layout: (depth, pos) per element, arrays [rows, N].

    Depth 0 holds the real tokens 0..seq-1. An element at depth d >= 1 and position p is a mask
    slot in the situation "tokens 0..p-d committed, masks at p-d+1..p"; it predicts token p+1.
    A depth-d element at p exists only if the depth-(d-1) element at p-1 does (its chain), and
    depth d keeps a random ratio**d (at least min_ratio) of the positions. Padding elements get
    depth -1. N depends only on (seq, k, ratios).
    """
    depth = [np.zeros((rows, seq), dtype=np.int64)]
    pos = [np.broadcast_to(np.arange(seq, dtype=np.int64), (rows, seq))]
    prev = pos[0]
    for d in range(1, k):
        cand = prev + 1  # sorted per row; only the last can fall off the end
        # at least len(prev) - 1 candidates are valid, so this count is the same for every row
        keep = min(prev.shape[1] - 1, int(seq * max(ratio ** d, min_ratio)))
        if keep <= 0:
            break
        key = np.where(cand < seq, rng.random(cand.shape), 2.0)
        pick = np.sort(np.argsort(key, axis=1)[:, :keep], axis=1)
        prev = np.take_along_axis(cand, pick, axis=1)
        depth.append(np.full((rows, keep), d, dtype=np.int64))
        pos.append(prev)
    depth, pos = np.concatenate(depth, axis=1), np.concatenate(pos, axis=1)
    pad = (-depth.shape[1]) % pad_to
    return (np.concatenate([depth, np.full((rows, pad), -1)], axis=1),
            np.concatenate([pos, np.zeros((rows, pad), dtype=np.int64)], axis=1))


def pard_layout_size(cfg: Config) -> int:
    rng = np.random.default_rng(0)
    return pard_layout(cfg.pard_seq, cfg.pard_k, cfg.pard_ratio, cfg.pard_min_ratio, rng)[0].shape[1]


def pard_mask(depth, pos):
    """Boolean visibility [B, 1, N, N] for pard_layout rows (torch tensors [B, N])."""
    import torch

    anchor = pos - depth
    d_q, a_q = depth[:, :, None], anchor[:, :, None]
    d_k, p_k, a_k = depth[:, None, :], pos[:, None, :], anchor[:, None, :]
    real = (d_k == 0) & (p_k <= a_q) & (d_q >= 0)
    chain = (d_k >= 1) & (a_k == a_q) & (d_k <= d_q)
    eye = torch.eye(depth.shape[1], dtype=torch.bool, device=depth.device)[None]
    return ((real | chain) | eye)[:, None]


def pard_inputs(rows: np.ndarray, cfg: Config, pard_token: int, rng):
    """ids, positions, labels, mask for a batch of [B, seq + 1] token rows."""
    import torch

    depth, pos = pard_layout(cfg.pard_seq, cfg.pard_k, cfg.pard_ratio, cfg.pard_min_ratio, rng, rows=len(rows))
    real = np.take_along_axis(rows, pos, axis=1)
    nxt = np.take_along_axis(rows, pos + 1, axis=1)
    ids = np.where(depth == 0, real, pard_token)
    ids = np.where(depth < 0, 0, ids)
    labels = np.where(depth < 0, -100, nxt)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))
    return t(ids), t(pos), t(labels), t(depth)


def stage_pard(cfg: Config, work: Path) -> dict:
    import torch
    import torch.nn.functional as F
    from transformers import Qwen3ForCausalLM

    if "pard" not in names(cfg):
        log(f"pard: the {cfg.family} family has no PARD drafter; skipped")
        return {}
    dev = device()
    generated = ensure_distill(cfg, work) if cfg.distill_fraction > 0 else None
    rng = seeded(cfg, "pard")
    tokens = load_train_tokens(work)
    pard_token = read_json(work / "tokens" / "info.json")["mask_token_id"]
    model = Qwen3ForCausalLM(qwen3_config(cfg, cfg.pard_hidden, cfg.pard_layers, cfg.pard_heads, cfg.pard_kv_heads,
                                          cfg.pard_intermediate))
    model.to(dev).train()
    nparams = sum(p.numel() for p in model.parameters())
    width = pard_layout_size(cfg)
    log(f"pard: {nparams / 1e6:.2f}M params, k {cfg.pard_k}, {cfg.pard_batch} rows of {cfg.pard_seq} tokens "
        f"-> {width} elements with COD")
    opt = make_optimizer(model.parameters(), cfg.pard_lr)
    budget = Budget(cfg.pard_steps, cfg.pard_seconds)
    step, curve, t0 = 0, [], time.time()
    depth_loss = np.zeros(cfg.pard_k)
    depth_acc = np.zeros(cfg.pard_k)
    depth_n = np.zeros(cfg.pard_k)
    while step < budget.total and not budget.over():
        lr = lr_at(step, budget.total, cfg.pard_lr, cfg.pard_warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        rows = drafter_batch(tokens, generated, cfg.pard_batch, cfg.pard_seq + 1, cfg.distill_fraction, rng)
        ids, pos, labels, depth = (t.to(dev, non_blocking=True) for t in pard_inputs(rows, cfg, pard_token, rng))
        mask = pard_mask(depth, pos)
        with autocast(dev):
            h, _ = lm_hidden(model, ids, pos, mask=mask)
            logits = model.lm_head(h)
        flat = logits.float().reshape(-1, logits.shape[-1])
        per_tok = F.cross_entropy(flat, labels.reshape(-1), reduction="none", ignore_index=-100)
        valid = labels.reshape(-1) >= 0
        loss = per_tok.sum() / valid.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        budget.update(step)
        if step % cfg.log_every == 0 or step == budget.total:
            with torch.no_grad():
                d = depth.reshape(-1)
                correct = (flat.argmax(-1) == labels.reshape(-1)).float()
                for k in range(cfg.pard_k):
                    sel = d == k
                    if sel.any():
                        depth_loss[k] = float(per_tok[sel].mean())
                        depth_acc[k] = float(correct[sel].mean())
                        depth_n[k] = float(sel.sum())
            curve.append((step, loss.item()))
            log(f"pard: step {step}/{budget.total} loss {loss.item():.4f} acc@depth0 {depth_acc[0]:.3f} "
                f"acc@depth{cfg.pard_k - 1} {depth_acc[-1]:.3f} lr {lr:.2e} {time.time() - t0:.0f}s")
    seconds = time.time() - t0
    model.eval()
    save_hf(model, work / "models" / names(cfg)["pard"], cfg, work, {"pard_token": int(pard_token), "spd_type": "pard"})
    metrics = {"params": nparams, "steps": step, "steps_capped_by_time": budget.capped, "seconds": round(seconds, 1),
               "elements_per_row": width, "final_loss": curve[-1][1] if curve else None, "loss_curve": curve,
               "last_batch_loss_by_depth": depth_loss.round(4).tolist(),
               "last_batch_top1_by_depth": depth_acc.round(4).tolist(), "pard_token": int(pard_token)}
    write_json(work / "metrics" / "pard.json", metrics)
    log(f"pard: {step} steps in {seconds:.0f}s; top-1 by depth {np.round(depth_acc, 2).tolist()}")
    return metrics


# ----------------------------------------------------------------------------------------------
# stage: DFlash


def dflash_raw_config(cfg: Config, mask_token_id: int) -> dict:
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        "hidden_size": cfg.hidden, "intermediate_size": cfg.dflash_intermediate,
        "num_hidden_layers": cfg.dflash_layers, "num_attention_heads": cfg.heads,
        "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "vocab_size": cfg.vocab_size,
        "rms_norm_eps": 1e-6, "rope_theta": cfg.rope_theta, "rope_scaling": None,
        "max_position_embeddings": cfg.context, "hidden_act": "silu", "attention_bias": False,
        "tie_word_embeddings": False, "block_size": cfg.dflash_block, "num_target_layers": cfg.layers,
        "dflash_config": {"mask_token_id": int(mask_token_id), "target_layer_ids": layer_ids(cfg)},
        "layer_types": ["full_attention"] * cfg.dflash_layers,
    }


def dflash_inputs(cfg: Config, bsz: int, seq: int, rng, dev):
    """Anchors [B, n] (sorted, in 1..seq-2), effective block lengths [B, n]."""
    import torch

    n, b = cfg.dflash_anchors, cfg.dflash_block
    n = min(n, seq - 2)
    anchors = np.sort(np.stack([rng.choice(np.arange(1, seq - 1), size=n, replace=False) for _ in range(bsz)]), 1)
    lengths = np.full((bsz, n), b)
    short = rng.random((bsz, n)) < cfg.dflash_short_blocks
    lengths[short] = rng.integers(2, b, size=int(short.sum())) if b > 2 else b
    return torch.from_numpy(anchors).to(dev), torch.from_numpy(lengths).to(dev)


def dflash_mask(anchors, lengths, ctx_len: int, block: int):
    """Boolean [B, 1, n*b, C + n*b]: a block's queries see context before its anchor and the
    active slots of their own block (non-causal)."""
    import torch

    bsz, n = anchors.shape
    dev = anchors.device
    q_block = torch.arange(n * block, device=dev) // block  # [Q]
    anchor_q = anchors[:, q_block]  # [B, Q]
    ctx_vis = torch.arange(ctx_len, device=dev)[None, None, :] < anchor_q[:, :, None]  # [B, Q, C]
    k_block = torch.arange(n * block, device=dev) // block
    k_slot = torch.arange(n * block, device=dev) % block
    same = q_block[:, None] == k_block[None, :]  # [Q, Q]
    active = k_slot[None, :] < lengths[:, k_block]  # [B, Q]
    blk_vis = same[None] & active[:, None, :]
    return torch.cat([ctx_vis, blk_vis], dim=2)[:, None]


def dflash_labels(greedy, anchors, lengths, block: int, rows=None):
    """Labels [B, n, b] and validity for training blocks: slot i of the block anchored at a
    predicts the token at position a + i, and the label is the target's greedy choice there
    given the sequence before it, greedy[a + i - 1] (on the target's own continuations this is
    the next token itself). Slot 0, slots past the block's length and past the row are invalid.

    With ``rows`` (the token rows, [B, seq]) a slot is also invalid unless the row's tokens between
    the anchor and it are the target's greedy choices (rows[a + j] == greedy[a + j - 1] for
    0 < j < i): otherwise its label continues text the target would not have written, which a
    drafter never sees at inference (it drafts the target's own greedy chain). On corpus rows this
    keeps slot 1 and the few slots where the text agrees with the target; on the target's own
    continuations, nearly everything."""
    import torch

    seq = greedy.shape[1]
    bsz, n = anchors.shape
    slot = torch.arange(block, device=anchors.device)
    idx = anchors[:, :, None] + slot - 1
    labels = greedy.gather(1, idx.clamp(0, seq - 1).reshape(bsz, -1)).reshape(bsz, n, block)
    valid = (slot >= 1) & (slot < lengths[:, :, None]) & (idx <= seq - 1)
    if rows is not None:
        pos = (anchors[:, :, None] + slot).clamp(max=seq - 1).reshape(bsz, -1)
        written = rows.gather(1, pos).reshape(bsz, n, block) == labels  # rows[a + j] == greedy[a + j - 1]
        written[:, :, 0] = True
        follows = torch.cumprod(written.long(), dim=2).bool()  # all of slots 0 .. j are the target's
        valid = valid & torch.cat([torch.ones_like(follows[:, :, :1]), follows[:, :, :-1]], dim=2)
    return labels, valid


def new_dflash(cfg: Config, mask_token_id: int):
    import torch

    from specc.stock.dflash_reference import DFlashReference

    raw = dflash_raw_config(cfg, mask_token_id)
    draft = DFlashReference(raw)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.02)
    return draft, raw


def init_from_target(draft, target) -> None:
    """Copy the target's last layers into the drafter's layers (same shapes, same names).

    A hybrid target's last layers are gated DeltaNet or gated attention layers: only the
    parameters of the drafter's name and shape are copied (MLP, norms, k/v/o projections), and
    its norms, stored zero-centred (scale 1 + w), are converted to the drafter's plain scales."""
    import torch

    hybrid = is_hybrid(target)
    src = target.model.layers[len(target.model.layers) - len(draft.layers):]
    with torch.no_grad():
        for mine, theirs in zip(draft.layers, src):
            ref = dict(theirs.named_parameters())
            for name, p in mine.named_parameters():
                if not hybrid:
                    p.copy_(ref[name])
                elif name in ref and ref[name].shape == p.shape:
                    p.copy_(ref[name] + 1.0 if "norm" in name else ref[name])


def stage_dflash(cfg: Config, work: Path) -> dict:
    import torch
    import torch.nn.functional as F
    from safetensors.torch import save_file

    dev = device()
    generated = ensure_distill(cfg, work) if cfg.distill_fraction > 0 else None
    rng = seeded(cfg, "dflash")
    tokens = load_train_tokens(work)
    mask_id = read_json(work / "tokens" / "info.json")["mask_token_id"]
    target = load_target(work, dev)
    for p in target.parameters():
        p.requires_grad_(False)
    draft, raw = new_dflash(cfg, mask_id)
    resumed = work / "models" / names(cfg)["dflash"] / "model.safetensors"
    if cfg.dflash_resume and resumed.is_file():  # continue the workdir's (e.g. restored) drafter
        from safetensors.torch import load_file

        missing, unexpected = draft.load_state_dict(load_file(str(resumed)), strict=False)
        if unexpected or any("rotary" not in k for k in missing):
            raise SystemExit(f"dflash: {resumed} does not fit this configuration ({missing}, {unexpected})")
        log(f"dflash: resuming from {resumed}")
    elif cfg.dflash_resume:
        raise SystemExit(f"dflash: dflash_resume but no {resumed} (restore the family first)")
    elif cfg.dflash_init_from_target and cfg.dflash_intermediate == cfg.intermediate:
        init_from_target(draft, target)
    draft.to(dev).train()
    ids_layers = layer_ids(cfg)
    nparams = sum(p.numel() for p in draft.parameters())
    seq, b = cfg.dflash_seq, cfg.dflash_block
    log(f"dflash: {nparams / 1e6:.2f}M params, {cfg.dflash_layers} layers, target layers {ids_layers}, block {b}, "
        f"{cfg.dflash_batch} rows x {cfg.dflash_anchors} blocks")
    opt = make_optimizer(draft.parameters(), cfg.dflash_lr)
    budget = Budget(cfg.dflash_steps, cfg.dflash_seconds)
    slot = torch.arange(b, device=dev)
    decay = torch.exp(-(slot - 1).clamp(min=0).float() / cfg.dflash_gamma)
    embed, head = target.model.embed_tokens, target.lm_head
    step, curve, t0 = 0, [], time.time()
    acc_slot = np.zeros(b)
    while step < budget.total and not budget.over():
        lr = lr_at(step, budget.total, cfg.dflash_lr, cfg.dflash_warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        rows = torch.from_numpy(drafter_batch(tokens, generated, cfg.dflash_batch, seq, cfg.distill_fraction, rng)).to(dev)
        bsz = rows.shape[0]
        anchors, lengths = dflash_inputs(cfg, bsz, seq, rng, dev)
        n = anchors.shape[1]
        with torch.no_grad(), autocast(dev):
            pos = torch.arange(seq, device=dev)[None].expand(bsz, -1)
            h, cap = target_hidden(target, rows, pos, capture=ids_layers)
            greedy = head(h).argmax(-1)  # greedy[t]: the target's next token after position t
            ctx = torch.cat([cap[i] for i in ids_layers], dim=-1)
        labels, valid = dflash_labels(greedy, anchors, lengths, b, rows if cfg.dflash_consistent_labels else None)
        weight = valid.float() * decay
        block_ids = torch.full((bsz, n, b), mask_id, dtype=torch.long, device=dev)
        block_ids[:, :, 0] = rows.gather(1, anchors)
        positions = torch.cat([pos, (anchors[:, :, None] + slot).reshape(bsz, -1)], dim=1)
        mask = dflash_mask(anchors, lengths, seq, b)
        with autocast(dev):
            noise = embed(block_ids.reshape(bsz, -1))
            out = dflash_hidden(draft, noise, ctx, positions, mask)
            logits = head(out)
        flat = logits.float().reshape(-1, logits.shape[-1])
        per_tok = F.cross_entropy(flat, labels.reshape(-1), reduction="none")
        w = weight.reshape(-1)
        loss = (per_tok * w).sum() / w.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        step += 1
        budget.update(step)
        if step % cfg.log_every == 0 or step == budget.total:
            with torch.no_grad():
                hit = (flat.argmax(-1) == labels.reshape(-1)).float().reshape(bsz, n, b)
                valid = weight > 0
                for i in range(1, b):
                    sel = valid[:, :, i]
                    acc_slot[i] = float(hit[:, :, i][sel].mean()) if sel.any() else float("nan")
                kept = float(valid[:, :, 1:].float().mean())
            curve.append((step, loss.item()))
            log(f"dflash: step {step}/{budget.total} loss {loss.item():.4f} acc@slot1 {acc_slot[1]:.3f} "
                f"acc@slot{b - 1} {acc_slot[b - 1]:.3f} labels kept {kept:.2f} lr {lr:.2e} {time.time() - t0:.0f}s")
    seconds = time.time() - t0
    draft.eval()
    path = work / "models" / names(cfg)["dflash"]
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    dtype = save_dtype(cfg)
    raw["dtype"] = str(dtype).replace("torch.", "")
    write_json(path / "config.json", raw)
    state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in draft.state_dict().items() if "rotary" not in k}
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    metrics = {"params": nparams, "steps": step, "steps_capped_by_time": budget.capped, "seconds": round(seconds, 1),
               "resumed": bool(cfg.dflash_resume), "consistent_labels": bool(cfg.dflash_consistent_labels),
               "final_loss": curve[-1][1] if curve else None, "loss_curve": curve, "target_layer_ids": ids_layers,
               "last_batch_top1_by_slot": [None] + acc_slot[1:].round(4).tolist()}
    write_json(work / "metrics" / "dflash.json", metrics)
    log(f"dflash: {step} steps in {seconds:.0f}s; top-1 by slot {np.round(acc_slot[1:], 2).tolist()}")
    return metrics


# ----------------------------------------------------------------------------------------------
# stage: eval


def eval_prompts(cfg: Config, work: Path) -> list[list[int]]:
    rng = seeded(cfg, "eval")
    docs = load_heldout(work)
    need = cfg.eval_prompt_max + 1
    order = [i for i in rng.permutation(len(docs)) if len(docs[i]) >= need]
    if not order:  # tiny corpora: the concatenated held-out stream
        docs, order = [np.concatenate(docs)], [0]
    prompts = []
    for j in range(cfg.eval_prompts):
        doc = docs[order[j % len(order)]]
        plen = int(rng.integers(cfg.eval_prompt_min, cfg.eval_prompt_max + 1))
        start = int(rng.integers(0, len(doc) - plen + 1))
        prompts.append([int(t) for t in doc[start:start + plen]])
    return prompts


_EVAL = {}
# the speculative methods evaluated per family, and the stock loops that run them
EVAL_METHODS = {"qwen3": ("ar-draft", "pard", "dflash"), "hybrid": ("dflash",)}
EVAL_LOOPS = {
    "qwen3": "specc.stock generate_chain (ar-draft: PARD model as plain AR drafter), generate_pard, generate_dflash",
    "hybrid": "specc.stock generate_dflash (chain verification; the stock loops have no tree for hybrid targets), "
              "generate_ar as the reference",
}


def _eval_init(models_dir: str, family: str = "qwen3") -> None:
    import torch

    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from specc.stock import DFlashReference

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    root = Path(models_dir)
    load = lambda name: AutoModelForCausalLM.from_pretrained(str(root / name), dtype=torch.float32).eval()
    family_names = names(Config(family=family))
    _EVAL["target"] = load(family_names["target"])
    if "pard" in family_names:
        _EVAL["pard"] = load(family_names["pard"])
        _EVAL["pard_token"] = read_json(root / family_names["pard"] / "config.json")["pard_token"]
    _EVAL["dflash"] = DFlashReference.from_pretrained(root / family_names["dflash"], torch.float32, "cpu")


def _eval_run(task):
    from specc.stock import generate_ar, generate_chain, generate_dflash, generate_pard

    method, block, index, prompt, max_new = task
    target = _EVAL["target"]
    t0 = time.time()
    if method == "ar":
        res = generate_ar(target, prompt, max_new)
    elif method == "ar-draft":
        res = generate_chain(target, _EVAL["pard"], prompt, max_new, num_draft=block - 1)
    elif method == "pard":
        res = generate_pard(target, _EVAL["pard"], _EVAL["pard_token"], prompt, max_new, num_draft=block - 1)
    else:
        res = generate_dflash(target, _EVAL["dflash"], prompt, max_new, block_size=block)
    return {"method": method, "block": block, "prompt": index, "tokens": res.tokens,
            "accepted_lengths": res.stats.accepted_lengths, "draft_forwards": res.stats.draft_forwards,
            "seconds": time.time() - t0}


def acceptance_curve(runs: list[dict], block: int, max_new: int) -> dict:
    """P(draft position i accepted | positions < i accepted), pooled over runs.

    The stock loops draft k = min(block - 1, remaining - 1) tokens per step (cap to budget), so
    a step's accepted drafts are a = committed - 1, and position i is reached when a >= i - 1
    and the step drafted at least i tokens."""
    reached = np.zeros(block)
    accepted = np.zeros(block)
    for run in runs:
        produced = 1  # the prefill token
        for committed in run["accepted_lengths"]:
            k = min(block - 1, max_new - produced - 1)
            a = committed - 1
            for i in range(1, k + 1):
                if a >= i - 1:
                    reached[i] += 1
                    if a >= i:
                        accepted[i] += 1
            produced += committed
    curve = [float(accepted[i] / reached[i]) if reached[i] else None for i in range(1, block)]
    return {"conditional": curve, "reached": reached[1:].astype(int).tolist(), "accepted": accepted[1:].astype(int).tolist()}


def distinct_ngrams(tokens: list[int], n: int = 4) -> float:
    """Share of distinct n-grams among a continuation's n-grams: near 1 for ordinary text, low
    for a continuation that loops (``return (n - 1) * (n - 1) * ...``)."""
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 1.0


def greedy_samples(cfg: Config, work: Path, target, prompts: list[list[int]], dev) -> list[dict]:
    """The target's greedy continuations (``sample_tokens`` new tokens, no EOS stop) of the
    built-in prompts (specc.verify.CALIBRATION_TEXTS, the README's among them) and of the first
    held-out eval prompts, decoded, with their distinct-4-gram share."""
    import torch
    from transformers import PreTrainedTokenizerFast

    from specc.verify.prompts import CALIBRATION_TEXTS

    tok = PreTrainedTokenizerFast.from_pretrained(str(work / "tokenizer"))
    cases = [("builtin", text, tok(text)["input_ids"]) for text in CALIBRATION_TEXTS]
    cases += [("heldout", tok.decode(p), p) for p in prompts[:cfg.sample_heldout]]
    out = []
    for kind, text, ids in cases:
        ids = ids[-(cfg.context - cfg.sample_tokens):]
        seq = generate_batch(target, torch.tensor([ids], device=dev), len(ids) + cfg.sample_tokens, dev)
        new = seq[0, len(ids):].tolist()
        out.append({"kind": kind, "prompt": text, "completion": tok.decode(new),
                    "distinct_4grams": round(distinct_ngrams(new), 3)})
    return out


def stage_eval(cfg: Config, work: Path) -> dict:
    dev = device()
    models = work / "models"
    target = load_target(work, dev)
    nll, n = heldout_loss(target, load_heldout(work), cfg.target_seq, cfg.ppl_tokens, dev)
    log(f"eval: held-out perplexity {math.exp(nll):.3f} over {n} tokens")
    prompts = eval_prompts(cfg, work)
    samples = greedy_samples(cfg, work, target, prompts, dev)
    write_json(work / "eval" / "samples.json", samples)
    for sample in samples[:2]:
        log(f"eval: sample {sample['prompt']!r} -> {sample['completion']!r}")
    del target
    methods = EVAL_METHODS[cfg.family]
    # longest tasks first so the pool stays busy
    tasks = [(m, b, i, p, cfg.eval_new_tokens) for b in sorted(cfg.eval_blocks, reverse=True)
             for m in methods for i, p in enumerate(prompts)]
    if cfg.family == "hybrid":  # plain AR greedy: the reference every method's tokens must equal
        tasks += [("ar", 1, i, p, cfg.eval_new_tokens) for i, p in enumerate(prompts)]
    workers = cfg.eval_workers
    if workers < 0:
        workers = min(15, (os.cpu_count() or 1) - 1) if (os.cpu_count() or 1) > 2 else 0
    t0 = time.time()
    if workers > 0:
        import multiprocessing as mp

        with mp.get_context("spawn").Pool(workers, initializer=_eval_init,
                                             initargs=(str(models), cfg.family)) as pool:
            results = pool.map(_eval_run, tasks, chunksize=1)
    else:
        _eval_init(str(models), cfg.family)
        results = [_eval_run(t) for t in tasks]
    seconds = time.time() - t0
    # every method and block must produce the target's greedy output: compare per prompt (with
    # plain AR's tokens where AR ran, else with the prompt's first run)
    reference = {}
    for r in sorted(results, key=lambda r: r["method"] != "ar"):
        reference.setdefault(r["prompt"], r["tokens"])
    lossless = all(r["tokens"] == reference[r["prompt"]] for r in results)
    table = {}
    for m in methods:
        for b in cfg.eval_blocks:
            runs = [r for r in results if r["method"] == m and r["block"] == b]
            lengths = [x for r in runs for x in r["accepted_lengths"]]
            table[f"{m}@{b}"] = {
                "method": m, "block": b, "num_draft": b - 1, "prompts": len(runs),
                "tau": sum(lengths) / len(lengths), "target_steps": len(lengths),
                "tau_per_prompt_mean": float(np.mean([np.mean(r["accepted_lengths"]) for r in runs])),
                "draft_forwards": sum(r["draft_forwards"] for r in runs),
                "acceptance": acceptance_curve(runs, b, cfg.eval_new_tokens),
                "cpu_seconds": round(sum(r["seconds"] for r in runs), 2),
            }
    metrics = {
        "heldout_ppl": math.exp(nll), "heldout_nll": nll, "heldout_tokens": n,
        "prompts": len(prompts), "prompt_len_range": [cfg.eval_prompt_min, cfg.eval_prompt_max],
        "new_tokens": cfg.eval_new_tokens, "eos_stops": False, "dtype": "float32", "device": "cpu",
        "loops": EVAL_LOOPS[cfg.family], "family": cfg.family, "target": names(cfg)["target"],
        "lossless_all_methods_equal": lossless, "eval_seconds": round(seconds, 1), "workers": workers,
        "samples_distinct_4grams_min": min(x["distinct_4grams"] for x in samples), "results": table,
    }
    out = work / "eval"
    write_json(out / "metrics.json", metrics)
    plot_acceptance(metrics, out / "tiny_acceptance.png")
    for key, row in table.items():
        log(f"eval: {key:12s} tau {row['tau']:.3f} over {row['target_steps']} steps")
    log(f"eval: lossless (all methods equal) = {lossless}; {seconds:.0f}s with {workers} workers")
    return metrics


def plot_acceptance(metrics: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    blocks = sorted({r["block"] for r in metrics["results"].values()})
    fig, axes = plt.subplots(1, len(blocks), figsize=(5.5 * len(blocks), 4), squeeze=False)
    for ax, b in zip(axes[0], blocks):
        for key, row in metrics["results"].items():
            if row["block"] != b:
                continue
            ys = row["acceptance"]["conditional"]
            xs = [i + 1 for i, y in enumerate(ys) if y is not None]
            ax.plot(xs, [y for y in ys if y is not None], marker="o", ms=3,
                    label=f"{row['method']} (tau {row['tau']:.2f})")
        ax.set_title(f"block {b}: P(draft i accepted | 1..i-1 accepted)")
        ax.set_xlabel("draft position i")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"{metrics.get('target', 'specc-tiny')} on held-out Python, {metrics['prompts']} prompts x {metrics['new_tokens']} tokens "
                 f"(ppl {metrics['heldout_ppl']:.2f})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------
# stages: distill, export, restore (moving results between machines)


def stage_distill(cfg: Config, work: Path) -> dict:
    """The target's greedy continuations on their own (else the PARD / DFlash stage makes them)."""
    data = ensure_distill(cfg, work)
    return {"sequences": int(data.shape[0])}


def packed_zoo_bytes(cfg: Config) -> int:
    """Approximate size of the family stored in bf12 (1.5 bytes a weight, escapes ignored)."""
    return int(1.5 * sum(param_count(k, cfg) for k in names(cfg)))


EXPORT_FILES = ("config.json", "commands.json", "timings.json", "corpus/manifest.json", "tokens/info.json",
                "distill/info.json", "metrics/target.json", "metrics/pard.json", "metrics/dflash.json",
                "eval/metrics.json", "eval/samples.json", "eval/tiny_acceptance.png")


def stage_export(cfg: Config, work: Path, dest: Path | None = None) -> dict:
    """One archive of the workdir's results, the models in bf12, split into parts of at most
    EXPORT_PART_BYTES (``DEST/tiny-export.tar.part-NN``): few files of bounded size, which is
    what a remote machine's output folder can hand back. ``cat parts > x.tar`` restores it;
    ``--stage restore --restore-dir DIR`` reads the parts (or the extracted tree) directly."""
    import tarfile

    from specc.models.packed_checkpoint import pack_checkpoint

    if dest is None:
        raise SystemExit("export: give --export-dir")
    dest.mkdir(parents=True, exist_ok=True)
    staging = work / "export"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    packed = {}
    for name in names(cfg).values():
        src = work / "models" / name
        if (src / "config.json").is_file():
            packed[name] = pack_checkpoint(src, staging / "models" / name)
    if (work / "models" / "MANIFEST.json").is_file():
        shutil.copy2(work / "models" / "MANIFEST.json", staging / "models" / "MANIFEST.json")
    for rel in EXPORT_FILES + (("distill/generated.npy",) if cfg.export_distill else ()):
        if (work / rel).is_file():
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(work / rel, staging / rel)
    archive = work / "tiny-export.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(staging, arcname="tiny-export")
    for old in dest.glob("tiny-export.tar.part-*"):
        old.unlink()
    parts = []
    with open(archive, "rb") as fh:
        while chunk := fh.read(EXPORT_PART_BYTES):
            part = dest / f"tiny-export.tar.part-{len(parts):02d}"
            part.write_bytes(chunk)
            parts.append(part.name)
    info = {"parts": parts, "bytes": archive.stat().st_size,
            "models": {k: sum(f.stat().st_size for f in (staging / "models" / k).iterdir()) for k in packed}}
    archive.unlink()
    log(f"export: {info['bytes'] / 1e6:.1f} MB in {len(parts)} parts to {dest}; models {info['models']}")
    return info


def _export_tree(src: Path, scratch: Path) -> Path:
    """The extracted ``tiny-export`` folder of an export: ``src`` holds it, or holds the parts."""
    import tarfile

    for cand in (src / "tiny-export", src):
        if (cand / "models").is_dir():
            return cand
    parts = sorted(src.glob("tiny-export.tar.part-*"))
    if not parts:
        raise SystemExit(f"restore: {src} holds no tiny-export folder or tiny-export.tar.part-* files")
    archive = scratch / "restore.tar"
    with open(archive, "wb") as out:
        for part in parts:
            out.write(part.read_bytes())
    shutil.rmtree(scratch / "tiny-export", ignore_errors=True)
    with tarfile.open(archive) as tar:
        tar.extractall(scratch, filter="data")
    archive.unlink()
    return scratch / "tiny-export"


def stage_restore(cfg: Config, work: Path, src: Path | None = None) -> dict:
    """Put an earlier call's exported models (and distillation data) into this workdir, after
    this call rebuilt the corpus and tokenizer: the target must use the very same tokenizer and
    the configuration this workdir was set up with. ``src`` may also be a folder of model
    directories such as ``specc/zoo`` (the shipped family: retrain a drafter against it)."""
    from specc.models.packed_checkpoint import is_packed, read_packed_state

    if src is None:
        raise SystemExit("restore: give --restore-dir")
    src = src.resolve()
    if (src / names(cfg)["target"] / "config.json").is_file():  # a folder of model directories: specc/zoo
        tree, models = src, src
    else:
        tree = _export_tree(src, work)
        models = tree / "models"
    mine = read_json(work / "tokenizer" / "tokenizer.json")
    restored = []
    for name in names(cfg).values():
        packed = models / name
        if not (packed / "config.json").is_file():
            continue
        theirs = read_json(packed / "tokenizer.json") if (packed / "tokenizer.json").is_file() else None
        if theirs is not None and theirs["model"] != mine["model"]:
            raise SystemExit(f"restore: {name}'s tokenizer differs from the one rebuilt here (other corpus?)")
        dst = work / "models" / name
        shutil.rmtree(dst, ignore_errors=True)
        dst.mkdir(parents=True)
        for f in packed.iterdir():
            if f.is_file() and not f.name.endswith(".safetensors") and f.name != "bf12.json":
                shutil.copy2(f, dst / f.name)
        from safetensors.torch import save_file

        state = read_packed_state(packed) if is_packed(packed) else None
        if state is None:
            shutil.copy2(packed / "model.safetensors", dst / "model.safetensors")
        else:
            save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
        restored.append(name)
    target_conf = work / "models" / names(cfg)["target"] / "config.json"
    if target_conf.is_file():
        raw = read_json(target_conf)
        want = {"hidden_size": cfg.hidden, "num_hidden_layers": cfg.layers, "intermediate_size": cfg.intermediate,
                "vocab_size": cfg.vocab_size}
        got = {k: raw.get(k) for k in want}
        if got != want:
            raise SystemExit(f"restore: the target is {got}, this workdir's configuration says {want}")
    for rel in EXPORT_FILES[3:] + ("distill/generated.npy",):
        if rel.startswith(("corpus/", "tokens/")) or not (tree / rel).is_file():
            continue
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(tree / rel, work / rel)
    old = read_json(tree / "timings.json") if (tree / "timings.json").is_file() else {}
    log(f"restore: {restored} from {src}; earlier timings {old}")
    return {"restored": restored}


# ----------------------------------------------------------------------------------------------
# driver


def write_manifest(cfg: Config, work: Path, argv: list[str]) -> None:
    metrics = {k: read_json(p) for k in ("target", "pard", "dflash") if (p := work / "metrics" / f"{k}.json").is_file()}
    for m in metrics.values():
        m.pop("loss_curve", None)
    ev = work / "eval" / "metrics.json"
    evm = read_json(ev) if ev.is_file() else None
    files = {}
    for name in names(cfg).values():
        d = work / "models" / name
        if d.is_dir():
            files[name] = {f.name: f.stat().st_size for f in sorted(d.iterdir())}
    commands_path = work / "commands.json"
    commands = read_json(commands_path) if commands_path.is_file() else []
    manifest = {
        "made_by": "examples/train_tiny.py", "commands": commands,
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "seed": cfg.seed, "versions": versions(), "save_dtype": str(save_dtype(cfg)).replace("torch.", ""),
        "corpus": read_json(work / "corpus" / "manifest.json") if (work / "corpus" / "manifest.json").is_file() else None,
        "tokens": read_json(work / "tokens" / "info.json") if (work / "tokens" / "info.json").is_file() else None,
        "distill": read_json(work / "distill" / "info.json") if (work / "distill" / "info.json").is_file() else None,
        "training": metrics,
        "eval": None if evm is None else {k: v for k, v in evm.items() if k != "results"} | {
            "tau": {k: round(r["tau"], 4) for k, r in evm["results"].items()}},
        "files": files, "total_bytes": sum(s for f in files.values() for s in f.values()),
        "config": dataclasses.asdict(cfg),
    }
    if cfg.family == "hybrid":
        manifest["tokenizer_equals_zoo_specc_tiny"] = tokenizer_equals_zoo(work)
    write_json(work / "models" / "MANIFEST.json", manifest)


def tokenizer_equals_zoo(work: Path):
    """Whether the workdir's tokenizer is the shipped specc-tiny's (same vocabulary and merges),
    so a family trained here shares its tokenizer; None when the zoo has no specc-tiny."""
    from specc.models.loading import ZOO_DIR

    shipped = ZOO_DIR / NAMES["target"] / "tokenizer.json"
    mine = work / "tokenizer" / "tokenizer.json"
    if not shipped.is_file() or not mine.is_file():
        return None
    return read_json(shipped)["model"] == read_json(mine)["model"]


def parse_config(args, saved: dict | None = None) -> Config:
    """The preset, or the settings a workdir's earlier stages ran with, then the overrides."""
    cfg = Config()
    for k, v in (saved if saved is not None else PRESETS[args.preset]).items():
        setattr(cfg, k, v)
    for item in args.set or []:
        key, _, value = item.partition("=")
        if not hasattr(cfg, key):
            raise SystemExit(f"unknown setting {key!r}")
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = value
        setattr(cfg, key, parsed)
    if args.seed is not None:
        cfg.seed = args.seed
    if args.source_dir:
        cfg.source_dirs = list(args.source_dir)
    return cfg


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", required=True, type=Path)
    ap.add_argument("--stage", default="all",
                    help=f"one of {', '.join(STAGES)}, 'all', 'manifest', or a comma-separated list of stages")
    ap.add_argument("--preset", default="full", choices=sorted(PRESETS))
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--source-dir", action="append", help="directories to take .py files from (repeatable)")
    ap.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a Config field (JSON value)")
    ap.add_argument("--export-dir", type=Path, help="where the export stage writes its archive parts")
    ap.add_argument("--restore-dir", type=Path, help="an export (its parts or extracted folder) for the restore stage")
    args = ap.parse_args(argv)
    if args.stage == "all":
        stages = tuple(s for s in STAGES if s not in ("restore", "export"))
    elif args.stage == "manifest":
        stages = ()
    else:
        stages = tuple(args.stage.split(","))
        bad = [s for s in stages if s not in STAGES]
        if bad:
            ap.error(f"unknown stage {bad[0]!r} (choose from {', '.join(STAGES)}, all, manifest)")
    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    saved = work / "config.json"
    # a run that starts at the corpus takes the preset; later stages reuse the workdir's settings
    cfg = parse_config(args, read_json(saved) if "corpus" not in stages and saved.is_file() else None)
    write_json(saved, dataclasses.asdict(cfg))
    commands_path = work / "commands.json"
    commands = read_json(commands_path) if commands_path.is_file() and "corpus" not in stages else []
    write_json(commands_path, commands + [" ".join(["python", "examples/train_tiny.py"] + argv)])

    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    sizes = " ".join(f"{role} {param_count(role, cfg) / 1e6:.2f}M" for role in names(cfg))
    log(f"train_tiny: {versions()}; workdir {work}; family {cfg.family}; seed {cfg.seed}; save dtype {save_dtype(cfg)}; "
        f"params {sizes}; ~{packed_zoo_bytes(cfg) / 1e6:.1f} MB in bf12")
    timings_path = work / "timings.json"
    timings = read_json(timings_path) if timings_path.is_file() else {}
    fns = {"corpus": stage_corpus, "tokenizer": stage_tokenizer, "target": stage_target, "distill": stage_distill,
           "pard": stage_pard, "dflash": stage_dflash, "eval": stage_eval,
           "restore": lambda c, w: stage_restore(c, w, args.restore_dir),
           "export": lambda c, w: stage_export(c, w, args.export_dir)}
    for name in stages:
        t0 = time.time()
        log(f"=== stage {name}")
        if name == "export" and (work / "models").is_dir():
            write_manifest(cfg, work, argv)  # the archive carries the up-to-date manifest
        fns[name](cfg, work)
        timings[name] = round(time.time() - t0, 1)
        write_json(timings_path, timings)
        log(f"=== stage {name} done in {timings[name]}s")
    if (work / "models").is_dir():
        write_manifest(cfg, work, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
