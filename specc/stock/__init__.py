"""The reference systems ("stock"): eager loops over HF transformers models, greedy; ``sample_ar``: plain
sampling, the reference distribution of speculative sampling.

Slow and obviously right; every compiled result is checked against these. Each returns a
``specc.result.GenerationResult`` (new tokens + per-step statistics).
"""

from specc.stock.ar import generate_ar
from specc.stock.chain import generate_chain
from specc.stock.dflash import generate_dflash
from specc.stock.dflash_reference import DFlashReference
from specc.stock.pard import generate_pard
from specc.stock.sampling import sample_ar

__all__ = ["DFlashReference", "generate_ar", "generate_chain", "generate_dflash", "generate_pard", "sample_ar"]
