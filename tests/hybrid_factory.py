"""Tiny random hybrid (Qwen3.5 / Qwen3-Next) HF checkpoints for tests, saved with save_pretrained."""

from __future__ import annotations

import torch

from specc.runtime.drafters import Drafter

VOCAB = 96


def hybrid_config(kind: str = "qwen3_5", **overrides):
    """A 4-layer config (3 GDN layers, then gated attention), 2 q/k heads serving 4 v heads."""
    from transformers import Qwen3_5TextConfig, Qwen3NextConfig

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
                  linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
                  linear_conv_kernel_dim=4, max_position_embeddings=512, eos_token_id=VOCAB - 1, bos_token_id=1)
    common.update(overrides)
    if kind == "qwen3_next":
        common.setdefault("num_experts", 0)
        return Qwen3NextConfig(**common)
    return Qwen3_5TextConfig(**common)


def make_hybrid(kind: str = "qwen3_5", seed: int = 0, scale: float = 0.08, **overrides):
    """An HF hybrid model with weights large enough for decisive, varied greedy outputs; norm
    weights randomised too (so a missing zero-centred offset would show)."""
    from transformers import Qwen3_5ForCausalLM, Qwen3NextForCausalLM

    torch.manual_seed(seed)
    cls = Qwen3NextForCausalLM if kind == "qwen3_next" else Qwen3_5ForCausalLM
    model = cls(hybrid_config(kind, **overrides)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed" in name:
                p.normal_(0, 1.0)
            elif p.dim() >= 2:
                p.normal_(0, scale if "conv1d" not in name else 0.3)
            elif "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def load_hybrid(tmp_path_factory, kind: str = "qwen3_5", seed: int = 0, name: str = "hybrid", **overrides):
    """(HF model, saved path, specc HybridLM loaded from it)."""
    from model_factory import save

    from specc.models import load_model

    hf = make_hybrid(kind, seed, **overrides)
    path = save(hf, tmp_path_factory, name)
    return hf, path, load_model(path).model


class ScriptedDrafter(Drafter):
    """A drafter that knows the reference continuation and makes scripted mistakes, so a test
    chooses each step's acceptance: ``plan[i]`` = (drafts, wrong_at) for step i (cycled):
    ``drafts`` proposed (fewer than the loop's k allowed in the eager loop: 0 = a zero-draft
    step), the one at index ``wrong_at`` replaced by another token (>= drafts: all right).
    Tree mode: the per-position logits put the proposed token first and, where it is wrong, the
    right one second, so the accepted path leaves the top-1 chain."""

    name = "scripted"
    supports_tree = True

    def __init__(self, reference, plan: list[tuple[int, int]], vocab: int = VOCAB):
        """``reference``: prompt + continuation, or one such list per batch row."""
        rows = reference if reference and isinstance(reference[0], list) else [reference]
        self.references, self.plan, self.vocab = [list(r) for r in rows], list(plan), vocab
        self.step = 0
        self.device = torch.device("cpu")

    def _next(self, n: int, k: int, row: int = 0) -> tuple[list[int], list[int]]:
        count, wrong_at = self.plan[self.step % len(self.plan)]
        self.step += 1
        ref = self.references[row % len(self.references)]
        right = [ref[n + j] if n + j < len(ref) else 0 for j in range(k)]
        drafts = list(right)
        if wrong_at < k:
            drafts[wrong_at] = (drafts[wrong_at] + 1) % self.vocab
        return drafts[:min(count, k)], right

    def propose(self, seq, k):
        self.forwards += 1
        return self._next(len(seq), k)[0]

    def propose_rows(self, seq, n, k, active=None):
        self.forwards += 1
        rows = [self._next(nb, k, b) for b, nb in enumerate(n)]
        return torch.tensor([d + r[len(d):] for d, r in rows], dtype=torch.long)

    def propose_logits_rows(self, seq, n, k, active=None):
        self.forwards += 1
        logits = torch.zeros(len(n), k, self.vocab)
        for b, nb in enumerate(n):
            drafts, right = self._next(nb, k, b)
            drafts = drafts + right[len(drafts):]
            for j in range(k):
                logits[b, j, right[j]] = 4.0
                logits[b, j, drafts[j]] = 5.0
        return logits


def bigram_drafter(target, layers: int = 1, scale: float = 0.01, seed: int = 5):
    """A Qwen3 attention drafter that shares the hybrid target's embedding, final norm and LM
    head, with near-zero layers: it predicts roughly what the target's embedding-to-head path
    does, so it agrees with the target on some tokens (partial acceptance)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = target.config
    torch.manual_seed(seed)
    draft = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=layers, num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim, max_position_embeddings=512, eos_token_id=cfg.eos_token_id, bos_token_id=1,
        tie_word_embeddings=False)).eval()
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if "layers" in name and p.dim() == 2:
                p.normal_(0, scale)
        draft.model.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
        draft.lm_head.weight.copy_(target.lm_head.weight)
        draft.model.norm.weight.copy_(1.0 + target.model.norm.weight)
    return draft


def constant(model, strength: float):
    """A shared component in every token embedding: the target's argmax depends less on the input."""
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        emb += strength * torch.randn(1, emb.shape[1], generator=torch.Generator().manual_seed(9))
    return model


def random_hybrid_lm(std: float = 0.15, seed: int = 0):
    """specc's own HybridLM from ``hybrid_config()`` with N(0, std) weights (no HF model, no
    checkpoint): for IR and codegen tests that need large enough activations to be telling."""
    from specc.models.hybrid import HybridLM
    from specc.models.hybrid_config import hybrid_config_from_hf

    torch.manual_seed(seed)
    model = HybridLM(hybrid_config_from_hf(hybrid_config().to_dict())).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, std)
    return model
