"""Port down, flapping and degraded links; counter resets, saturation and topology changes."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from detect_views import GUID, PEER, link, view

from ibmon.detect.engine import Engine
from ibmon.detect.events import Event
from ibmon.infiniband.linkspeed import SPEED_ORDER, WIDTH_LANES, is_degraded
from ibmon.infiniband.model import LinkInfo, PortView
from tests.detect_settings import TABLE_IDS, TABLES, below, settings_for


def step(engine: Engine, views: list[PortView], t: float) -> list[Event]:
    return engine.process({v.key: v for v in views}, monotonic=t, wall=1e9 + t)


def test_port_down_only_for_ports_that_were_active() -> None:
    engine = Engine()
    assert step(engine, [view(state=1)], 0) == []  # never active: an unused port
    assert step(engine, [view(state=4)], 1) == []
    (fired,) = step(engine, [view(state=1, link=link())], 2)
    assert (fired.type, fired.status, fired.severity) == ("port_down", "firing", "critical")
    assert fired.peer is not None
    assert fired.peer.guid == PEER
    assert fired.peer.port == "12"
    # the state seen against Active, and the physical state (2: Polling, no light from the far
    # end; 3: Disabled by someone) that says which
    assert (fired.value, fired.threshold) == (1.0, 4.0)
    # IBA numbers for programs, the names beside them, as in port JSON
    assert {k: fired.details[k] for k in ("state", "state_name", "phys_state",
                                          "phys_state_name")} == {
        "state": 1, "state_name": "DOWN", "phys_state": 2, "phys_state_name": "Polling"}
    assert "port 12) is down (DOWN/Polling):" in fired.message
    assert step(engine, [view(state=2)], 3) == []  # still not active: no second event
    assert step(engine, [view(state=None)], 4) == []  # unknown state: no opinion
    (resolved,) = step(engine, [view(state=4)], 5)
    assert (resolved.type, resolved.status) == ("port_down", "resolved")


@pytest.mark.parametrize(("state", "phys", "says"), [
    (1, 2, "is down (DOWN/Polling): no signal: the cable is out, or the far end is down or "
           "rebooting"),
    (1, 3, "is down (DOWN/Disabled): the port is disabled (by an administrator, ibportstate "
           "or the subnet manager)"),
    (2, 5, "is down (INIT/LinkUp): the link trained, but no subnet manager has made the port "
           "Active (is one running?)"),
    (1, 6, "is down (DOWN/LinkErrorRecovery): the link is recovering from errors"),
    (1, None, "is down (DOWN): the link was down"),
])
def test_port_down_says_what_the_physical_state_tells(state: int, phys: int | None,
                                                      says: str) -> None:
    engine = Engine()
    step(engine, [view(link=link())], 0)
    (fired,) = step(engine, [dataclasses.replace(view(state=state, link=link()),
                                                 phys_state=phys)], 1)
    assert fired.message == f"host042 mlx5_0 port 1 (to leaf03 port 12) {says}"


def test_flapping_counts_link_downs_in_a_sliding_window() -> None:
    engine = Engine()
    evs: list[tuple[float, Event]] = []
    downs = 7  # history
    for t in range(0, 1000, 10):
        if t in (100, 200, 300, 400):
            downs += 1
        v = view(totals={"link_downed": downs})
        evs += [(t, e) for e in step(engine, [v], t) if e.type == "link_flapping"]
    assert [(t, e.status) for t, e in evs] == [(300, "firing"), (800, "resolved")]
    assert evs[0][1].value == 3


def test_degraded_fabric_link_uses_max_common_width_and_speed() -> None:
    engine = Engine()
    (fired,) = step(engine, [view(link=link(width="1X"))], 0)
    assert fired.type == "link_degraded"
    assert "1X EDR, could be 4X EDR" in fired.message
    assert step(engine, [view(link=link(width="1X"))], 1) == []
    (done,) = step(engine, [view(link=link())], 2)
    assert done.status == "resolved"
    assert step(engine, [view(link=link(speed="FDR", max_speed="FDR"))], 3) == []


def test_degraded_agrees_with_linkspeed_on_every_width_and_speed() -> None:
    """The detector orders widths and speeds by linkspeed's tables, the one copy of them."""
    widths = sorted(WIDTH_LANES, key=WIDTH_LANES.__getitem__)
    cases = [(w, "EDR", m, "EDR") for w in widths for m in widths]
    cases += [("4X", s, "4X", m) for s in SPEED_ORDER for m in SPEED_ORDER]
    for n, (w, s, mw, ms) in enumerate(cases):
        engine = Engine()
        fired = step(engine, [view(link=link(width=w, speed=s, max_width=mw, max_speed=ms))], n)
        assert bool(fired) == is_degraded(w, s, mw, ms), (w, s, mw, ms)
    # a speed linkspeed does not know gives no opinion rather than a guess
    assert step(Engine(), [view(link=link(speed="ZDR", max_speed="XDR"))], 0) == []


