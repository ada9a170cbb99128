"""Measured launches of the bf12 tensor-core kernel per GPU: where a sweep found a faster launch
than :func:`specc.codegen.kernels.linear_bf12_mma.get_config`'s rule, the kernel takes it.

Why: the rule (waves of 16-row blocks per SM -> unroll, warps) was fitted on the H200 and the
H100 with layout 2 (runs 17-18). Layout 3 changed the loads, and on the H100 the rule's launch
for the Qwen3-8B q/k/v projection costs 17.3 us at one row where another takes 15.8, and the
16-row LM head 329.6 us where another takes 318.0 (docs/benchmarks/run29.md). A per-GPU table
of sweep winners (``examples/bench_bf12.py --record``) keeps the rule for everything it does not
list, like the Triton linears' config table and the cuBLAS times of the linear choice.

The table (``specc/data/bf12-mma-launch.json``, format ``specc-bf12-mma-launch/1``) maps a GPU
name as ``torch.cuda.get_device_name`` reports it to measured launches keyed by (rows, N, K):
``rows`` is 1, 4 or 16, the row counts the sweep times; a launch of M rows uses the entry of
:func:`rows_key` (1 -> 1, 2 .. 4 -> 4, 9 .. 16 -> 16; 5 .. 8 rows keep the rule). Each entry
records what was measured (``us``, and the rule's launch and time beside it) and where.
``SPECC_BF12_MMA_TABLE=0`` ignores the table (the rule everywhere)."""

from __future__ import annotations

import dataclasses
import functools
import json
from importlib import resources
from typing import Any, Mapping

FORMAT = "specc-bf12-mma-launch/1"
RECORD = "bf12-mma-launch.json"
TABLE_ENV = "SPECC_BF12_MMA_TABLE"


def rows_key(m: int) -> int | None:
    """The measured row count whose launch ``m`` rows take, or None (the rule's)."""
    if m == 1:
        return 1
    if 2 <= m <= 4:
        return 4
    if 9 <= m <= 16:
        return 16
    return None


def enabled() -> bool:
    """Whether launches come from the table where it has them (``SPECC_BF12_MMA_TABLE``, default on)."""
    from specc.switches import env_switch

    return env_switch(TABLE_ENV, True)


LAUNCH_FIELDS = ("unroll", "warps", "splits", "prefetch")  # linear_bf12_mma.Bf12MmaConfig's


def parse(record: Mapping[str, Any]) -> dict[str, dict[tuple[int, int, int], dict]]:
    """GPU -> {(rows, N, K): launch} from a table record (a launch: the fields of
    ``linear_bf12_mma.Bf12MmaConfig``, which checks their values); refuses a malformed one."""
    if record.get("format") != FORMAT:
        raise ValueError(f"bf12 launch table: format {record.get('format')!r}, expected {FORMAT!r}")
    out: dict[str, dict[tuple[int, int, int], Any]] = {}
    for gpu, entry in record.get("gpus", {}).items():
        launches = {}
        for row in entry.get("launches", []):
            key = (int(row["rows"]), int(row["n"]), int(row["k"]))
            if key[0] not in (1, 4, 16):
                raise ValueError(f"bf12 launch table, {gpu}: rows {key[0]} (1, 4 or 16)")
            launch = {"unroll": int(row["unroll"]), "warps": int(row["warps"]), "splits": int(row["splits"]),
                      "prefetch": bool(row["prefetch"])}
            if not tiles(launch, key[2]):
                raise ValueError(f"bf12 launch table, {gpu}: {launch} does not tile K = {key[2]}")
            launches[key] = launch
        out[gpu] = launches
    return out


def tiles(launch: Mapping[str, Any], kp: int) -> bool:
    """Whether the launch tiles a K-column weight: whole chunks per split, a chunk per warp at least."""
    per = 64 * launch["unroll"] * launch["splits"]
    return kp % per == 0 and kp // per >= launch["warps"]


@functools.cache
def packaged() -> dict[str, dict[tuple[int, int, int], dict]]:
    """The packaged table (``specc/data``), read once per process."""
    return parse(json.loads(resources.files("specc").joinpath("data", RECORD).read_text()))


def lookup(gpu: str | None, m: int, n: int, kp: int) -> dict | None:
    """The measured launch (Bf12MmaConfig's fields) for ``m`` rows of an ``[n, kp]`` weight on
    ``gpu``, or None."""
    key = rows_key(m)
    if gpu is None or key is None or not enabled():
        return None
    return packaged().get(gpu, {}).get((key, n, kp))


def merge(record: Mapping[str, Any] | None, gpu: str, launches: list[Mapping[str, Any]], source: str) -> dict:
    """``record`` (or a new table) with ``gpu``'s launches at the measured (rows, N, K) replaced by
    ``launches`` (dicts: rows, n, k, unroll, warps, splits, prefetch, us, and what else was
    measured), ``source`` appended to the GPU's sources. Checked by :func:`parse`."""
    out = {"format": FORMAT, "gpus": {}} if record is None else json.loads(json.dumps(record))
    entry = out["gpus"].setdefault(gpu, {"sources": [], "launches": []})
    fresh = {(int(r["rows"]), int(r["n"]), int(r["k"])) for r in launches}
    kept = [r for r in entry["launches"] if (int(r["rows"]), int(r["n"]), int(r["k"])) not in fresh]
    entry["launches"] = sorted(kept + [dict(r) for r in launches], key=lambda r: (r["n"], r["k"], r["rows"]))
    if source not in entry["sources"]:
        entry["sources"].append(source)
    parse(out)
    return out


def winners(sweep: list[Mapping[str, Any]], rule) -> list[dict]:
    """Table rows from a bench_bf12 sweep: per (M, shape) the fastest exact launch, with the
    rule's launch and its time in the same sweep (None where the sweep did not time it).
    ``sweep``: the bench's ``linear`` records (``mma3_configs`` / ``mma_configs``: config params,
    ok, us); ``rule(m, n, k)``: the rule's launch (a Bf12MmaConfig)."""
    rows = []
    for rec in sweep:
        m = int(rec["M"])
        if m not in (1, 4, 16):
            continue
        timed = [c for c in rec.get("mma3_configs") or rec.get("mma_configs") or [] if c.get("ok")]
        if not timed:
            continue
        best = min(timed, key=lambda c: c["us"])
        ruled = dataclasses.asdict(rule(m, int(rec["N"]), int(rec["K"])))
        rule_us = next((c["us"] for c in timed if c["params"] == ruled), None)
        rows.append({"rows": m, "n": int(rec["N"]), "k": int(rec["K"]), **best["params"], "us": round(best["us"], 3),
                     "rule": ruled, "rule_us": None if rule_us is None else round(rule_us, 3)})
    return rows
