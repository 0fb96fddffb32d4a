"""``PortDetector.needs`` only leaves out ports whose verdict it knows.

Each detector skips the ports it can judge without ``check`` (nearly all of a healthy fabric's)
and must apply the same side effects ``check`` would have (window values, the BER gauge). The
attack: scenarios played through two pipelines on the same clock, one with the shortcuts and
one where every detector checks every port, compared on every poll: the events, each port's
conditions, causes and BER, and at the end every detector's persisted state. Four scenarios
raise every fault kind the detectors judge: ``demo`` (hotspot, BER warning then critical, a
flap, a degraded link, backpressure, receive errors, a counter reset), ``link-errors`` (a BER
ramp, discards, integrity errors), ``flap`` (flaps and a link down for minutes) and
``saturation``; the first three with ports that do not answer now and then (stale views: no
vote, no verdict), where link faults are judged from one end. The other shipped scenarios
repeat these fault kinds (a test below keeps it so). All four are played with the column store
(how a fabric is polled); port by port (a node's few ports) all but ``flap``, whose events
(a flap, a port down) ``demo`` raises too: the shortcuts' port-by-port reads differ from the
column store's in how a counter is fetched, not in what is judged, so one scenario per kind of
event is enough there.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from ibmon.detect.base import Pairs
from ibmon.infiniband.model import PortKey, Snapshot, SourceError
from ibmon.runtime import sizes
from ibmon.runtime.pipeline import Pipeline
from ibmon.runtime.selfmetrics import SelfMetrics
from ibmon.sources.mock import MockSource, MockSourceConfig
from mocks.scenario import ManualClock, list_scenarios, load_scenario

#: Simulated seconds played at 2 s polls (every shipped scenario's faults start and end
#: within them; the answer keys' 1 s polls would double the time for no other path), then
#: 30 s polls to the end (windows and holds expiring).
FINE = 900.0
STEP = 2.0


def _every_port(fresh: Pairs, now: float, active: Any) -> Pairs:
    return fresh


def _pipeline(interval: float) -> Pipeline:
    return Pipeline(MockSourceConfig(name="mock", interval=interval), metrics=SelfMetrics(),
                    fabric="test")


class _Silencing:
    """``source``, with a different ninth of its ports not answering every third poll (a
    ``SourceError`` naming each: the pipeline keeps their last views, stale)."""

    def __init__(self, source: MockSource) -> None:
        self.source = source
        self.polls = 0

    async def sample(self) -> Snapshot:
        snap = await self.source.sample()
        self.polls += 1
        if self.polls % 3 == 0:
            for i, key in enumerate(list(snap.ports)):
                if i % 9 == self.polls % 9:
                    del snap.ports[key]
                    snap.errors.append(SourceError("timeout", "test: not answering", key))
        return snap

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)


def _judged(pipeline: Pipeline) -> dict[PortKey, tuple[Any, ...]]:
    return {
        key: (view.symbol_error_ber, sorted(view.conditions), view.causes)
        for key, view in pipeline.views.items()
    }


CASES = [("demo", True), ("link-errors", True), ("flap", True), ("saturation", False)]
#: The two ways the shortcuts read counters: gathered from the tracker's column store
#: (``ibmon.detect.columns``, a fabric-sized poll) and port by port (a node-sized one).
STORES = {"column-store": [name for name, _ in CASES],
          "per-port": ["demo", "link-errors", "saturation"]}


@pytest.mark.parametrize(
    ("store", "name", "silent"),
    [(store, name, silent) for store, names in STORES.items()
     for name, silent in CASES if name in names],
)
def test_detectors_judge_alike_with_and_without_their_shortcuts(
    store: str, name: str, silent: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sizes, "OFFLOAD_PORTS", 1 if store == "column-store" else 1 << 62)
    sc = load_scenario(name)
    clock = ManualClock()
    fast_mock = MockSource.from_scenario(name, clock=clock)
    slow_mock = MockSource.from_scenario(name, clock=clock)
    slow_mock.epoch = fast_mock.epoch  # the same wall clock: the same event times and ids
    fast_source: Any = _Silencing(fast_mock) if silent else fast_mock
    slow_source: Any = _Silencing(slow_mock) if silent else slow_mock
    fast = _pipeline(STEP)
    slow = _pipeline(STEP)
    for det in slow.engine.detectors:
        det.needs = _every_port  # type: ignore[method-assign]
    events = stale = 0

    async def run() -> None:
        nonlocal events, stale
        t = 0.0
        while t <= sc.duration:
            clock.t = t
            got = [e.model_dump() for e in await fast.poll(fast_source)]
            want = [e.model_dump() for e in await slow.poll(slow_source)]
            assert got == want, f"t={t}"
            assert _judged(fast) == _judged(slow), f"t={t}"
            events += len(got)
            stale += sum(v.stale for v in fast.views.values())
            t = round(t + (STEP if t < FINE else 30.0), 6)

    asyncio.run(run())
    dumped = fast.engine.dump(), slow.engine.dump()
    assert json.dumps(dumped[0], sort_keys=True) == json.dumps(dumped[1], sort_keys=True)
    assert events >= len(sc.expect)  # the faults happened: there was something to judge
    assert (stale > 0) == silent


def test_the_cases_raise_every_fault_and_event_kind_of_the_shipped_scenarios() -> None:
    """A shipped scenario with a new fault or event kind joins ``CASES`` (else the shortcuts
    of its detector go unchecked here), and one with a new event kind is played port by port."""

    def kinds(names: list[str]) -> tuple[set[str], set[str]]:
        scenarios = [load_scenario(n) for n in names]
        return ({e.fault for sc in scenarios for e in sc.timeline},
                {x.type for sc in scenarios for x in sc.expect})

    shipped = kinds(list_scenarios())
    played = kinds(STORES["column-store"])
    assert played[0] >= shipped[0], f"faults not played: {shipped[0] - played[0]}"
    assert played[1] >= shipped[1], f"events not played: {shipped[1] - played[1]}"
    per_port = kinds(STORES["per-port"])[1]
    assert per_port >= shipped[1], f"events not played port by port: {shipped[1] - per_port}"


def test_the_shortcuts_leave_out_the_ports_of_a_healthy_fabric() -> None:
    """Not a speed test: that the fast path is taken at all (else the above proves little)."""
    clock = ManualClock()
    source = MockSource.from_scenario("healthy", clock=clock)
    pipeline = _pipeline(1.0)
    asked: dict[str, int] = {}
    for det in pipeline.engine.detectors:
        def counted(fresh: Pairs, now: float, active: Any, det: Any = det,
                    needs: Any = det.needs) -> Pairs:
            out: Pairs = needs(fresh, now, active)
            asked[det.type] = len(out)
            return out
        det.needs = counted  # type: ignore[method-assign]

    async def run() -> None:
        for t in range(4):
            clock.t = float(t)
            await pipeline.poll(source)

    asyncio.run(run())
    ports = len(pipeline.views)
    assert ports > 200
    assert set(asked) == {d.type for d in pipeline.engine.detectors}
    assert all(n < ports // 10 for n in asked.values()), asked
