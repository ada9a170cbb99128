"""The sandbox for proposed pass code holds: a confined worker (scrubbed environment, limits,
private directory, no network where the OS allows), a verdict computed by the parent only (its own
kernel-ABI check and token forcing of the emitted modules, in a process that never imports the
pass), pinned pass sources in the memory, and LLM plans that cannot name files or objects."""

from __future__ import annotations

import json
import os
import sys

import pytest
from broken_passes import negate_logits_source

from specc.errors import UserError
from specc.search.driver import Search
from specc.search.emitted_check import EmittedCodeError, check_emitted_source
from specc.search.evaluated import Evaluated
from specc.search.llm_proposer import plan_candidate, source_candidate
from specc.search.memory import Memory, MemoryEntry, pass_sources
from specc.search.proposers import Candidate, MemoryProposer

NOOP = '''
from specc.passes import Pass, PassResult


class {cls}(Pass):
    name = "{name}"

    def run(self, ir, ctx):
{body}
        return PassResult(False, {{}})
'''

PROBE_BODY = '''
        import json, os, resource
        info = {{"env": dict(os.environ), "cwd": os.getcwd(), "pid": os.getpid(), "ppid": os.getppid(),
                "netns": os.readlink("/proc/self/ns/net"), "stdin": os.readlink("/proc/self/fd/0"),
                "limits": {{k: resource.getrlimit(getattr(resource, k))[0]
                           for k in ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_NPROC")}}}}
        with open({probe!r}, "w") as f:
            json.dump(info, f)
'''

# (a) patch the verifier and the forcing functions inside the worker, and break the model
PATCH_VERIFIER = negate_logits_source("llm_patch_verifier").replace("class NegateLogits(Pass):", '''
import specc.verify, specc.verify.forcing


class _Passed:
    passed = True
    def summary(self): return "PASS"
    def to_json(self): return {"passed": True, "failures": [], "ties": []}


def _always(*a, **k):
    return _Passed()


specc.verify.verify_system = specc.verify.forcing.verify_system = _always
import specc.search.check as _check
_check.verify_system = _always


class NegateLogits(Pass):''')

# (b) forge every result file a worker could be believed for, and break the model
FORGE = negate_logits_source("llm_forge").replace("        ir.refresh()\n", '''        ir.refresh()
        import json, os, pathlib
        forged = {"ok": True, "stage": "verified", "passed": True, "summary": "PASS", "lengths": [],
                  "forcing": {"passed": True, "failures": [], "ties": []},
                  "prediction": {"tokens_per_s": 1e12, "speedup": 1e6}}
        import atexit, sys

        def forge_last():  # after the worker wrote its own: the file the worker was told to write
            for target in (pathlib.Path(sys.argv[-1]), pathlib.Path(sys.argv[-1]) / "info.json"):
                try:
                    target.write_text(json.dumps(forged))
                except OSError:
                    pass
        atexit.register(forge_last)
        for d in (pathlib.Path("."), pathlib.Path("out"), pathlib.Path("..")):
            for name in ("result.json", "info.json"):
                try:
                    d.mkdir(exist_ok=True)
                    (d / name).write_text(json.dumps(forged))
                except OSError:
                    pass
''')

# (e) patch emission in the worker so the emitted module runs arbitrary code
INJECT = NOOP.format(cls="Inject", name="llm_inject", body='''
        import specc.codegen.emit as emit
        orig = emit.emit_step
        def patched(*a, **k):
            out = orig(*a, **k)
            out.source = out.source.replace("import torch\\n", "import torch\\nimport os\\nos.system('true')\\n", 1)
            return out
        emit.emit_step = patched
        import specc.codegen.build as build
        build.emit_step = patched''')


@pytest.fixture(scope="module")
def search(tiny):
    s = Search(tiny["target"], None, deployment="cpu", memory=False, start_pipeline="", num_prompts=2,
               max_new_tokens=6, sandbox_timeout=240)
    s.setup_stock()
    s._load_models()
    return s


def _check(search, source, tmp_path):
    cand = source_candidate(source, search.start, search.roles, tmp_path / "llm_passes")
    ev = search.check(Evaluated(cand))
    assert not any(m.startswith("specc_user_pass_llm_") for m in sys.modules), "the parent imported the pass"
    return ev


