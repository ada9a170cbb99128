"""Token forcing against stock (see forcing.py) and the calibration prompt set."""

from specc.verify.forcing import (DEFAULT_TOLERANCE, ForcingReport, Fp32Referee, Mismatch, StockRun, fp32_referee,
                                  run_stock_reference, stock_margins, verify_system)
from specc.verify.prompts import CALIBRATION_TEXTS, calibration_prompts, load_prompts_file
from specc.verify.ragged_forcing import force_ragged

__all__ = ["CALIBRATION_TEXTS", "DEFAULT_TOLERANCE", "ForcingReport", "Mismatch", "StockRun", "calibration_prompts", "force_ragged",
           "load_prompts_file", "Fp32Referee", "fp32_referee", "run_stock_reference", "stock_margins", "verify_system"]
