"""BER over a sliding window, link integrity hold, receive-error and discard rates."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from detect_views import view

from ibmon.detect.engine import Engine
from ibmon.detect.events import Event
from ibmon.infiniband.model import PortView
from tests.detect_settings import TABLE_IDS, TABLES, above, below, settings_for


def step(engine: Engine, v: PortView, t: float) -> list[Event]:
    return engine.process({v.key: v}, monotonic=t, wall=1e9 + t)


def test_ber_is_errors_over_window_times_link_rate() -> None:
    engine = Engine()
    total = 1000  # history before monitoring is not an error burst
    v = view(totals={"symbol_errors": total})
    step(engine, v, 0)
    assert v.symbol_error_ber == 0.0
    evs: list[tuple[float, Event]] = []
    for t in range(1, 200):
        total += 1  # 1 error/s at 100 Gb/s, full 600 s window: 1/(600*1e11) per s of errors
        v = view(totals={"symbol_errors": total})
        evs += [(t, e) for e in step(engine, v, t)]
    assert v.symbol_error_ber == pytest.approx(199 / (600 * 100e9))
    # warning once 60 errors are in the window (1e-12 * 600 s * 1e11 b/s)
    assert [(t, e.status, e.severity) for t, e in evs] == [(60, "firing", "warning")]
    assert evs[0][1].value == pytest.approx(1e-12)


def test_ber_window_slides_and_resolves_once() -> None:
    engine = Engine({"high_ber": {"window": 100}})
    total = 0
    evs: list[tuple[float, Event]] = []
    for t in range(0, 400):
        if 10 <= t < 50:
            total += 200  # 2e-10 of 1e11 b/s over 100 s when 40 s of it are in the window
        v = view(totals={"symbol_errors": total})
        evs += [(t, e) for e in step(engine, v, t)]
    got = [(t, e.status, e.severity) for t, e in evs]
    assert got == [
        (10, "firing", "warning"),
        (14, "firing", "critical"),
        (149, "resolved", "critical"),  # the last error (t=49) left the 100 s window
    ]
    # the message is the BER itself; it does not quote its own symbol errors back as evidence
    assert "rising on the same link" not in evs[0][1].message


def test_saturated_symbol_counter_gives_no_ber_and_keeps_state() -> None:
    engine = Engine({"high_ber": {"window": 10}})
    evs = []
    for t in range(30):
        sat = frozenset({"symbol_errors"}) if t >= 5 else frozenset()
        v = view(totals={"symbol_errors": 100 * min(t, 5)}, saturated=sat)
        evs += step(engine, v, t)
        if t >= 5:
            assert v.symbol_error_ber is None
    assert [e.status for e in evs if e.type == "high_ber"] == ["firing"]  # never resolved


def test_ber_uses_the_current_link_rate_and_ignores_down_ports() -> None:
    engine = Engine()
    step(engine, view(totals={"symbol_errors": 0}, rate_bps=25e9), 0)
    v = view(totals={"symbol_errors": 30}, rate_bps=25e9)
    evs = step(engine, v, 1)
    assert v.symbol_error_ber == pytest.approx(30 / (600 * 25e9))
    assert [e.severity for e in evs] == ["warning"]
    down = view(totals={"symbol_errors": 30}, state=1, rate_bps=None)
    assert [e.type for e in step(engine, down, 2) if e.type == "high_ber"] == []


def test_link_integrity_fires_on_any_increase_and_resolves_after_hold() -> None:
    engine = Engine({"link_integrity": {"hold": 100}})
    evs: list[tuple[float, Event]] = []
    for t in range(400):
        n = 5 + (t >= 10) + (t >= 60)
        v = view(totals={"local_link_integrity_errors": n, "excessive_buffer_overrun_errors": 2})
        evs += [(t, e) for e in step(engine, v, t)]
    assert [(t, e.status) for t, e in evs] == [(10, "firing"), (160, "resolved")]
    assert evs[0][1].details["counters"] == {"local_link_integrity_errors": 1}


@pytest.mark.parametrize(("kind", "counter", "rate"), [
    ("receive_errors", "receive_errors", 50.0), ("discards", "transmit_discards", 400.0)])
def test_rate_detectors_fire_above_threshold_and_clear_after_quiet_polls(
    kind: str, counter: str, rate: float
) -> None:
    engine = Engine()
    evs: list[tuple[float, Event]] = []
    for t in range(30):
        r = rate if 5 <= t < 15 else 0.0
        v = view(rates={counter: r})
        evs += [(t, e) for e in step(engine, v, t)]
    assert [(t, e.type, e.status) for t, e in evs] == [(5, kind, "firing"), (17, kind, "resolved")]


def test_rate_at_threshold_is_not_an_error() -> None:
    engine = Engine()
    evs = []
    for t in range(10):
        evs += step(engine, view(rates={"receive_errors": 10.0, "transmit_discards": 100.0}), t)
    assert evs == []


def test_saturated_counter_still_proves_a_ber_above_threshold() -> None:
    """Pinned at its maximum the count is a lower bound: enough to fire, never to resolve."""
    engine = Engine({"high_ber": {"window": 10}})
    step(engine, view(totals={"symbol_errors": 0}), 0)
    pinned = view(totals={"symbol_errors": 65535}, saturated=frozenset({"symbol_errors"}))
    (ev,) = [e for e in step(engine, pinned, 1) if e.type == "high_ber"]
    assert (ev.status, ev.severity, ev.details["lower_bound"]) == ("firing", "critical", True)
    assert "at least" in ev.message
    assert pinned.symbol_error_ber is None  # the gauge does not show a number it cannot know
    for t in range(2, 30):  # the burst leaves the window, but the counter is still pinned
        pinned = view(totals={"symbol_errors": 65535}, saturated=frozenset({"symbol_errors"}))
        assert [e for e in step(engine, pinned, t) if e.type == "high_ber"] == []


# --------------------------------------------------------------------------- boundaries
#
# At, just below and just above every level, with the default thresholds and a configured table.

boundary = pytest.mark.parametrize("tables", TABLES, ids=TABLE_IDS)
LINK_BPS = 100e9  # 4X EDR data rate; window x rate is an exact float for both tables


def errors_for_ber(ber: float, window: float) -> int:
    """The symbol-error count whose BER over ``window`` at LINK_BPS is exactly ``ber``.

    BER = errors / (window x link bits per second) (docs/infiniband.md §4). The count is checked to
    give the threshold exactly in floating point, so "at" really is at the threshold.
    """
    n = round(ber * window * LINK_BPS)
    assert n / (window * LINK_BPS) == ber, "pick a window/rate where the threshold is exact"
    return n


def ber_edges(tables: dict[str, Any], errors: int) -> list[tuple[str, str]]:
    """A port with a long error history, then ``errors`` new symbol errors one second later."""
    engine = Engine(tables)
    step(engine, view(totals={"symbol_errors": 500}, rate_bps=LINK_BPS), 0)
    v = view(totals={"symbol_errors": 500 + errors}, rate_bps=LINK_BPS)
    return [(e.status, e.severity) for e in step(engine, v, 1) if e.type == "high_ber"]


@boundary
@pytest.mark.parametrize(("delta", "expected"), [(-1, []), (0, [("firing", "warning")]),
                                                 (1, [("firing", "warning")])])
def test_ber_warning_at_or_above_its_level(
    tables: dict[str, Any], delta: int, expected: list[tuple[str, str]]
) -> None:
    s = settings_for("high_ber", tables)
    assert ber_edges(tables, errors_for_ber(s.warning, s.window) + delta) == expected


@boundary
@pytest.mark.parametrize(("delta", "severity"), [(-1, "warning"), (0, "critical"),
                                                 (1, "critical")])
def test_ber_critical_at_or_above_its_level(
    tables: dict[str, Any], delta: int, severity: str
) -> None:
    s = settings_for("high_ber", tables)
    errors = errors_for_ber(s.critical, s.window) + delta
    assert ber_edges(tables, errors) == [("firing", severity)]


@boundary
def test_ber_counts_errors_of_exactly_one_window(tables: dict[str, Any]) -> None:
    """An error burst counts for ``window`` seconds: still in just before, gone at the edge."""
    s = settings_for("high_ber", tables)
    n = errors_for_ber(s.warning, s.window)
    engine = Engine(tables)
    step(engine, view(totals={"symbol_errors": 0}, rate_bps=LINK_BPS), 0)
    (fired,) = step(engine, view(totals={"symbol_errors": n}, rate_bps=LINK_BPS), 1)
    assert (fired.type, fired.status) == ("high_ber", "firing")
    assert step(engine, view(totals={"symbol_errors": n}, rate_bps=LINK_BPS),
                below(1 + s.window)) == []
    (done,) = step(engine, view(totals={"symbol_errors": n}, rate_bps=LINK_BPS), 1 + s.window)
    assert (done.type, done.status) == ("high_ber", "resolved")


def rate_edges(kind: str, tables: dict[str, Any], rates: list[float]) -> list[tuple[int, str]]:
    counter = {"receive_errors": "receive_errors", "discards": "transmit_discards"}[kind]
    engine = Engine(tables)
    out: list[tuple[int, str]] = []
    for t, r in enumerate(rates):
        out += [(t, e.status) for e in step(engine, view(rates={counter: r}), t) if e.type == kind]
    return out


RATE_KINDS = pytest.mark.parametrize("kind", ["receive_errors", "discards"])


@boundary
@RATE_KINDS
@pytest.mark.parametrize(("where", "fires"), [("below", False), ("at", False), ("above", True)])
def test_rate_detectors_fire_only_above_the_threshold(
    tables: dict[str, Any], kind: str, where: str, fires: bool
) -> None:
    """NVSentinel's rule is "more than N per second": exactly N is not yet an error."""
    threshold = settings_for(kind, tables).threshold
    rate = {"below": below, "at": float, "above": above}[where](threshold)
    assert rate_edges(kind, tables, [rate]) == ([(0, "firing")] if fires else [])


