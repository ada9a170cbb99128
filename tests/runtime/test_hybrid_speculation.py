"""Speculative decoding on a hybrid (GDN + attention) target keeps the recurrent state exact.

A scripted drafter (``hybrid_factory.ScriptedDrafter``) knows the target's greedy continuation
and makes planned mistakes, so each step's acceptance is chosen: full, partial, zero, a step
with no drafts right after an accepting one (the stale-state bug of vLLM #39273 / #52942), and,
in tree mode, paths that leave the top-1 chain (the accepted path is not a block prefix). After
each run the live recurrent state and conv window of every GDN layer must equal those of plain
AR decoding of the same tokens, and the tokens must equal plain AR greedy."""

import pytest
import torch
from hybrid_factory import ScriptedDrafter, load_hybrid

from specc.runtime.device_loop import DeviceSpeculativeDecoder
from specc.runtime.eager import EagerSpeculativeDecoder

PROMPT = [5, 17, 33, 2, 61, 40, 8, 71, 12]
NEW = 24
# (drafts, index of the wrong one): full, partial, zero, no drafts after full, full, partial
PLAN = [(4, 9), (4, 1), (4, 0), (4, 9), (0, 9), (4, 9), (3, 2), (4, 3)]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    _, _, model = load_hybrid(tmp_path_factory, seed=0, name="hy-spec")
    return model


@pytest.fixture(scope="module")
def reference(target):
    """Plain AR greedy tokens, and the GDN states after AR-decoding prompt + tokens[:-1]."""
    tokens = EagerSpeculativeDecoder(target, None, 0, 64).generate(PROMPT, NEW).tokens
    return tokens, _ar_states(target, PROMPT + tokens[:-1])


@torch.no_grad()
def _ar_states(model, ids):
    """Prefill the prompt, then one token per forward: the states plain decoding reaches."""
    model.setup_caches(1, 64)
    model(torch.tensor([PROMPT]), torch.arange(len(PROMPT))[None], torch.tensor([0]))
    for pos in range(len(PROMPT), len(ids)):
        model(torch.tensor([[ids[pos]]]), torch.tensor([[pos]]), torch.tensor([pos]))
    return _live(model)


def _live(model, row=0):
    return {name: buf[row, 0].clone() for name, buf in model.named_buffers()
            if name.endswith(("recurrent_state", "conv_state"))}


def _assert_states(model, want, row=0):
    got = _live(model, row)
    assert set(got) == set(want) and got
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6, msg=name)


def _drafter(reference, plan):
    tokens, _ = reference
    return ScriptedDrafter(PROMPT + tokens, plan)


@pytest.mark.parametrize("tree", [0, 6])
def test_eager_tokens_and_state_equal_plain_decoding(target, reference, tree):
    tokens, states = reference
    plan = PLAN if not tree else [p for p in PLAN if p[0]]  # a tree step always drafts
    result = EagerSpeculativeDecoder(target, _drafter(reference, plan), 4, 64, tree_budget=tree).generate(PROMPT, NEW)
    assert result.tokens == tokens
    lengths = result.stats.accepted_lengths
    assert 5 in lengths and 1 in lengths and any(1 < n < 5 for n in lengths), lengths
    _assert_states(target, states)


def test_zero_draft_step_after_accepting_step(target, reference):
    """A step with no drafts right after an accepting one (fully, then partially) must continue
    from the committed state (the snapshot of the last accepted token), not a stale one."""
    tokens, states = reference
    plan = [(4, 9), (0, 9), (4, 2), (0, 9)]
    result = EagerSpeculativeDecoder(target, _drafter(reference, plan), 4, 64).generate(PROMPT, NEW)
    assert result.tokens == tokens
    assert result.stats.accepted_lengths[:4] == [5, 1, 3, 1]
    _assert_states(target, states)


@pytest.mark.parametrize("tree", [0, 6])
def test_device_loop_tokens_and_state_equal_plain_decoding(target, reference, tree):
    tokens, states = reference
    loop = DeviceSpeculativeDecoder(target, _drafter(reference, [p for p in PLAN if p[0]]), 4, 64, tree_budget=tree)
    result = loop.generate(PROMPT, NEW)
    assert result.tokens == tokens
    assert loop.state.buffers  # the loop's DecodingState holds the GDN buffers the model reads
    _assert_states(target, states)


def test_device_loop_batch_rows_keep_their_own_state(target, reference):
    """Two rows with different acceptance per step (their drafters' plans are interleaved)."""
    tokens, states = reference
    loop = DeviceSpeculativeDecoder(target, _drafter(reference, [(4, 9), (4, 0), (4, 1), (4, 9), (4, 2), (4, 9)]), 4, 64)
    results = loop.generate_batch([PROMPT, PROMPT], NEW)
    assert [r.tokens for r in results] == [tokens, tokens]
    assert results[0].stats.accepted_lengths != results[1].stats.accepted_lengths
    _assert_states(target, states, row=0)
    _assert_states(target, states, row=1)


