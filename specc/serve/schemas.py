"""OpenAI request shapes (field names as in the OpenAI API) and the error envelope.

Fields are typed strictly (``"max_tokens": "16"`` is an error, not 16) and unknown fields are
refused, so a request never silently means something other than what it says (the app drops
fields sent as null first: null asks for the default). Fields the server accepts but cannot
honour (sampling, several choices, log-probabilities, penalties) are checked by
``unsupported()`` with a message saying why.
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
    seed: int | None = None
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
    """(message, field) for a request asking for what greedy decoding cannot give, else None."""
    if req.temperature:
        return ("temperature > 0 (sampling) is not supported: this server decodes greedily; "
                "send temperature 0 or leave it out"), "temperature"
    if req.n not in (None, 1):
        return f"n must be 1 (got {req.n}): greedy decoding gives one choice", "n"
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(req, name):
            return f"{name} is not supported (greedy decoding without penalties)", name
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
