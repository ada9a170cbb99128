"""The speculative decoding loop over uncompiled specc.models step functions.

This is the loop the compiled engine reproduces with generated kernels; here it runs the model
definitions eagerly, which makes it the bridge in the lossless proof: stock (HF) == this loop ==
compiled. Greedy, or speculative sampling through the same decoding policy as the production
loop (``specc.runtime.policy``); batch 1 on host lists; acceptance by the same ``ChainVerifier`` (tree mode:
``TreeVerifier``) as the production loop (``specc.runtime.device_loop``), which is a separate implementation of the same
surface (``specc.runtime.loop.SpeculativeLoop``), not a subclass of this one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from specc.result import GenerationResult, GenerationStats, as_prompt_list, clip_committed
from specc.runtime.drafters import Drafter
from specc.runtime.loop import SpeculativeLoop
from specc.runtime.policy import decoding_policy
from specc.runtime.state import DecodingState, get_attr, reserve_block, state_specs_of
from specc.runtime.trees import build_tree
from specc.runtime.verifiers import TreeVerifier

if TYPE_CHECKING:  # pragma: no cover - annotations only: the runtime runs generated steps
    from specc.models.decoder import CausalLM


class EagerSpeculativeDecoder(SpeculativeLoop):
    def __init__(self, target: CausalLM, drafter: Drafter | None = None, num_draft: int = 4,
                 max_len: int = 2048, cap_to_budget: bool = True, tree_budget: int = 0,
                 tree_topk: int | None = None):
        """``tree_budget`` N > 0: tree mode (a draft tree of N drafted nodes per step from the
        drafter's per-position distributions; drafters without them keep chains)."""
        self.cap_to_budget = cap_to_budget
        self.target, self.drafter, self.num_draft, self.max_len = target, drafter, num_draft, max_len
        self.tree_budget = int(tree_budget) if drafter is not None and drafter.supports_tree else 0
        self.tree_topk = tree_topk  # candidate tokens per position (None: the budget)
        if drafter is not None and drafter.needs_target_hidden:
            target.capture_layers = tuple(drafter.spec.target_layer_ids)
        self.resize(max_len)

    def resize(self, max_len: int) -> None:
        """(Re)allocate the static caches for sequences of up to ``max_len`` tokens."""
        self.max_len = max_len
        block = max(self.num_draft, self.tree_budget) + 1
        reserve_block(self.target, block)
        self.target.setup_caches(1, max_len + block)
        # state kinds committed by selection (hybrid targets' recurrent and conv states); the
        # K/V caches are committed plainly here (lengths from the host lists, tree paths copied)
        self.snapshots = DecodingState.adopt(self.target, 1, max_len + block, kinds=("recurrent", "conv"))
        if self.drafter is not None:
            self.drafter.setup(max_len + self.num_draft + 1)

    def _target(self, ids: list[int], start: int):
        dev = self.target.device
        out = self.target(torch.tensor([ids], device=dev), torch.arange(start, start + len(ids), device=dev)[None],
                          torch.tensor([start], device=dev))
        return out if isinstance(out, tuple) else (out, None)

    @torch.inference_mode()
    def forced_argmax(self, prompt: list[int], tokens: list[int]) -> list[int]:
        """Target argmax at each position of ``tokens`` when fed them (token forcing): prefill
        on the prompt, then verify-sized blocks through the KV cache."""
        prompt, tokens = as_prompt_list(prompt), list(tokens)
        logits, _ = self._target(prompt, 0)
        out = [int(logits[0, -1].argmax())]
        block = self.num_draft + 1
        pos = len(prompt)
        for start in range(0, len(tokens) - 1, block):
            chunk = tokens[start:start + block][: len(tokens) - 1 - start]
            logits, _ = self._target(chunk, pos)
            out += logits[0].argmax(-1).tolist()
            pos += len(chunk)
        return out[: len(tokens)]

    def _loop(self, input_ids, max_new_tokens: int, eos_token_ids=(), sampling=None):
        prompt = as_prompt_list(input_ids)
        if len(prompt) + max_new_tokens > self.max_len:
            raise ValueError(f"prompt ({len(prompt)}) + max_new_tokens ({max_new_tokens}) exceeds max_len {self.max_len}")
        stats = GenerationStats()
        logits, context = self._target(prompt, 0)
        stats.target_forwards += 1
        dev = logits.device
        policy = decoding_policy(sampling, 1, torch.tensor([prompt], device=dev), logits.shape[-1])
        first = policy.first(logits[:, -1], torch.tensor([len(prompt)], device=dev))
        tokens, stop = clip_committed([int(first[0])], 0, max_new_tokens, eos_token_ids)
        yield from tokens
        if self.drafter is not None:
            self.drafter.forwards = 0
            self.drafter.reset(prompt, context)
        while not stop:
            seq = prompt + tokens
            k = 0
            if self.drafter is not None:
                k = min(self.num_draft, max_new_tokens - len(tokens) - 1) if self.cap_to_budget else self.num_draft
            if self.tree_budget and k > 0:
                step, stop, nodes = self._tree_step(seq, k, tokens, max_new_tokens, eos_token_ids, policy)
                stats.target_forwards += 1
                tokens += step
                stats.accepted_lengths.append(len(step))
                stats.tree_nodes.append(nodes)
                yield from step
                continue
            lengths = torch.tensor([len(seq) - 1], device=dev)  # the last committed token's position
            drafts, q = policy.draft_list(self.drafter, seq, k, lengths) if k > 0 else ([], None)
            logits, context = self._target([seq[-1]] + drafts, len(seq) - 1)
            stats.target_forwards += 1
            accepted, committed = policy.verify_chain(self.verifier, torch.tensor([drafts], dtype=torch.long, device=dev),
                                                      q, logits, None, lengths)
            policy.observe(committed, accepted)
            a, posterior = int(accepted[0]), committed[0].tolist()
            self.snapshots.commit(accepted + 1)
            if self.drafter is not None:
                self.drafter.accepted(len(seq), a, k, context)
            step, stop = clip_committed(drafts[:a] + [posterior[a]], len(tokens), max_new_tokens, eos_token_ids)
            tokens += step
            stats.accepted_lengths.append(len(step))
            yield from step
        stats.draft_forwards = self.drafter.forwards if self.drafter is not None else 0
        return GenerationResult.finish(tokens, stats, self.method, eos_token_ids)


    def _tree_step(self, seq: list[int], k: int, tokens: list[int], max_new_tokens: int, eos_token_ids, policy):
        """One tree step, plainly: draft tree from the drafter's k distributions, one target
        forward over its nodes with the ancestor mask, greedy path acceptance, then the accepted
        path's K/V copied to consecutive cache slots (and DFlash's context taken along it)."""
        dev = self.target.device
        base = len(seq) - 1  # the root (last committed token) goes to this cache slot
        start = torch.tensor([base], device=dev)
        logprobs = policy.tree_logprobs(self.drafter.propose_logits(seq, k), start)
        tree = build_tree(logprobs, torch.tensor([seq[-1]], device=dev), self.tree_budget, self.tree_topk)
        out = self.target(tree.tokens, tree.positions(start), start, tree.ancestor_mask())
        logits, hidden = out if isinstance(out, tuple) else (out, None)
        res = policy.verify_tree(TreeVerifier(), tree, logits, None, None, start)
        policy.observe(res.committed, res.accepted)
        a = int(res.accepted[0])
        path = res.path[0, : a + 1].tolist()
        for spec in state_specs_of(self.target):  # path slots ascend and path[p] >= p: copy in order
            if spec.kind != "kv":
                continue
            cache = get_attr(self.target, spec.name)
            for p, node in enumerate(path):
                if node != p:
                    cache[0, :, base + p] = cache[0, :, base + node]
        self.snapshots.commit(res.accepted + 1, res.path)  # GDN states: the path's last node
        if self.drafter is not None:
            context = hidden[:, path] if hidden is not None else None
            self.drafter.accepted(len(seq), a, k, context)
        committed = res.committed[0, : a + 1].tolist()  # the path's tokens after the root, then the bonus
        assert committed[:a] == tree.tokens[0, path[1:]].tolist()
        step, stop = clip_committed(committed, len(tokens), max_new_tokens, eos_token_ids)
        return step, stop, tree.num_nodes


def build_eager(pair, num_draft: int | None = None, max_len: int = 2048, dtype=torch.float32,
                device="cpu", tree_budget: int = 0) -> EagerSpeculativeDecoder:
    """An eager specc.models decoder for a resolved ``specc.pairing.Pair``: the pair's method
    (``pair.impl``, a ``specc.methods.Method``) loads the definitions and picks the drafter."""
    impl = pair.impl
    loaded = impl.load(pair, dtype, device)
    drafter: Drafter | None = impl.drafter_for(loaded.draft, pair) if loaded.draft is not None else None
    k = impl.num_draft(num_draft, pair.drafter.raw if pair.drafter is not None else None)
    return EagerSpeculativeDecoder(loaded.target, drafter, k, max_len, tree_budget=tree_budget)


def build_device_loop(pair, num_draft: int | None = None, max_len: int = 2048, dtype=torch.float32, device="cpu",
                      tree_budget: int = 0):
    """The production loop (``specc.runtime.device_loop``: batches, continuous batching) over the
    same uncompiled definitions ``build_eager`` loads."""
    from specc.runtime.device_loop import DeviceSpeculativeDecoder

    eager = build_eager(pair, num_draft, max_len, dtype, device)
    return DeviceSpeculativeDecoder(eager.target, eager.drafter, eager.num_draft, max_len, tree_budget=tree_budget)
