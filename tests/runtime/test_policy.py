"""The sampling policy's on-device work at Qwen3's vocabulary stays vectorised: no scan walks a
whole vocabulary row, top-k alone sorts nothing, and no step syncs with the host.

Why these and not timings: a CUDA cumsum along a 151936-token row walks it sequentially (about
a verify forward's time each), a full sort per top-k row is the work of a top-k many times
over, and a host sync stalls the loop; each shows up in the ops the policy calls, which
torch.profiler records on the CPU as on the GPU (names and input shapes)."""

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from specc.runtime.policy import SamplingPolicy
from specc.runtime.trees import build_tree
from specc.runtime.verifiers import ChainVerifier, TreeVerifier
from specc.sampling import SamplingParams

V, K, BUDGET, ROWS = 151936, 3, 4, 2
PARAMS = {
    "t1": SamplingParams(temperature=1.0),
    "top-k": SamplingParams(temperature=0.7, top_k=50),
    "top-p": SamplingParams(temperature=0.7, top_p=0.9, top_k=50),
    "rep": SamplingParams(temperature=1.0, repetition_penalty=1.1),
    "mixed": [None, SamplingParams(temperature=1.0, repetition_penalty=1.1, top_p=0.8, min_p=0.05)],
}


class _Parallel:
    """A parallel drafter whose forward is done: per-position logits."""

    supports_tree = True

    def __init__(self, logits):
        self.logits = logits

    def propose_logits_rows(self, seq, n, k):
        return self.logits[:, :k]

    def propose_sampled_rows(self, seq, n, k, pick):
        picked = [pick(self.logits[:, j], j) for j in range(k)]
        return torch.stack([t for t, _ in picked], 1), torch.stack([q for _, q in picked], 1)


def _step_ops(params):
    """(name, input shapes) of every op one chain step and one tree step call."""
    g = torch.Generator().manual_seed(0)
    draft = torch.randn(ROWS, K, V, generator=g) * 3
    target = torch.randn(ROWS, K + 1, V, generator=g) * 3
    tree_target = torch.randn(ROWS, BUDGET + 1, V, generator=g) * 3
    lengths = torch.full((ROWS,), 20)
    seq = torch.zeros(ROWS, 40, dtype=torch.long)
    policy = SamplingPolicy(params, torch.arange(ROWS), torch.randint(0, V, (ROWS, 20), generator=g), V)
    drafter = _Parallel(draft)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        drafts, q = policy.draft(drafter, seq, [21] * ROWS, K, lengths)
        chain = policy.verify_chain(ChainVerifier(), drafts, q, target, None, lengths)
        tree = build_tree(policy.tree_logprobs(draft, lengths), seq[:, 0], BUDGET)
        tree.ancestor_mask(K)
        res = policy.verify_tree(TreeVerifier(), tree, tree_target, None, K, lengths)
    assert chain[0].shape == (ROWS,) and res.accepted.shape == (ROWS,)
    return [(e.name, e.input_shapes) for e in prof.events()]


@pytest.mark.parametrize("mode", list(PARAMS))
def test_sampling_steps_stay_vectorised(mode):
    ops = _step_ops(PARAMS[mode])
    names = {name for name, _ in ops}
    scans = [shapes[0][-1] for name, shapes in ops if name == "aten::cumsum" and shapes and shapes[0]]
    assert scans, "the step draws tokens: some cumulative sum runs"  # the check below is not vacuous
    # chunks of 128 and the 1187 chunk totals (151936 = 128 * 1187), never a whole row
    assert max(scans) <= 2048, f"a cumsum scans a row of {max(scans)}"
    sorts = [shapes[0][-1] for name, shapes in ops if name == "aten::sort" and shapes and shapes[0]]
    if "top-p" not in mode and mode != "mixed":  # top-p needs HF's full sort; nothing else does
        assert not any(n >= V for n in sorts), f"a full-vocabulary sort without top-p: {sorts}"
    assert "aten::_local_scalar_dense" not in names, "a host sync (.item()) inside a sampling step"
    vocab_wide = [name for name, shapes in ops if name in ("aten::one_hot", "aten::bmm", "aten::mm")
                  and any(s and s[-1] >= V for s in shapes)]
    assert not vocab_wide, f"the seen sets are one scatter, not one-hot sums over the vocabulary: {vocab_wide}"
