"""Blind means down, from the start and within three intervals: ``ibmon_source_up`` is 0 before a
source's first success (a hanging first discovery left no series at all) and as soon as a poll
has run three intervals, not at the poll's timeout (10 s at least)."""

from __future__ import annotations

import asyncio
import time

from ibmon.runtime.pipeline import OVERDUE_INTERVALS, Pipeline
from ibmon.runtime.selfmetrics import SelfMetrics
from ibmon.sources.diags import DiagsSourceConfig
from tests.unit.test_pipeline import FakeFabric


async def test_source_up_is_0_from_the_start_and_within_three_intervals_of_a_hang() -> None:
    metrics = SelfMetrics()
    p = Pipeline(DiagsSourceConfig(name="src", interval=0.2), metrics=metrics)
    up = metrics.registry.get_sample_value
    assert up("ibmon_source_up", {"source": "src"}) == 0  # before any poll
    src = FakeFabric()
    src.hang = True
    started = time.monotonic()
    poll = asyncio.create_task(p.poll(src))
    while up("ibmon_source_up", {"source": "src"}) != 0 or p.status.last_error is None:
        await asyncio.sleep(0.02)
        assert time.monotonic() - started < 5
    assert OVERDUE_INTERVALS * 0.2 <= time.monotonic() - started < p.timeout
    assert p.status.last_error.startswith("poll_overdue") and not p.status.up
    poll.cancel()
    await asyncio.gather(poll, return_exceptions=True)
    src.hang = False
    await p.poll(src)
    assert up("ibmon_source_up", {"source": "src"}) == 1
