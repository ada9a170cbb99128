"""Hybrid (Qwen3.5-style) targets with AR, PARD and DFlash attention drafters: the stock loops
(HF models; a partially accepted step restores the cache copied before the verify forward and
replays the accepted tokens) and specc's eager loops (chain and tree) give HF's own greedy output.

Drafters share the target's embedding and LM head (``bigram_drafter``) so acceptance is partial
(some full blocks, some rejections); the DFlash pair uses a target with a shared embedding
component (``constant``), where its random drafter is accepted on some steps."""

import functools

import pytest
import torch
from helpers import hf_greedy
from hybrid_factory import bigram_drafter, constant, make_hybrid
from model_factory import make_dflash_checkpoint, save

from specc.pairing import resolve_pair
from specc.runtime.device_loop import DeviceSpeculativeDecoder
from specc.runtime.eager import build_eager
from specc.stock import DFlashReference, generate_ar, generate_chain, generate_dflash, generate_pard
from specc.stock.runner import load_hf_causal_lm

PROMPT = [5, 17, 33, 2, 61, 40, 8, 71, 12]
NEW = 20


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    target = make_hybrid("qwen3_5", 0)
    const = constant(make_hybrid("qwen3_5", 0), 2.0)
    draft = bigram_drafter(target)
    return {
        "target": save(target, tmp_path_factory, "hy-target"),
        "ar-draft": save(draft, tmp_path_factory, "hy-ar"),
        "pard": save(draft, tmp_path_factory, "hy-pard", {"pard_token": 3}),
        "const": save(const, tmp_path_factory, "hy-const"),
        "dflash": make_dflash_checkpoint(const, tmp_path_factory, "hy-dflash", seed=3, layer_ids=(0, 3), block_size=5,
                                     scale=0.01),
    }


@functools.lru_cache(maxsize=None)
def _hf(path):
    return load_hf_causal_lm(path)


def _stock(method, paths, eos=()):
    if method == "dflash":
        ref = DFlashReference.from_pretrained(paths["dflash"])
        return generate_dflash(_hf(paths["const"]), ref, PROMPT, NEW, 5, eos)
    target = _hf(paths["target"])
    if method == "pard":
        return generate_pard(target, _hf(paths["pard"]), 3, PROMPT, NEW, 4, eos)
    return generate_chain(target, _hf(paths["ar-draft"]), PROMPT, NEW, 4, eos)


TARGET = {"ar-draft": "target", "pard": "target", "dflash": "const"}


def _mixed(lengths, block):
    """The run saw steps that accepted drafts and steps that rejected some (so the rollback
    of a partially accepted block ran; full blocks are the scripted tests' business)."""
    return any(n > 1 for n in lengths) and any(n < block for n in lengths[:-1])


@pytest.mark.parametrize("method", ["ar-draft", "pard", "dflash"])
def test_stock_equals_hf_greedy(paths, method):
    target = _hf(paths[TARGET[method]])
    want = hf_greedy(target, PROMPT, NEW)
    assert generate_ar(target, PROMPT, NEW).tokens == want
    got = _stock(method, paths)
    assert got.tokens == want
    assert _mixed(got.stats.accepted_lengths, 5), got.stats.accepted_lengths


@pytest.mark.parametrize("method, tree", [("ar-draft", 0), ("pard", 0), ("pard", 6), ("dflash", 0), ("dflash", 6)])
def test_eager_equals_stock(paths, method, tree):
    stock = _stock(method, paths)
    pair = resolve_pair(paths[TARGET[method]], paths[method], method)
    decoder = build_eager(pair, 4, max_len=len(PROMPT) + NEW, tree_budget=tree)
    got = decoder.generate(PROMPT, NEW)
    assert got.tokens == stock.tokens
    if not tree:  # same drafter, same verification: the same steps
        assert got.stats.accepted_lengths == stock.stats.accepted_lengths


def _device_tokens(paths, method, eos=()):
    """The production loop over the model definitions, chain and tree (budget 6)."""
    pair = resolve_pair(paths[TARGET[method]], paths[method], method)
    loaded = pair.impl.load(pair, torch.float32, "cpu")
    out = []
    for tree in (0, 6):
        drafter = pair.impl.drafter_for(loaded.draft, pair)
        loop = DeviceSpeculativeDecoder(loaded.target, drafter, 4, len(PROMPT) + NEW, tree_budget=tree)
        out.append(loop.generate(PROMPT, NEW, eos).tokens)
    return out


def test_device_loop_equals_stock_dflash(paths):
    want = _stock("dflash", paths).tokens
    assert _device_tokens(paths, "dflash") == [want, want]


@pytest.mark.parametrize("method", ["ar-draft", "pard"])
def test_device_loop_equals_stock_with_eos_inside_a_block(paths, method):
    """An EOS that the stock run commits inside a multi-token step (not its last token)."""
    stock = _stock(method, paths)
    index, eos = 1, None
    for n in stock.stats.accepted_lengths:
        if n >= 2 and stock.tokens[index] not in stock.tokens[:index]:
            eos = stock.tokens[index]
            break
        index += n
    assert eos is not None, stock.stats.accepted_lengths
    want = _stock(method, paths, eos=(eos,))
    assert want.tokens[-1] == eos and len(want.tokens) < NEW
    assert _device_tokens(paths, method, (eos,)) == [want.tokens, want.tokens]


class _IgnoresCacheForBlocks:
    """An HF hybrid model as older transformers' qwen3_next modeling behaved: a multi-token input
    runs from a fresh cache (the recurrent state and conv window are ignored)."""

    def __init__(self, model):
        self.model, self.config, self.device = model, model.config, model.device

    def __call__(self, input_ids, past_key_values=None, **kwargs):
        if input_ids.shape[1] > 1 and past_key_values is not None and past_key_values.get_seq_length() > 0:
            from transformers import DynamicCache

            past_key_values = DynamicCache(config=self.config)
        return self.model(input_ids=input_ids, past_key_values=past_key_values, **kwargs)


def test_stock_refuses_a_modeling_that_ignores_the_cache_for_blocks(paths):
    from specc.errors import UserError
    from specc.stock import hf as stock_hf

    model = make_hybrid("qwen3_5", 0)
    stock_hf.check_cached_blocks(model)  # the real modeling passes
    with pytest.raises(UserError, match="ignores the cache for multi-token inputs"):
        generate_chain(_IgnoresCacheForBlocks(make_hybrid("qwen3_5", 0)), _hf(paths["ar-draft"]), PROMPT, NEW, 4)
