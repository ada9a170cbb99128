"""pack_weights_12bit on the target's steps only (the drafter keeps bf16): a bench probe."""
from specc.passes.pack_weights_12bit import PackWeights12bit


class PackTargetOnly(PackWeights12bit):
    def requires(self, ir):
        if ir.step == "draft":
            return "drafter left unpacked"
        return super().requires(ir)
