"""Proposers: pipeline editing, the built-in proposer's candidates, pack_weights_12bit only when registered."""

from __future__ import annotations

import types

from specc.search.proposers import (PACK_12BIT, BuiltinProposer, Candidate, MemoryProposer, with_pass,
                                    without_pass)


def test_pipeline_editing_keeps_canonical_order():
    assert with_pass("fuse_qkv,dce", "fuse_gate_up") == "fuse_qkv,fuse_gate_up,dce"
    assert with_pass("fuse_gate_up,dce", "fuse_qkv") == "fuse_qkv,fuse_gate_up,dce"
    assert with_pass("fuse_qkv,dce", PACK_12BIT) == f"fuse_qkv,{PACK_12BIT},dce"
    assert with_pass("", "fuse_qkv") == "fuse_qkv"
    assert with_pass("fuse_qkv", "fuse_qkv") == "fuse_qkv"
    assert without_pass("fuse_qkv,fuse_gate_up,dce", "fuse_gate_up") == "fuse_qkv,dce"


def _ctx(passes, method="pard", k=8, layers=4, roles=("target", "drafter"), top="target launch overhead"):
    best = Candidate({r: "fuse_qkv,fuse_gate_up,fuse_norm_linear,dce" for r in roles}, k)
    report = types.SimpleNamespace(top=lambda: types.SimpleNamespace(name=top))
    return types.SimpleNamespace(round=1, method=method, best=types.SimpleNamespace(candidate=best), gap_report=report,
                                 passes={p: None for p in passes}, roles=roles, num_layers={"target": layers},
                                 k_choices=[2, 4, 8], memory=None, siblings=[], model_name="m", drafter_name="d")


def test_builtin_proposer_k_and_fusions():
    cands = BuiltinProposer().propose(_ctx(["fuse_qkv", "fuse_gate_up", "fuse_norm_linear", "dce"]))
    mechs = [c.mechanism for c in cands]
    assert "num_draft 8 -> 2" in mechs and "num_draft 8 -> 4" in mechs
    assert {"fuse_qkv off", "fuse_gate_up off", "fuse_norm_linear off"} <= set(mechs)
    assert mechs.index("fuse_qkv off") < mechs.index("num_draft 8 -> 2")  # launch gap leads: fusions first
    off = next(c for c in cands if c.mechanism == "fuse_qkv off")
    assert off.passes == {"target": "fuse_gate_up,fuse_norm_linear,dce", "drafter": "fuse_gate_up,fuse_norm_linear,dce"}
    assert not any(PACK_12BIT in c.mechanism for c in cands)  # not registered in this context: skipped
    # keys identify configurations, not how they were found
    assert off.key() == off.with_(mechanism="other").key()


def test_pack_weights_12bit_per_layer_group_when_registered():
    ctx = _ctx(["fuse_qkv", "fuse_gate_up", "fuse_norm_linear", "dce", PACK_12BIT], top="target linear weights")
    cands = [c for c in BuiltinProposer().propose(ctx) if PACK_12BIT in c.mechanism]
    assert cands and BuiltinProposer().propose(ctx)[0].mechanism.startswith(PACK_12BIT)  # weights gap leads
    by = {c.mechanism: c for c in cands}
    assert by[f"{PACK_12BIT} on all target linears"].options.get("target") == {}
    half = by[f"{PACK_12BIT} on target layers 0-1"]
    assert half.options["target"] == {"pack_include": ["layers.0.", "layers.1."]}
    assert PACK_12BIT in half.passes["target"] and PACK_12BIT not in half.passes["drafter"]
    assert by[f"{PACK_12BIT} on target linears except the LM head"].options["target"] == {"pack_exclude": ["lm_head"]}
    assert f"{PACK_12BIT} on drafter" in by


def test_memory_proposer_keeps_k_only_for_the_same_drafter():
    from specc.search.memory import Memory, MemoryEntry

    mem = Memory("/nonexistent/qwen3__x.json", "qwen3", "x")
    mem.add(MemoryEntry("a", {"passes": {"target": "fuse_qkv", "drafter": "fuse_qkv"}, "num_draft": 4},
                        validated=True, model="m", drafter="d", method="pard"))
    mem.add(MemoryEntry("b", {"passes": {"target": "fuse_gate_up", "drafter": ""}, "num_draft": 2},
                        validated=True, model="m", drafter="other", method="pard"))
    mem.add(MemoryEntry("c", {"passes": {"target": "no_such_pass"}, "num_draft": 2}, validated=True))
    mem.add(MemoryEntry("d", {"passes": {"target": "fuse_qkv,dce"}, "num_draft": 2}, validated=False))
    ctx = _ctx(["fuse_qkv", "fuse_gate_up", "dce"])
    ctx.memory = mem
    cands = MemoryProposer().propose(ctx)
    assert [c.mechanism for c in cands] == ["a", "b"]
    assert cands[0].num_draft == 4 and cands[1].num_draft == 8  # another drafter's k is not reused
    assert all(c.origin == "memory" for c in cands)
    ctx.round = 2
    assert MemoryProposer().propose(ctx) == []
