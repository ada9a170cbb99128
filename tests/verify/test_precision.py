"""Logit deviation against a reference: the numbers the hybrid bench prints to tell rounding
noise from a bug (max |d| overall and at the first positions, rms, argmax agreement)."""

import pytest
import torch

from specc.verify.precision import deviation_line, logit_deviation


def test_deviation_numbers():
    ref = torch.zeros(6, 5)
    ref[:, 0] = 1.0  # argmax 0 everywhere
    low = ref.clone()
    low[1, 3] = 0.5  # within the first 4 positions, argmax unchanged
    low[5, 2] = 2.0  # after them, and it moves the argmax
    dev = logit_deviation(low, ref, first=4)
    assert dev["positions"] == 6 and dev["first"] == 4
    assert dev["max_abs"] == 2.0 and dev["max_abs_first"] == 0.5
    assert dev["rms"] == pytest.approx(((0.5 ** 2 + 2.0 ** 2) / 30) ** 0.5)
    assert dev["argmax_agreement"] == pytest.approx(5 / 6)
    line = deviation_line("bf16 vs fp32", dev)
    assert line.startswith("bf16 vs fp32: max |d| 2.0000 (first 4 positions: 0.5000)") and "83% of 6" in line


def test_identical_and_bad_shapes():
    x = torch.randn(3, 7, generator=torch.Generator().manual_seed(0))
    dev = logit_deviation(x.bfloat16(), x.bfloat16(), first=10)
    assert dev["max_abs"] == 0.0 and dev["first"] == 3 and dev["argmax_agreement"] == 1.0
    with pytest.raises(ValueError, match="same non-empty"):
        logit_deviation(x, x[:2])
    with pytest.raises(ValueError, match="same non-empty"):
        logit_deviation(x[:0], x[:0])
