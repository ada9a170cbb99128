"""`specc generate` / `specc models`: JSON shape, equality with HF generate, one-line errors."""

import json
import shutil

import pytest
from helpers import PROMPT, hf_greedy, hf_model

from specc.cli import main

IDS = ",".join(map(str, PROMPT))


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("drafter_key,method", [(None, None), ("ar_same", None), ("pard_same", "pard"),
                                                ("pard_same", "ar-draft"), ("dflash", None)])
@pytest.mark.parametrize("engine", ["stock", "eager"])
def test_generate_json_equals_hf_generate(checkpoints, capsys, drafter_key, method, engine):
    argv = ["generate", checkpoints["target"], "--input-ids", IDS, "--max-new-tokens", "12", "--json",
            "--engine", engine]
    if drafter_key:
        argv += ["--drafter", checkpoints[drafter_key]]
    if method:
        argv += ["--method", method]
    code, out, _ = _run(capsys, *argv)
    assert code == 0
    payload = json.loads(out)
    eos = hf_model(checkpoints["target"]).config.eos_token_id
    assert payload["tokens"] == hf_greedy(hf_model(checkpoints["target"]), PROMPT, 12, eos)
    assert set(payload["stats"]) >= {"accepted_lengths", "steps"}
    assert payload["stats"]["steps"] == len(payload["stats"]["accepted_lengths"])


def test_prompt_text_uses_tokenizer(checkpoints, tmp_path, capsys):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    target = tmp_path / "with-tok"
    shutil.copytree(checkpoints["target"], target)
    vocab = {chr(ord("a") + i): i for i in range(26)} | {"[UNK]": 26}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(target)
    code, out, _ = _run(capsys, "generate", str(target), "--prompt", "hello", "--max-new-tokens", "5", "--json")
    assert code == 0
    payload = json.loads(out)
    assert payload["tokens"] == hf_greedy(hf_model(target), [7, 4, 11, 11, 14], 5, hf_model(target).config.eos_token_id)
    assert "text" in payload


@pytest.mark.parametrize("case,fragment", [
    ("missing", "no such checkpoint"),
    ("vocab", "vocabulary mismatch"),
    ("method", "does not fit"),
    ("dflash-target", "not a target"),
    ("no-drafter", "needs a --drafter"),
    ("bad-ids", "comma-separated integers"),
    ("oov", "outside the vocabulary"),
    ("no-tokenizer", "ships no tokenizer"),
    ("unknown-arch", "unsupported model_type"),
    ("bad-json", "unreadable"),
])
def test_bad_input_is_one_line_exit_2(checkpoints, tmp_path, capsys, case, fragment):
    t = checkpoints["target"]
    argv = {
        "missing": ["generate", str(tmp_path / "nope"), "--input-ids", IDS],
        "vocab": lambda: ["generate", t, "--drafter", _other_vocab(checkpoints, tmp_path), "--input-ids", IDS],
        "method": ["generate", t, "--drafter", checkpoints["ar_same"], "--method", "pard", "--input-ids", IDS],
        "dflash-target": ["generate", checkpoints["dflash"], "--input-ids", IDS],
        "no-drafter": ["generate", t, "--method", "dflash", "--input-ids", IDS],
        "bad-ids": ["generate", t, "--input-ids", "1,x"],
        "oov": ["generate", t, "--input-ids", "1,100000"],
        "no-tokenizer": ["generate", t, "--prompt", "hi"],
        "unknown-arch": lambda: ["generate", _write_config(tmp_path, {"model_type": "gpt2"}), "--input-ids", IDS],
        "bad-json": lambda: ["generate", _write_config(tmp_path, "{not json"), "--input-ids", IDS],
    }[case]
    argv = argv() if callable(argv) else argv
    code, out, err = _run(capsys, *argv)
    assert code == 2
    assert fragment in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("specc: error: ")


def _other_vocab(checkpoints, tmp_path):
    dst = tmp_path / "other-vocab"
    shutil.copytree(checkpoints["ar_same"], dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["vocab_size"] += 1
    (dst / "config.json").write_text(json.dumps(cfg))
    return str(dst)


def _write_config(tmp_path, content):
    d = tmp_path / "cfg"
    d.mkdir()
    (d / "config.json").write_text(content if isinstance(content, str) else json.dumps(content))
    return str(d)


def test_models_and_help(capsys):
    code, out, _ = _run(capsys, "models", "--json")
    assert code == 0 and set(json.loads(out)["architectures"]) == {"llama", "qwen3", "qwen3_5", "qwen3_next", "pard", "dflash"}
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    assert "generate" in capsys.readouterr().out


@pytest.mark.parametrize("argv,expect", [
    (["ir", "specc-tiny", "--q", "0"], "specc: error: ir: unrecognized arguments: --q 0 (see `specc ir --help`)"),
    (["passes", "--bogus"], "specc: error: passes: unrecognized arguments: --bogus (see `specc passes --help`)"),
    (["--bogus"], "specc: error: unrecognized arguments: --bogus (see `specc --help`)"),
])
def test_an_unknown_argument_points_at_its_commands_help(capsys, argv, expect):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and capsys.readouterr().err.strip() == expect
