"""The bf12 tensor-core kernel's measured launches per GPU (specc.codegen.kernels.bf12_mma_table)."""

from __future__ import annotations

import pytest

from specc.codegen.kernels import bf12_mma_table as table
from specc.codegen.kernels import linear_bf12_mma as mma

H100 = "NVIDIA H100 80GB HBM3"
QKV, LM_HEAD = (6144, 4096), (151936, 4096)


def test_rows_map_to_the_measured_row_counts():
    assert [table.rows_key(m) for m in (1, 2, 4, 5, 8, 9, 16, 17)] == [1, 4, 4, None, None, 16, 16, None]


def test_the_packaged_table_parses_and_every_launch_tiles_its_weight():
    launches = table.packaged()
    assert H100 in launches and len(launches[H100]) == 15  # 5 Qwen3-8B shapes x 1 / 4 / 16 rows
    for (rows, n, k), launch in launches[H100].items():
        assert rows in (1, 4, 16) and n % 16 == 0 and table.tiles(launch, k)
        mma.Bf12MmaConfig(**launch)  # the kernel's own checks


def test_a_listed_gpu_takes_its_measured_launch_and_others_the_rule(monkeypatch):
    monkeypatch.delenv(table.TABLE_ENV, raising=False)
    rule = mma.get_config(1, *QKV, 132)
    measured = mma.get_config(1, *QKV, 132, gpu=H100)
    listed = table.packaged()[H100]
    assert measured == mma.Bf12MmaConfig(**listed[(1, *QKV)]) != rule  # the sweep beat the rule here
    assert mma.get_config(3, *QKV, 132, gpu=H100) == mma.Bf12MmaConfig(**listed[(4, *QKV)])
    assert mma.get_config(16, *LM_HEAD, 132, gpu=H100) == mma.Bf12MmaConfig(**listed[(16, *LM_HEAD)])
    assert mma.get_config(6, *QKV, 132, gpu=H100) == mma.get_config(6, *QKV, 132)  # 5 .. 8 rows: not measured
    assert mma.get_config(1, *QKV, 132, gpu="NVIDIA H200") == rule  # no H200 launches yet
    assert mma.get_config(1, 4096, 5120, 132, gpu=H100) == mma.get_config(1, 4096, 5120, 132)  # shape not listed
    monkeypatch.setenv(table.TABLE_ENV, "0")
    assert mma.get_config(1, *QKV, 132, gpu=H100) == rule


def _record(**launch):
    row = {"rows": 1, "n": 64, "k": 1024, "unroll": 2, "warps": 4, "splits": 1, "prefetch": True, "us": 1.0}
    row.update(launch)
    return {"format": table.FORMAT, "gpus": {"GPU": {"sources": ["x"], "launches": [row]}}}


def test_a_malformed_table_is_refused():
    assert table.parse(_record())["GPU"][(1, 64, 1024)] == {"unroll": 2, "warps": 4, "splits": 1, "prefetch": True}
    with pytest.raises(ValueError, match="format"):
        table.parse({**_record(), "format": "other/1"})
    with pytest.raises(ValueError, match="rows 8"):
        table.parse(_record(rows=8))
    with pytest.raises(ValueError, match="does not tile"):
        table.parse(_record(k=1000))


def test_merge_replaces_the_measured_keys_and_keeps_the_rest():
    first = table.merge(None, "GPU", [{"rows": 1, "n": 64, "k": 1024, "unroll": 1, "warps": 8, "splits": 1,
                                       "prefetch": False, "us": 2.0},
                                      {"rows": 4, "n": 64, "k": 1024, "unroll": 1, "warps": 8, "splits": 1,
                                       "prefetch": False, "us": 3.0}], "run A")
    second = table.merge(first, "GPU", [{"rows": 1, "n": 64, "k": 1024, "unroll": 2, "warps": 4, "splits": 1,
                                         "prefetch": True, "us": 1.5}], "run B")
    parsed = table.parse(second)["GPU"]
    assert parsed[(1, 64, 1024)] == {"unroll": 2, "warps": 4, "splits": 1, "prefetch": True}  # replaced
    assert parsed[(4, 64, 1024)] == {"unroll": 1, "warps": 8, "splits": 1, "prefetch": False}  # kept
    assert second["gpus"]["GPU"]["sources"] == ["run A", "run B"]
    assert table.parse(first)["GPU"][(1, 64, 1024)]["unroll"] == 1  # not mutated


def test_winners_take_the_fastest_exact_launch_with_the_rule_beside_it():
    def timed(unroll, warps, prefetch, us, ok=True):
        return {"params": {"unroll": unroll, "warps": warps, "splits": 1, "prefetch": prefetch}, "us": us, "ok": ok}

    sweep = [{"M": 1, "N": 6144, "K": 4096, "mma3_configs": [timed(1, 8, True, 17.3), timed(2, 4, True, 15.8),
                                                            timed(1, 4, False, 9.0, ok=False)]},
             {"M": 64, "N": 6144, "K": 4096, "mma3_configs": [timed(2, 4, True, 30.0)]},  # not a table row count
             {"M": 4, "N": 6144, "K": 4096, "mma3_configs": []}]  # nothing timed
    rows = table.winners(sweep, lambda m, n, k: mma.get_config(m, n, k, 132))
    assert len(rows) == 1
    (row,) = rows
    assert (row["rows"], row["unroll"], row["warps"], row["prefetch"], row["us"]) == (1, 2, 4, True, 15.8)
    assert row["rule"] == {"unroll": 1, "warps": 8, "splits": 1, "prefetch": True} and row["rule_us"] == 17.3
    assert table.parse(table.merge(None, "GPU", rows, "s"))["GPU"][(1, 6144, 4096)]["warps"] == 4
