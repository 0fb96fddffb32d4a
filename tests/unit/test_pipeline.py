"""The one poll pipeline: discovery schedule, health bookkeeping, stage timings, persistence,
the merged state, and what a port that is not Active shows."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ibmon.infiniband.model import PortIdentity, PortSample, Snapshot, Topology
from ibmon.runtime.pipeline import Pipeline, build_state
from ibmon.runtime.selfmetrics import SelfMetrics
from ibmon.sources.diags import DiagsSourceConfig
from ibmon.sources.sysfs import SysfsSourceConfig
from ibmon.track.tracker import Tracker

GUID = "0x0002c90300a1b2c3"


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class FakeFabric:
    """One port whose counters and state the test sets; counts discover() calls."""

    def __init__(self, name: str = "src", clock: Clock | None = None) -> None:
        self.name = name
        self.clock = clock or Clock()
        self.discovers = 0
        self.state = 4
        self.words = 0
        self.wait = 0
        self.raise_: BaseException | None = None
        self.hang = False

    async def discover(self) -> Topology:
        self.discovers += 1
        return Topology(source=self.name)

    async def sample(self) -> Snapshot:
        if self.raise_ is not None:
            raise self.raise_
        if self.hang:
            await asyncio.Event().wait()
        ident = PortIdentity(guid=GUID, port="1", node_desc="host1", source=self.name)
        sample = PortSample(
            identity=ident, state=self.state, phys_state=5 if self.state == 4 else 2,
            rate_bps=100e9,
            counters={"transmit_data": self.words, "receive_data": self.words,
                      "transmit_wait": self.wait, "link_downed": 0},
            wide=frozenset({"transmit_data", "receive_data", "transmit_wait"}),
        )
        t = self.clock.t
        return Snapshot(self.name, monotonic=t, wall=1.7e9 + t, ports={ident.key: sample})

    async def close(self) -> None:
        return None


def pipeline(cfg: Any = None, clock: Clock | None = None, **kw: Any) -> Pipeline:
    clock = clock or Clock()
    return Pipeline(cfg or SysfsSourceConfig(name="src", interval=1.0), metrics=SelfMetrics(),
                    clock=clock, wall=lambda: 1.7e9 + clock.t, **kw)


def metric(p: Pipeline, name: str, **labels: str) -> float | None:
    return p.metrics.registry.get_sample_value(name, labels)


async def test_a_poll_tracks_detects_and_keeps_health() -> None:
    clock = Clock()
    src = FakeFabric(clock=clock)
    p = pipeline(clock=clock)
    assert await p.poll(src) == []
    clock.t += 1
    src.words += 10**9 // 4
    await p.poll(src)
    view = p.views[(GUID, "1")]
    assert view.rates["transmit_data"] == pytest.approx(1e9)
    assert view.utilization_tx == pytest.approx(1e9 / 12.5e9)
    assert p.status.up and p.status.ports == 1 and p.status.last_success == 1.7e9 + 101
    assert p.error is None and p.sampled_at == 101
    assert metric(p, "ibmon_source_up", source="src") == 1
    assert metric(p, "ibmon_source_ports", source="src") == 1
    for stage in ("sample", "track", "detect"):
        assert metric(p, "ibmon_pipeline_stage_seconds_count", source="src", stage=stage) == 2
    p.observe_publish(0.01)
    assert metric(p, "ibmon_pipeline_stage_seconds_count", source="src", stage="publish") == 1


async def test_discovery_on_the_first_poll_of_each_source_object_then_when_due() -> None:
    clock = Clock()
    p = pipeline(DiagsSourceConfig(name="src", interval=10.0, topology_interval=300.0),
                 clock=clock)
    src = FakeFabric(clock=clock)
    for _ in range(3):
        await p.poll(src)
        clock.t += 10
    assert src.discovers == 1
    clock.t += 300
    await p.poll(src)
    assert src.discovers == 2
    again = FakeFabric(clock=clock)  # a reload builds a new source object: it needs discovery
    await p.poll(again)
    assert again.discovers == 1


async def test_a_failing_source_is_a_failed_poll_and_its_ports_stay() -> None:
    clock = Clock()
    src = FakeFabric(clock=clock)
    p = pipeline(clock=clock, tables={"source_failed": {"after": 1}})
    await p.poll(src)
    good = p.status.last_success
    assert good is not None
    src.raise_ = OSError("cannot open MAD port")
    clock.t += 1.0
    events = await p.poll(src)
    assert [(e.type, e.status) for e in events] == [("source_failed", "firing")]
    assert await p.poll(src) == []  # an edge, not one event per failed poll
    assert p.error == "cannot open MAD port"
    assert not p.status.up and p.status.last_error == "poll_failed: cannot open MAD port"
    assert p.status.ports == 1 and (GUID, "1") in p.views and p.views[(GUID, "1")].stale
    assert p.status.last_success == good  # when it last answered, for the API and the alert
    assert metric(p, "ibmon_source_up", source="src") == 0
    # the port stays, stale: none answered this poll
    assert metric(p, "ibmon_source_ports", source="src") == 0
    assert metric(p, "ibmon_source_stale_ports", source="src") == 1
    assert metric(p, "ibmon_source_poll_errors_total", source="src", reason="poll_failed") == 2
    src.raise_ = None
    events = await p.poll(src)
    assert [(e.type, e.status) for e in events] == [("source_failed", "resolved")]
    assert p.error is None and p.status.up


async def test_a_hung_source_times_out_but_its_own_timeout_error_is_a_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("ibmon.runtime.polltime.MIN_POLL_TIMEOUT", 0.05)
    src = FakeFabric()
    p = pipeline(SysfsSourceConfig(name="src", interval=0.001))
    src.hang = True
    await p.poll(src)
    assert p.status.last_error == "poll_timeout: poll took over 0s"
    src.hang = False
    src.raise_ = TimeoutError("perfquery timed out")
    await p.poll(src)
    assert p.status.last_error == "poll_failed: perfquery timed out"


async def test_first_configured_source_wins_a_shared_port() -> None:
    clock = Clock()
    first, second = pipeline(clock=clock), pipeline(SysfsSourceConfig(name="other"), clock=clock)
    await first.poll(FakeFabric("src", clock))
    await second.poll(FakeFabric("other", clock))
    state = build_state([second, first])
    assert state.ports[(GUID, "1")].identity.source == "other"
    assert list(state.sources) == ["other", "src"]
    assert build_state([first, second]).ports[(GUID, "1")].identity.source == "src"


async def test_dump_and_load_carry_totals_and_conditions() -> None:
    clock = Clock()
    src = FakeFabric(clock=clock)
    p = pipeline(clock=clock)
    await p.poll(src)
    clock.t += 1
    src.state = 1  # was Active, now down: port_down fires
    await p.poll(src)
    assert [a.type for a in p.active()] == ["port_down"]
    saved = p.dump()
    fresh = pipeline(clock=clock)
    fresh.load(saved)
    assert [a.type for a in fresh.active()] == ["port_down"]
    clock.t += 1
    assert await fresh.poll(src) == []  # still down: nothing re-announced
    broken = pipeline(clock=clock)
    with pytest.raises(ValueError, match="engine state"):
        broken.load({**saved, "engine": {"version": 99}})
    assert len(broken.tracker) == 1  # the usable part (totals) was restored anyway


async def test_retune_keeps_what_fires() -> None:
    clock = Clock()
    src = FakeFabric(clock=clock)
    p = pipeline(clock=clock)
    await p.poll(src)
    clock.t += 1
    src.state = 1
    await p.poll(src)
    p.retune({"congestion": {"warning": 0.2}})
    clock.t += 1
    assert await p.poll(src) == []
    assert [a.type for a in p.active()] == ["port_down"]


def test_a_port_that_is_not_active_has_no_rates_but_keeps_counting() -> None:
    tracker = Tracker()

    def snap(t: float, state: int, words: int, wait: int) -> Snapshot:
        ident = PortIdentity(guid=GUID, port="1")
        return Snapshot("s", t, t, {ident.key: PortSample(
            ident, state=state, rate_bps=100e9,
            counters={"transmit_data": words, "receive_data": words, "transmit_wait": wait},
            wide=frozenset({"transmit_data", "receive_data", "transmit_wait"}))})

    tracker.update(snap(0.0, 4, 0, 0))
    busy = tracker.update(snap(1.0, 4, 10**9, 5 * 10**6))[(GUID, "1")]
    assert busy.utilization_tx and busy.xmit_wait_ratio and busy.rate_bytes_per_second
    for state in (1, 2, 3):  # DOWN, INIT, ARMED
        down = tracker.update(snap(2.0 + state, state, 2 * 10**9, 6 * 10**6))[(GUID, "1")]
        assert down.rates == {} and down.hw_rates == {}
        assert down.utilization_tx is None and down.utilization_rx is None
        assert down.xmit_wait_ratio is None and down.rate_bytes_per_second is None
        assert down.totals["transmit_data"] == 8 * 10**9
    back = tracker.update(snap(6.0, 4, 2 * 10**9, 6 * 10**6))[(GUID, "1")]
    assert back.rates["transmit_data"] == 0.0 and back.utilization_tx == 0.0
    unknown = tracker.update(snap(7.0, None, 2 * 10**9, 6 * 10**6))[(GUID, "1")]  # type: ignore[arg-type]
    assert unknown.rates  # a source that cannot tell the state: rates as usual


def test_a_reset_a_saturation_or_a_new_key_asks_for_a_save_before_publishing() -> None:
    """What a crash right after the poll would lose: a reset's carried-over total, a pinned
    counter, the totals' new key once a GUID arrives. Each asks the daemon to save before it
    publishes (``save_due``); a plain poll does not."""
    p = pipeline()
    t = [0.0]

    def poll(guid: str, counters: dict[str, int], renamed: dict[Any, Any] | None = None) -> None:
        t[0] += 1.0
        ident = PortIdentity(guid=guid, port="1", node_desc="host1", source="src")
        sample = PortSample(identity=ident, state=4, phys_state=5, rate_bps=100e9,
                            counters=counters, wide=frozenset({"transmit_data"}))
        snap = Snapshot("src", monotonic=t[0], wall=1.7e9 + t[0], ports={ident.key: sample},
                        renamed=renamed or {})
        p.save_due = False
        p.ingest(snap)

    poll("", {"transmit_data": 100, "link_downed": 1})
    poll("", {"transmit_data": 200, "link_downed": 1})
    assert not p.save_due
    poll("", {"transmit_data": 50, "link_downed": 1})  # reset
    assert p.save_due
    poll("", {"transmit_data": 60, "link_downed": 255})  # link_downed pinned at 8 bits
    assert p.save_due
    poll("", {"transmit_data": 70, "link_downed": 255})
    assert not p.save_due
    poll(GUID, {"transmit_data": 80, "link_downed": 255}, renamed={("", "1"): (GUID, "1")})
    assert p.save_due and p.views[(GUID, "1")].totals["transmit_data"] > 80 * 4


def test_a_corrupt_part_of_the_saved_state_costs_only_that_part() -> None:
    """Totals that cannot be restored do not take the active conditions with them: the
    restart re-announces nothing it had announced."""
    from ibmon.detect.engine import Engine
    from tests.detect_views import view

    engine = Engine()
    for t in range(3):
        v = view(xmit_wait_ratio=0.3)
        engine.process({v.key: v}, monotonic=t, wall=1e9 + t)
    p = pipeline()
    with pytest.raises(ValueError, match=r"tracker|state"):
        p.load({"tracker": {"version": 99}, "engine": engine.dump()})
    assert [a.type for a in p.active()] == ["congestion"]
