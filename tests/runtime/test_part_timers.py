"""The loop's per-part profiles: ``profile = True`` (``PartTimer``, synchronising) and
``profile = "events"`` (``EventTimer``: device time between events, host time on the CPU) time
the same parts, the event profile's parts add up to the run's time including ``between`` (the
host's work between steps), and profiling changes no token."""

from __future__ import annotations

import time

import pytest
from helpers import PROMPT

from specc.pairing import resolve_pair
from specc.runtime.device_loop import DeviceSpeculativeDecoder, EventTimer
from specc.runtime.eager import build_eager

@pytest.mark.parametrize("family", ["qwen3"], indirect=True)
def test_event_profile_adds_up_and_changes_nothing(checkpoints):
    eager = build_eager(resolve_pair(checkpoints["target"], checkpoints["dflash"], "dflash"), 3,
                        max_len=len(PROMPT) + 32)
    loop = DeviceSpeculativeDecoder(eager.target, eager.drafter, eager.num_draft, eager.max_len)
    plain = loop.generate(PROMPT, 17, ())
    assert loop.part_seconds == {}  # not profiling
    loop.profile = True
    synced = loop.generate(PROMPT, 17, ())
    synced_parts = loop.part_seconds
    loop.profile = "events"
    t0 = time.perf_counter()
    evented = loop.generate(PROMPT, 17, ())
    wall = time.perf_counter() - t0
    parts = loop.part_seconds
    assert plain.tokens == synced.tokens == evented.tokens
    assert {"prefill", "draft", "verify", "accept"} <= set(synced_parts) and "between" not in synced_parts
    assert set(parts) == set(synced_parts) | {"between"}
    assert all(v > 0 for v in parts.values())
    assert 0.5 * wall < sum(parts.values()) <= wall  # the parts tile the run from its first mark


def test_event_timer_sums_per_part():
    timer = EventTimer(__import__("torch").device("cpu"))
    for part in ("prefill", "draft", "verify", None, "draft", None):
        timer.mark(part)
    assert set(timer.parts) == {"prefill", "draft", "verify", "between"}
    assert timer.parts is timer.parts  # computed once until the next mark


@pytest.mark.parametrize("family", ["qwen3"], indirect=True)
def test_a_timer_class_as_profile_times_the_same_parts(checkpoints):
    """``profile`` may be a timer class (``device -> timer``): the loop builds it per run, marks
    the same parts on it, and ``part_seconds`` reports its parts."""
    eager = build_eager(resolve_pair(checkpoints["target"], checkpoints["dflash"], "dflash"), 3,
                        max_len=len(PROMPT) + 32)
    loop = DeviceSpeculativeDecoder(eager.target, eager.drafter, eager.num_draft, eager.max_len)
    marked = []

    class Recording(EventTimer):
        def mark(self, part):
            marked.append(part)
            super().mark(part)

    loop.profile = "events"
    evented = loop.generate(PROMPT, 17, ())
    event_parts = set(loop.part_seconds)
    loop.profile = Recording
    recorded = loop.generate(PROMPT, 17, ())
    assert recorded.tokens == evented.tokens
    assert set(loop.part_seconds) == event_parts and {p for p in marked if p} | {"between"} == event_parts
