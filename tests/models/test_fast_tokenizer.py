"""FastTokenizer (tokenizer.json through the `tokenizers` library alone) encodes and decodes
exactly as transformers' tokenizer of the same directory, without importing transformers; other
attributes reach transformers' tokenizer; checkpoints it does not cover get transformers' own."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from specc.models.fast_tokenizer import FastTokenizer, eligible
from specc.models.loading import ZOO_DIR, load_tokenizer, resolve_checkpoint

TEXTS = ["def load_config(path):", "import os\nimport sys\n\n\ndef main(argv):\n    ",
         "  tabs\tand   spaces  ", "unicode: café, naïve, 你好, emoji 🙂", "<|endoftext|>x<|mask|>y", ""]

pytestmark = pytest.mark.skipif(not (ZOO_DIR / "specc-tiny" / "config.json").is_file(), reason="zoo not shipped")


@pytest.fixture(scope="module")
def both():
    from transformers import AutoTokenizer

    path = resolve_checkpoint("specc-tiny")
    return FastTokenizer(path), AutoTokenizer.from_pretrained(str(path))


def test_encode_decode_equal_transformers(both):
    fast, hf = both
    for text in TEXTS:
        for special in (True, False):
            assert fast(text, add_special_tokens=special)["input_ids"] == hf(text, add_special_tokens=special)["input_ids"]
            assert fast.encode(text, add_special_tokens=special) == hf.encode(text, add_special_tokens=special)
        ids = hf(text)["input_ids"] + [hf.eos_token_id, hf.convert_tokens_to_ids("<|mask|>")]
        for skip in (True, False):
            assert fast.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
    assert (fast.eos_token, fast.eos_token_id, fast.pad_token_id) == (hf.eos_token, hf.eos_token_id, hf.pad_token_id)
    assert fast.convert_tokens_to_ids("<|mask|>") == hf.convert_tokens_to_ids("<|mask|>") == 1
    assert len(fast) == len(hf)


def test_other_attributes_reach_transformers(both, tmp_path):
    fast, hf = both
    assert fast.get_vocab() == hf.get_vocab()  # not defined by FastTokenizer: transformers' answers
    assert fast(["a b", "c"])["input_ids"] == hf(["a b", "c"])["input_ids"]  # batches go to transformers too
    fast.save_pretrained(tmp_path)
    assert (tmp_path / "tokenizer.json").is_file()
    fast.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"  # set on transformers'
    assert fast.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "<user>hi"
    assert fast.hf.chat_template == fast.chat_template


def test_zoo_loads_fast_without_importing_transformers():
    code = ("import sys; from specc.models.loading import load_tokenizer, resolve_checkpoint; "
            "t = load_tokenizer(resolve_checkpoint('specc-tiny')); ids = t('def f(x):')['input_ids']; t.decode(ids); "
            "print(type(t).__name__, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["FastTokenizer", "False"]


def test_only_generic_tokenizers_take_the_fast_path(tmp_path):
    src = resolve_checkpoint("specc-tiny")
    assert eligible(src) and isinstance(load_tokenizer(src), FastTokenizer)
    for change in ({"tokenizer_class": "Qwen2Tokenizer"}, {"add_bos_token": True},
                   {"clean_up_tokenization_spaces": True}):
        d = tmp_path / next(iter(change))
        d.mkdir()
        shutil.copy(src / "tokenizer.json", d / "tokenizer.json")
        cfg = json.loads((src / "tokenizer_config.json").read_text())
        cfg.update(change)
        (d / "tokenizer_config.json").write_text(json.dumps(cfg))
        assert not eligible(d), change
    no_json = tmp_path / "no-json"
    no_json.mkdir()
    shutil.copy(src / "tokenizer_config.json", no_json / "tokenizer_config.json")
    assert not eligible(no_json)
