"""Source health in the pipeline: a source that cannot see says so, and what it cannot see stays.

The rules (``ibmon.runtime.pipeline``): a poll in which no port answered, or in which more than half
of the ports that answered the last successful poll did not, is a failed poll (``ibmon_source_up``
0, one ``source_failed`` edge), although what did answer is still tracked. A port that did not
answer keeps its last view, marked stale, with its totals and conditions and without rates; a
port the source no longer asks about leaves. After a failed poll the next one rediscovers.
"""

from __future__ import annotations

from typing import Any

import pytest

from ibmon.infiniband.model import (
    PortIdentity,
    PortKey,
    PortSample,
    Snapshot,
    SourceError,
    Topology,
)
from ibmon.runtime.pipeline import Pipeline
from ibmon.runtime.selfmetrics import SelfMetrics
from ibmon.sources.diags import DiagsSourceConfig

SRC = "fab"


def key(i: int) -> PortKey:
    return (f"0x{i:016x}", "1")


class Fabric:
    """``n`` ports whose data counters grow 1 GB/s; the test picks who answers and how."""

    def __init__(self, n: int) -> None:
        self.t = 100.0
        self.n = n
        self.words = 0
        self.silent: set[int] = set()  # asked, did not answer: a keyed SourceError
        self.gone: set[int] = set()  # not asked at all any more (topology dropped them)
        self.no_lid: set[int] = set()  # listed, nothing can be asked (no LID)
        self.partial: set[int] = set()  # answered, with an error about part of the answer
        self.hw_only: set[int] = set()  # only driver counters (sysfs ``hw_counters/``)
        self.state: dict[int, int] = {}
        self.wait: dict[int, int] = {}
        self.discovers = 0
        self.unreachable: frozenset[str] = frozenset()

    async def discover(self) -> Topology:
        self.discovers += 1
        return Topology(source=SRC, unreachable=self.unreachable)

    async def sample(self) -> Snapshot:
        snap = Snapshot(SRC, monotonic=self.t, wall=1.7e9 + self.t)
        for i in range(self.n):
            k = key(i)
            if i in self.gone:
                continue
            if i in self.silent:
                snap.errors.append(SourceError("timeout", f"{k[0]} port 1: PMA", k))
                continue
            ident = PortIdentity(guid=k[0], port="1", node_desc=f"node{i}", source=SRC)
            state = self.state.get(i, 4)
            counters: dict[str, int] = {} if i in self.no_lid else {
                "transmit_data": self.words, "receive_data": self.words,
                "transmit_wait": self.wait.get(i, 0), "link_downed": 0, "symbol_errors": 0,
            }
            if i in self.partial:
                snap.errors.append(SourceError("parse", f"{k[0]} port 1: one field", k))
            hw = {"out_of_buffer": self.words} if i in self.hw_only else {}
            if hw:
                counters = {}
            snap.ports[k] = PortSample(
                identity=ident, state=state, phys_state=5 if state == 4 else 2, rate_bps=100e9,
                counters=counters, wide=frozenset(counters), hw_counters=hw,
            )
        return snap

    async def close(self) -> None:
        return None

    def tick(self) -> None:
        self.t += 1.0
        self.words += 10**9 // 4


def make(tables: dict[str, Any] | None = None) -> tuple[Pipeline, list[float]]:
    now = [100.0]
    p = Pipeline(DiagsSourceConfig(name=SRC, interval=1.0, topology_interval=300.0),
                 metrics=SelfMetrics(), tables=tables, clock=lambda: now[0],
                 wall=lambda: 1.7e9 + now[0])
    return p, now


def metric(p: Pipeline, name: str, **labels: str) -> float | None:
    return p.metrics.registry.get_sample_value(name, {"source": SRC, **labels})


async def run(p: Pipeline, fab: Fabric, now: list[float], polls: int = 1) -> list[str]:
    """``polls`` polls one simulated second apart; the events as ``type:status`` strings."""
    out: list[str] = []
    for _ in range(polls):
        fab.tick()
        now[0] = fab.t
        out += [f"{e.type}:{e.status}" for e in await p.poll(fab)]
    return out


