"""A checkpoint's ``tokenizer.json`` through the ``tokenizers`` library alone.

Why: importing transformers takes seconds (about 10 s on the H200 machines specc is measured on,
docs/benchmarks/tiny.md), and loading an artifact to generate from it needs only encode and
decode. :class:`FastTokenizer` does those itself with the same ``tokenizers`` backend
transformers' fast tokenizers wrap, and hands any other attribute (chat templates, batch
encoding, ``save_pretrained``...) to transformers' tokenizer for the same directory, loaded on
first use. ``load_tokenizer`` takes this path only for generic fast tokenizers whose config asks
nothing transformers would add at load time (:func:`eligible`); every other checkpoint gets
transformers' own tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["FastTokenizer", "eligible"]

_OWN = ("path", "backend", "config", "_hf")  # FastTokenizer's own fields; every other attribute is transformers'

# tokenizer classes that are the tokenizer.json and nothing more (transformers 4.x / 5.x names)
GENERIC_CLASSES = {"PreTrainedTokenizerFast", "TokenizersBackend"}
# config keys with which transformers changes the tokenizer.json's behaviour at load time
CHANGES_AT_LOAD = ("add_bos_token", "add_eos_token", "add_prefix_space", "clean_up_tokenization_spaces",
                   "legacy", "spaces_between_special_tokens", "do_lower_case")


def _config(path: Path) -> dict | None:
    try:
        return json.loads((path / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None


def eligible(path: Path) -> bool:
    """True when ``path`` holds a tokenizer.json whose tokenizer_config.json names a generic
    fast tokenizer class and none of the options transformers applies on top of the file."""
    cfg = _config(path)
    if cfg is None or not (path / "tokenizer.json").is_file():
        return False
    if cfg.get("tokenizer_class") not in GENERIC_CLASSES:
        return False
    return not any(cfg.get(k) for k in CHANGES_AT_LOAD)


class FastTokenizer:
    """Encode / decode like transformers' fast tokenizer of the same directory (module doc)."""

    def __init__(self, path: Path):
        from tokenizers import Tokenizer

        self.path = Path(path)
        self.backend = Tokenizer.from_file(str(self.path / "tokenizer.json"))
        self.config = _config(self.path) or {}
        self._hf = None

    # ------------------------------------------------------------------ what specc calls
    def __call__(self, text, add_special_tokens: bool = True, **kwargs):
        if kwargs or not isinstance(text, str):
            return self.hf(text, add_special_tokens=add_special_tokens, **kwargs)
        ids = self.encode(text, add_special_tokens=add_special_tokens)
        return {"input_ids": ids, "attention_mask": [1] * len(ids)}

    def encode(self, text: str, add_special_tokens: bool = True, **kwargs) -> list[int]:
        if kwargs:
            return self.hf.encode(text, add_special_tokens=add_special_tokens, **kwargs)
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = False, **kwargs) -> str:
        if kwargs:
            return self.hf.decode(ids, skip_special_tokens=skip_special_tokens, **kwargs)
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        if isinstance(ids, int):
            ids = [ids]
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def convert_tokens_to_ids(self, tokens):
        if isinstance(tokens, str):
            return self.backend.token_to_id(tokens)
        return [self.backend.token_to_id(t) for t in tokens]

    def _special(self, key: str) -> str | None:
        value = self.config.get(key)
        return value.get("content") if isinstance(value, dict) else value

    def _special_id(self, key: str) -> int | None:
        token = self._special(key)
        return self.backend.token_to_id(token) if token else None

    eos_token = property(lambda self: self._special("eos_token"))
    eos_token_id = property(lambda self: self._special_id("eos_token"))
    pad_token = property(lambda self: self._special("pad_token"))
    pad_token_id = property(lambda self: self._special_id("pad_token"))

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    # ------------------------------------------------------------------ everything else
    @property
    def hf(self):
        """transformers' tokenizer of the same directory (imported and loaded on first use)."""
        if self._hf is None:
            from transformers import AutoTokenizer

            self._hf = AutoTokenizer.from_pretrained(str(self.path))
        return self._hf

    def __getattr__(self, name):
        if name.startswith("__") or name in _OWN:
            raise AttributeError(name)
        return getattr(self.hf, name)

    def __setattr__(self, name, value):
        """Its own fields here; anything else (``chat_template``...) on transformers' tokenizer,
        which is what answers for it."""
        if name in _OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self.hf, name, value)

    def __repr__(self) -> str:
        return f"FastTokenizer({str(self.path)!r}, vocab {len(self)})"