@pytest.mark.parametrize("tree", [0, 6])
def test_eos_inside_an_accepted_path(target, reference, tree):
    """Generation stops at an EOS committed inside a fully accepted block, like plain AR."""
    tokens, _ = reference
    first = {t: i for i, t in reversed(list(enumerate(tokens)))}
    eos = next(t for t in tokens[2:4] if first[t] in (2, 3))  # inside the first step's block of 5
    want = EagerSpeculativeDecoder(target, None, 0, 64).generate(PROMPT, NEW, (eos,)).tokens
    assert want == tokens[:first[eos] + 1]
    for loop_cls in (EagerSpeculativeDecoder, DeviceSpeculativeDecoder):
        loop = loop_cls(target, _drafter(reference, [(4, 9)]), 4, 64, tree_budget=tree)
        result = loop.generate(PROMPT, NEW, (eos,))
        assert result.tokens == want
        assert result.stats.accepted_lengths[0] == len(want) - 1  # clipped inside the first block


@pytest.mark.parametrize("tree", [0, 6])
def test_token_forcing_reproduces_greedy_tokens(target, reference, tree):
    """forced_argmax (verify-sized blocks; tree mode: each block one branch of a tree with
    distractor siblings, committed along that branch) gives back the greedy tokens."""
    tokens, _ = reference
    for loop_cls in (EagerSpeculativeDecoder, DeviceSpeculativeDecoder):
        loop = loop_cls(target, _drafter(reference, [(4, 9)]), 4, 64, tree_budget=tree)
        assert loop.forced_argmax(PROMPT, tokens) == tokens


def test_a_finished_row_keeps_its_state_while_the_batch_goes_on(target):
    """Rows with different prompts, every block accepted in full; EOS is the last token of one of
    row 0's blocks, so row 0 finishes early. Its later steps commit nothing (accepted 0: the
    state before each step is restored), so at the end its GDN state is the one plain decoding
    reaches at its EOS, while row 1 runs on to its budget."""
    prompts = [PROMPT, PROMPT[::-1]]
    plain = [EagerSpeculativeDecoder(target, None, 0, 64).generate(p, NEW).tokens for p in prompts]
    ends = [j for j in (5, 10, 15) if plain[0][j] not in plain[0][:j] and plain[0][j] not in plain[1]]
    assert ends, plain
    cut = ends[0] + 1
    eos = plain[0][cut - 1]
    want_states = [_ar_states_of(target, prompts[0], plain[0][:cut - 1]), _ar_states_of(target, prompts[1], plain[1][:-1])]
    drafter = ScriptedDrafter([prompts[b] + plain[b] for b in range(2)], [(4, 9)])
    results = DeviceSpeculativeDecoder(target, drafter, 4, 64).generate_batch(prompts, NEW, (eos,))
    assert [r.tokens for r in results] == [plain[0][:cut], plain[1]]
    assert len(results[1].stats.accepted_lengths) > len(results[0].stats.accepted_lengths)
    for row in range(2):
        _assert_states(target, want_states[row], row=row)


@torch.no_grad()
def _ar_states_of(model, prompt, tokens):
    model.setup_caches(1, 64)
    model(torch.tensor([prompt]), torch.arange(len(prompt))[None], torch.tensor([0]))
    for j, tok in enumerate(tokens):
        pos = len(prompt) + j
        model(torch.tensor([[tok]]), torch.tensor([[pos]]), torch.tensor([pos]))
    return _live(model)


@pytest.mark.parametrize("loop_cls", [EagerSpeculativeDecoder, DeviceSpeculativeDecoder])
def test_tree_mode_zero_draft_step_after_an_accepted_path(target, reference, loop_cls):
    """Tree steps accept whole paths (the last one off the top-1 chain), then the budget leaves
    room for one token: a zero-draft chain step, which must read the committed path's state."""
    tokens, _ = reference
    new = 21  # 1 (prefill) + tree steps of 5, 5, 5 and 4 tokens (the last off the chain), then 1 left
    want = tokens[:new]
    loop = loop_cls(target, _drafter(reference, [(4, 9), (4, 9), (4, 9), (4, 1)]), 4, 64, tree_budget=6)
    result = loop.generate(PROMPT, new)
    assert result.tokens == want
    lengths = result.stats.accepted_lengths
    assert lengths == [5, 5, 5, 4, 1] and len(result.stats.tree_nodes) == 4, lengths
    _assert_states(target, _ar_states(target, PROMPT + want[:-1]))
