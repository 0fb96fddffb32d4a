"""Detector boundaries and the carrying end of a link fault, at the exact values.

Each test sits on a boundary a user's alert depends on (``>=`` versus ``>``, a tie, a
minimum count, a tolerance) so that moving the boundary by one step fails it. The carrying
end is tested with GUIDs where the switch end is the *higher* key, so "the switch end" and
"the lower key" no longer coincide as they do on the simulated fabrics.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from detect_views import link, view

from ibmon.detect.engine import Engine
from ibmon.detect.events import Event
from ibmon.infiniband.model import LinkInfo, PortIdentity, PortView

#: A switch whose GUID sorts above its host's: the carrier must still be the switch.
SWITCH = "0xf452140300000001"
HOST = "0x0002c90300000009"
SWITCH2 = "0xf452140300000002"


def _port(guid: str, port: str, desc: str, node_type: str, peer: tuple[str, str, str],
          **fields: Any) -> PortView:
    ident = PortIdentity(guid=guid, port=port, node_desc=desc, node_type=node_type, lid=5)
    lk = LinkInfo(remote_guid=peer[0], remote_port=peer[1], remote_node_desc=peer[2],
                  active_width="4X", active_speed="EDR", max_width="4X", max_speed="EDR")
    fields.setdefault("state", 4)
    fields.setdefault("phys_state", 5 if fields["state"] == 4 else 2)
    return PortView(identity=ident, link=lk, rate_bytes_per_second=100e9 / 8, **fields)


def sw(**fields: Any) -> PortView:
    return _port(SWITCH, "7", "spine01", "switch", (HOST, "1", "host005 mlx5_0"), **fields)


def host(**fields: Any) -> PortView:
    return _port(HOST, "1", "host005 mlx5_0", "ca", (SWITCH, "7", "spine01"), **fields)


def step(engine: Engine, views: list[PortView], t: float) -> list[Event]:
    return engine.process({v.key: v for v in views}, monotonic=t, wall=1e9 + t)


# --- the carrying end -------------------------------------------------------------------


def test_the_switch_end_carries_a_host_link_even_when_the_host_key_is_lower() -> None:
    assert HOST < SWITCH
    engine = Engine()
    step(engine, [sw(), host()], 0)
    (ev,) = step(engine, [sw(state=1), host(state=1)], 1)
    assert ev.port is not None
    assert (ev.port.guid, ev.port.port) == (SWITCH, "7")
    assert ev.peer is not None
    assert ev.peer.guid == HOST


def test_between_two_switches_the_lower_key_carries() -> None:
    a = _port(SWITCH2, "3", "leaf02", "switch", (SWITCH, "9", "spine01"))
    b = _port(SWITCH, "9", "spine01", "switch", (SWITCH2, "3", "leaf02"))
    engine = Engine()
    step(engine, [a, b], 0)
    a = _port(SWITCH2, "3", "leaf02", "switch", (SWITCH, "9", "spine01"), state=1)
    b = _port(SWITCH, "9", "spine01", "switch", (SWITCH2, "3", "leaf02"), state=1)
    (ev,) = step(engine, [a, b], 1)
    assert ev.port is not None
    assert (ev.port.guid, ev.port.port) == (SWITCH, "9")


def test_a_held_condition_keeps_its_end() -> None:
    """The host end fired while the switch was out of sight; when the switch end shows up
    the condition stays on the host end (no second firing on the switch, one resolve)."""
    engine = Engine()
    step(engine, [host()], 0)
    (ev,) = step(engine, [host(state=1)], 1)
    assert ev.port is not None
    assert ev.port.guid == HOST
    later = step(engine, [sw(state=1), host(state=1)], 2)
    assert [e for e in later if e.type == "port_down"] == []
    (active,) = engine.active()
    assert active.key == (HOST, "1")
    (done,) = [e for e in step(engine, [sw(), host()], 3) if e.type == "port_down"]
    assert (done.status, done.port and done.port.guid) == ("resolved", HOST)


# --- the far end's words ------------------------------------------------------------------


def test_port_down_does_not_claim_a_stale_far_end_is_fine() -> None:
    """The host end did not answer: nothing is known of it, so the message must not say the
    fault is "not at the far end"; it says the far end does not answer."""
    engine = Engine()
    step(engine, [sw(), host()], 0)
    (ev,) = step(engine, [sw(state=1), host(stale=True)], 1)
    assert ev.type == "port_down"
    assert "not at the far end" not in ev.message
    assert "host005 mlx5_0 port 1" in ev.message
    assert "does not answer" in ev.message
    # an end that answered Active is fine, and says so
    engine = Engine()
    step(engine, [sw(), host()], 0)
    (ev,) = step(engine, [sw(state=1), host()], 1)
    assert "not at the far end (host005 mlx5_0 port 1)" in ev.message


# --- boundaries ---------------------------------------------------------------------------


def _congested(util: float) -> Event:
    engine = Engine()
    out: list[Event] = []
    for t in range(3):
        v = view(xmit_wait_ratio=0.3, utilization_tx=util)
        out += step(engine, [v], t)
    (ev,) = out
    return ev


def test_hotspot_at_exactly_its_utilization_level() -> None:
    assert _congested(0.4).details["kind"] == "hotspot"
    assert _congested(0.3999).details["kind"] == "backpressure"


def test_majority_rate_needs_more_than_half_not_a_tie() -> None:
    """Two 100G and two 25G ports: no majority, so neither half is degraded."""
    ports = [view("1"), view("2"), view("3", rate_bps=25e9), view("4", rate_bps=25e9)]
    assert step(Engine(), ports, 0) == []


def test_majority_rate_at_exactly_its_minimum_port_count() -> None:
    """Three ports (the default minimum), two at 100G: the 25G one is degraded."""
    (ev,) = step(Engine(), [view("1"), view("2"), view("3", rate_bps=25e9)], 0)
    assert (ev.type, ev.port and ev.port.port) == ("link_degraded", "3")
    assert step(Engine({"link_degraded": {"majority_min_ports": 4}}),
                [view("1"), view("2"), view("3", rate_bps=25e9)], 0) == []


def test_majority_rate_counts_only_ports_graded_by_rate() -> None:
    """A port whose link names its best width and speed is graded by them, not by the
    majority: four NDR switch links (400G, at their best) beside three HDR host ports that
    name no best (200G) leave the host ports alone, as three hosts alone would."""
    best = link("4X", "NDR", "4X", "NDR")
    switches = [view(str(p), guid=SWITCH, rate_bps=400e9, link=best) for p in range(1, 5)]
    hosts = [view("1", guid=f"0x0002c9030000001{i}", rate_bps=200e9) for i in range(3)]
    assert step(Engine(), switches + hosts, 0) == []
    (ev,) = step(Engine(), switches + hosts[:2] + [
        view("1", guid="0x0002c90300000012", rate_bps=100e9)], 0)
    assert (ev.type, ev.port and ev.port.guid) == ("link_degraded", "0x0002c90300000012")


def test_degraded_rate_tolerance() -> None:
    """A rate within 0.1 % of the expected one is rounding, not a degraded link."""
    engine = Engine({"link_degraded": {"expected_rate_gbps": 200}})
    assert step(engine, [view("1", rate_bps=199.81e9)], 0) == []
    engine = Engine({"link_degraded": {"expected_rate_gbps": 200}})
    (ev,) = step(engine, [view("1", rate_bps=199.7e9)], 0)
    assert ev.type == "link_degraded"


def test_a_pinned_symbol_error_counter_publishes_no_ber() -> None:
    """A saturated counter loses increments: its BER is unknown, not 0 and not a low value."""
    engine = Engine({"high_ber": {"window": 10}})
    pinned = frozenset({"symbol_errors"})
    step(engine, [view(totals={"symbol_errors": 65535}, saturated=pinned)], 0)
    quiet = view(totals={"symbol_errors": 65535}, saturated=pinned)
    step(engine, [quiet], 1)
    assert quiet.symbol_error_ber is None
    engine = Engine({"high_ber": {"window": 60}})
    step(engine, [view(totals={"symbol_errors": 100})], 0)
    moved = view(totals={"symbol_errors": 101}, saturated=pinned)
    assert [e for e in step(engine, [moved], 1) if e.type == "high_ber"] == []
    assert moved.symbol_error_ber is None
    # the same port unpinned: a gauge, 0 when quiet
    engine = Engine({"high_ber": {"window": 10}})
    step(engine, [view(totals={"symbol_errors": 100})], 0)
    free = view(totals={"symbol_errors": 100})
    step(engine, [free], 1)
    assert free.symbol_error_ber == 0.0
