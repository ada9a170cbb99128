"""The batch-invariant kernel mode (``specc.codegen.kernels.batch_invariant``): the switch, the
launch plans it fixes (linear config and split-K, bf12 configs, attention splits and merge, the
ragged plan, lowering's cuBLAS choice, the warm-up marker), and a row computed in a batch equal
bit for bit to the row computed alone: under the interpreter in fp32 (conftest.py), and in bf16
at Qwen3-8B shapes on a GPU (``gpu`` marks)."""

from __future__ import annotations

import pytest
import torch

from specc.codegen.kernels import attention as A
from specc.codegen.kernels import batch_invariant as BI
from specc.codegen.kernels import linear as L
from specc.codegen.kernels import linear_bf12 as B1
from specc.codegen.kernels import linear_bf12_v2 as B2
from specc.codegen.kernels import ragged_attention as RA

ROWS = (1, 3, 16, 48, 200)
CPU = torch.device("cpu")  # plans for 132 SMs (an H100/H200's count) off CUDA


# ------------------------------------------------------------------------------ the switch
@pytest.mark.parametrize("raw, on", [("0", False), ("1", True), (" 1 ", True), ("off", False), ("ON", True),
                                     ("true", True), ("false", False)])
def test_env_values(monkeypatch, raw, on):
    monkeypatch.setenv("SPECC_BATCH_INVARIANT", raw)
    assert BI._from_env() is on


def test_off_by_default(monkeypatch):
    monkeypatch.delenv("SPECC_BATCH_INVARIANT", raising=False)
    assert BI._from_env() is False


@pytest.mark.parametrize("raw", ["2", "yes please", "-1", ""])
def test_bad_value_names_the_variable(monkeypatch, raw):
    monkeypatch.setenv("SPECC_BATCH_INVARIANT", raw)
    with pytest.raises(ValueError, match="SPECC_BATCH_INVARIANT"):
        BI._from_env()


def test_context_manager_switches_and_restores():
    before = BI.enabled()
    with BI.batch_invariant():
        assert BI.enabled()
        with BI.batch_invariant(False):
            assert not BI.enabled()
        assert BI.enabled()
    assert BI.enabled() == before
    with pytest.raises(RuntimeError), BI.batch_invariant():
        raise RuntimeError
    assert BI.enabled() == before


# ------------------------------------------------------------------------------ launch plans
@pytest.mark.parametrize("n, k", [(4096, 4096), (6144, 4096), (151936, 4096), (40, 96)])
def test_linear_config_and_split_do_not_depend_on_rows(n, k):
    with BI.batch_invariant(False):
        normal = {L.get_config(m, n, k) for m in ROWS}
    assert len(normal) > 1  # outside the mode the config follows M (so this test can fail)
    L.set_config(3, n, k, L.LinearConfig("gemv", block_n=8, block_k=32, split_k=4))
    try:
        with BI.batch_invariant():
            configs = {L.get_config(m, n, k) for m in ROWS}
            splits = {L._split_plan(L.get_config(m, n, k), m, n, k, CPU) for m in ROWS}
            auto = {L._split_plan(L.BATCH_INVARIANT_CONFIG.replace(split_k=0), m, n, k, CPU) for m in ROWS}
    finally:
        L.set_config(3, n, k, None)
    assert configs == {L.BATCH_INVARIANT_CONFIG}  # overrides ignored too
    assert L.BATCH_INVARIANT_CONFIG.kind == "dot" and L.BATCH_INVARIANT_CONFIG.split_k == 1
    assert len(splits) == 1 and next(iter(splits))[1] == 1
    assert len(auto) == 1 and next(iter(auto))[1] == 1  # automatic split-K is one split


def test_bf12_configs_do_not_depend_on_rows():
    n, k = 4096, 4096
    for mod in (B1, B2):
        with BI.batch_invariant(False):
            assert len({mod.get_config(m, n, k) for m in ROWS}) > 1
        with BI.batch_invariant():
            assert {mod.get_config(m, n, k) for m in ROWS} == {mod.BATCH_INVARIANT_CONFIG}
        assert mod.BATCH_INVARIANT_CONFIG.kind == "dot" and mod.BATCH_INVARIANT_CONFIG.split_k == 1


def _plan_key(plan):
    return plan["num_splits"], plan["fused_merge"], plan["block_m"], plan["block_n"], plan["num_stages"]


@pytest.mark.parametrize("num_q, kv", [(1, 4096), (4, 1152), (16, 1152), (16, 4096), (64, 4096)])
def test_attention_plan_does_not_depend_on_batch(num_q, kv):
    plans = lambda: {b: _plan_key(A.launch_plan(b, num_q, 32, 8, 128, kv, CPU)) for b in (1, 3, 16)}  # noqa: E731
    with BI.batch_invariant():
        inside = plans()
    assert len(set(inside.values())) == 1
    with BI.batch_invariant(False):
        assert inside[1] == plans()[1]  # batch 1 plans as before


