"""Congestion: sustain, hysteresis, escalation, hotspot versus backpressure, RoCE."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from detect_views import GUID, PEER, link, view

from ibmon.detect.engine import Engine
from ibmon.detect.events import Event
from ibmon.infiniband.model import LinkInfo
from tests.detect_settings import TABLE_IDS, TABLES, above, below, settings_for


def run(engine: Engine, ratios: list[float | None], util: float | None = 0.9,
        **extra: object) -> list[tuple[int, Event]]:
    out: list[tuple[int, Event]] = []
    for t, r in enumerate(ratios):
        v = view(xmit_wait_ratio=r, utilization_tx=util, **extra)  # type: ignore[arg-type]
        out += [(t, e) for e in engine.process({v.key: v}, monotonic=t, wall=1e9 + t)]
    return out


def test_fires_after_three_polls_once_and_clears_after_three_quiet_polls() -> None:
    engine = Engine()
    evs = run(engine, [0.0, 0.2, 0.2, 0.2, 0.2, 0.2, 0.07, 0.04, 0.04, 0.2, 0.04, 0.04, 0.04])
    assert [(t, e.status, e.severity) for t, e in evs] == [
        (3, "firing", "warning"),
        (12, "resolved", "warning"),  # 0.07 is inside the hysteresis band; 0.2 restarts the count
    ]
    assert evs[0][1].value == pytest.approx(0.2)
    assert evs[0][1].threshold == pytest.approx(0.10)


def test_two_polls_above_is_not_congestion() -> None:
    assert run(Engine(), [0.3, 0.3, 0.0, 0.3, 0.3, 0.0] * 5) == []


def test_escalation_is_one_more_firing_event_and_never_de_escalates() -> None:
    evs = run(Engine(), [0.2] * 3 + [0.6] * 3 + [0.2] * 5 + [0.6] * 3 + [0.0] * 3)
    assert [(t, e.status, e.severity) for t, e in evs] == [
        (2, "firing", "warning"),
        (5, "firing", "critical"),
        (16, "resolved", "critical"),
    ]
    assert evs[1][1].details["escalated"] is True
    # each edge names the level it crossed (an alert shows "stalled 60 %, critical at 50 %")
    assert [e.threshold for _, e in evs[:2]] == [pytest.approx(0.10), pytest.approx(0.50)]


def test_crossing_both_levels_at_once_fires_once_at_critical() -> None:
    evs = run(Engine(), [0.8] * 5)
    assert [(e.status, e.severity) for _, e in evs] == [("firing", "critical")]


@pytest.mark.parametrize(("util", "kind"), [(0.94, "hotspot"), (0.03, "backpressure")])
def test_event_says_hotspot_or_backpressure(util: float, kind: str) -> None:
    (_, ev), = run(Engine(), [0.38] * 3, util=util)
    assert ev.details["kind"] == kind
    assert kind in ev.message
    assert "38 % of the time stalled" in ev.message
    assert ev.details["utilization"] == pytest.approx(util)
    assert ev.port is not None
    assert ev.port.node_desc == "host042 mlx5_0"


def test_a_congestion_event_says_what_the_far_end_shows() -> None:
    engine = Engine()
    back = LinkInfo(remote_guid=GUID, remote_port="1", remote_node_desc="host042 mlx5_0",
                    active_width="4X", active_speed="EDR", max_width="4X", max_speed="EDR")
    evs: list[Event] = []
    for t in range(3):
        here = view(xmit_wait_ratio=0.38, utilization_tx=0.9, link=link())
        far = view("12", guid=PEER, node_desc="leaf03", link=back, stale=t > 0)
        evs += engine.process({here.key: here, far.key: far}, monotonic=t, wall=1e9 + t)
    (ev,) = [e for e in evs if e.type == "congestion"]
    assert ev.message.endswith("; the far end does not answer")
    assert ev.details["peer_shows"]["stale"] is True


@pytest.mark.parametrize(("util", "trained", "port", "cause"), [
    (0.9, {}, {}, "unknown"),  # a healthy link with too much traffic: nothing is broken
    (0.9, {"width": "1X"}, {}, "speed_negotiation"),  # a hotspot because it trained narrow
    (0.9, {"speed": "FDR", "max_speed": "EDR"}, {}, "speed_negotiation"),  # ... or slow
    # the link knows its best but not what it runs at: the port's own width or speed says
    (0.9, {"width": ""}, {"active_width": "1X"}, "speed_negotiation"),
    (0.9, {"speed": ""}, {"active_speed": "FDR"}, "speed_negotiation"),
    (0.9, {"width": ""}, {"active_width": "4X"}, "unknown"),
    (0.05, {"width": "1X"}, {}, "congestion_victim"),  # blocked further along, whatever its rate
])
def test_a_hotspot_on_a_link_that_trained_below_its_best_blames_the_training(
        util: float, trained: dict[str, str], port: dict[str, str], cause: str) -> None:
    evs = run(Engine(), [0.38] * 3, util=util, link=link(**trained), **port)
    (ev,) = [e for _, e in evs if e.type == "congestion"]
    assert ev.details["cause"] == cause
    if cause == "unknown":  # nothing to repair: the action is to move traffic
        assert ev.details["action"].startswith("Too much traffic is routed over host042 mlx5_0 "
                                               "port 1 towards leaf03 port 12: rebalance")
        assert "too much traffic for this link" in ev.message


@pytest.mark.parametrize("trained", [{}, {"width": "1X"}])
def test_unknown_utilization_is_neither_hotspot_nor_backpressure(trained: dict[str, str]) -> None:
    """A port whose data counters give no rate (a pinned 32-bit PortXmitData) may be the
    hotspot or blocked further along: the event says it cannot tell, and how to."""
    evs = run(Engine(), [0.38] * 3, util=None, link=link(**trained))
    (ev,) = [e for _, e in evs if e.type == "congestion"]
    assert ev.details["kind"] == "unknown"
    assert ev.details["utilization"] is None
    assert ev.details["cause"] == "unknown"
    assert "is congested (utilization unknown, 38 % of the time stalled): whether" in ev.message
    assert "hotspot or blocked further along cannot be told" in ev.message
    assert ev.details["action"].startswith("Compare the transmit rate of host042 mlx5_0 port 1 "
                                           "with its link rate")
    assert "look past leaf03 port 12 for the hotspot" in ev.details["action"]


def test_missing_ratio_keeps_the_condition() -> None:
    """A saturated PortXmitWait gives no ratio: no resolve, no re-fire."""
    evs = run(Engine(), [0.3] * 3 + [None] * 10 + [0.3] * 2)
    assert [(t, e.status) for t, e in evs] == [(2, "firing")]


def test_conditions_are_set_on_the_view_while_firing() -> None:
    engine = Engine()
    for t in range(3):
        v = view(xmit_wait_ratio=0.3, utilization_tx=0.5)
        engine.process({v.key: v}, monotonic=t, wall=t)
    assert v.conditions == frozenset({"congestion"})
    for t in range(3, 6):
        v = view(xmit_wait_ratio=0.0)
        engine.process({v.key: v}, monotonic=t, wall=t)
    assert v.conditions == frozenset()


@pytest.mark.parametrize("rates", [
    {"rp_cnp_handled": 5000.0},
    # a reaction point that handles few CNPs while its notification point marks many: the
    # larger of the two signals is the congestion
    {"rp_cnp_handled": 3.0, "np_ecn_marked_roce_packets": 5000.0},
])
def test_roce_ports_use_cnp_rates(rates: dict[str, float]) -> None:
    engine = Engine()
    evs = []
    for t in range(4):
        v = view(link_layer="Ethernet", hw_rates=rates, utilization_tx=0.1)
        evs += engine.process({v.key: v}, monotonic=t, wall=t)
    assert [(e.status, e.severity, e.details["signal"], e.value) for e in evs] == [
        ("firing", "warning", "ecn_cnp", 5000.0)]


def test_thresholds_are_configurable() -> None:
    engine = Engine({"congestion": {"warning": 0.02, "clear": 0.01, "sustain": 1}})
    evs = run(engine, [0.03])
    assert [(t, e.severity) for t, e in evs] == [(0, "warning")]
    with pytest.raises(ValueError, match="congestion"):
        Engine({"congestion": {"warning": 0.9, "critical": 0.5}})
    with pytest.raises(ValueError, match=r"congestion\.bogus"):
        Engine({"congestion": {"bogus": 1}})


# --------------------------------------------------------------------------- boundaries
#
# Every level is tested at, just below and just above its value (the neighbouring floats), for
# the InfiniBand ratio and the RoCE ECN/CNP rate, with the default thresholds and with a
# configured table. docs/infiniband.md §4: "at or above" warning/critical, clear "below".


@dataclass(frozen=True)
class Levels:
    warning: float
    critical: float
    clear: float
    sustain: int
    clear_polls: int


def levels(tables: dict[str, Any], signal: str) -> Levels:
    s = settings_for("congestion", tables)
    if signal == "roce":
        return Levels(s.roce_warning, s.roce_critical, s.roce_clear, s.sustain, s.clear_polls)
    return Levels(s.warning, s.critical, s.clear, s.sustain, s.clear_polls)


class Port:
    """One port polled once per simulated second; collects (poll, status, severity) edges."""

    def __init__(self, tables: dict[str, Any], signal: str) -> None:
        self.engine = Engine(tables)
        self.signal = signal
        self.counter = settings_for("congestion", tables).roce_counters[0]
        self.t = 0
        self.edges: list[tuple[int, str, str]] = []

    def poll(self, value: float, times: int = 1) -> Port:
        for _ in range(times):
            if self.signal == "roce":
                v = view(link_layer="Ethernet", hw_rates={self.counter: value},
                         utilization_tx=0.5)
            else:
                v = view(xmit_wait_ratio=value, utilization_tx=0.5)
            evs = self.engine.process({v.key: v}, monotonic=self.t, wall=1e9 + self.t)
            self.edges += [(self.t, e.status, e.severity) for e in evs if e.type == "congestion"]
            self.t += 1
        return self

    @property
    def firing(self) -> bool:
        state = [s for _, s, _ in self.edges]
        return bool(state) and state[-1] == "firing"


SIGNALS = ["ratio", "roce"]
boundary = pytest.mark.parametrize("tables", TABLES, ids=TABLE_IDS)
signals = pytest.mark.parametrize("signal", SIGNALS)


@boundary
@signals
@pytest.mark.parametrize(("where", "fires"), [("below", False), ("at", True), ("above", True)])
def test_warning_fires_at_or_above_the_level(
    tables: dict[str, Any], signal: str, where: str, fires: bool
) -> None:
    lv = levels(tables, signal)
    value = {"below": below, "at": float, "above": above}[where](lv.warning)
    port = Port(tables, signal).poll(value, lv.sustain)
    expected = [(lv.sustain - 1, "firing", "warning")] if fires else []
    assert port.edges == expected


@boundary
@signals
@pytest.mark.parametrize(("where", "severity"),
                         [("below", "warning"), ("at", "critical"), ("above", "critical")])
def test_critical_at_or_above_its_level(
    tables: dict[str, Any], signal: str, where: str, severity: str
) -> None:
    lv = levels(tables, signal)
    value = {"below": below, "at": float, "above": above}[where](lv.critical)
    port = Port(tables, signal).poll(value, lv.sustain)
    assert port.edges == [(lv.sustain - 1, "firing", severity)]


@boundary
@signals
def test_warning_needs_sustain_consecutive_polls(tables: dict[str, Any], signal: str) -> None:
    lv = levels(tables, signal)
    port = Port(tables, signal)
    # sustain - 1 polls at the level, interrupted by one poll just below it, twice over
    port.poll(lv.warning, lv.sustain - 1).poll(below(lv.warning))
    port.poll(lv.warning, lv.sustain - 1).poll(below(lv.warning))
    assert port.edges == []
    start = port.t
    port.poll(lv.warning, lv.sustain)
    assert port.edges == [(start + lv.sustain - 1, "firing", "warning")]


@boundary
@signals
def test_critical_needs_sustain_consecutive_polls(tables: dict[str, Any], signal: str) -> None:
    lv = levels(tables, signal)
    port = Port(tables, signal).poll(lv.warning, lv.sustain)  # warning fires
    port.poll(lv.critical, lv.sustain - 1).poll(below(lv.critical))
    assert [sev for _, _, sev in port.edges] == ["warning"]
    start = port.t
    port.poll(lv.critical, lv.sustain)
    assert port.edges[1:] == [(start + lv.sustain - 1, "firing", "critical")]


@boundary
@signals
@pytest.mark.parametrize(("where", "clears"), [("below", True), ("at", False), ("above", False)])
def test_clears_only_below_the_clear_level(
    tables: dict[str, Any], signal: str, where: str, clears: bool
) -> None:
    lv = levels(tables, signal)
    port = Port(tables, signal).poll(lv.warning, lv.sustain)
    assert port.firing
    value = {"below": below, "at": float, "above": above}[where](lv.clear)
    start = port.t
    port.poll(value, lv.clear_polls + 2)
    if clears:
        assert port.edges[1:] == [(start + lv.clear_polls - 1, "resolved", "warning")]
    else:
        assert port.edges[1:] == []  # inside the hysteresis band: still congested
        assert port.firing


@boundary
@signals
def test_clear_needs_clear_polls_consecutive_quiet_polls(
    tables: dict[str, Any], signal: str
) -> None:
    lv = levels(tables, signal)
    quiet = below(lv.clear)
    port = Port(tables, signal).poll(lv.warning, lv.sustain)
    # clear_polls - 1 quiet polls, one poll at the clear level (not quiet), again short by one
    port.poll(quiet, lv.clear_polls - 1).poll(lv.clear).poll(quiet, lv.clear_polls - 1)
    assert port.firing
    assert len(port.edges) == 1
    port.poll(quiet)  # the clear_polls-th consecutive quiet poll
    assert port.edges[1:] == [(port.t - 1, "resolved", "warning")]
