"""The chain verifier: batched, ragged accept counts, per-row caps, k = 0."""

import torch

from specc.runtime.verifiers import ChainVerifier, VERIFIERS


def _logits(tokens, vocab=16):
    """Logits whose argmax is ``tokens`` [B, Q]."""
    out = torch.zeros(*tokens.shape, vocab)
    out.scatter_(-1, tokens[..., None], 1.0)
    return out


def test_batched_ragged_accept_counts():
    drafts = torch.tensor([[4, 5, 6, 7], [1, 2, 3, 4], [9, 9, 9, 9]])
    target = torch.tensor([[4, 5, 9, 7, 1], [1, 2, 3, 4, 8], [2, 9, 9, 9, 9]])
    accepted, committed = ChainVerifier().verify(drafts, _logits(target))
    assert accepted.tolist() == [2, 4, 0]
    assert committed[0, :3].tolist() == [4, 5, 9]
    assert committed[1].tolist() == [1, 2, 3, 4, 8]
    assert committed[2, :1].tolist() == [2]


def test_per_row_caps():
    drafts = torch.tensor([[1, 2, 3], [1, 2, 3]])
    target = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4]])
    accepted, committed = ChainVerifier().verify(drafts, _logits(target), torch.tensor([1, 0]))
    assert accepted.tolist() == [1, 0] and committed[0, 1].item() == 2 and committed[1, 0].item() == 1


def test_no_drafts():
    accepted, committed = ChainVerifier().verify(torch.zeros(2, 0, dtype=torch.long), _logits(torch.tensor([[3], [5]])))
    assert accepted.tolist() == [0, 0] and committed.tolist() == [[3], [5]]
    assert VERIFIERS["chain"] is ChainVerifier
