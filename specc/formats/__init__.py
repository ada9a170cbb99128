"""Weight storage formats (lossless 12-bit bf16: :mod:`specc.formats.bf12`)."""

from .bf12 import FORMAT_NAME, FORMAT_VERSION, FORMAT_VERSIONS, Packed12, pack_bf16_12bit

__all__ = ["Packed12", "pack_bf16_12bit", "FORMAT_NAME", "FORMAT_VERSION", "FORMAT_VERSIONS"]
