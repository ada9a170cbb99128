"""Token forcing against stock (see forcing.py), tie-aware equality of two greedy outputs
(output_equality.py) and the calibration prompt set."""

from specc.verify.forcing import (DEFAULT_TOLERANCE, ForcingReport, Fp32Referee, Mismatch, StockRun, fp32_referee,
                                  run_stock_reference, stock_margins, verify_system)
from specc.verify.output_equality import Divergence, EqualityReport, PrefixLogits, compare_outputs
from specc.verify.prompts import CALIBRATION_TEXTS, calibration_prompts, load_prompts_file
from specc.verify.ragged_forcing import force_ragged

__all__ = ["CALIBRATION_TEXTS", "DEFAULT_TOLERANCE", "Divergence", "EqualityReport", "ForcingReport", "Mismatch", "StockRun", "calibration_prompts", "force_ragged",
           "load_prompts_file", "Fp32Referee", "PrefixLogits", "compare_outputs", "fp32_referee", "run_stock_reference",
           "stock_margins", "verify_system"]
