"""StepAudit counts what a speculative step costs besides its forwards: the loop's host reads of
device values (one per step by design: the step's outcome; two with two-level verification),
its blocking host -> device copies (none: they are queued) and its eager glue ops, with nothing
counted inside the step modules."""

import pytest
from ragged_helpers import PROMPTS, RowPattern, make_loop

from specc.bench.step_audit import StepAudit
from specc.runtime.batching import BatchScheduler


def _steady_step(loop, rows, budget=20, rule=None):
    """Counts of the third decode step of ``rows`` requests (prefills and first drafts done)."""
    loop.ragged_target = getattr(loop.ragged_target, "step", loop.ragged_target)  # no spy: it reads on the host
    scheduler = BatchScheduler(loop, rows, draft_length=rule)
    for prompt in PROMPTS[:rows]:
        scheduler.submit(prompt, budget)
    scheduler.admit()
    scheduler.decode()
    scheduler.decode()
    with StepAudit(loop) as audit:
        scheduler.decode()
    return audit


@pytest.mark.parametrize("rows", [1, 3])
def test_one_host_read_per_step_and_two_with_two_levels(checkpoints, rows):
    if "qwen3" not in checkpoints["target"]:
        pytest.skip("one family is enough")
    loop = make_loop(checkpoints, "pard", "const_target", "const_pard", 4)
    audit = _steady_step(loop, rows)
    assert audit.host_reads == 1 and audit.reads_by["tolist"] == 1
    assert audit.blocking_uploads == 0  # caps, live mask, drafter positions: queued uploads
    assert audit.forwards == 2  # one draft forward, one verify forward
    assert 0 < audit.glue_ops < 100 and audit.glue_seconds > 0
    loop = make_loop(checkpoints, "pard", "const_target", "const_pard", 4)
    loop.two_level_k1 = 2
    audit = _steady_step(loop, rows)
    assert loop.last_level2_rows  # this pair accepts its drafts: level 2 ran
    assert audit.host_reads == 2 and audit.forwards == 3 and audit.blocking_uploads == 0


def test_per_request_drafts_pack_without_a_blocking_upload(checkpoints):
    if "qwen3" not in checkpoints["target"]:
        pytest.skip("one family is enough")
    loop = make_loop(checkpoints, "pard", "const_target", "const_pard", 4)
    audit = _steady_step(loop, 3, rule=RowPattern([[4, 1, 2]]))
    assert audit.host_reads == 1 and audit.blocking_uploads == 0 and audit.forwards == 2


def test_a_blocking_upload_in_the_glue_is_counted(checkpoints, monkeypatch):
    import torch

    from specc.runtime import device_loop
    from specc.runtime.drafters import base, dflash, rows

    if "qwen3" not in checkpoints["target"]:
        pytest.skip("one family is enough")
    for module in (device_loop, base, dflash, rows):
        monkeypatch.setattr(module, "upload", lambda values, device: torch.tensor(values, device=device))
    audit = _steady_step(make_loop(checkpoints, "pard", "const_target", "const_pard", 4), 3)
    assert audit.blocking_uploads >= 1  # the drafter's positions, uploaded the blocking way


def test_a_host_read_in_the_glue_is_counted(checkpoints):
    if "qwen3" not in checkpoints["target"]:
        pytest.skip("one family is enough")
    loop = make_loop(checkpoints, "pard", "const_target", "const_pard", 4)
    verify = loop.verifier.verify

    def syncing(drafts, logits, caps=None, **kw):
        accepted, committed = verify(drafts, logits, caps, **kw)
        bool(accepted.sum() > 0)  # a stray host read, as a glue bug would add
        return accepted, committed

    loop.verifier.verify = syncing
    audit = _steady_step(loop, 3)
    assert audit.host_reads == 2 and audit.reads_by["__bool__"] == 1
