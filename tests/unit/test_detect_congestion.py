"""Congestion: sustain, hysteresis, escalation, hotspot versus backpressure, RoCE."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from detect_views import view

from ibmon.detect.engine import Engine
from ibmon.events import Event


def run(engine: Engine, ratios: list[float | None], util: float = 0.9,
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


def test_crossing_both_levels_at_once_fires_once_at_critical() -> None:
    evs = run(Engine(), [0.8] * 5)
    assert [(e.status, e.severity) for _, e in evs] == [("firing", "critical")]


@pytest.mark.parametrize(("util", "kind"), [(0.94, "hotspot"), (0.03, "backpressure")])
def test_event_says_hotspot_or_backpressure(util: float, kind: str) -> None:
    (_, ev), = run(Engine(), [0.38] * 3, util=util)
    assert ev.details["kind"] == kind
    assert kind in ev.message
    assert "38 % of the time stalled" in ev.message
    assert ev.port is not None
    assert ev.port.node_desc == "host042 mlx5_0"


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


def test_roce_ports_use_cnp_rates() -> None:
    engine = Engine()
    evs = []
    for t in range(4):
        v = view(link_layer="Ethernet", hw_rates={"rp_cnp_handled": 5000.0},
                 utilization_tx=0.1)
        evs += engine.process({v.key: v}, monotonic=t, wall=t)
    assert [(e.status, e.severity, e.details["signal"]) for e in evs] == [
        ("firing", "warning", "ecn_cnp")]


def test_thresholds_are_configurable() -> None:
    engine = Engine({"congestion": {"warning": 0.02, "clear": 0.01, "sustain": 1}})
    evs = run(engine, [0.03])
    assert [(t, e.severity) for t, e in evs] == [(0, "warning")]
    with pytest.raises(ValueError, match="congestion"):
        Engine({"congestion": {"warning": 0.9, "critical": 0.5}})
    with pytest.raises(ValueError, match=r"congestion\.bogus"):
        Engine({"congestion": {"bogus": 1}})
