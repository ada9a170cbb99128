"""`specc bench`'s "= HF eager" column: a row whose tokens leave HF eager's only at numerical ties
is "tie" (positions listed), any other difference is False with the differences listed."""

from __future__ import annotations

import io

import torch
from helpers import greedy_by_prefix

from specc.bench.equality import classify_differences
from specc.bench.shapes import build_causal, target_config
from specc.verify import PrefixLogits

PROMPT = [5, 17, 33, 2]



@torch.inference_mode()
def test_ties_and_real_differences_are_told_apart():
    model = build_causal(target_config("tiny-qwen3"), torch.float32, torch.device("cpu"), seed=1)
    reference = [greedy_by_prefix(model, PROMPT, 4)]
    logits = PrefixLogits.logits(model, PROMPT, reference[0], 2)
    winner, runner_up = (int(i) for i in logits.topk(2).indices)
    flipped = [reference[0][:2] + [runner_up, 0]]
    rows = [{"system": "specc-ar"}, {"system": "specc-dflash"}, {"system": "hf-eager"}]
    # fp32: tolerance 1e-3, and this random model's top-2 margin at token 2 is far above it
    classify_differences(rows, {"specc-ar": flipped}, reference, [PROMPT], model, torch.float32)
    ar = rows[0]
    assert ar["same_tokens_as_hf_eager"] is False and ar["numerical_ties"] == []
    (diff,) = ar["token_differences"]
    assert (diff["request"], diff["position"], diff["expected"], diff["got"]) == (0, 2, winner, runner_up)
    assert "same_tokens_as_hf_eager" not in rows[1]  # rows not listed as differing are left alone
    # the same difference where the two tokens' logits are equal: a numerical tie
    model.lm_head.weight[runner_up] = model.lm_head.weight[winner]
    rows = [{"system": "specc-ar"}]
    classify_differences(rows, {"specc-ar": flipped}, reference, [PROMPT], model, torch.float32)
    assert rows[0]["same_tokens_as_hf_eager"] == "tie" and "token_differences" not in rows[0]
    assert rows[0]["numerical_ties"][0]["position"] == 2 and rows[0]["numerical_ties"][0]["margin"] == 0.0
    assert rows[0]["tie_tolerance"] == 1e-3


def test_report_prints_ties_and_differences():
    from rich.console import Console

    from specc.bench import report as report_mod

    rows = [{"system": "specc-ar", "tokens_per_s": 10.0, "same_tokens_as_hf_eager": "tie", "tie_tolerance": 0.25,
             "numerical_ties": [{"request": 1, "position": 40, "margin": 0.0625}]},
            {"system": "specc-dflash", "tokens_per_s": 20.0, "same_tokens_as_hf_eager": False,
             "numerical_ties": [], "token_differences": [{"request": 0, "position": 3, "margin": 2.0}]}]
    rep = {"what": "x", "device": "cpu", "dtype": "bfloat16", "tokens": 8, "prompts": 2, "deployment": "cpu",
           "acceptance": {"mode": "none"}, "rows": rows}
    buf = io.StringIO()
    report_mod.print_table(rep, console=Console(file=buf, width=200))
    text = buf.getvalue()
    assert "prompt 1 token 40 (margin 0.0625)" in text and "margin < 0.25" in text
    assert "specc-dflash differs from HF eager beyond a numerical tie" in text


@torch.inference_mode()
def test_hf_system_generates_every_token_past_the_models_eos():
    """transformers fills an unset eos_token_id from the model's generation config: HF eager must
    not stop at the model's EOS where specc's systems (no EOS in the bench) run on."""
    from model_factory import make_hf_model

    from specc.bench.systems import HFSystem

    model = make_hf_model("qwen3", seed=0).eval()
    prompt = [5, 17, 33, 2]
    first = int(model(torch.tensor([prompt])).logits[0, -1].argmax())
    model.generation_config.eos_token_id = first  # the model's EOS is its first greedy token
    tokens, _ = HFSystem(model, "cpu").generate(prompt, 6)
    assert len(tokens) == 6 and tokens[0] == first