def test_node_local_degraded_against_majority_and_expected_rate() -> None:
    engine = Engine()
    ports = [view(str(p), rate_bps=100e9) for p in range(1, 4)] + [view("4", rate_bps=25e9)]
    (fired,) = step(engine, ports, 0)
    assert fired.port is not None
    assert fired.port.port == "4"
    assert fired.type == "link_degraded"
    two = Engine()  # two ports, one slow: no majority, no opinion
    assert step(two, [view("1"), view("2", rate_bps=25e9)], 0) == []
    configured = Engine({"link_degraded": {"expected_rate_gbps": 200}})
    evs = step(configured, [view("1")], 0)
    assert [(e.type, e.value, e.threshold) for e in evs] == [("link_degraded", 100.0, 200.0)]


def test_degraded_takes_what_the_link_does_not_say_from_the_port() -> None:
    """A link that names no active width or speed is graded on the port's own; one that
    names no best width or speed is judged like a node-local port, on the majority rate."""
    (fired,) = step(Engine(), [view(link=link(width="", speed=""), active_width="1X",
                                    active_speed="EDR")], 0)
    assert "1X EDR, could be 4X EDR" in fired.message
    for unknown in ({"max_width": ""}, {"max_speed": ""}, {"max_width": "", "max_speed": ""}):
        ports = [view(str(p), rate_bps=100e9, link=link(**unknown)) for p in range(1, 4)]
        slow = view("4", rate_bps=25e9, link=link(**unknown))
        (fired,) = step(Engine(), [*ports, slow], 0)
        assert (fired.type, fired.port.port if fired.port else None) == ("link_degraded", "4")
        assert (fired.value, fired.threshold) == (25.0, 100.0), unknown


def test_a_degraded_link_stays_degraded_until_it_trains_at_its_best_again() -> None:
    engine = Engine()
    (fired,) = step(engine, [view(link=link(width="1X"))], 0)
    assert (fired.type, fired.status) == ("link_degraded", "firing")
    assert [e.type for e in step(engine, [view(state=1, link=link(width="1X"))], 1)] == [
        "port_down"]
    # back up at a speed this ibmon has no name for: no opinion either
    unknown = link(width="1X", speed="ZDR", max_speed="ZDR")
    assert [(e.type, e.status) for e in step(engine, [view(link=unknown)], 2)] == [
        ("port_down", "resolved")]
    assert [(e.type, e.status) for e in step(engine, [view(link=link())], 3)] == [
        ("link_degraded", "resolved")]


def test_a_node_local_port_whose_rate_is_not_read_keeps_its_degraded() -> None:
    engine = Engine()
    up = [view(str(p), rate_bps=100e9) for p in range(1, 4)]
    (fired,) = step(engine, [*up, view("4", rate_bps=25e9)], 0)
    assert (fired.type, fired.status) == ("link_degraded", "firing")
    assert step(engine, [*up, view("4", rate_bps=None)], 1) == []  # no rate: no opinion
    (done,) = step(engine, [*up, view("4", rate_bps=100e9)], 2)
    assert (done.type, done.status) == ("link_degraded", "resolved")


def test_node_local_majority_counts_active_ports_only() -> None:
    """Down ports (their sysfs rate is whatever the HCA last trained or defaults to) neither
    make a majority nor break one."""
    up = [view(str(p), rate_bps=100e9) for p in range(1, 4)]
    slow = view("4", rate_bps=25e9)
    down = [view(str(p), state=1, rate_bps=10e9) for p in range(5, 9)]
    (fired,) = step(Engine(), [*up, slow, *down], 0)
    assert (fired.type, fired.port.port if fired.port else None) == ("link_degraded", "4")
    assert fired.threshold == 100.0


def test_node_local_majority_is_per_link_layer() -> None:
    """A 25G RoCE port beside three 100G InfiniBand ports is not a degraded InfiniBand port."""
    ib = [view(str(p), rate_bps=100e9) for p in range(1, 4)]
    roce = view("5", rate_bps=25e9, link_layer="Ethernet")
    assert step(Engine(), [*ib, roce], 0) == []
    slow_ib = view("4", rate_bps=25e9)
    (fired,) = step(Engine(), [*ib, slow_ib, roce], 0)
    assert (fired.type, fired.port.port if fired.port else None) == ("link_degraded", "4")
    assert "InfiniBand ports" in fired.message