async def test_a_poll_in_which_no_port_answered_fails_and_every_port_stays_stale() -> None:
    fab = Fabric(4)
    p, now = make()
    await run(p, fab, now, 2)
    before = {k: dict(v.totals) for k, v in p.views.items()}
    assert all(v.symbol_error_ber == 0.0 for v in p.views.values())  # measured: no errors
    fab.silent = set(range(4))
    events = await run(p, fab, now)
    assert events == ["source_failed:firing"]
    assert metric(p, "ibmon_source_up") == 0
    assert p.status.last_error is not None and p.status.last_error.startswith("no_answer: ")
    assert metric(p, "ibmon_source_poll_errors_total", reason="no_answer") == 1
    assert metric(p, "ibmon_source_stale_ports") == 4
    assert metric(p, "ibmon_source_ports") == 0
    for k, v in p.views.items():
        assert v.stale and v.totals == before[k]
        assert v.rates == {} and v.utilization_tx is None and v.xmit_wait_ratio is None
        assert v.utilization_rx is None and v.symbol_error_ber is None  # nothing measured
    # Blind for a while: one edge, never a vanished port, last_success does not move.
    last = metric(p, "ibmon_source_last_success_timestamp_seconds")
    assert await run(p, fab, now, 5) == []
    assert len(p.views) == 4 and metric(p, "ibmon_source_last_success_timestamp_seconds") == last
    fab.silent = set()
    events = await run(p, fab, now)
    assert events == ["source_failed:resolved"]
    assert metric(p, "ibmon_source_up") == 1 and metric(p, "ibmon_source_stale_ports") == 0
    for k, v in p.views.items():
        assert not v.stale and v.totals["transmit_data"] > before[k]["transmit_data"]
    await run(p, fab, now)
    assert all(v.rates["transmit_data"] == pytest.approx(1e9) for v in p.views.values())


async def test_a_few_silent_ports_cost_only_themselves() -> None:
    fab = Fabric(4)
    p, now = make()
    await run(p, fab, now, 2)
    fab.silent = {1}
    assert await run(p, fab, now, 10) == []  # no vanished/appeared churn, no source_failed
    assert metric(p, "ibmon_source_up") == 1
    assert p.views[key(1)].stale and not p.views[key(0)].stale
    assert metric(p, "ibmon_source_stale_ports") == 1 and metric(p, "ibmon_source_ports") == 3
    fab.silent = set()
    assert await run(p, fab, now, 2) == []
    assert not p.views[key(1)].stale


async def test_most_ports_silent_is_a_failed_poll_that_still_tracks_what_answered() -> None:
    fab = Fabric(5)
    p, now = make()
    await run(p, fab, now, 2)
    fab.silent = {0, 1}  # 2 of 5: the source still sees most of its fabric
    assert await run(p, fab, now) == []
    fab.silent = {0, 1, 2}  # 3 of 5 that answered the last successful poll
    before = p.views[key(4)].totals["transmit_data"]
    assert await run(p, fab, now) == ["source_failed:firing"]
    assert p.status.last_error == (
        "ports_silent: 3 of 5 known ports did not answer"
    )
    assert p.views[key(4)].totals["transmit_data"] > before and not p.views[key(4)].stale
    # Measured against every port it knows, stale ones included: the bar does not sink.
    assert await run(p, fab, now) == []
    assert metric(p, "ibmon_source_up") == 0


