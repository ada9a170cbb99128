"""The shipped hybrid family (specc/zoo/specc-tiny-hybrid*: a Qwen3.5-style gated-DeltaNet +
attention target stored in bf12, and its DFlash drafter): loads with specc and transformers with
equal logits, pairs up as DFlash, and specc's speculative loops give the target's AR greedy
tokens. Kept to one short prompt: the family is the zoo's largest and CI is a 2-core CPU."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import assert_specc_logits_equal_hf

from specc.models.loading import ZOO_DIR, load_tokenizer, resolve_checkpoint
from specc.models.registry import load_model
from specc.pairing import resolve_pair

TARGET, DRAFTER = "specc-tiny-hybrid", "specc-tiny-hybrid-dflash"
pytestmark = pytest.mark.skipif(not all((ZOO_DIR / n / "config.json").is_file() for n in (TARGET, DRAFTER)),
                                reason="hybrid zoo models not shipped")
CODE = "import os\n\n\ndef read_lines(path):\n    with open(path) as fh:\n"
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def prompt():
    return load_tokenizer(resolve_checkpoint(TARGET))(CODE)["input_ids"]


@pytest.fixture(scope="module")
def ar_greedy(prompt):
    """The target's plain greedy continuation through HF transformers (the stock AR loop)."""
    from specc.stock.runner import run_stock

    return run_stock(resolve_pair(TARGET), prompt, NEW_TOKENS, eos_token_ids=()).tokens


def test_load_with_specc_and_hf(prompt):
    """specc's HybridLM over the unpacked bf12 weights equals transformers' Qwen3.5 forward."""
    from specc.models.hybrid import HybridLM

    target = load_model(TARGET)
    assert target.kind == "hybrid" and isinstance(target.model, HybridLM)
    drafter = load_model(DRAFTER)
    assert drafter.kind == "dflash" and drafter.model.spec.block_size == 16
    assert drafter.model.spec.mask_token_id == target.tokenizer.convert_tokens_to_ids("<|mask|>")
    assert max(drafter.model.spec.target_layer_ids) < len(target.model.config.layer_types)
    assert_specc_logits_equal_hf(TARGET, torch.tensor([prompt]))


def test_same_tokenizer_as_specc_tiny():
    """The family was trained with specc-tiny's tokenizer (the export compared them): one vocabulary."""
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (ZOO_DIR / TARGET / name).read_bytes() == (ZOO_DIR / "specc-tiny" / name).read_bytes()


def test_pairing_and_manifest():
    pair = resolve_pair(TARGET, DRAFTER)
    assert pair.method == "dflash" and pair.eos_token_ids == (0,)
    manifest = json.loads((ZOO_DIR / "MANIFEST.json").read_text())[TARGET]
    assert set(manifest["files"]) == {TARGET, DRAFTER}
    assert manifest["training"]["dflash"]["target_layer_ids"] == list(load_model(DRAFTER).model.spec.target_layer_ids)


@pytest.mark.parametrize("budget", [0, 15], ids=["chain", "tree15"])
def test_device_loop_equals_ar_greedy(prompt, ar_greedy, budget):
    """The production device loop (model definitions, DFlash block 16, chain or a tree of 15 nodes)
    commits exactly the target's AR greedy tokens, and the trained drafter gets drafts accepted."""
    from specc.runtime.device_loop import DeviceSpeculativeDecoder
    from specc.runtime.eager import build_eager

    max_len = len(prompt) + NEW_TOKENS + 2
    eager = build_eager(resolve_pair(TARGET, DRAFTER), 15, max_len)
    loop = DeviceSpeculativeDecoder(eager.target, eager.drafter, 15, max_len, tree_budget=budget)
    result = loop.generate(prompt, NEW_TOKENS, ())
    assert result.tokens == ar_greedy
    assert result.stats.tau > 1.0


def test_stock_dflash_equals_ar_greedy(prompt, ar_greedy):
    """The stock DFlash loop (HF transformers target) gives the same tokens as AR greedy."""
    from specc.stock.runner import run_stock

    result = run_stock(resolve_pair(TARGET, DRAFTER), prompt, NEW_TOKENS, 15, eos_token_ids=())
    assert result.tokens == ar_greedy
    assert result.stats.tau > 1.0
