"""TreeVerifier: accepted path, committed tokens (path tokens then the bonus) and per-row caps."""

import torch

from specc.runtime.trees import DraftTree
from specc.runtime.verifiers import VERIFIERS, TreeVerifier


def _tree():
    # root 0 -> {1: tok 10, 2: tok 11}; 1 -> 3: tok 12; 3 -> 4: tok 13
    parents = torch.tensor([[-1, 0, 0, 1, 3]])
    return DraftTree(tokens=torch.tensor([[7, 10, 11, 12, 13]]), parents=parents,
                     depths=torch.tensor([[0, 1, 1, 2, 3]]), scores=torch.zeros(1, 5))


def test_tree_verifier_accepts_longest_path_and_bonus():
    tree = _tree()
    argmax = torch.tensor([[10, 12, 99, 13, 42]])  # root->10 ok, 10->12 ok, 12->13 ok, bonus 42
    res = TreeVerifier().verify_tree_tokens(tree, argmax)
    assert res.accepted.tolist() == [3]
    assert res.path.tolist() == [[0, 1, 3, 4]]
    assert res.committed.tolist() == [[10, 12, 13, 42]]
    capped = TreeVerifier().verify_tree_tokens(tree, argmax, torch.tensor([1]), depth=3)
    assert capped.accepted.tolist() == [1] and capped.path.tolist() == [[0, 1, -1, -1]]
    assert capped.committed[0, :2].tolist() == [10, 12]
    miss = TreeVerifier().verify_tree_tokens(tree, torch.tensor([[11, 0, 5, 0, 0]]))
    assert miss.accepted.tolist() == [1] and miss.committed[0, :2].tolist() == [11, 5]
    assert VERIFIERS["tree"] is TreeVerifier