def test_attention_plan_differs_by_batch_outside_the_mode():
    """The case the mode exists for: a batched verify block plans other splits and a fused merge."""
    with BI.batch_invariant(False):
        one = _plan_key(A.launch_plan(1, 16, 32, 8, 128, 4096, CPU))
        sixteen = _plan_key(A.launch_plan(16, 16, 32, 8, 128, 4096, CPU))
    assert one[:2] != sixteen[:2]


def test_ragged_plan_does_not_depend_on_the_row_mix():
    mixes = [(1, 1), (5, 1), (80, 16), (7, 3), (200, 8)]  # (tokens, rows)
    with BI.batch_invariant(False):
        assert len({_plan_key(RA.ragged_launch_plan(t, r, 32, 8, 128, 4096, CPU)) for t, r in mixes}) > 1
    with BI.batch_invariant():
        plans = [RA.ragged_launch_plan(t, r, 32, 8, 128, 4096, CPU) for t, r in mixes]
    assert len({_plan_key(p) for p in plans}) == 1
    # the query-tile axis still grows with the mean row (it only deals the same tiles to programs)
    assert plans[0]["row_blocks"] == 1 and plans[4]["row_blocks"] > 1


def test_lowered_cublas_rows_are_ignored():
    from specc.codegen import kernel_abi

    x = torch.zeros(300, 8)
    assert kernel_abi._cublas(x, ((128, None),))
    with BI.batch_invariant():
        assert not kernel_abi._cublas(x, ((128, None),))


def test_warmup_marker_and_reports_name_the_mode():
    from specc.codegen.kernels import pdl
    from specc.runtime import warmup

    with BI.batch_invariant(False):
        plain = warmup.prefills_marker("cpu")
        assert pdl.launch_mode("cpu") == "plain"
    with BI.batch_invariant():
        assert warmup.prefills_marker("cpu") == plain + "-batch-invariant"
        assert pdl.launch_mode("cpu") == "plain, batch-invariant"


