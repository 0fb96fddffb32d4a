"""``ibmon_event_loop_lag_seconds``: a loop held by synchronous work is reported, in the daemon's
own exposition.

Not timed: the probe's reading of a stall is bounded below by the stall itself (it cannot wake
before the loop is free), so the assertions only use lower bounds.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from ibmon.runtime.looplag import LoopLagProbe
from ibmon.runtime.metrics import Registry


def _samples(registry: Registry) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in registry.samples():
        key = s.name + (f'{{le="{s.labels["le"]}"}}' if "le" in s.labels else "")
        out[key] = s.value
    return out


def _hold_the_loop(seconds: float) -> None:
    """Synchronous work on the loop's thread (tracking a large fabric, a full collection)."""
    time.sleep(seconds)


def test_a_blocked_loop_is_reported() -> None:
    registry = Registry()
    probe = LoopLagProbe(registry, period=0.01)

    async def main() -> None:
        task = asyncio.create_task(probe.run())
        await asyncio.sleep(0.05)  # the probe is sleeping on its timer
        _hold_the_loop(0.3)  # the probe's timer cannot fire before 0.3 s have passed
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    s = _samples(registry)
    count = s["ibmon_event_loop_lag_seconds_count"]
    assert count >= 2
    # exactly the wake-up that fell inside the stall is over 0.25 s; it is counted whole
    assert s['ibmon_event_loop_lag_seconds_bucket{le="0.25"}'] <= count - 1
    assert s["ibmon_event_loop_lag_seconds_sum"] >= 0.3 - 0.01
    text = registry.render().decode()
    assert "# TYPE ibmon_event_loop_lag_seconds histogram" in text
    assert 'ibmon_event_loop_lag_seconds_bucket{le="0.05"}' in text


def test_lag_is_measured_against_the_due_time() -> None:
    """With a clock that jumps while the probe sleeps, the lag is what is past the due time."""
    registry = Registry()
    now = [100.0]

    def clock() -> float:
        return now[0]

    probe = LoopLagProbe(registry, period=0.01, clock=clock)

    async def main() -> None:
        task = asyncio.create_task(probe.run())
        await asyncio.sleep(0)  # the probe reads the due time: 100.01
        now[0] = 100.01 + 0.07  # ... and wakes 70 ms late
        await asyncio.sleep(0.03)
        task.cancel()

    asyncio.run(main())
    s = _samples(registry)
    count = s["ibmon_event_loop_lag_seconds_count"]
    assert count >= 1
    # one wake-up 70 ms late; the later ones (the clock stands still) are on time
    assert count - s['ibmon_event_loop_lag_seconds_bucket{le="0.05"}'] == 1
    assert s['ibmon_event_loop_lag_seconds_bucket{le="0.1"}'] == count
    assert s["ibmon_event_loop_lag_seconds_sum"] == pytest.approx(0.07, abs=1e-9)


def test_period_must_be_positive() -> None:
    with pytest.raises(ValueError, match="period"):
        LoopLagProbe(Registry(), period=0)
