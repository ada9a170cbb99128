"""Bad inputs of every kind (issue 14, finding 4): configs, weights, deployment and calibration
files, search memories, manifests, prompt files and CLI arguments.

Whatever the input, the CLI exits 0, 1 (a failed check) or 2 (bad input); on 2 it prints exactly
one ``specc: error:`` line and never a traceback or an "internal error"; the Python API raises
only ``specc.errors.UserError`` subclasses. Hypothesis drives each property with a modest number
of examples (CI has two cores); the deterministic tests below pin each category once.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specc.cli import main
from specc.errors import UserError

FUZZ = settings(max_examples=30, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
IDS = "5,17,33,2"


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:  # argparse usage errors
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def assert_clean(code, err: str, argv=()) -> None:
    assert code in (0, 1, 2), (code, argv, err[-2000:])
    assert "Traceback" not in err, (argv, err[-3000:])
    if code == 2:
        lines = [line for line in err.splitlines() if line.startswith("specc: error:")]
        assert len(lines) == 1, (argv, err[-2000:])
        assert "internal error" not in lines[0], (argv, lines[0])


# ---------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    from model_factory import make_dflash_checkpoint, make_hf_model, save

    target = make_hf_model("qwen3", seed=0)
    return {"target": Path(save(target, tmp_path_factory, "fuzz-target")),
            "dflash": Path(make_dflash_checkpoint(target, tmp_path_factory, "fuzz-dflash", seed=3))}


@pytest.fixture(scope="module")
def artifact(ckpts, tmp_path_factory):
    from specc.compiler import compile_artifact

    out = tmp_path_factory.mktemp("fuzz-art") / "a.specc"
    compile_artifact(str(ckpts["target"]), out=out, passes="", max_new_tokens=3)
    return out


@contextlib.contextmanager
def scratch():
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


JSONISH = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**63) | st.floats(allow_nan=True)
                       | st.text(max_size=8),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                       max_leaves=6)
NUMBERS = st.sampled_from([0, -1, 1, 2, 3, 7, 10**9, 2**40, -(2**31), 1.5, 64.0, float("nan"), float("inf"),
                           "64", None, True, [], {}])


def _dumps(value) -> str:
    return json.dumps(value, allow_nan=True)


# ---------------------------------------------------------------------------------- configs

CONFIG_FIELDS = ["hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                 "vocab_size", "num_hidden_layers", "max_position_embeddings", "rms_norm_eps", "rope_theta",
                 "rope_scaling", "eos_token_id", "bos_token_id", "tie_word_embeddings", "model_type", "hidden_act",
                 "torch_dtype", "pard_token", "architectures", "attention_bias"]


@FUZZ
@given(edits=st.dictionaries(st.sampled_from(CONFIG_FIELDS), NUMBERS | JSONISH, min_size=1, max_size=3),
       engine=st.sampled_from(["eager", "stock"]))
def test_fuzz_config_fields(ckpts, edits, engine):
    with scratch() as d:
        ck = d / "ck"
        shutil.copytree(ckpts["target"], ck)
        cfg = json.loads((ck / "config.json").read_text())
        cfg.update(edits)
        (ck / "config.json").write_text(_dumps(cfg))
        argv = ("generate", ck, "--input-ids", IDS, "--max-new-tokens", "2", "--engine", engine)
        code, _, err = run_cli(*argv)
        assert_clean(code, err, (argv, edits))


DFLASH_FIELDS = ["block_size", "mask_token_id", "target_layer_ids", "num_target_layers"]


@FUZZ
@given(edits=st.dictionaries(st.sampled_from(DFLASH_FIELDS), NUMBERS | JSONISH, min_size=1, max_size=2),
       num_draft=st.sampled_from([None, 1, 3, 15, 16, 100]))
def test_fuzz_dflash_config_and_num_draft(ckpts, edits, num_draft):
    with scratch() as d:
        dr = d / "dr"
        shutil.copytree(ckpts["dflash"], dr)
        cfg = json.loads((dr / "config.json").read_text())
        cfg.setdefault("dflash_config", {}).update(edits)
        (dr / "config.json").write_text(_dumps(cfg))
        argv = ["generate", ckpts["target"], "--drafter", dr, "--input-ids", IDS, "--max-new-tokens", "3",
                "--engine", "eager"] + (["--num-draft", num_draft] if num_draft is not None else [])
        code, _, err = run_cli(*argv)
        assert_clean(code, err, argv)


# ---------------------------------------------------------------------------------- weights


@FUZZ
@given(mode=st.sampled_from(["truncate", "header-bytes", "garbage", "empty", "rename", "reshape", "nan", "dtype",
                             "delete", "index"]),
       where=st.floats(0, 1), seed=st.integers(0, 2**16))
def test_fuzz_weights(ckpts, mode, where, seed):
    import torch
    from safetensors.torch import load_file, save_file

    with scratch() as d:
        ck = d / "ck"
        shutil.copytree(ckpts["target"], ck)
        wf = ck / "model.safetensors"
        data = wf.read_bytes()
        header_len = struct.unpack("<Q", data[:8])[0]
        if mode == "truncate":
            wf.write_bytes(data[:int(where * len(data))])
        elif mode == "header-bytes":
            pos = 8 + int(where * (header_len - 1))
            wf.write_bytes(data[:pos] + bytes([(data[pos] + 1 + seed % 250) % 256]) + data[pos + 1:])
        elif mode == "garbage":
            wf.write_bytes(bytes((seed * 7 + i * 13) % 256 for i in range(int(where * 4096))))
        elif mode == "empty":
            wf.write_bytes(b"")
        elif mode == "delete":
            wf.unlink()
        elif mode == "index":
            (ck / "model.safetensors.index.json").write_text(
                _dumps({"weight_map": {"x": "../../etc/passwd"}} if seed % 2 else {"weight_map": seed}))
        else:
            state = load_file(str(wf))
            name = sorted(state)[seed % len(state)]
            if mode == "rename":
                state[name + ".renamed"] = state.pop(name)
            elif mode == "reshape":
                state[name] = torch.zeros(state[name].numel() + 1)
            elif mode == "nan":
                state[name] = torch.full_like(state[name], float("nan"))
            else:
                state[name] = state[name].to(torch.int8)
            save_file(state, str(wf))
        argv = ("generate", ck, "--input-ids", IDS, "--max-new-tokens", "2", "--engine",
                "stock" if seed % 2 else "eager")
        code, _, err = run_cli(*argv)
        assert_clean(code, err, (argv, mode))


# ---------------------------------------------------------------------------------- deployments


DEPLOYMENT_FIELDS = ["name", "gpu", "device", "dtype", "batch_size", "hbm_bandwidth", "bf16_flops", "sm_count",
                     "l2_bytes", "memory_bytes", "launch_overhead_s", "graph_node_overhead_s", "bandwidth_efficiency",
                     "flops_efficiency", "context_min", "context_max", "calibrated", "base", "bogus"]


@FUZZ
@given(edits=st.dictionaries(st.sampled_from(DEPLOYMENT_FIELDS), NUMBERS | JSONISH | st.sampled_from(
           ["cpu", "cuda", "h200", "float32", "int4"]), max_size=4),
       base=st.sampled_from([None, "h200", "nope"]), suffix=st.sampled_from([".json", ".toml"]),
       raw=st.sampled_from([None, "", "[1, 2]", "{", "\xff\xfe", "x = [", "null"]),
       calibration=st.none() | JSONISH | st.dictionaries(
           st.sampled_from(["deployment", "device", "kind_efficiency", "linear_flops_by_m", "quick", "linear_choice"]),
           NUMBERS | JSONISH, max_size=3))
def test_fuzz_deployment_and_calibration_files(ckpts, edits, base, suffix, raw, calibration):
    from specc.search.deployments import BUILTIN

    with scratch() as d:
        data = dict(BUILTIN["cpu"].to_json())
        data.pop("source", None)
        if base is not None:
            data = {"base": base}
        data.update(edits)
        path = d / f"dep{suffix}"
        if raw is not None:
            path.write_bytes(raw.encode("latin-1"))
        elif suffix == ".json":
            path.write_text(_dumps(data))
        else:
            path.write_text("\n".join(f"{k} = {json.dumps(v)}" for k, v in data.items() if isinstance(v, (str, int, float))
                                      and not (isinstance(v, float) and not math.isfinite(v))))
        if calibration is not None:
            (d / "dep.calibration.json").write_text(_dumps(calibration))
        for argv in (("deployments", path), ("cost", ckpts["target"], "--deployment", path)):
            code, _, err = run_cli(*argv)
            assert_clean(code, err, (argv, data))


# ---------------------------------------------------------------------------------- search memory


@FUZZ
@given(content=JSONISH | st.fixed_dictionaries({"entries": st.lists(
           st.fixed_dictionaries({"mechanism": st.text(max_size=5), "parameters": st.dictionaries(st.text(max_size=3), JSONISH, max_size=2)},
                                 optional={"predicted_gain": NUMBERS, "validated": NUMBERS, "prediction": JSONISH,
                                           "model": NUMBERS | st.text(max_size=3)}), max_size=3)},
           optional={"acceptance": JSONISH | st.dictionaries(st.text(max_size=8), st.fixed_dictionaries(
               {"alphas": st.lists(NUMBERS, max_size=3)}), max_size=2), "family": NUMBERS}))
def test_fuzz_memory_files(content):
    from specc.search.memory import Memory

    with scratch() as d:
        path = d / "qwen3__cpu.json"
        path.write_text(_dumps(content))
        try:
            mem = Memory.load(path, "qwen3", "cpu")
            mem.validated("m", "d", "pard")
            for key in list(mem.acceptance):
                model, drafter, method, _ = key.split("|", 3) if key.count("|") >= 3 else ("m", "d", "pard", "")
                mem.find_acceptance(model, drafter, method)
            mem.save()
        except UserError as exc:
            assert "\n" not in str(exc)


def test_bad_memory_file_is_one_line_in_compile(ckpts, tmp_path):
    mem = tmp_path / "mem.json"
    mem.write_text('{"entries": [{"mechanism": "x", "parameters": {}, "predicted_gain": "lots"}]}')
    argv = ("compile", ckpts["target"], "-o", tmp_path / "o.specc", "--memory", mem, "--verify-tokens", "2")
    code, _, err = run_cli(*argv)
    assert code == 2 and "predicted_gain" in err
    assert_clean(code, err, argv)
    assert not (tmp_path / "o.specc").exists()


# ---------------------------------------------------------------------------------- manifests


def _mutate(tree, path, value, delete):
    node = tree
    for key in path[:-1]:
        node = node[key]
    if delete and isinstance(node, dict):
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value


def _paths(tree, prefix=()):
    yield prefix
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from _paths(v, prefix + (i,))


@FUZZ
@given(pick=st.integers(0, 10**6), value=NUMBERS | JSONISH, delete=st.booleans())
def test_fuzz_manifest(artifact, pick, value, delete):
    manifest = json.loads((artifact / "manifest.json").read_text())
    paths = [p for p in _paths(manifest) if p]
    path = paths[pick % len(paths)]
    _mutate(manifest, path, value, delete)
    with scratch() as d:
        art = d / "a.specc"
        shutil.copytree(artifact, art)
        (art / "manifest.json").write_text(_dumps(manifest))
        argv = ("run", art, "--input-ids", IDS, "--max-new-tokens", "2")
        code, _, err = run_cli(*argv)
        assert_clean(code, err, (argv, path, value))
        from specc.runtime.engine import load

        try:
            load(art)
        except UserError:
            pass


def test_corrupt_manifest_json_is_one_line(artifact, tmp_path):
    art = tmp_path / "a.specc"
    shutil.copytree(artifact, art)
    for text in ("", "{", "[]", '{"format_version": 1}', "\xff"):
        (art / "manifest.json").write_bytes(text.encode("latin-1"))
        code, _, err = run_cli("run", art, "--input-ids", IDS)
        assert code == 2
        assert_clean(code, err)


# ---------------------------------------------------------------------------------- prompt files


@FUZZ
@given(content=JSONISH | st.text(max_size=20) | st.lists(st.lists(NUMBERS, max_size=4), max_size=3))
def test_fuzz_prompt_files(artifact, content):
    with scratch() as d:
        pf = d / "prompts.json"
        pf.write_text(content if isinstance(content, str) else _dumps(content))
        argv = ("verify", artifact, "--prompts", pf, "--tokens", "2")
        code, _, err = run_cli(*argv)
        assert_clean(code, err, (argv, content))


# ---------------------------------------------------------------------------------- CLI arguments

INT_VALUES = st.sampled_from(["0", "-1", "1", "3", "10", "1000000000", "99999999999999999999", "x", "", "1e3", "nan"])


@FUZZ
@given(command=st.sampled_from(["generate", "run", "verify", "cost", "deployments", "models", "passes", "ir"]),
       flags=st.lists(st.sampled_from(["--max-new-tokens", "--num-draft", "--tokens", "--tolerance", "--context",
                                       "--batch", "--device", "--dtype", "--input-ids", "--engine", "--method",
                                       "--alpha", "--tau", "--expect-hash", "--bogus"]), max_size=3, unique=True),
       values=st.lists(INT_VALUES | st.sampled_from(["cpu", "cuda:7", "meta", "float32", "-5,3", "1,2,3", "inf"]),
                       min_size=3, max_size=3),
       target=st.sampled_from(["ckpt", "artifact", "missing", "file"]))
def test_fuzz_cli_arguments(ckpts, artifact, tmp_path_factory, command, flags, values, target):
    where = {"ckpt": ckpts["target"], "artifact": artifact, "missing": "/nonexistent/x",
             "file": ckpts["target"] / "config.json"}[target]
    argv = [command]
    if command in ("generate", "run", "verify", "cost", "ir"):
        argv.append(where)
    if command in ("generate", "run") and "--input-ids" not in flags:
        argv += ["--input-ids", IDS]
    if command in ("generate", "run") and "--max-new-tokens" not in flags:
        argv += ["--max-new-tokens", "2"]
    if command == "verify" and "--tokens" not in flags:
        argv += ["--tokens", "2"]
    for flag, value in zip(flags, values):
        argv += [flag, value]
    code, _, err = run_cli(*argv)
    assert_clean(code, err, argv)


# ---------------------------------------------------------------------------------- pinned categories


@pytest.mark.parametrize("argv_fn,fragment", [
    (lambda c, a: ["generate", c["target"], "--input-ids", IDS, "--max-new-tokens", str(10**9)], "positions"),
    (lambda c, a: ["run", a, "--input-ids", IDS, "--max-new-tokens", str(10**9)], "positions"),
    (lambda c, a: ["generate", c["target"], "--input-ids", ",".join(["1"] * 600), "--max-new-tokens", "2"],
     "more than the model's 512 positions"),
    (lambda c, a: ["run", a, "--input-ids", ",".join(["1"] * 600), "--max-new-tokens", "2"], "positions"),
    (lambda c, a: ["generate", c["target"], "--drafter", c["dflash"], "--num-draft", "50", "--input-ids", IDS],
     "block"),
    (lambda c, a: ["compile", c["target"], "--drafter", c["dflash"], "--num-draft", "50", "-o", "/tmp/never.specc"],
     "block"),
    (lambda c, a: ["verify", a, "--tokens", "0"], "--tokens must be >= 1"),
    (lambda c, a: ["verify", a, "--tolerance", "nan"], "--tolerance"),
])
def test_absurd_values_are_refused_before_allocating(ckpts, artifact, argv_fn, fragment):
    argv = argv_fn(ckpts, artifact)
    code, _, err = run_cli(*argv)
    assert code == 2, (argv, err)
    assert_clean(code, err, argv)
    assert fragment in err, err


def test_cache_memory_estimate_refuses_before_allocating(ckpts, monkeypatch):
    import specc.models.loading as loading

    monkeypatch.setattr(loading, "available_memory_bytes", lambda device="cpu": 10_000)
    code, _, err = run_cli("generate", ckpts["target"], "--input-ids", IDS, "--max-new-tokens", "100")
    assert code == 2 and "GB available" in err


def test_unreadable_weights_are_one_line(ckpts, tmp_path):
    ck = tmp_path / "ck"
    shutil.copytree(ckpts["target"], ck)
    (ck / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}")
    for engine in ("eager", "stock"):
        code, _, err = run_cli("generate", ck, "--input-ids", IDS, "--engine", engine)
        assert code == 2 and "cannot read weights" in err
        assert_clean(code, err)
    from specc.models.loading import CheckpointError
    from specc.models.registry import load_model

    with pytest.raises(CheckpointError) as exc:
        load_model(ck)
    assert isinstance(exc.value, UserError)


def test_config_out_of_range_is_one_line(ckpts, tmp_path):
    for edit, fragment in (({"hidden_size": -4}, "hidden_size"), ({"num_hidden_layers": "two"}, "num_hidden_layers"),
                           ({"intermediate_size": 10**12}, "intermediate_size"), ({"rms_norm_eps": "nan"}, "rms_norm_eps"),
                           ({"eos_token_id": "x"}, "eos_token_id"), ({"num_key_value_heads": 3}, "num_key_value_heads")):
        ck = tmp_path / f"ck{len(list(tmp_path.iterdir()))}"
        shutil.copytree(ckpts["target"], ck)
        cfg = json.loads((ck / "config.json").read_text())
        cfg.update(edit)
        (ck / "config.json").write_text(json.dumps(cfg))
        code, _, err = run_cli("generate", ck, "--input-ids", IDS)
        assert code == 2 and fragment in err, (edit, err)
        assert_clean(code, err)


def test_nonfinite_logits_fail_token_forcing(ckpts, tmp_path):
    """A model with a non-finite weight: stock and compiled agree on argmax garbage, which used to
    PASS; now the artifact is refused (exit 1, nothing written)."""
    import torch
    from safetensors.torch import load_file, save_file

    ck = tmp_path / "nan"
    shutil.copytree(ckpts["target"], ck)
    state = load_file(str(ck / "model.safetensors"))
    name = next(k for k in sorted(state) if k.endswith("norm.weight") and "layers.0." in k)
    state[name] = torch.full_like(state[name], float("inf"))
    save_file(state, str(ck / "model.safetensors"), metadata={"format": "pt"})
    out = tmp_path / "nan.specc"
    code, _, err = run_cli("compile", ck, "-o", out, "--passes", "", "--verify-tokens", "3")
    assert code == 1 and "non-finite" in err, err
    assert not out.exists()


def test_verify_zero_positions_is_not_a_pass():
    from specc.verify.forcing import ForcingReport

    report = ForcingReport(tolerance=0.1)
    assert not report.passed and "nothing was checked" in report.summary()
