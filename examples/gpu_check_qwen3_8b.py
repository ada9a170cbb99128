"""GPU check: specc.models Qwen3 in bf16 at Qwen3-8B shapes (random weights) vs HF eager.

Reports the max relative error of the logits over a prompt and whether greedy decoding agrees
token for token over 64 steps; at the first disagreement (if any) it prints HF's top-2 logit
margin there, so a numerical tie can be told from a bug. Writes JSON to --out.

    PYTHONPATH=. python3 examples/gpu_check_qwen3_8b.py --out $OUT/qwen3_8b_check.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def qwen3_8b_config(layers: int):
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=layers,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                       rope_theta=1000000.0, max_position_embeddings=40960, tie_word_embeddings=False)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--out", default="qwen3_8b_check.json")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()

    from transformers import Qwen3ForCausalLM

    from specc.models import CausalLM, model_config_from_hf
    from specc.models.registry import load_weights

    torch.manual_seed(0)
    dev = torch.device(args.device)
    cfg = qwen3_8b_config(args.layers)
    cfg._attn_implementation = "eager"
    t0 = time.time()
    with dev:
        hf = Qwen3ForCausalLM(cfg).to(torch.bfloat16).eval()
    raw = cfg.to_dict()
    raw["model_type"] = "qwen3"
    with torch.device("meta"):
        ours = CausalLM(model_config_from_hf(raw))
    load_weights(ours, hf.state_dict(), "hf", tied=False, assign=True)
    ours.inv_freq = ours.config.rope.inv_freq(ours.config.head_dim).to(dev)
    ours.eval()
    prompt_len = 32
    ours.setup_caches(1, prompt_len + args.steps + 8, torch.bfloat16, dev)
    print(f"built in {time.time() - t0:.1f}s; params {sum(p.numel() for p in hf.parameters()) / 1e9:.2f}B")

    ids = torch.randint(0, cfg.vocab_size, (1, prompt_len), device=dev)
    with torch.inference_mode():
        ref = hf(ids).logits.float()
        got = ours(ids, torch.arange(prompt_len, device=dev)[None], torch.zeros(1, dtype=torch.long, device=dev)).float()
        rel = ((got - ref).abs().max() / ref.abs().max()).item()
        rel_fro = ((got - ref).norm() / ref.norm()).item()
        # greedy over args.steps new tokens: HF generate vs our eager loop
        hf_tokens = hf.generate(ids, max_new_tokens=args.steps, do_sample=False, eos_token_id=None,
                                pad_token_id=0, attention_mask=torch.ones_like(ids))[0, prompt_len:].tolist()
        from specc.runtime.eager import EagerSpeculativeDecoder

        dec = EagerSpeculativeDecoder(ours, None, 0, prompt_len + args.steps)
        our_tokens = dec.generate(ids[0].tolist(), args.steps).tokens
    first_diff = next((i for i, (a, b) in enumerate(zip(hf_tokens, our_tokens)) if a != b), None)
    margin = None
    if first_diff is not None:
        with torch.inference_mode():
            seq = torch.tensor([ids[0].tolist() + hf_tokens[:first_diff]], device=dev)
            top2 = hf(seq).logits[0, -1].float().topk(2).values
            margin = (top2[0] - top2[1]).item()
    result = {
        "gpu": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "torch": torch.__version__,
        "transformers": __import__("transformers").__version__, "layers": args.layers,
        "prompt_len": prompt_len, "logits_max_rel_error": rel, "logits_rel_fro_error": rel_fro,
        "steps": args.steps, "greedy_equal": hf_tokens == our_tokens, "first_difference": first_diff,
        "hf_top2_margin_at_difference": margin,
    }
    print(json.dumps(result, indent=2))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