def test_good_pass_is_accepted_in_a_confined_worker(search, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECC_TEST_SECRET_TOKEN", "hunter2")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    probe = tmp_path / "probe.json"
    ev = _check(search, NOOP.format(cls="Probe", name="llm_probe", body=PROBE_BODY.format(probe=str(probe))), tmp_path)
    assert ev.verified and ev.status == "verified (sandbox)", ev.error
    info = json.loads(probe.read_text())
    assert "SPECC_TEST_SECRET_TOKEN" not in info["env"] and "OPENAI_API_KEY" not in info["env"]
    assert "hunter2" not in json.dumps(info["env"]) and "sk-secret" not in json.dumps(info["env"])
    assert set(info["env"]) <= {"PATH", "HOME", "TMPDIR", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONNOUSERSITE",
                                "OMP_NUM_THREADS", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TRITON_CACHE_DIR",
                                "LANG", "LC_ALL", "LC_CTYPE", "TZ",
                                "TORCHINDUCTOR_CACHE_DIR"}  # the last one torch sets itself on import
    assert info["env"]["HOME"] != os.environ.get("HOME") and info["env"]["HOME"].startswith(info["cwd"])
    assert "specc-sandbox-" in info["cwd"] and info["pid"] != os.getpid()
    assert info["stdin"] == "/dev/null"
    for k in ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_NPROC"):
        assert info["limits"][k] != -1, k  # not RLIM_INFINITY
    net = ev.sandbox["network"]
    assert net == "isolated" or net.startswith("not isolated (")
    if net == "isolated":
        assert info["netns"] != os.readlink("/proc/self/ns/net")
    assert ev.to_json()["sandbox"]["network"] == net


def test_patched_verifier_is_rejected(search, tmp_path):
    ev = _check(search, PATCH_VERIFIER, tmp_path)
    assert ev.verified is False and ev.status == "rejected: token forcing failed", (ev.status, ev.error)
    assert ev.forcing["failures"]


def test_forged_result_files_are_rejected(search, tmp_path):
    ev = _check(search, FORGE, tmp_path)
    assert ev.verified is False and ev.status == "rejected: token forcing failed", (ev.status, ev.error)


def test_lossy_pass_is_rejected(search, tmp_path):
    ev = _check(search, negate_logits_source("llm_lossy"), tmp_path)
    assert ev.verified is False and ev.status == "rejected: token forcing failed"


def test_emitted_code_beyond_the_abi_is_rejected(search, tmp_path):
    ev = _check(search, INJECT, tmp_path)
    assert ev.verified is False and ev.status == "rejected: emitted code beyond the kernel ABI", (ev.status, ev.error)
    assert "import os" in ev.error


def test_pass_that_rewrites_its_own_source_is_rejected(search, tmp_path):
    body = '''
        import pathlib, glob
        for f in glob.glob({d!r} + "/*.py"):
            pathlib.Path(f).write_text(pathlib.Path(f).read_text() + "\\n# changed\\n")'''.format(
        d=str(tmp_path / "llm_passes"))
    ev = _check(search, NOOP.format(cls="SelfEdit", name="llm_self_edit", body=body), tmp_path)
    assert ev.verified is False and "source changed" in ev.status


# ---------------------------------------------------------------------- the static ABI check


def test_emitted_check_accepts_emission_and_refuses_the_rest(search):
    _, emitted, _ = search.real_ir("target", search.start)
    check_emitted_source(emitted.source, emitted.class_name)
    cls = emitted.class_name
    head, body = emitted.source.split(f"class {cls}(CompiledStep):\n    def forward(", 1)
    sig, rest = body.split("\n", 1)
    bad_lines = ["x = eval('1')", "x = open('/etc/passwd')", "x = __import__('os')", "x = torch.load('f')",
                 "x = torch.sys.modules", "x = self.__class__", "x = getattr(torch, 'load')", "x = (lambda: 1)()",
                 "x = torch.ops.aten.add", "x = torch._C", "x = [i for i in range(3)]", "x = torch.utils",
                 "x = torch.hub.load", "x = exec"]
    for line in bad_lines:
        src = f"{head}class {cls}(CompiledStep):\n    def forward({sig}\n        {line}\n{rest}"
        with pytest.raises(EmittedCodeError):
            check_emitted_source(src, cls)
    for header_line in ["import os", "import subprocess as torch_x", "from specc.search import driver",
                        "from torch import load"]:
        with pytest.raises(EmittedCodeError):
            check_emitted_source(emitted.source.replace("import torch\n", f"import torch\n{header_line}\n", 1), cls)
    with pytest.raises(EmittedCodeError):
        check_emitted_source(emitted.source + "\nprint('hi')\n", cls)


# ---------------------------------------------------------------------- plans and memory


def test_llm_plans_cannot_name_files_or_objects(tmp_path):
    marker = tmp_path / "imported"
    evil = tmp_path / "evil.py"
    evil.write_text(f"open({str(marker)!r}, 'w').write('x')\nclass P: pass\n")
    best = Candidate({"target": "", "drafter": ""}, 4)
    for item in (f"+{evil}:P", "examples.custom_pass:FuseSiluMulDown", "+examples.custom_pass:FuseSiluMulDown",
                 "specc.passes.fuse_qkv", "../evil", {"name": f"+{evil}:P"}):
        with pytest.raises(UserError, match="registered passes only"):
            plan_candidate({"plan": ["fuse_qkv", item]}, best, ("target", "drafter"))
    with pytest.raises(UserError, match="not a registered pass"):
        plan_candidate({"plan": ["no_such_pass"]}, best, ("target",), registered={"fuse_qkv": None})
    assert not marker.exists()
    ok = plan_candidate({"plan": ["fuse_qkv"]}, best, ("target",), registered={"fuse_qkv": None})
    assert ok.passes["target"] == "fuse_qkv" and not ok.sandbox


def test_memory_pins_pass_sources_and_skips_changed_ones(tmp_path):
    src = tmp_path / "my_pass.py"
    src.write_text("# v1\n")
    ref = f"{src}:MyPass"
    pins = pass_sources([f"fuse_qkv,+{ref}"])
    assert set(pins) == {ref} and len(pins[ref]) == 64
    mem = Memory(tmp_path / "m.json", "qwen3", "cpu")
    mem.add(MemoryEntry("my pass on", {"passes": {"target": f"+{ref}"}, "num_draft": 0}, validated=True,
                        pass_sources=pins, sandbox={"network": "isolated"}))
    mem.add(MemoryEntry("unpinned", {"passes": {"target": f"fuse_qkv,+{ref}"}, "num_draft": 0}, validated=True))
    mem.add(MemoryEntry("plain", {"passes": {"target": "fuse_qkv"}, "num_draft": 0}, validated=True))
    mem.save()
    mem = Memory.load(tmp_path / "m.json")
    notes: list[str] = []
    assert [e.mechanism for e in mem.validated(notes=notes)] == ["my pass on", "plain"]
    assert len(notes) == 1 and "no pinned source hash" in notes[0]
    src.write_text("# v2: changed after validation\n")
    notes = []
    assert [e.mechanism for e in mem.validated(notes=notes)] == ["plain"]
    assert any("changed since it was validated" in n for n in notes)


def test_memory_proposer_keeps_sandboxed_passes_sandboxed(tmp_path):
    import types

    src = tmp_path / "llm_p.py"
    src.write_text("# pass\n")
    ref = f"{src}:P"
    mem = Memory(tmp_path / "m.json", "qwen3", "cpu")
    mem.add(MemoryEntry("llm pass P", {"passes": {"target": f"+{ref}"}, "num_draft": 0}, validated=True,
                        pass_sources=pass_sources([f"+{ref}"]), sandbox={"network": "isolated"}))
    ctx = types.SimpleNamespace(round=1, memory=mem, siblings=[], model_name="", drafter_name="", method="ar",
                                passes={}, roles=("target",), k_choices=[], notes=[],
                                best=types.SimpleNamespace(candidate=Candidate({"target": ""}, 0)))
    (cand,) = MemoryProposer().propose(ctx)
    assert cand.sandbox
    src.write_text("# tampered\n")
    ctx.notes = []
    assert MemoryProposer().propose(ctx) == [] and "not trusted" in ctx.notes[0]
