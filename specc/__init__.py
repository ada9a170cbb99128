"""specc: a compiler for speculative decoding of large language models."""

__version__ = "0.1.0"
