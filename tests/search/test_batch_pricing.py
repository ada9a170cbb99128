"""The cost model's step-time curve T(B, k) (specc.search.batch_pricing) drives the runtime's
goodput rule: at Qwen3-8B + DFlash shapes on an H200 deployment it grows with the batch and the
drafts, and the rule picks fewer drafts where verification turns compute-bound."""

from specc.runtime.adaptive import GoodputDraftLength
from specc.search.batch_pricing import step_seconds
from specc.search.cost_model import CostModel
from specc.search.deployments import get_deployment


def test_step_time_curve_and_the_goodput_choice(meta8b):
    t_ir, d_ir = meta8b.irs("")
    seconds = step_seconds(CostModel(get_deployment("h200-bs1")), t_ir, d_ir, "dflash", context=1024)
    assert seconds(1, 0) < seconds(1, 15) and seconds(1, 15) < seconds(32, 15) and seconds(32, 4) < seconds(32, 15)
    rule = GoodputDraftLength(seconds, 15)
    # bs1 is memory-bound: verifying 16 tokens costs about one AR step, so a good drafter drafts them all
    assert rule.choose([0.85], [100], 1) == 15
    # 32 rows verifying 16 tokens each is compute-bound: the same acceptance drafts fewer
    k32 = rule.choose([0.85] * 32, [100] * 32, 32)
    assert 0 < k32 < 15
    # a drafter that is almost never right is not worth a single draft at batch 32
    assert rule.choose([0.02] * 32, [100] * 32, 32) == 0
