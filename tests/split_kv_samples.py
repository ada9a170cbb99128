"""Synthetic attention samples timed by the split-KV form with known parameters, for the fits'
tests (``specc.search.calibrate.fit_split_kv_attention`` and ``fit_attention_by_heads``)."""

from __future__ import annotations

from specc.search.attention_traffic import split_kv_traffic


def split_kv_samples(dep, truth: dict, slot: float, node: float) -> list[dict]:
    """Calibration-style attention samples per head layout ``(Hq, Hkv, d) -> (latency_s,
    bandwidth efficiency)`` at B 1 / 8 / 32, Q 1 / 4 / 16, C 512 / 4096: ``latency + (bytes +
    partials) / bw + slot x merge work`` plus ``node`` per kernel launched."""
    rows = []
    for heads, (latency, bw) in truth.items():
        hq, hkv, d = heads
        for b in (1, 8, 32):
            for q in (1, 4, 16):
                for c in (512, 4096):
                    tr = split_kv_traffic(b, q, hq, hkv, d, c + q, dep.sm_count)
                    nbytes = 2 * b * hkv * (c + q) * d * 2 + 2 * b * q * hq * d * 2
                    t = latency + (nbytes + tr.extra_bytes) / (bw * dep.hbm_bandwidth) + slot * tr.merge_work
                    rows.append({"B": b, "Q": q, "C": c, "bytes": nbytes, "flops": 4.0 * b * hq * q * (c + q) * d,
                                 "seconds": t + (2 if tr.merge_kernel else 1) * node, "heads": list(heads)})
    return rows
