"""Test helpers shared across test modules (import as ``from helpers import ...``)."""

from __future__ import annotations

from typing import NamedTuple

import torch
from transformers import AutoModelForCausalLM

PROMPT = [5, 17, 33, 2, 8, 9, 41]


def hf_model(path):
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def assert_specc_logits_equal_hf(name, ids: torch.Tensor, tol: float = 2e-4) -> None:
    """A checkpoint (zoo name or directory) loaded by specc and by transformers (fp32) gives the
    same prefill logits over ``ids`` [1, T]."""
    from specc.models.loading import resolve_checkpoint
    from specc.models.registry import load_model

    theirs_model = hf_model(resolve_checkpoint(name))
    ours_model = load_model(name).model
    ours_model.setup_caches(1, ids.shape[1])
    with torch.no_grad():
        ours = ours_model(ids, torch.arange(ids.shape[1])[None], torch.tensor([0]))
        theirs = theirs_model(input_ids=ids).logits
    torch.testing.assert_close(ours, theirs, atol=tol, rtol=tol)


def hf_greedy(model, prompt, max_new_tokens, eos=None) -> list[int]:
    """HF transformers' own greedy generate: the ground truth."""
    out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=eos, pad_token_id=0, attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    return out[0, len(prompt):].tolist()


def ancestor_mask(parents: list[int]) -> torch.Tensor:
    """[N, N] bool: node i sees itself and its ancestors (``parents[root] == -1``), walked one
    parent at a time: the reference the tree masks of kernels and steps are checked against."""
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    return mask


def eos_inside_block(tokens: list[int], block: int) -> int | None:
    """A token whose first occurrence in ``tokens`` falls strictly inside a committed block of
    ``block`` tokens (blocks start after the prefill token), i.e. not on a block's last slot."""
    for j in range(1, len(tokens)):
        if tokens[j] not in tokens[:j] and j % block != 0:
            return tokens[j]
    return None


def run_ir(ir, inputs):
    """Run a step IR from empty caches (so before/after a pass see the same state)."""
    with torch.no_grad():
        ir.reset_caches()
        return ir(*inputs)


class TensorSig(NamedTuple):
    """A tensor argument in a recorded call signature (equal to the plain ``(shape, dtype)``)."""

    shape: tuple
    dtype: torch.dtype


class SignatureSpy:
    """Stands in for a loop's step (a drafter's model, the target's tree step, ...): records the
    signature of every call, ``TensorSig(shape, dtype)`` for a tensor argument and the value of any
    other, and passes calls and attribute reads on to the step. A CUDA graph of a step
    (``runtime.graphs.GraphedStep``) is keyed on its calls' signatures, so these tell whether every
    call could replay a capture. Put the step back (``spy.step``) when done."""

    def __init__(self, step):
        self.step, self.signatures = step, []

    def __getattr__(self, name):
        return getattr(self.__dict__["step"], name)

    def __call__(self, *args):
        self.signatures.append(tuple(TensorSig(tuple(a.shape), a.dtype) if torch.is_tensor(a) else a for a in args))
        return self.step(*args)

    @property
    def shapes(self) -> list[tuple]:
        """Per call, the shapes of its tensor arguments alone."""
        return [tuple(a.shape for a in sig if isinstance(a, TensorSig)) for sig in self.signatures]


def greedy_by_prefix(model, prompt, n):
    """n greedy tokens of a model definition, each from one forward over the whole prefix
    (``PrefixLogits.logits``): the slow, obviously right reference of the equality tests."""
    from specc.verify import PrefixLogits

    out = []
    for _ in range(n):
        out.append(int(PrefixLogits.logits(model, prompt, out + [0], len(out)).argmax()))
    return out