# ------------------------------------------------------------------------------ bits (interpreter / GPU fp32)
@pytest.mark.parametrize("m", [1, 3, 17, 33])
@pytest.mark.parametrize("extras", ["plain", "bias+residual", "norm"])
def test_linear_rows_alone_equal_rows_in_a_batch(dev, m, extras):
    torch.manual_seed(m)
    n, k = 40, 96  # K not a multiple of block_k, N not of block_n: the masked paths
    x = torch.randn(m, k, device=dev)
    w = torch.randn(n, k, device=dev) * 0.1
    b = torch.randn(n, device=dev) if extras == "bias+residual" else None
    r = torch.randn(m, n, device=dev) if extras == "bias+residual" else None
    g = 1 + 0.1 * torch.randn(k, device=dev) if extras == "norm" else None
    with BI.batch_invariant():
        y = L.linear(x, w, b, norm_weight=g, residual=r)
        for i in {0, m // 2, m - 1}:
            alone = L.linear(x[i:i + 1], w, b, norm_weight=g, residual=None if r is None else r[i:i + 1])
            assert torch.equal(y[i:i + 1], alone), i


def test_linear_rows_depend_on_the_batch_outside_the_mode(dev):
    """What the mode fixes: outside it, a row launched alone (the GEMV) and in a 33-row launch
    (the tensor-core kernel) get other bits."""
    torch.manual_seed(0)
    x, w = torch.randn(33, 96, device=dev), torch.randn(40, 96, device=dev) * 0.1
    with BI.batch_invariant(False):
        y = L.linear(x, w)
        assert any(not torch.equal(y[i:i + 1], L.linear(x[i:i + 1], w)) for i in range(33))


@pytest.mark.parametrize("layout", [1, 2])
def test_bf12_rows_alone_equal_rows_in_a_batch(dev, layout):
    from specc.formats import pack_bf16_12bit

    torch.manual_seed(layout)
    n, k, m = 48, 128, 5
    packed = pack_bf16_12bit((torch.randn(n, k) * 0.1).bfloat16().to(dev), version=layout)
    x = torch.randn(m, k, device=dev)
    with BI.batch_invariant():
        y = B1.linear_bf12(x, packed)
        for i in (0, 2, 4):
            assert torch.equal(y[i:i + 1], B1.linear_bf12(x[i:i + 1], packed)), i


def _attention_case(dev, dtype, bsz, num_q, hq, hkv, d, cap, lens, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *shape: torch.randn(*shape, generator=g).to(dtype).to(dev)  # noqa: E731
    return mk(bsz, num_q, hq, d), mk(bsz, hkv, cap, d), mk(bsz, hkv, cap, d), torch.tensor(lens, device=dev)


def _attention_rows_differing(dev, dtype, num_q, hq, hkv, d, cap, lens, on=True) -> int:
    """How many requests of a batch get other bits than alone (mode ``on`` or off)."""
    q, ck, cv, cl = _attention_case(dev, dtype, len(lens), num_q, hq, hkv, d, cap, lens)
    with BI.batch_invariant(on):
        batch = A.attention(q, ck, cv, cl, num_q, "causal", d ** -0.5)
        return sum(not torch.equal(batch[b:b + 1], A.attention(q[b:b + 1], ck[b:b + 1], cv[b:b + 1], cl[b:b + 1],
                                                              num_q, "causal", d ** -0.5))
                   for b in range(len(lens)))


@pytest.mark.parametrize("num_q", [1, 3])
def test_attention_rows_alone_equal_rows_in_a_batch(dev, monkeypatch, num_q):
    """Planned for 4 SMs, batch 3 takes 3 KV splits where a request alone takes 8: outside the
    mode some requests' bits change with the batch; inside, none does."""
    monkeypatch.setattr(A, "num_sms", lambda device: 4)
    case = (dev, torch.float32, num_q, 4, 2, 32, 512, [5, 200, 500])
    with BI.batch_invariant(False):
        assert A.launch_plan(3, num_q, 4, 2, 32, 512, CPU)["num_splits"] != \
            A.launch_plan(1, num_q, 4, 2, 32, 512, CPU)["num_splits"]
    assert _attention_rows_differing(*case, on=False) > 0
    assert _attention_rows_differing(*case) == 0


def test_ragged_row_alone_equals_the_row_in_a_mix(dev):
    """In the mode the ragged plan does not follow the mix: a row gives its bits alone (R = 1)."""
    g = torch.Generator().manual_seed(3)
    hq, hkv, d, cap = 4, 2, 32, 96
    counts, slots, lens = [3, 0, 6, 1], [2, 0, 3, 1], [4, 7, 50, 9]
    mk = lambda *shape: torch.randn(*shape, generator=g).to(dev)  # noqa: E731
    total = sum(counts)
    q, k, v = mk(1, total, hq, d), mk(1, total, hkv, d), mk(1, total, hkv, d)
    ck, cv = mk(4, hkv, cap, d), mk(4, hkv, cap, d)
    starts = [0] + torch.tensor(counts).cumsum(0).tolist()
    t = lambda xs: torch.tensor(xs, device=dev)  # noqa: E731
    with BI.batch_invariant():
        mixed = RA.ragged_attention(q, k, v, ck.clone(), cv.clone(), t(lens), t(slots), t(starts), d ** -0.5)
        for r, n in enumerate(counts):
            if not n:
                continue
            lo, hi = starts[r], starts[r + 1]
            alone = RA.ragged_attention(q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], ck.clone(), cv.clone(),
                                        t(lens[r:r + 1]), t(slots[r:r + 1]), t([0, n]), d ** -0.5)
            assert torch.equal(mixed[:, lo:hi], alone), r


# ------------------------------------------------------------------------------ bf16 on a GPU
@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 48])
@pytest.mark.parametrize("extras", ["plain", "norm+residual"])
def test_linear_bf16_rows_alone_equal_rows_in_a_batch_gpu(m, extras):
    """Qwen3-8B's o projection shape (N = K = 4096): each row of an M-row launch equals the same
    row launched alone, bit for bit."""
    torch.manual_seed(m)
    n, k = 4096, 4096
    x = torch.randn(m, k, device="cuda").bfloat16()
    w = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
    g = (1 + 0.1 * torch.randn(k, device="cuda")).bfloat16() if extras != "plain" else None
    r = torch.randn(m, n, device="cuda").bfloat16() if extras != "plain" else None
    with BI.batch_invariant():
        y = L.linear(x, w, None, norm_weight=g, residual=r)
        for i in sorted({0, m // 2, m - 1}):
            alone = L.linear(x[i:i + 1], w, None, norm_weight=g, residual=None if r is None else r[i:i + 1])
            assert torch.equal(y[i:i + 1], alone), i


@pytest.mark.gpu
@pytest.mark.parametrize("num_q", [1, 16])
def test_attention_bf16_rows_alone_equal_rows_in_a_batch_gpu(num_q):
    """Qwen3-8B heads (32 query, 8 KV, D 128) over a 4096-slot cache, batch 3 against each alone."""
    assert _attention_rows_differing("cuda", torch.bfloat16, num_q, 32, 8, 128, 4096, [1000, 2900, 4000]) == 0
