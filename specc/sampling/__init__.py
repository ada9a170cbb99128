"""Sampling shared by every loop: request parameters, logits processors, counter-based RNG.

A leaf package (torch only): the stock sampling reference (``specc.stock.sampling``) and the
runtime's speculative sampling (``specc.runtime.sampling_verify``, ``specc.runtime.policy``) must
compute the same distributions from the same random numbers, and stock sits below the runtime.
See docs/sampling.md.
"""

from specc.sampling.params import SamplingParams
from specc.sampling.processors import process_logits, sampling_probs

__all__ = ["SamplingParams", "process_logits", "sampling_probs"]