async def test_the_bar_is_more_than_half_of_the_ports_that_ever_answered() -> None:
    fab = Fabric(4)
    p, now = make()
    await run(p, fab, now, 2)
    fab.silent = {0, 1}  # exactly half: half the fabric still answers
    assert await run(p, fab, now) == []
    # a port that answered with an error about part of its answer did answer
    fab.silent, fab.partial = {0}, {1, 2, 3}
    assert await run(p, fab, now) == []
    assert metric(p, "ibmon_source_up") == 1
    # ports that never answered (no LID yet) are not in the bar: 2 of the 3 that ever
    # answered are silent, although 2 of 7 listed ports is few
    listed = Fabric(7)
    listed.no_lid = {3, 4, 5, 6}
    q, qnow = make()
    await run(q, listed, qnow, 2)
    listed.silent = {0, 1}
    assert await run(q, listed, qnow) == ["source_failed:firing"]
    assert q.status.last_error == "ports_silent: 2 of 3 known ports did not answer"
    # nor are they silent when asked in vain: the 3 that ever answered all still do
    quiet = Fabric(7)
    quiet.no_lid = {3, 4, 5, 6}
    r, rnow = make()
    await run(r, quiet, rnow, 2)
    quiet.silent = {3, 4, 5, 6}
    assert await run(r, quiet, rnow) == []
    assert metric(r, "ibmon_source_up") == 1


async def test_ports_with_driver_counters_only_answered() -> None:
    fab = Fabric(2)
    fab.hw_only = {0, 1}  # a RoCE port whose ``counters/`` the driver leaves empty
    p, now = make()
    assert await run(p, fab, now, 3) == []
    assert metric(p, "ibmon_source_up") == 1
    assert all(v.hw_totals for v in p.views.values())


async def test_a_port_the_source_no_longer_asks_about_leaves() -> None:
    fab = Fabric(4)
    p, now = make()
    await run(p, fab, now, 2)
    fab.gone = {2, 3}  # topology dropped them: no error, no sample
    assert await run(p, fab, now, 2) == []
    assert set(p.views) == {key(0), key(1)} and metric(p, "ibmon_source_up") == 1
    events = await run(p, fab, now)
    assert events == ["topology_changed:firing"] * 2  # vanished after absent_polls (3)


async def test_ports_without_counters_only_is_blind_and_an_empty_source_is_not() -> None:
    fab = Fabric(3)
    p, now = make()
    await run(p, fab, now)
    fab.no_lid = {0, 1, 2}  # e.g. the fabric came back before a subnet manager gave LIDs
    assert await run(p, fab, now) == ["source_failed:firing"]
    assert "no LID" in (p.status.last_error or "")
    empty = Fabric(0)
    q, qnow = make()
    await run(q, empty, qnow, 2)
    assert metric(q, "ibmon_source_up") == 1


async def test_a_stale_port_keeps_its_conditions() -> None:
    fab = Fabric(2)
    p, now = make({"congestion": {"sustain": 1}})
    await run(p, fab, now, 2)
    fab.state[0] = 1
    fab.wait[1] = 0
    await run(p, fab, now)
    for _ in range(3):
        fab.wait[1] += int(0.8 * 100e9 / 8 / 8)  # 80 % of 1 s stalled, 8 bytes a count
        await run(p, fab, now)
    assert p.views[key(0)].conditions == {"down"}
    assert p.views[key(1)].conditions == {"congestion"}
    fab.silent = {0, 1}
    assert await run(p, fab, now, 3) == ["source_failed:firing"]
    assert p.views[key(0)].conditions == {"down"} and p.views[key(1)].conditions == {"congestion"}
    assert {a.type for a in p.active()} == {"port_down", "congestion"}


async def test_after_a_failed_poll_the_next_one_rediscovers() -> None:
    fab = Fabric(2)
    p, now = make()
    await run(p, fab, now, 3)
    assert fab.discovers == 1
    fab.silent = {0, 1}
    await run(p, fab, now)
    assert fab.discovers == 1
    await run(p, fab, now, 2)  # each poll after a failed one starts with a discovery
    assert fab.discovers == 3
    fab.silent = set()
    await run(p, fab, now, 3)
    assert fab.discovers == 4  # the poll after the last failure, then back to the schedule


async def test_unreachable_nodes_are_counted_at_each_discovery() -> None:
    fab = Fabric(2)
    fab.unreachable = frozenset({"0x00000000000000aa", "0x00000000000000bb"})
    p, now = make()
    await run(p, fab, now)
    assert metric(p, "ibmon_source_unreachable_nodes") == 2
    fab.unreachable = frozenset()
    now[0] += 400
    fab.t += 400
    await run(p, fab, now)
    assert metric(p, "ibmon_source_unreachable_nodes") == 0
