"""GPU check: specc.models Qwen3 in bf16 at Qwen3-8B shapes (random weights) vs HF eager.

For each weight initialisation it reports, against HF transformers eager attention on the same
bf16 weights:
- the max relative error of the prompt logits (max |ours - hf| / max |hf|),
- free-running greedy equality over --steps tokens and the first difference with HF's top-2
  margin there,
- token forcing over HF's greedy tokens (prefill path: one forward; decode path: one token per
  step through the KV cache): mismatches, and how many are numerical ties (HF top-2 margin below
  the tolerance),
and the same figures for HF's own SDPA attention against HF eager: the implementation-noise floor
of bf16 on these weights. Two inits: "hf" (every matrix N(0, 0.02), HF's default; a 36-layer
random net is close to chaotic, margins are a few bf16 ulps) and "scaled" (residual-branch
outputs o_proj/down_proj N(0, 0.02/sqrt(2L)), GPT-2 style: a calmer net with larger margins).

    PYTHONPATH=. python3 examples/gpu_check_qwen3_8b.py --out $OUT/qwen3_8b_check.json
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch

TIE_TOL = 0.0625  # 2 bf16 ulps for |logit| in [4, 8): below it, rounding order decides argmax


def qwen3_8b_config(layers: int):
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=layers,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                       rope_theta=1000000.0, max_position_embeddings=40960, tie_word_embeddings=False)


def init_weights(hf, mode: str, layers: int) -> None:
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            elif mode == "scaled" and ("o_proj" in name or "down_proj" in name):
                p.normal_(0, 0.02 / math.sqrt(2 * layers))
            else:
                p.normal_(0, 0.02)


def set_attn(hf, impl: str) -> None:
    hf.config._attn_implementation = impl
    for layer in hf.model.layers:
        layer.self_attn.config._attn_implementation = impl


def forcing_report(pred: torch.Tensor, want: torch.Tensor, margins: torch.Tensor) -> dict:
    bad = (pred != want).nonzero().flatten().tolist()
    ties = [i for i in bad if margins[i].item() < TIE_TOL]
    return {"positions": len(want), "mismatches": len(bad), "ties": len(ties),
            "non_tie_mismatches": [[i, round(margins[i].item(), 5)] for i in bad if i not in ties]}


def check(hf, ours, dev, vocab: int, steps: int, prompt_len: int = 32) -> dict:
    from specc.runtime.eager import EagerSpeculativeDecoder

    ids = torch.randint(0, vocab, (1, prompt_len), device=dev)
    zero = torch.zeros(1, dtype=torch.long, device=dev)
    ours.setup_caches(1, prompt_len + steps + 8, torch.bfloat16, dev)
    with torch.inference_mode():
        set_attn(hf, "eager")
        ref = hf(ids).logits.float()
        got = ours(ids, torch.arange(prompt_len, device=dev)[None], zero).float()
        hf_tokens = hf.generate(ids, max_new_tokens=steps, do_sample=False, eos_token_id=None, pad_token_id=0,
                                attention_mask=torch.ones_like(ids))[0, prompt_len:].tolist()
        dec = EagerSpeculativeDecoder(ours, None, 0, prompt_len + steps)
        our_tokens = dec.generate(ids[0].tolist(), steps).tokens
        seq = torch.tensor([ids[0].tolist() + hf_tokens], device=dev)
        n = seq.shape[1]
        hf_logits = hf(seq).logits[0, prompt_len - 1:-1].float()
        top2 = hf_logits.topk(2, dim=-1).values
        margins = top2[:, 0] - top2[:, 1]
        want = torch.tensor(hf_tokens, device=dev)
        full = ours(seq, torch.arange(n, device=dev)[None], zero)[0, prompt_len - 1:-1].float()
        ours(seq[:, :prompt_len], torch.arange(prompt_len, device=dev)[None], zero)
        decode = [full[0]]
        for t in range(prompt_len, n - 1):
            pos = torch.tensor([[t]], device=dev)
            decode.append(ours(seq[:, t:t + 1], pos, torch.tensor([t], device=dev))[0, -1].float())
        decode = torch.stack(decode)
        set_attn(hf, "sdpa")
        sdpa_prompt = hf(ids).logits.float()
        sdpa_full = hf(seq).logits[0, prompt_len - 1:-1].float()
        set_attn(hf, "eager")
    first = next((i for i, (a, b) in enumerate(zip(hf_tokens, our_tokens)) if a != b), None)
    return {
        "logits_max_rel_error": ((got - ref).abs().max() / ref.abs().max()).item(),
        "hf_sdpa_logits_max_rel_error": ((sdpa_prompt - ref).abs().max() / ref.abs().max()).item(),
        "greedy_equal": hf_tokens == our_tokens,
        "first_difference": first,
        "hf_margin_at_first_difference": None if first is None else round(margins[first].item(), 5),
        "hf_margin_median": margins.median().item(),
        "forcing_ours_prefill_path": forcing_report(full.argmax(-1), want, margins),
        "forcing_ours_decode_path": forcing_report(decode.argmax(-1), want, margins),
        "forcing_hf_sdpa": forcing_report(sdpa_full.argmax(-1), want, margins),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default="qwen3_8b_check.json")
    args = ap.parse_args()

    from transformers import Qwen3ForCausalLM

    from specc.models import CausalLM, model_config_from_hf
    from specc.models.registry import load_weights

    dev = torch.device(args.device)
    cfg = qwen3_8b_config(args.layers)
    cfg._attn_implementation = "eager"
    with dev:
        hf = Qwen3ForCausalLM(cfg).to(torch.bfloat16).eval()
    raw = dict(cfg.to_dict(), model_type="qwen3")
    result = {"gpu": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "torch": torch.__version__,
              "transformers": __import__("transformers").__version__, "layers": args.layers, "steps": args.steps,
              "tie_tolerance": TIE_TOL, "params_b": sum(p.numel() for p in hf.parameters()) / 1e9}
    for mode in ("hf", "scaled"):
        torch.manual_seed(0)
        init_weights(hf, mode, args.layers)
        with torch.device("meta"):
            ours = CausalLM(model_config_from_hf(raw))
        load_weights(ours, hf.state_dict(), "hf", tied=False, assign=True)
        ours.inv_freq = ours.config.rope.inv_freq(ours.config.head_dim).to(dev)
        t0 = time.time()
        result[f"init_{mode}"] = check(hf, ours.eval(), dev, cfg.vocab_size, args.steps)
        result[f"init_{mode}"]["seconds"] = round(time.time() - t0, 1)
        print(mode, json.dumps(result[f"init_{mode}"]))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