def test_node_local_majority_is_per_adapter_model() -> None:
    """A host's storage adapter at HDR beside three compute adapters at NDR is not degraded
    (nor an iWARP NIC its driver lists as InfiniBand); a compute adapter at HDR is. The model is
    the board id, else the HCA type."""

    def on(model: str, port: str, gbps: float, field: str = "board_id") -> PortView:
        v = view(port, guid=f"0x{int(port):016x}", rate_bps=gbps * 1e9)
        return dataclasses.replace(v, identity=dataclasses.replace(v.identity, **{field: model}))

    compute = [on("MT_0000000838", str(p), 400) for p in range(1, 4)]
    storage = on("MT_0000000970", "4", 200)
    assert step(Engine(), [*compute, storage], 0) == []
    slow = on("MT_0000000838", "5", 200)
    (fired,) = step(Engine(), [*compute, storage, slow], 0)
    assert (fired.type, fired.port.port if fired.port else None) == ("link_degraded", "5")
    assert (fired.value, fired.threshold) == (200.0, 400.0)
    assert "InfiniBand ports on MT_0000000838 adapters" in fired.message
    by_type = [on("MT4129", str(p), 400, "hca_type") for p in range(1, 4)]
    assert step(Engine(), [*by_type, on("I40IW", "4", 8, "hca_type")], 0) == []


def test_counter_reset_is_one_info_event_per_reset() -> None:
    engine = Engine()
    assert step(engine, [view()], 0) == []
    (ev,) = step(engine, [view(resets={"transmit_data": 1, "receive_data": 1})], 1)
    assert (ev.type, ev.status, ev.severity) == ("counter_reset", "firing", "info")
    assert ev.details["counters"] == ["receive_data", "transmit_data"]
    assert step(engine, [view(resets={"transmit_data": 1, "receive_data": 1})], 2) == []
    (again,) = step(engine, [view(resets={"transmit_data": 2, "receive_data": 1})], 3)
    assert again.details["counter"] == "transmit_data"


def test_counter_saturated_fires_and_resolves() -> None:
    engine = Engine()
    (ev,) = step(engine, [view(saturated=frozenset({"transmit_wait"}))], 0)
    assert (ev.type, ev.details["counter"]) == ("counter_saturated", "transmit_wait")
    assert step(engine, [view(saturated=frozenset({"transmit_wait"}))], 1) == []
    # a second counter pinned: no new event, but the condition the API shows names both
    both = frozenset({"transmit_wait", "symbol_errors"})
    assert step(engine, [view(saturated=both)], 2) == []
    (held,) = engine.active()
    assert held.finding.details["counters"] == ["symbol_errors", "transmit_wait"]
    (done,) = step(engine, [view()], 3)
    assert (done.type, done.status) == ("counter_saturated", "resolved")


def test_topology_changes_after_the_baseline() -> None:
    engine = Engine({"topology_changed": {"absent_polls": 2}})
    a, b = view("1", link=link()), view("2")
    assert step(engine, [a, b], 0) == []  # baseline
    moved = LinkInfo(remote_guid="0x0002c90300ffff02", remote_port="3")
    (ev,) = step(engine, [view("1", link=moved), b], 1)
    assert ev.details["change"] == "moved"
    assert ev.details["old_remote_guid"] == PEER
    assert step(engine, [view("1", link=moved)], 2) == []  # port 2 missing once: not yet
    (gone,) = step(engine, [view("1", link=moved)], 3)
    assert gone.details["change"] == "vanished"
    assert gone.port is not None  # who it was when last seen, two polls ago
    assert (gone.port.guid, gone.port.port, gone.port.node_desc) == (GUID, "2", "host042 mlx5_0")
    assert gone.message == "host042 mlx5_0 port 2 vanished"
    (new,) = step(engine, [view("1", link=moved), view("3")], 4)
    assert new.details["change"] == "appeared"


def test_only_polls_in_a_row_without_a_port_make_it_vanish() -> None:
    """A port that misses a poll now and then (a flaky PMA) never vanishes: its count starts
    again each time it answers; only ``absent_polls`` misses in a row are a removed cable."""
    engine = Engine({"topology_changed": {"absent_polls": 3}})
    both, one = [view("1"), view("2")], [view("1")]
    assert step(engine, both, 0) == []
    for t, polled in enumerate([one, one, both, one, one, both, one, one], start=1):
        assert step(engine, polled, t) == [], t
    (gone,) = step(engine, one, 9)
    assert gone.details["change"] == "vanished"


