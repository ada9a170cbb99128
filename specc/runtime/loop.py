"""The surface every speculative decoding loop offers, and what it is built from.

A loop holds a target step, an optional ``Drafter`` (``specc.runtime.drafters``) and a
``Verifier`` (``specc.runtime.verifiers``), and offers ``generate`` / ``stream`` /
``forced_argmax`` returning a ``GenerationResult``. Two implementations:

- ``specc.runtime.device_loop.DeviceSpeculativeDecoder``: the production loop (the engine's):
  batch-shaped device state, one small host copy per step.
- ``specc.runtime.eager.EagerSpeculativeDecoder``: the reference loop, batch 1 on host lists,
  obviously right; tests use it as the bridge stock == eager == compiled.

Neither derives from the other; both derive from :class:`SpeculativeLoop`.
"""

from __future__ import annotations

from specc.result import GenerationResult
from specc.runtime.verifiers import ChainVerifier, Verifier


class SpeculativeLoop:
    """``generate`` / ``stream`` over a generator ``_loop(input_ids, max_new_tokens, eos)`` that
    yields committed tokens and returns the ``GenerationResult``."""

    verifier: Verifier = ChainVerifier()
    drafter = None

    @property
    def method(self) -> str:
        """The drafting strategy's registered name ("ar" without a drafter)."""
        return self.drafter.name if self.drafter is not None else "ar"

    def generate(self, input_ids, max_new_tokens: int, eos_token_ids=(), sampling=None) -> GenerationResult:
        """``sampling``: a ``specc.sampling.SamplingParams`` (None or temperature 0: greedy)."""
        return run_to_end(self.stream(input_ids, max_new_tokens, eos_token_ids, sampling))

    def stream(self, input_ids, max_new_tokens: int, eos_token_ids=(), sampling=None):
        """Yield each committed token as soon as its verification step finishes."""
        import torch

        with torch.inference_mode():
            return (yield from self._loop(input_ids, max_new_tokens, eos_token_ids, sampling))

    def _loop(self, input_ids, max_new_tokens: int, eos_token_ids=(), sampling=None):
        raise NotImplementedError

    def forced_argmax(self, prompt, tokens) -> list[int]:
        raise NotImplementedError


def run_to_end(gen):
    """Exhaust a generator that yields tokens as it goes and return its return value (the
    GenerationResult a loop's ``stream`` ends with)."""
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            return stop.value
