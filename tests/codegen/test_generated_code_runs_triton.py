"""The generated module drives the real Triton kernels: an artifact compiled on CPU passes token
forcing when its kernel ABI dispatches to Triton (under the interpreter, fp32)."""

import json
import os
import subprocess
import sys

from specc.compiler import compile_artifact


def test_artifact_verifies_with_triton_kernels(checkpoints, tmp_path):
    if "qwen3" not in checkpoints["target"]:
        return  # one family is enough: the kernels are the same (this test takes ~30 s)
    out = tmp_path / "k.specc"
    compile_artifact(checkpoints["target"], out=out, max_new_tokens=4)
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps([[5, 17, 33, 2]]))
    env = dict(os.environ, SPECC_KERNELS="triton", TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-m", "specc", "verify", str(out), "--prompts", str(prompts),
                           "--tokens", "4", "--json"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["passed"] and report["positions"] == 4
