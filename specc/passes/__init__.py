"""IR passes: the Pass interface, a registry, the pass manager, a bisector, built-in rewrites.

    from specc.passes import PassManager, parse_pipeline
    report = PassManager("fuse_qkv,fuse_gate_up,fuse_norm_linear,dce").run(ir)

Built-in passes (one file each): fuse_qkv, fuse_gate_up, fuse_norm_linear, fuse_rope_attention,
fuse_residual_add,
pack_weights_12bit, shard_tensor_parallel, dce.
Write your own: subclass :class:`Pass`, decorate with :func:`register_pass` (docs/writing-passes.md).
"""

from specc.passes.base import Pass, PassContext, PassError, PassResult
from specc.passes.bisector import BisectReport, bisect, outputs_match
from specc.passes.manager import PassManager, PassRecord, PipelineReport, order_passes, run_pipeline
from specc.passes.registry import (
    ENTRY_POINT_GROUP, PassInfo, PipelineError, as_pass, available_passes, get_pass, load_plugins, parse_pipeline,
    register_pass,
)

# Built-in passes register themselves on import.
from specc.passes import dce, fuse_gate_up, fuse_norm_linear, fuse_qkv, fuse_residual_add, fuse_rope_attention, pack_weights_12bit  # noqa: E402,F401  isort: skip
from specc.passes import shard_tensor_parallel  # noqa: E402,F401  isort: skip

__all__ = [
    "BisectReport", "ENTRY_POINT_GROUP", "Pass", "PassContext", "PassError", "PassInfo", "PassManager", "PassRecord",
    "PassResult", "PipelineError", "PipelineReport", "as_pass", "available_passes", "bisect", "get_pass",
    "load_plugins", "order_passes", "outputs_match", "parse_pipeline", "register_pass", "run_pipeline",
]
