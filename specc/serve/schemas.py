"""OpenAI request shapes (field names as in the OpenAI API) and the error envelope.

Fields are typed strictly (``"max_tokens": "16"`` is an error, not 16) and unknown fields are
refused, so a request never silently means something other than what it says (the app drops
fields sent as null first: null asks for the default). Fields the server accepts but cannot
honour (several choices, log-probabilities, presence / frequency penalties) are checked by
``unsupported()`` with a message saying why. Sampling (``temperature`` > 0 with ``top_p``, ``seed``
and the extensions ``top_k``, ``min_p``, ``repetition_penalty``, as in vLLM) becomes a
``SamplingParams`` (``sampling_params()``); an absent temperature means greedy.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

_STRICT = ConfigDict(extra="forbid", strict=True)


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool = False


class _Sampling(BaseModel):
    """What completions and chat completions share."""

    model_config = _STRICT
    model: str | None = None  # None: the served model
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = Field(None, description="up to 4 stop strings")
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = Field(None, ge=0, lt=2 ** 63)
    top_k: int | None = Field(None, ge=0)  # extensions (as in vLLM): top_k, min_p, repetition_penalty
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0)
    n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    return_token_ids: bool = False  # extension (as in vLLM): choices[i].token_ids

    @field_validator("stop")
    @classmethod
    def _at_most_four(cls, v):
        if isinstance(v, list) and len(v) > 4:
            raise ValueError(f"at most 4 stop strings (got {len(v)})")
        return v

    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    def sampling_params(self):
        """(``SamplingParams`` or None for greedy, the field a ValueError is about). Without a
        ``seed`` a sampling request gets a random one (the response is then not reproducible)."""
        import secrets

        from specc.sampling import SamplingParams

        if not self.temperature:
            return None
        seed = self.seed if self.seed is not None else secrets.randbits(63)
        return SamplingParams(temperature=self.temperature, top_p=1.0 if self.top_p is None else self.top_p,
                              top_k=self.top_k or 0, min_p=self.min_p or 0.0,
                              repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
                              seed=seed)


class CompletionRequest(_Sampling):
    """POST /v1/completions. ``prompt``: a string, a list of token ids, or a list holding one of
    those (one prompt per request)."""

    prompt: Any
    max_tokens: int = Field(16, ge=1)  # OpenAI's default
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v):
        if isinstance(v, list) and len(v) == 1 and isinstance(v[0], (str, list)):
            v = v[0]
        if isinstance(v, str):
            return v
        if isinstance(v, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in v):
            return v
        if isinstance(v, list) and v and all(isinstance(p, (str, list)) for p in v):
            raise ValueError(f"one prompt per request (got {len(v)})")
        raise ValueError("must be a string or a list of token ids")


class TextPart(BaseModel):
    model_config = _STRICT
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = _STRICT
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions (needs a tokenizer with a chat template)."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None


def unsupported(req: _Sampling) -> tuple[str, str] | None:
    """(message, field) for a request asking for what this server cannot give, else None."""
    if req.n not in (None, 1):
        return f"n must be 1 (got {req.n}): one choice per request", "n"
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(req, name):
            return f"{name} is not supported (repetition_penalty is)", name
    if req.logit_bias:
        return "logit_bias is not supported", "logit_bias"
    logprobs = getattr(req, "logprobs", None)
    if (logprobs is not None and logprobs is not False) or getattr(req, "top_logprobs", None) is not None:
        return "logprobs are not supported", "logprobs"
    if getattr(req, "best_of", None) not in (None, 1):
        return "best_of must be 1", "best_of"
    if getattr(req, "suffix", None):
        return "suffix is not supported", "suffix"
    return None


def error_body(message: str, type_: str = "invalid_request_error", code: str | None = None,
               param: str | None = None) -> dict:
    """The OpenAI error envelope: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": " ".join(str(message).split()), "type": type_, "param": param, "code": code}}
