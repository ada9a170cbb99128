"""Step functions to run passes on: a target's verify step (plain and capturing hidden states for
DFlash), a PARD drafter's and a DFlash drafter's draft step, each with inputs and the model whose
eager forward is the reference."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from specc.ir import IR, bind_dflash, trace
from specc.ir.testing import run_step
from specc.models import load_model


@dataclasses.dataclass
class Step:
    name: str
    model: torch.nn.Module
    step: str
    inputs: tuple
    num_layers: int

    def trace(self) -> IR:
        return trace(self.model, self.step)

    def expected(self):
        return run_step(self.model, self.inputs)


def _ids(ids, start):
    t = torch.tensor([ids])
    return t, torch.arange(start, start + t.shape[1])[None], torch.tensor([start])



@pytest.fixture(scope="session")
def steps(checkpoints) -> dict[str, Step]:
    target = load_model(checkpoints["target"], with_tokenizer=False).model
    target.setup_caches(1, 32)
    capturing = load_model(checkpoints["target"], with_tokenizer=False).model
    capturing.setup_caches(1, 32)
    draft = load_model(checkpoints["dflash"], with_tokenizer=False).model
    draft.setup_caches(1, 32)
    capturing.capture_layers = tuple(draft.spec.target_layer_ids)
    pard = load_model(checkpoints["pard_same"], with_tokenizer=False)
    pard.model.setup_caches(1, 32)
    b = draft.spec.block_size
    hidden = torch.randn(1, 3, len(draft.spec.target_layer_ids) * draft.config.hidden_size,
                         generator=torch.Generator().manual_seed(0))
    dflash_inputs = (torch.tensor([[8] + [draft.spec.mask_token_id] * (b - 1)]), hidden,
                     torch.arange(0, 3 + b)[None], torch.tensor([0]))
    n = target.config.num_layers
    return {
        "verify": Step("verify", target, "verify", _ids([5, 17, 33, 2, 8, 9, 41], 0), n),
        "verify_capture": Step("verify_capture", capturing, "verify", _ids([5, 17, 33, 2, 8], 0), n),
        "pard_draft": Step("pard_draft", pard.model, "draft", _ids([5, 17, 33] + [pard.pard_token] * 3, 0), n),
        "dflash_draft": Step("dflash_draft", bind_dflash(target, draft), "draft", dflash_inputs, draft.config.num_layers),
    }


def compare_after(step: Step, pipeline) -> tuple[IR, object]:
    """Trace, apply ``pipeline`` with checking on, return (ir, report) after asserting the
    outputs are unchanged."""
    from specc.ir.testing import assert_same_outputs
    from specc.passes import PassManager

    expected = step.expected()
    ir = step.trace()
    report = PassManager(pipeline, check=True).run(ir)
    assert_same_outputs(expected, run_step(ir, step.inputs), context=f"{step.name} after {pipeline}")
    return ir, report



@pytest.fixture
def apply_checked():
    """``apply_checked(step, pipeline) -> (ir, report)``, asserting outputs are unchanged."""
    return compare_after