@boundary
@RATE_KINDS
@pytest.mark.parametrize("where", ["below", "at"])
def test_rate_detectors_resolve_after_clear_polls_at_or_below_the_threshold(
    tables: dict[str, Any], kind: str, where: str
) -> None:
    s = settings_for(kind, tables)
    quiet = {"below": below, "at": float}[where](s.threshold)
    loud = above(s.threshold)
    # fire; clear_polls - 1 quiet polls; one loud poll restarts the count; then clear_polls quiet
    rates = [loud, *[quiet] * (s.clear_polls - 1), loud, *[quiet] * s.clear_polls]
    resolved_at = len(rates) - 1
    assert rate_edges(kind, tables, [*rates, quiet]) == [(0, "firing"), (resolved_at, "resolved")]


def integrity_edges(
    tables: dict[str, Any], polls: list[tuple[float, int]]
) -> list[tuple[float, str]]:
    engine = Engine(tables)
    out: list[tuple[float, str]] = []
    for t, n in polls:
        v = view(totals={"local_link_integrity_errors": n, "excessive_buffer_overrun_errors": 0})
        out += [(t, e.status) for e in step(engine, v, t) if e.type == "link_integrity"]
    return out


@boundary
@pytest.mark.parametrize(("increase", "fires"), [(0, False), (1, True), (2, True)])
def test_link_integrity_fires_on_any_increase_and_on_nothing_else(
    tables: dict[str, Any], increase: int, fires: bool
) -> None:
    edges = integrity_edges(tables, [(0, 3), (1, 3 + increase)])
    assert edges == ([(1, "firing")] if fires else [])


@boundary
def test_link_integrity_resolves_exactly_hold_seconds_after_the_last_increase(
    tables: dict[str, Any],
) -> None:
    hold = settings_for("link_integrity", tables).hold
    polls = [(0.0, 3), (1.0, 4), (below(1.0 + hold), 4), (1.0 + hold, 4)]
    assert integrity_edges(tables, polls) == [(1.0, "firing"), (1.0 + hold, "resolved")]
