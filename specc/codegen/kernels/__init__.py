"""Triton kernels used by codegen (one module per kernel family, e.g. ``.linear_bf12``)."""
