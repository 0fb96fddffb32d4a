"""One port JSON and one set of state names for scan, the API and top."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from exporters.ports import port_detail_json, port_json
from ibmon.detect.events import Event, PortRef
from ibmon.infiniband.model import LinkInfo, phys_state_name, state_label, state_name
from ibmon.infiniband.xmitwait import WaitUnit
from ibmon.state import FabricState
from tests.detect_views import GUID, PEER, link, view


def test_state_names_as_the_kernel_spells_them() -> None:
    assert [state_name(s) for s in (1, 2, 3, 4)] == ["DOWN", "INIT", "ARMED", "ACTIVE"]
    assert [phys_state_name(p) for p in (2, 3, 4, 5, 6)] == [
        "Polling", "Disabled", "PortConfigurationTraining", "LinkUp", "LinkErrorRecovery"]
    assert state_name(None) is None and state_name(9) == "9"


def test_table_cells_explain_a_port_that_is_not_active() -> None:
    assert state_label(4, 5) == "ACTIVE"
    assert state_label(1, 2) == "DOWN/Polling"
    assert state_label(1, 3) == "DOWN/Disabled"
    assert state_label(2, 5) == "INIT/LinkUp"
    assert state_label(1, None) == "DOWN"
    assert state_label(None, None) == "-"


def test_port_json_keeps_numbers_and_adds_names() -> None:
    doc = port_json(view(state=1))
    assert (doc["state"], doc["state_name"]) == (1, "DOWN")
    assert (doc["phys_state"], doc["phys_state_name"]) == (2, "Polling")
    for key in ("totals", "rates", "hw_totals", "conditions", "active", "symbol_error_ber",
                "utilization", "transmit_wait_ratio", "remote", "source"):
        assert key in doc


def test_port_json_says_what_one_transmit_wait_count_is_at_the_ports_width() -> None:
    """A program turning PortXmitWait into time needs the bytes a count stands for on this
    port: 32 per lane on a 2X Switch-IB 2 port is 64 for the port."""
    lanes = WaitUnit(32, True, "family", "Switch-IB 2")
    ident = replace(view().identity, xmit_wait=lanes)
    doc = port_json(replace(view(), identity=ident, active_width="2X"))
    assert doc["transmit_wait_unit"] == {"bytes": 32, "per": "lane", "bytes_per_count": 64.0,
                                         "source": "family", "family": "Switch-IB 2"}
    doc = port_json(view(active_width="4X"))
    assert doc["transmit_wait_unit"]["per"] == "port"
    assert doc["transmit_wait_unit"]["bytes_per_count"] == 8.0


def test_port_json_shows_the_link_and_the_counters_health_as_the_view_has_them() -> None:
    v = view(link=link(width="1X", max_width="4X", speed="HDR", max_speed="NDR"),
             saturated=frozenset({"symbol_errors", "link_downed"}),
             resets={"transmit_data": 2}, hw_gauges={"np_cnp_sent": 3},
             xmit_wait_seconds=1.5)
    doc = port_json(v)
    assert doc["remote"] == {"guid": PEER, "port": "12", "node_desc": "leaf03",
                             "max_width": "4X", "max_speed": "NDR"}
    assert doc["saturated"] == ["link_downed", "symbol_errors"]
    assert doc["resets"] == {"transmit_data": 2}
    assert doc["hw_gauges"] == {"np_cnp_sent": 3}
    assert doc["transmit_wait_seconds_total"] == 1.5
    assert port_json(view())["remote"] is None


def _event(at: int, port: PortRef, peer: PortRef | None = None) -> Event:
    return Event(time=datetime.fromtimestamp(1e9 + at, UTC), fabric="main",
                 type="link_flapping", status="firing", severity="warning", port=port,
                 peer=peer, message=f"event {at}")


def test_a_port_answer_has_both_ends_and_the_newest_events_about_either() -> None:
    here = view(link=link(), conditions=frozenset({"flapping"}), utilization_tx=0.2)
    back = LinkInfo(remote_guid=GUID, remote_port="1", remote_node_desc="host042 mlx5_0",
                    active_width="4X", active_speed="EDR", max_width="4X", max_speed="EDR")
    far = view("12", guid=PEER, node_desc="leaf03", link=back, state=1,
               utilization_rx=0.7)
    other = view("3", guid="0x0002c90300000099", node_desc="leaf09")
    state = FabricState(generated=5.0, ports={v.key: v for v in (here, far, other)})
    mine, theirs, elsewhere = (PortRef(guid=v.key[0], port=v.key[1]) for v in (here, far, other))
    events = [_event(0, mine), _event(1, elsewhere),
              _event(2, elsewhere, peer=theirs),  # about the far end, from its other side
              _event(3, theirs), _event(4, elsewhere, peer=elsewhere), _event(5, mine)]
    doc = port_detail_json(state, here.key, (), events, max_events=3)
    assert doc is not None
    assert [e["message"] for e in doc["events"]] == ["event 2", "event 3", "event 5"]
    assert doc["peer"]["guid"] == PEER and doc["peer"]["state_name"] == "DOWN"
    # the link as both ends see it: the far end is down, and its traffic counts
    assert doc["link"]["b"]["seen"] is True
    assert doc["link"]["state"] == "down"
    assert doc["link"]["utilization"] == 0.7
    # the far end unseen: named from the link, never invented
    alone = FabricState(generated=5.0, ports={here.key: here})
    doc = port_detail_json(alone, here.key, (), events)
    assert doc is not None
    assert doc["peer"] == {"guid": PEER, "port": "12", "node_desc": "leaf03", "seen": False}
    assert doc["link"]["b"]["seen"] is False
    assert port_detail_json(alone, far.key, (), events) is None
