"""Named pass pipelines: the one place the default pipeline is spelled.

``specc compile`` (when the search does not choose), the search's starting configuration and
tensor-parallel ranks with generated steps all run :data:`DEFAULT_PIPELINE`.
"""

from __future__ import annotations

DEFAULT_PIPELINE = "fuse_qkv,fuse_gate_up,fuse_norm_linear,fuse_rope_attention,fuse_residual_add,dce"

# what a tensor-parallel rank runs on its traced IR when it does not generate code (the fusions
# that need no kernel of their own); shard_tensor_parallel joins it for world > 1
TP_TRACED_PASSES = ("fuse_qkv", "fuse_gate_up", "fuse_norm_linear", "dce")
