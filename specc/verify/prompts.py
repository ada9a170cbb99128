"""The built-in calibration prompt set used by `specc compile` / `specc verify`.

Texts when the target ships a tokenizer (code and prose, since the default family is a code
model); otherwise seeded random token ids, which exercise the same code paths.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

CALIBRATION_TEXTS = [
    "def fibonacci(n):",
    "import os\nimport sys\n\n\ndef main(argv):\n    ",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):",
    "for i in range(10):\n    if i % 2 == 0:",
    "The quick brown fox jumps over the lazy dog. Speculative decoding",
    "def parse_args():\n    parser = argparse.ArgumentParser(description=",
    "    return sorted(items, key=lambda x:",
    "# Compute the mean and variance of a list\ndef stats(values):",
]


def calibration_prompts(tokenizer, vocab_size: int, count: int = 4, random_len: int = 12, seed: int = 0) -> list[list[int]]:
    if tokenizer is not None:
        out = []
        for text in CALIBRATION_TEXTS[:count]:
            ids = tokenizer(text, add_special_tokens=True)["input_ids"]
            if ids:
                out.append([int(i) for i in ids])
        if out:
            return out
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (random_len,), generator=gen).tolist() for _ in range(count)]


def load_prompts_file(path, tokenizer, vocab_size: int) -> list[list[int]]:
    """A prompts file: JSON list of strings or of token-id lists, or one text prompt per line."""
    from specc.errors import UserError

    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise UserError(f"{p}: cannot read prompts file ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise UserError(f"{p}: prompts file is not UTF-8 text ({exc.reason})") from exc
    try:
        items = json.loads(text)
        if not isinstance(items, list):
            raise UserError(f"{p}: a JSON prompts file must hold a list")
    except json.JSONDecodeError:
        items = [line for line in text.splitlines() if line.strip()]
    prompts = []
    for item in items:
        if isinstance(item, list):
            if not all(isinstance(i, int) and not isinstance(i, bool) for i in item):
                raise UserError(f"{p}: prompt {len(prompts)} is a list but not of integer token ids")
            ids = list(item)
        elif not isinstance(item, str):
            raise UserError(f"{p}: prompt {len(prompts)} is neither text nor a list of token ids")
        elif tokenizer is None:
            raise UserError(f"{p}: text prompts need a tokenizer; the target ships none (give token-id lists)")
        else:
            ids = tokenizer(item, add_special_tokens=True)["input_ids"]
        if not ids or any(not 0 <= i < vocab_size for i in ids):
            raise UserError(f"{p}: prompt {len(prompts)} is empty or has ids outside 0..{vocab_size - 1}")
        prompts.append(ids)
    if not prompts:
        raise UserError(f"{p}: no prompts")
    return prompts