def test_a_restored_port_no_poll_names_vanishes_though_the_polls_stay_alike() -> None:
    """``vanished`` skips its search while the ports are those of a poll that missed none;
    a port restored from saved state is one it must search for all the same."""
    engine = Engine({"topology_changed": {"absent_polls": 2}})
    polled = [view("1", link=link()), view("2")]
    for t in range(3):
        assert step(engine, polled, t) == []
    saved = engine.dump()
    saved["detectors"]["topology_changed"].append([GUID, "3", None])
    engine.load(saved)
    assert step(engine, polled, 3) == []  # missing once: not yet
    (gone,) = step(engine, polled, 4)
    assert gone.details["change"] == "vanished"
    assert gone.port is not None
    assert gone.port.port == "3"
    assert step(engine, polled, 5) == []


def test_topology_compares_far_ends_not_link_objects_and_survives_a_restart() -> None:
    """The detector keeps each view's own link, not a copy of its far end: a new link object
    to the same far end (the link's width changed) is no move, a restored far end (saved
    state holds none of the objects) compares by value, and a move after a restart names
    the far end from before it."""
    def moves(engine: Engine, views: list[PortView], t: float) -> list[Event]:
        return [e for e in step(engine, views, t) if e.type == "topology_changed"]

    engine = Engine()
    assert moves(engine, [view("1", link=link()), view("2")], 0) == []
    assert moves(engine, [view("1", link=link(width="1X")), view("2")], 1) == []
    assert moves(engine, [view("1", link=link()), view("2", link=link())], 2) == []  # named late
    # judged anyway (``needs`` leaves such a port out): an equal far end is no move
    (topo,) = (d for d in engine.detectors if d.type == "topology_changed")
    again = view("2", link=link(width="2X"))
    assert topo.check(again.key, again, 2.5, None) is None
    saved = engine.dump()
    assert saved["detectors"]["topology_changed"] == [[GUID, "1", [PEER, "12"]],
                                                      [GUID, "2", [PEER, "12"]]]
    restored = Engine()
    restored.load(saved)
    assert moves(restored, [view("1", link=link(speed="HDR")), view("2", link=link())], 3) == []
    moved = LinkInfo(remote_guid="0x0002c90300ffff02", remote_port="3")
    (ev,) = moves(restored, [view("1", link=link()), view("2", link=moved)], 4)
    assert (ev.details["change"], ev.port.port) == ("moved", "2")  # type: ignore[union-attr]
    assert (ev.details["old_remote_guid"], ev.details["old_remote_port"]) == (PEER, "12")
    assert (ev.details["remote_guid"], ev.details["remote_port"]) == ("0x0002c90300ffff02", "3")
    assert moves(restored, [view("1", link=link()), view("2", link=moved)], 5) == []


def test_a_cable_moved_while_ibmon_was_down_is_announced_at_the_first_poll() -> None:
    """Restored far ends are a baseline already: the first poll after a restart compares with
    them (a fresh engine, with nothing saved, takes its first poll as the baseline)."""
    engine = Engine()
    assert step(engine, [view("1", link=link()), view("2", link=link())], 0) == []
    restored = Engine()
    restored.load(engine.dump())
    moved = LinkInfo(remote_guid="0x0002c90300ffff02", remote_port="3")
    events = step(restored, [view("1", link=link()), view("2", link=moved)], 1)
    (ev,) = [e for e in events if e.type == "topology_changed"]
    assert (ev.details["change"], ev.details["old_remote_guid"]) == ("moved", PEER)


# --------------------------------------------------------------------------- boundaries

boundary = pytest.mark.parametrize("tables", TABLES, ids=TABLE_IDS)


def flaps(
    tables: dict[str, Any], downs_at: list[float], polls: list[float]
) -> list[tuple[float, Event]]:
    """LinkDowned goes up by one at each time in ``downs_at``; the port is polled then and at
    ``polls``. Returns the flapping edges with the poll time they happened at."""
    engine = Engine(tables)
    history = 40  # link downs from before monitoring started: not flapping
    out: list[tuple[float, Event]] = []
    for t in sorted({0.0, *downs_at, *polls}):
        total = history + sum(1 for d in downs_at if d <= t)
        out += [(t, e) for e in step(engine, [view(totals={"link_downed": total})], t)
                if e.type == "link_flapping"]
    return out


