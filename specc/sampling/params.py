"""What a request asks of sampling: ``SamplingParams``, validated once where it is built."""

from __future__ import annotations

import dataclasses

__all__ = ["SamplingParams"]


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. ``temperature`` 0 / None: greedy (every other field is ignored);
    ``top_k`` 0: off; ``top_p`` 1: off; ``min_p`` 0: off; ``repetition_penalty`` 1: off (the
    CTRL rule: a seen token's logit is divided by it when positive, multiplied when negative,
    over the prompt and everything generated); ``seed``: the request's random stream
    (``specc.sampling.rng``): the same seed gives the same tokens, alone or in any batch."""

    temperature: float | None = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int = 0

    def __post_init__(self):
        t = self.temperature
        if t is not None and not (isinstance(t, (int, float)) and t >= 0 and t == t and t != float("inf")):
            raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got {t!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0: off), got {self.top_k!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1] (1: off), got {self.top_p!r}")
        if not (isinstance(self.min_p, (int, float)) and 0 <= self.min_p <= 1):
            raise ValueError(f"min_p must be in [0, 1] (0: off), got {self.min_p!r}")
        r = self.repetition_penalty
        if not (isinstance(r, (int, float)) and 0 < r < float("inf")):
            raise ValueError(f"repetition_penalty must be a positive number (1: off), got {r!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed < 2 ** 63:
            raise ValueError(f"seed must be an integer in [0, 2**63), got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return not self.temperature

    @property
    def uses_history(self) -> bool:
        """Whether the distribution depends on the tokens seen so far (repetition penalty)."""
        return self.repetition_penalty != 1.0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def coerce(cls, sampling=None, **fields) -> "SamplingParams | None":
        """``sampling`` (a SamplingParams or None) with keyword overrides (``temperature=``,
        ``top_p=``, ...; None values ignored); None when the result is greedy."""
        given = {k: v for k, v in fields.items() if v is not None}
        if sampling is not None and not isinstance(sampling, SamplingParams):
            raise TypeError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
        params = dataclasses.replace(sampling, **given) if sampling is not None else cls(**given)
        return None if params.greedy else params
