"""Detection latency: a fault is reported no later than the detector's sustain count plus one
poll after its counters cross the threshold (simulated fabric, simulated clock)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from ibmon.detect.engine import Engine
from ibmon.sources.mock import MockSource
from ibmon.track.tracker import Tracker
from mocks.scenario import ManualClock
from mocks.topology import fat_tree
from mocks.traffic import FabricModel

Fault = Callable[[FabricModel, tuple[str, int]], None]


def first_firing(fault: Fault, kind: str, *, interval: float, t0: float = 60.0,
                 tables: dict[str, Any] | None = None, until: float = 400.0) -> float:
    """Simulated time of the first ``kind`` firing event after ``fault`` is applied at t0."""
    model = FabricModel(fat_tree(levels=2, radix=8, leaves=2, hosts_per_leaf=4), seed=3)
    key = (model.fabric.node_by_desc("host003 mlx5_0").guid, 1)
    clock = ManualClock()
    source = MockSource(model=model, clock=clock)
    tracker, engine = Tracker(), Engine(tables)

    async def run() -> float:
        t = 0.0
        applied = False
        while t <= until:
            if not applied and t >= t0:
                model.advance_to(t0)
                fault(model, key)
                applied = True
            clock.t = t
            snap = await source.sample()
            for ev in engine.process(tracker.update(snap), monotonic=t, wall=1e9 + t):
                # a link fault is raised once per link, on its switch end: either end counts
                ends = {ev.port.guid if ev.port else None, ev.peer.guid if ev.peer else None}
                if ev.type == kind and ev.status == "firing" and key[0] in ends:
                    return t
            t += interval
        raise AssertionError(f"{kind} never fired")

    return asyncio.run(run())


@pytest.mark.parametrize("interval", [1.0, 10.0])
@pytest.mark.parametrize("sustain", [1, 3, 5])
def test_congestion_within_sustain_plus_one_poll(interval: float, sustain: int) -> None:
    fired = first_firing(
        lambda m, k: m.congest(k, wait_ratio=0.3, utilization=0.5), "congestion",
        interval=interval, tables={"congestion": {"sustain": sustain}})
    # The first poll after the fault sees the ratio over the threshold (counters cross there).
    crossed = 60.0 + interval
    assert crossed <= fired <= crossed + (sustain + 1) * interval
    assert fired >= crossed + (sustain - 1) * interval  # and not before it is sustained


@pytest.mark.parametrize(("fault", "kind"), [
    (lambda m, k: m.link_down(k), "port_down"),
    (lambda m, k: m.set_error_rate(k, "receive_errors", 50), "receive_errors"),
    (lambda m, k: m.set_error_rate(k, "transmit_discards", 500), "discards"),
    (lambda m, k: m.bump(k, "local_link_integrity_errors"), "link_integrity"),
    (lambda m, k: m.degrade(k, width="1X"), "link_degraded"),
    (lambda m, k: m.set_ber(k, 1e-9), "high_ber"),
])
@pytest.mark.parametrize("interval", [1.0, 10.0])
def test_instant_detectors_within_one_poll(fault: Fault, kind: str, interval: float) -> None:
    fired = first_firing(fault, kind, interval=interval)
    assert fired <= 60.0 + 2 * interval  # sustain 0/1: the next poll, plus one
