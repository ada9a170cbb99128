"""The production loop is batch-shaped: B = 2 rows give, per row, the tokens of each prompt run
alone; and it is a separate implementation, not a subclass of the eager reference loop."""

import pytest
from helpers import PROMPT
from lossless import reference

from specc.pairing import resolve_pair
from specc.runtime.device_loop import DeviceSpeculativeDecoder
from specc.runtime.drafters import DRAFTERS, ARDraft, DFlashDraft, PardDraft
from specc.runtime.eager import EagerSpeculativeDecoder, build_eager
from specc.runtime.loop import SpeculativeLoop

OTHER = [7, 3, 30, 12, 1, 44, 6]  # same length as PROMPT


@pytest.mark.parametrize("method,drafter_key,num_draft", [("ar", None, 0), ("ar-draft", "ar_perturbed", 3),
                                                          ("pard", "pard_same", 4), ("ar-draft", "ar_same", 4)])
@pytest.mark.parametrize("cap", [True, False])
def test_two_rows_equal_each_prompt_alone(checkpoints, method, drafter_key, num_draft, cap):
    target = checkpoints["target"]
    eager = build_eager(resolve_pair(target, checkpoints.get(drafter_key), method), num_draft or None,
                        max_len=len(PROMPT) + 16)
    loop = DeviceSpeculativeDecoder(eager.target, eager.drafter, eager.num_draft, eager.max_len, cap_to_budget=cap)
    eos = reference(target, 16, prompt=OTHER)[5]  # row 1 stops early at an EOS: row 0 goes on alone
    rows = loop.generate_batch([PROMPT, OTHER], 16, (eos,))
    assert loop.state.lengths.shape == (2,) and loop.batch == 2
    assert rows[0].tokens == reference(target, 16, eos=eos, prompt=PROMPT)
    assert rows[1].tokens == reference(target, 16, eos=eos, prompt=OTHER)
    assert rows[1].finished_by == "eos"
    alone = loop.generate(PROMPT, 16, (eos,))  # back to one row
    assert loop.batch == 1 and alone.tokens == rows[0].tokens


def test_production_loop_does_not_subclass_the_eager_loop():
    assert not issubclass(DeviceSpeculativeDecoder, EagerSpeculativeDecoder)
    assert not issubclass(EagerSpeculativeDecoder, DeviceSpeculativeDecoder)
    assert issubclass(DeviceSpeculativeDecoder, SpeculativeLoop) and issubclass(EagerSpeculativeDecoder, SpeculativeLoop)


def test_drafter_registry():
    assert DRAFTERS == {"ar-draft": ARDraft, "pard": PardDraft, "dflash": DFlashDraft}
    step = object()
    assert PardDraft.from_manifest(step, {"pard_token": 3}).pard_token == 3
    assert ARDraft.from_manifest(step, {}).model is step
    with pytest.raises(ValueError, match="pard_token"):
        PardDraft.from_manifest(step, {})
