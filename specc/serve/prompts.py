"""From an accepted request to checked token ids: the prompt (text, ids or chat messages) is
tokenized and checked against the model (vocabulary, tokenizer, chat template, length) before
anything reaches the backend, so a bad request costs no engine time and gets a 4xx."""

from __future__ import annotations

from specc.result import check_vocab
from specc.serve.backend import ModelInfo


class RequestError(Exception):
    """A request the server refuses: HTTP ``status`` with the OpenAI error envelope."""

    def __init__(self, message: str, status: int = 400, code: str | None = None, param: str | None = None,
                 type_: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.status, self.code, self.param, self.type = message, status, code, param, type_


def check_model(requested: str | None, info: ModelInfo) -> None:
    if requested is not None and requested != info.name:
        raise RequestError(f"the model {requested!r} does not exist; this server serves {info.name!r}", 404,
                           "model_not_found", "model")


def completion_prompt_ids(prompt, info: ModelInfo) -> list[int]:
    """Token ids of a completions ``prompt`` (a string, or a list of token ids)."""
    if isinstance(prompt, str):
        if info.tokenizer is None:
            raise RequestError("this model ships no tokenizer: send the prompt as a list of token ids",
                               param="prompt")
        ids = info.tokenizer(prompt, add_special_tokens=True)["input_ids"]
    else:
        ids = list(prompt)
        try:
            check_vocab(ids, info.vocab_size)
        except ValueError as exc:
            raise RequestError(str(exc), param="prompt") from None
    if not ids:
        raise RequestError("the prompt is empty", param="prompt")
    return ids


def chat_prompt_ids(messages, info: ModelInfo) -> list[int]:
    """Token ids of chat ``messages`` through the tokenizer's chat template (with the
    assistant's generation prompt)."""
    tok = info.tokenizer
    if tok is None or not getattr(tok, "chat_template", None):
        raise RequestError("this model's tokenizer has no chat template: use /v1/completions",
                           code="chat_template_missing", param="messages")
    convo = [{"role": m.role, "content": m.text(), **({"name": m.name} if m.name else {})} for m in messages]
    try:
        text = tok.apply_chat_template(convo, tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # the template refuses the conversation (roles out of order, ...)
        raise RequestError(f"the chat template refused the messages: {' '.join(str(exc).split())}",
                           param="messages") from None
    ids = tok(text, add_special_tokens=False)["input_ids"]  # the template wrote any BOS itself
    if not ids:
        raise RequestError("the messages render to an empty prompt", param="messages")
    return ids


def check_length(prompt_len: int, max_tokens: int, info: ModelInfo, param: str = "max_tokens") -> None:
    """The prompt plus the tokens asked for must fit the server's ``--max-len``."""
    if prompt_len + max_tokens > info.max_len:
        raise RequestError(f"this server's maximum length is {info.max_len} tokens; the request has {prompt_len} "
                           f"prompt tokens + {max_tokens} to generate = {prompt_len + max_tokens}",
                           code="context_length_exceeded", param=param if prompt_len < info.max_len else "prompt")