@boundary
@pytest.mark.parametrize(("extra", "fires"), [(-1, False), (0, True), (1, True)])
def test_flapping_at_count_link_downs_within_the_window(
    tables: dict[str, Any], extra: int, fires: bool
) -> None:
    s = settings_for("link_flapping", tables)
    n = s.count + extra
    gap = s.window / (n + 1)  # all n downs well inside one window
    downs = [gap * (i + 1) for i in range(n)]
    edges = [(t, e.status, e.value, e.threshold) for t, e in flaps(tables, downs, [])]
    # one edge, at the count-th down, however many more follow
    assert edges == ([(downs[s.count - 1], "firing", s.count, s.count)] if fires else [])


@boundary
def test_a_link_down_counts_for_exactly_one_window(tables: dict[str, Any]) -> None:
    s = settings_for("link_flapping", tables)
    downs = [1.0 + i for i in range(s.count)]  # count downs, one per second from t=1
    edge = downs[0] + s.window  # the first of them leaves the window here
    edges = [(t, e.status) for t, e in flaps(tables, downs, [below(edge), edge])]
    assert edges == [(downs[-1], "firing"), (edge, "resolved")]


# --------------------------------------------------------------------------- flapping's cause

BACK = LinkInfo(remote_guid=GUID, remote_port="1", remote_node_desc="host042 mlx5_0",
                active_width="4X", active_speed="EDR", max_width="4X", max_speed="EDR")


@pytest.mark.parametrize(("here", "there", "cause"), [
    ({}, {}, "link_down"),
    # symbol errors rising as the link flaps (under the BER threshold: no condition)
    ({"symbol_errors": (30, 50)}, {}, "physical"),
    ({}, {"symbol_errors": (30, 50)}, "physical"),
    # a high BER raised earlier, its counter pinned since (no BER this poll, the condition holds)
    ({"symbol_errors": (10, 100), "pinned": (20, 1)}, {}, "physical"),
    # link integrity errors from the first down on, their condition still firing
    ({"local_link_integrity_errors": (10, 1)}, {}, "physical"),
    ({}, {"local_link_integrity_errors": (10, 1)}, "physical"),
    # buffer overruns raise the same condition, but point at flow control, not the cable
    ({"excessive_buffer_overrun_errors": (10, 1)}, {}, "link_down"),
], ids=["nothing", "own-ber", "far-ber", "own-pinned-ber", "own-integrity", "far-integrity",
        "overruns"])
def test_a_flapping_link_with_bit_errors_at_either_end_is_the_cable(
    here: dict[str, tuple[int, int]], there: dict[str, tuple[int, int]], cause: str
) -> None:
    """A link that keeps going down is ``physical`` (check the cable) when either end shows
    bit errors: this poll's BER, or a high BER or link integrity errors still firing; else
    ``link_down`` (the far end rebooted or was disabled). Only this end counts the downs, so
    the far end's errors can only come in through this end's verdict. ``here``/``there``:
    counter -> (from which poll, its total from then on)."""
    engine = Engine()
    flapped: list[Event] = []
    for t, downs in ((0, 0), (10, 1), (20, 2), (30, 3)):
        at, far = ({k: v if t >= since else 0 for k, (since, v) in errors.items()}
                   for errors in (here, there))
        pinned = frozenset({"symbol_errors"}) if at.pop("pinned", 0) else frozenset()
        a = view("1", link=link(), totals={"link_downed": 40 + downs, **at}, saturated=pinned)
        b = view("12", guid=PEER, node_desc="leaf03", link=BACK,
                 totals={"link_downed": 7, **far})
        flapped += [e for e in step(engine, [a, b], t) if e.type == "link_flapping"]
    (ev,) = flapped
    assert (ev.status, ev.details["cause"]) == ("firing", cause)
    assert ev.message.endswith({
        "link_down": ": a far end that keeps restarting, or a cable or transceiver that keeps "
                     "losing the signal",
        "physical": ": suspect the cable or transceiver"}[cause])


def test_a_port_whose_link_downed_is_not_read_keeps_its_flapping() -> None:
    """No LinkDowned in a poll is no opinion: the condition holds until the count says."""
    engine = Engine()
    for t in range(4):
        step(engine, [view(totals={"link_downed": 40 + t})], t)
    assert [a.finding.details["cause"] for a in engine.active()] == ["link_down"]
    assert step(engine, [view(totals={"symbol_errors": 0})], 4) == []
    assert [a.type for a in engine.active()] == ["link_flapping"]
