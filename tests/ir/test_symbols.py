"""specc.ir.symbols' number formatting: rates take the decimal prefix that fits their magnitude."""

import pytest

from specc.ir import fmt_bytes, fmt_flops, fmt_rate


@pytest.mark.parametrize("value,unit,text", [
    (4.8e12, "B", "4.80 TB/s"),  # the H200 datasheet
    (3.35e12, "B", "3.35 TB/s"),
    (989e12, "FLOP", "989 TFLOP/s"),
    (50e9, "B", "50.0 GB/s"),  # the cpu profile: not "0.05 TB/s"
    (200e9, "FLOP", "200 GFLOP/s"),  # not "0 TFLOP/s"
    (450e9, "B", "450 GB/s"),
    (56.34e9, "B", "56.3 GB/s"),
    (999.6e9, "B", "1.00 TB/s"),  # rounds to three digits before picking the prefix
    (1979e12, "FLOP", "1980 TFLOP/s"),  # past the largest prefix the figure grows
    (2.5e6, "B", "2.50 MB/s"),
    (500, "B", "500 B/s"),
    (0, "B", "0 B/s"),
])
def test_fmt_rate(value, unit, text):
    assert fmt_rate(value, unit) == text


def test_amounts_keep_their_format():
    assert fmt_bytes(4.8e12) == "4.80 TB" and fmt_bytes(512) == "512 B"
    assert fmt_flops(200e9) == "200.00 GFLOP" and fmt_flops(12) == "12 FLOP"
