"""Likely causes, breakdowns and actions in events; link faults once per link, both ends named.

Views are built by hand with the detail counters G1's sources put in ``PortView.totals``
(``receive_local_physical_errors``...): present on some polls, absent on others, as a source
that reads them only when the aggregate moved produces them.
"""

from __future__ import annotations

import dataclasses
import sys
from array import array
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from detect_views import store_views, view

from ibmon.detect.cause import (
    CAUSES,
    DISCARD_DETAILS,
    RECEIVE_DETAILS,
    DetailWindow,
    dominant,
    end_name,
    peer_note,
    peer_summary,
)
from ibmon.detect.columns import Fresh
from ibmon.detect.engine import Engine
from ibmon.detect.events import Event
from ibmon.infiniband.model import LinkInfo, PortIdentity, PortView, replaced
from ibmon.track.totals import Totals

LEAF = "0x0002c90100000010"
HOST = "0x0002c90a00000007"


def leaf_view(port: str = "12", **fields: Any) -> PortView:
    """leaf07 port 12, cabled to gpu031 mlx5_0 port 1."""
    ident = PortIdentity(guid=LEAF, port=port, node_desc="leaf07", node_type="switch", lid=3)
    lk = LinkInfo(remote_guid=HOST, remote_port="1", remote_node_desc="gpu031 mlx5_0",
                  active_width="4X", active_speed="EDR", max_width="4X", max_speed="EDR")
    fields.setdefault("link", lk)
    fields.setdefault("state", 4)
    fields.setdefault("phys_state", 5 if fields["state"] == 4 else 2)
    return PortView(identity=ident, rate_bytes_per_second=100e9 / 8, **fields)


def host_view(**fields: Any) -> PortView:
    ident = PortIdentity(guid=HOST, port="1", device="mlx5_0", node_desc="gpu031 mlx5_0",
                         lid=9)
    lk = LinkInfo(remote_guid=LEAF, remote_port="12", remote_node_desc="leaf07",
                  active_width="4X", active_speed="EDR", max_width="4X", max_speed="EDR")
    fields.setdefault("link", lk)
    fields.setdefault("state", 4)
    fields.setdefault("phys_state", 5 if fields["state"] == 4 else 2)
    return PortView(identity=ident, rate_bytes_per_second=100e9 / 8, **fields)


def step(engine: Engine, views: list[PortView], t: float) -> list[Event]:
    return engine.process({v.key: v for v in views}, monotonic=t, wall=1e9 + t)


def receive_errors(engine: Engine, details: dict[str, int], *, per_poll: int = 1240,
                   polls: int = 1) -> list[Event]:
    """A clean baseline, then ``polls`` polls in which receive errors and ``details`` grow."""
    base = dict.fromkeys(RECEIVE_DETAILS, 0)
    step(engine, [leaf_view(totals={"receive_errors": 0, **base})], 0)
    out: list[Event] = []
    for n in range(1, polls + 1):
        totals = {"receive_errors": per_poll * n,
                  **{k: base[k] + details.get(k, 0) * n for k in base}}
        out += step(engine, [leaf_view(totals=totals,
                                       rates={"receive_errors": float(per_poll)})], n)
    return out


def test_the_issues_example_reads_like_the_issue() -> None:
    engine = Engine()
    (ev,) = receive_errors(engine, {"receive_local_physical_errors": 1215,
                                    "receive_malformed_packet_errors": 25})
    assert ev.type == "receive_errors"
    assert ev.details["cause"] == "physical"
    assert ev.details["breakdown"]["receive_local_physical_errors"] == 1215
    assert ev.details["breakdown"]["receive_malformed_packet_errors"] == 25
    assert ev.message.startswith(
        "leaf07 port 12 (to gpu031 mlx5_0 port 1): 1,240 receive errors in 60 s, "
        "98 % local physical errors: suspect the cable or transceiver")
    assert ev.peer is not None
    assert ev.peer.node_desc == "gpu031 mlx5_0"
    action = ev.details["action"]
    assert "leaf07 port 12" in action
    assert "gpu031 mlx5_0 port 1" in action


@pytest.mark.parametrize(("counter", "cause"), sorted(RECEIVE_DETAILS.items()))
def test_each_receive_detail_names_its_cause(counter: str, cause: str) -> None:
    (ev,) = receive_errors(Engine(), {counter: 1200})
    assert ev.details["cause"] == cause
    assert ev.details["breakdown"][counter] == 1200


@pytest.mark.parametrize(("counter", "cause"), sorted(DISCARD_DETAILS.items()))
def test_each_discard_detail_names_its_cause(counter: str, cause: str) -> None:
    engine = Engine()
    base = dict.fromkeys(DISCARD_DETAILS, 0)
    step(engine, [leaf_view(totals={"transmit_discards": 0, **base})], 0)
    (ev,) = step(engine, [leaf_view(totals={"transmit_discards": 500, **base, counter: 500},
                                    rates={"transmit_discards": 500.0})], 1)
    assert (ev.type, ev.details["cause"]) == ("discards", cause)
    assert ev.details["breakdown"][counter] == 500


def test_breakdown_is_over_the_window_from_totals_not_one_sample() -> None:
    """Details missing from a poll's sample keep their totals; the window adds up across polls
    and forgets what left it."""
    w = DetailWindow("receive_errors", ("receive_local_physical_errors",), window=60)
    key = (LEAF, "12")
    w.observe(key, 0, {"receive_errors": 100, "receive_local_physical_errors": 90})
    assert w.increase(key, 0) == (0, {})  # a baseline is not an increase
    w.observe(key, 10, {"receive_errors": 110, "receive_local_physical_errors": 99})
    w.observe(key, 20, {"receive_errors": 110, "receive_local_physical_errors": 99})
    w.observe(key, 30, {"receive_errors": 130, "receive_local_physical_errors": 119})
    assert w.increase(key, 30) == (30, {"receive_local_physical_errors": 29})
    assert w.increase(key, 75) == (20, {"receive_local_physical_errors": 20})  # t=10 left
    assert w.increase(key, 91) == (0, {})
    # a detail that appears later (read at the first move) is left out, never its history
    w2 = DetailWindow("receive_errors", ("receive_local_physical_errors",), window=60)
    w2.observe(key, 0, {"receive_errors": 5})
    w2.observe(key, 1, {"receive_errors": 9, "receive_local_physical_errors": 70_000})
    assert w2.increase(key, 1) == (4, {})
    # a detail first read while the aggregate stood still (a baseline read) counts from there
    w3 = DetailWindow("receive_errors", ("receive_local_physical_errors",), window=60)
    w3.observe(key, 0, {"receive_errors": 100})
    w3.observe(key, 10, {"receive_errors": 100, "receive_local_physical_errors": 90})
    w3.observe(key, 20, {"receive_errors": 110, "receive_local_physical_errors": 99})
    assert w3.increase(key, 20) == (10, {"receive_local_physical_errors": 9})
    # a detail no longer read at the end of the window: its increase is not known
    w4 = DetailWindow("receive_errors", ("receive_local_physical_errors",), window=60)
    w4.observe(key, 0, {"receive_errors": 100, "receive_local_physical_errors": 90})
    w4.observe(key, 10, {"receive_errors": 110})
    assert w4.increase(key, 10) == (10, {})


def test_details_first_read_on_a_quiet_poll_count_from_that_read() -> None:
    """A source's baseline read brings a port's details while its aggregate stands still; the
    engine's window records them then (on a poll like the one before, where most answers are
    reused), so the next move has its breakdown and cause at once."""
    engine = Engine()
    details = dict.fromkeys(RECEIVE_DETAILS, 0)
    step(engine, [leaf_view(totals={"receive_errors": 100})], 0)
    step(engine, [leaf_view(totals={"receive_errors": 100})], 1)
    step(engine, [leaf_view(totals={"receive_errors": 100, **details,
                                    "receive_local_physical_errors": 90})], 2)
    (ev,) = step(engine, [leaf_view(totals={"receive_errors": 1340, **details,
                                            "receive_local_physical_errors": 1330},
                                    rates={"receive_errors": 1240.0})], 3)
    assert (ev.type, ev.details["cause"]) == ("receive_errors", "physical")
    assert ev.details["breakdown"]["receive_local_physical_errors"] == 1240


def test_the_window_keeps_the_last_record_before_it_starts() -> None:
    w = DetailWindow("receive_errors", ("receive_local_physical_errors",), window=60)
    key = (LEAF, "12")
    for t, total in ((0, 100), (10, 110), (70, 130), (75, 140)):
        w.observe(key, t, {"receive_errors": total, "receive_local_physical_errors": total})
    # the window (15, 75] starts from the total at t=10, the last one before it
    assert w.increase(key, 75) == (30, {"receive_local_physical_errors": 30})


def test_a_port_quiet_for_a_whole_window_drops_out_of_the_detectors_work() -> None:
    """A quiet port costs one comparison a poll: once its last change has left the window it
    keeps no history, and ``moves`` says there is nothing to record for it."""
    w = DetailWindow("receive_errors", ("receive_local_physical_errors",), window=60)
    key = (LEAF, "12")
    for t, total in ((0, 100), (10, 110)):
        w.observe(key, t, {"receive_errors": total, "receive_local_physical_errors": total})
    quiet = {"receive_errors": 110, "receive_local_physical_errors": 110}
    pairs = [(key, view(totals=quiet))]
    # details first read while the aggregate stands still are no change either
    other = (LEAF, "13")
    w.observe(other, 0, {"receive_errors": 110})
    w.observe(other, 10, quiet)
    assert list(w.moves([(other, view(totals=quiet))], [110])) == [False]
    assert list(w.moves(pairs, [110])) == [True]  # an increase still in the window
    w.observe(key, 80, quiet)  # the change at t=10 has left the window
    assert list(w.moves(pairs, [110])) == [False]
    assert w.increase(key, 80) == (0, {})


@pytest.mark.parametrize("later", [1240, 0], ids=["still-rising", "stopped"])
def test_details_first_read_at_the_first_move_name_the_cause_one_poll_later(later: int) -> None:
    """``mad`` and ``diags`` read a port's detail counters only once its aggregate moved, so on
    the poll the errors start the details have no earlier value to count from. The event waits
    one poll for their increase and names the cause, instead of firing at once as
    ``unknown``; it fires then even when the errors have stopped, with the rate that crossed."""
    engine = Engine()
    step(engine, [leaf_view(totals={"receive_errors": 0})], 0)  # details not read yet
    history = dict.fromkeys(RECEIVE_DETAILS, 0) | {"receive_local_physical_errors": 70_000}
    first = {"receive_errors": 1240, **history}
    assert step(engine, [leaf_view(totals=first, rates={"receive_errors": 1240.0})], 1) == []
    then = first | {"receive_errors": 1240 + later,
                    "receive_local_physical_errors": 70_000 + later}
    (ev,) = step(engine, [leaf_view(totals=then, rates={"receive_errors": float(later)})], 2)
    assert ev.type == "receive_errors"
    assert ev.value == 1240.0
    if later:
        assert ev.details["cause"] == "physical"
        moved = {k: v for k, v in ev.details["breakdown"].items() if v}
        assert moved == {"receive_local_physical_errors": later}  # not the 70,000 of history
    else:  # nothing moved after the first read: nothing to name, and no history counted
        assert ev.details["cause"] == "unknown"
        assert ev.details["breakdown"] == {}


def test_without_detail_counters_the_other_counters_decide() -> None:
    """sysfs ports have no details: symbol errors on the port mean the wire, else unknown."""
    engine = Engine()
    step(engine, [view(totals={"receive_errors": 0, "symbol_errors": 0})], 0)
    (ev,) = [e for e in step(engine, [view(totals={"receive_errors": 50, "symbol_errors": 6000},
                                           rates={"receive_errors": 50.0})], 1)
             if e.type == "receive_errors"]
    assert ev.details["cause"] == "physical"
    assert ev.details["breakdown"] == {}
    assert "no detail counters" in ev.message
    assert "symbol errors are rising on the same link (BER" in ev.message
    engine = Engine()
    step(engine, [view(totals={"receive_errors": 0})], 0)
    (ev,) = step(engine, [view(totals={"receive_errors": 50}, rates={"receive_errors": 50.0})], 1)
    assert ev.details["cause"] == "unknown"
    assert set(ev.details) >= {"cause", "breakdown", "action"}


@pytest.mark.parametrize(("integrity", "cause"), [
    ("local_link_integrity_errors", "physical"),
    ("excessive_buffer_overrun_errors", "buffer_overrun"),
])
def test_without_detail_counters_integrity_errors_lend_their_cause(integrity: str,
                                                                    cause: str) -> None:
    """PortRcvErrors counts packets dropped for buffer overruns as well as bad packets off the
    wire: receive errors beside overrun integrity errors are flow control, not the cable."""
    engine = Engine()
    zero = {"receive_errors": 0, "local_link_integrity_errors": 0,
            "excessive_buffer_overrun_errors": 0}
    step(engine, [view(totals=zero)], 0)
    fired = step(engine, [view(totals={**zero, integrity: 3})], 1)
    assert [(e.type, e.details["cause"]) for e in fired] == [("link_integrity", cause)]
    (ev,) = step(engine, [view(totals={**zero, integrity: 3, "receive_errors": 50},
                               rates={"receive_errors": 50.0})], 2)
    assert (ev.type, ev.details["cause"]) == ("receive_errors", cause)
    assert "no detail counters" in ev.message


def test_discards_while_stalled_are_congestion_victims() -> None:
    engine = Engine()
    step(engine, [view(totals={"transmit_discards": 0})], 0)
    (ev,) = step(engine, [view(totals={"transmit_discards": 500}, xmit_wait_ratio=0.3,
                               rates={"transmit_discards": 500.0})], 1)
    assert ev.details["cause"] == "congestion_victim"


def test_an_event_says_what_the_far_end_shows() -> None:
    engine = Engine({"high_ber": {"window": 10}})
    base = dict.fromkeys(RECEIVE_DETAILS, 0)
    step(engine, [leaf_view(totals={"receive_errors": 0, **base}),
                  host_view(totals={"symbol_errors": 0})], 0)
    evs = step(engine, [leaf_view(totals={"receive_errors": 100, **base,
                                          "receive_local_physical_errors": 100},
                                  rates={"receive_errors": 100.0}),
                        host_view(totals={"symbol_errors": 5000})], 1)
    (ev,) = [e for e in evs if e.type == "receive_errors"]
    assert "symbol errors are rising at the far end too" in ev.message
    assert ev.details["peer_shows"]["symbol_error_ber"] > 0


@pytest.mark.parametrize(("far", "says"), [
    ({"stale": True}, "the far end does not answer"),
    ({"state": 1}, "the far end is down"),
    ({"state": 2}, "the far end is init"),
])
def test_an_event_says_when_the_far_end_is_silent_or_not_active(
    far: dict[str, Any], says: str
) -> None:
    """Receive errors on one end of a link whose other end does not answer, or has left
    Active: the message says so (a link coming up or going down explains the errors)."""
    engine = Engine()
    base = dict.fromkeys(RECEIVE_DETAILS, 0)
    step(engine, [leaf_view(totals={"receive_errors": 0, **base}), host_view()], 0)
    evs = step(engine, [leaf_view(totals={"receive_errors": 100, **base,
                                          "receive_local_physical_errors": 100},
                                  rates={"receive_errors": 100.0}),
                        host_view(**far)], 1)
    (ev,) = [e for e in evs if e.type == "receive_errors"]
    assert says in ev.message
    assert "symbol errors are rising at the far end" not in ev.message


def test_a_link_fault_is_raised_once_on_the_switch_end_with_both_ends_named() -> None:
    engine = Engine()
    step(engine, [leaf_view(), host_view()], 0)
    down = [leaf_view(state=1), host_view(state=1)]
    (ev,) = step(engine, down, 1)
    assert (ev.type, ev.status) == ("port_down", "firing")
    assert ev.port is not None
    assert (ev.port.guid, ev.port.port) == (LEAF, "12")
    assert ev.peer is not None
    assert (ev.peer.guid, ev.peer.port) == (HOST, "1")
    assert ev.details["cause"] == "link_down"
    assert [e["holds"] for e in ev.details["ends"]] == [True, True]
    assert "leaf07 port 12 (to gpu031 mlx5_0 port 1)" in ev.message
    assert "at both ends" in ev.message
    # the condition shows on both ports; the cause (and so the alert) only on the carrier
    assert [v.conditions for v in down] == [frozenset({"down"})] * 2
    assert down[0].causes == {"down": "link_down"}
    assert down[1].causes == {}
    assert step(engine, [leaf_view(state=1), host_view(state=1)], 2) == []
    (done,) = step(engine, [leaf_view(), host_view()], 3)
    assert (done.type, done.status, done.port and done.port.guid) == (
        "port_down", "resolved", LEAF)


def test_a_port_whose_peer_is_not_seen_carries_its_own_link_fault() -> None:
    engine = Engine()
    step(engine, [host_view()], 0)
    (ev,) = step(engine, [host_view(state=1)], 1)
    assert ev.port is not None
    assert ev.port.guid == HOST
    assert "ends" not in ev.details


def test_a_hidden_far_end_does_not_hold_the_link_fault_open() -> None:
    """A fabric-wide source loses the host end of a host link that is down (stale); the
    switch end alone decides."""
    engine = Engine()
    step(engine, [leaf_view(), host_view()], 0)
    (ev,) = step(engine, [leaf_view(state=1), host_view(stale=True)], 1)
    assert ev.port is not None
    assert ev.port.guid == LEAF
    (done,) = step(engine, [leaf_view(), host_view(stale=True)], 2)
    assert done.status == "resolved"


def test_a_hidden_carrying_end_leaves_the_far_end_to_decide() -> None:
    """The other way round: the switch that carries a host link's fault stops answering (a
    hung switch); the host end, which answers, says the link is up again, and that ends it."""
    engine = Engine()
    step(engine, [leaf_view(), host_view()], 0)
    (ev,) = step(engine, [leaf_view(state=1), host_view(state=1)], 1)
    assert ev.port is not None and ev.port.guid == LEAF
    assert step(engine, [leaf_view(state=1, stale=True), host_view(state=1)], 2) == []
    (done,) = step(engine, [leaf_view(state=1, stale=True), host_view()], 3)
    assert (done.status, done.port and done.port.guid) == ("resolved", LEAF)


def test_no_end_with_an_opinion_leaves_the_link_fault_as_it_is() -> None:
    """The host end is silent and the switch end's state could not be read this poll (no
    opinion): nothing says the link is up, so its fault stays; a state read says so."""
    engine = Engine()
    step(engine, [leaf_view(), host_view()], 0)
    (fired,) = step(engine, [leaf_view(state=1), host_view(state=1)], 1)
    assert fired.status == "firing"
    assert step(engine, [leaf_view(state=None, phys_state=None), host_view(stale=True)], 2) == []
    assert [a.type for a in engine.active()] == ["port_down"]
    (done,) = step(engine, [leaf_view(), host_view(stale=True)], 3)
    assert done.status == "resolved"


def test_one_end_up_ends_the_link_fault_the_other_end_has_no_opinion_of() -> None:
    engine = Engine()
    step(engine, [leaf_view(), host_view()], 0)
    (fired,) = step(engine, [leaf_view(state=1), host_view(state=1)], 1)
    assert fired.status == "firing"
    (done,) = step(engine, [leaf_view(), host_view(state=None, phys_state=None)], 2)
    assert (done.status, done.port and done.port.guid) == ("resolved", LEAF)


def test_the_cause_stays_as_announced_while_the_condition_holds() -> None:
    engine = Engine()
    (ev,) = receive_errors(engine, {"receive_local_physical_errors": 1240})
    assert ev.details["cause"] == "physical"
    totals = {"receive_errors": 1240 * 2, **dict.fromkeys(RECEIVE_DETAILS, 0),
              "receive_local_physical_errors": 1240, "receive_dlid_mapping_errors": 1240 * 3}
    v = leaf_view(totals=totals, rates={"receive_errors": 1240.0})
    assert step(engine, [v], 2) == []
    (active,) = engine.active()
    assert active.finding.details["cause"] == "physical"
    assert v.causes == {"receive_errors": "physical"}


def test_dominant_ties_and_groups() -> None:
    assert dominant({}, RECEIVE_DETAILS) == ("unknown", 0.0)
    # three routing counters outweigh one bigger physical one
    cause, share = dominant({"receive_local_physical_errors": 40,
                             "receive_dlid_mapping_errors": 20, "receive_vl_mapping_errors": 20,
                             "receive_looping_errors": 20}, RECEIVE_DETAILS)
    assert (cause, share) == ("routing", 0.6)
    assert dominant({"receive_local_physical_errors": 5, "receive_looping_errors": 5},
                    RECEIVE_DETAILS)[0] == "physical"
    assert set(RECEIVE_DETAILS.values()) | set(DISCARD_DETAILS.values()) <= set(CAUSES)


def test_state_from_before_links_were_joined_resolves_both_ends() -> None:
    """A state file saved when each end raised its own port_down: both resolve once."""
    old = Engine()
    step(old, [leaf_view()], 0)
    step(old, [leaf_view(state=1)], 1)
    step(old, [host_view()], 0)
    step(old, [host_view(state=1)], 1)
    assert len(old.active()) == 2
    engine = Engine()
    engine.load(old.dump())
    assert step(engine, [leaf_view(state=1), host_view(state=1)], 2) == []
    done = step(engine, [leaf_view(), host_view()], 3)
    assert sorted((e.type, e.status, e.port and e.port.guid) for e in done) == [
        ("port_down", "resolved", LEAF), ("port_down", "resolved", HOST)]
    assert engine.active() == []


def test_a_down_link_that_discovery_no_longer_shows_is_still_one_link() -> None:
    """ibnetdiscover shows no neighbour behind a port whose link is down: the ends are paired
    by the link they last had, so the fault is still raised once, naming the far end."""
    engine = Engine()
    step(engine, [leaf_view(), host_view()], 0)
    unlinked = [leaf_view(state=1, link=None), host_view(state=1, link=None)]
    (ev,) = step(engine, unlinked, 1)
    assert ev.port is not None
    assert ev.port.guid == LEAF
    assert ev.peer is not None
    assert ev.peer.guid == HOST
    (done,) = step(engine, [leaf_view(), host_view()], 2)
    assert done.status == "resolved"
    # re-cabled to another host, then down again with no neighbour shown: paired with the
    # host it had last, not the one it had when it first went down
    other = "0x0002c90a00000008"
    to_other = LinkInfo(remote_guid=other, remote_port="1", remote_node_desc="gpu032 mlx5_0",
                        active_width="4X", active_speed="EDR", max_width="4X", max_speed="EDR")

    def other_view(**fields: Any) -> PortView:
        view = host_view(**fields)
        return dataclasses.replace(view, identity=dataclasses.replace(
            view.identity, guid=other, node_desc="gpu032 mlx5_0", lid=10))

    step(engine, [leaf_view(link=to_other), other_view()], 3)
    downs = [e for e in step(engine, [leaf_view(state=1, link=None),
                                      other_view(state=1, link=None)], 4)
             if e.type == "port_down"]
    assert [(e.port and e.port.guid, e.peer and e.peer.guid) for e in downs] == [(LEAF, other)]


def test_an_end_is_named_by_its_description_else_its_device_else_its_guid() -> None:
    """A port whose node description is empty (a host that never set one) is still named the
    way an operator finds it: ``mlx5_0 port 1`` on a host, the GUID where nothing else."""
    ident = PortIdentity(guid="0x0002c90300a1b2c3", port="1", device="mlx5_0",
                         node_desc="gpu031 mlx5_0")
    assert end_name(ident) == "gpu031 mlx5_0 port 1"
    assert end_name(dataclasses.replace(ident, node_desc="")) == "mlx5_0 port 1"
    assert end_name(dataclasses.replace(ident, node_desc="", device="")) == (
        "0x0002c90300a1b2c3 port 1")
    assert end_name(None, "0x0002c90300ffff01", "12", "leaf03") == "leaf03 port 12"
    assert end_name(None, "0x0002c90300ffff01", "12") == "0x0002c90300ffff01 port 12"
    assert end_name(None) == "its peer"


def test_what_the_rest_of_the_link_shows_is_said_in_the_message_and_the_details() -> None:
    here = view(symbol_error_ber=2e-12)
    far = view("12", guid="0x0002c90300ffff01", symbol_error_ber=3e-12,
               conditions=frozenset({"link_integrity", "high_ber"}))
    assert peer_note(here, far) == (
        "symbol errors are rising on the same link (BER 2e-12); "
        "symbol errors are rising at the far end too (BER 3e-12); "
        "the far end has high_ber, link_integrity")
    assert peer_note(here, far, own_ber=False).startswith("symbol errors are rising at the far")
    assert peer_summary(far) == {"state": 4, "state_name": "ACTIVE", "phys_state": 5,
                                 "phys_state_name": "LinkUp", "stale": False,
                                 "symbol_error_ber": 3e-12,
                                 "conditions": ["high_ber", "link_integrity"]}
    # a far end that does not answer, is down, or whose state is not known yet
    silent = dataclasses.replace(far, stale=True, conditions=frozenset())
    assert peer_note(view(), silent) == "the far end does not answer"
    assert peer_summary(silent)["stale"] is True  # type: ignore[index]
    down = view("12", state=1)
    assert peer_note(view(), down) == "the far end is down"
    assert peer_note(view(), view("12", state=None)) == ""
    assert peer_summary(view("12", state=None))["state"] is None  # type: ignore[index]
    assert (peer_note(view(), None), peer_summary(None)) == ("", None)


def test_a_port_whose_counters_grew_among_a_stores_rows_is_recorded() -> None:
    """On a fabric-sized poll most ports are rows of the tracker's store and a few have their
    own arrays (a reset, a counter set that changed). A port read with more counters than its
    record (its details read for the first time) must be recorded, whether its totals are a
    store row or its own."""
    views = store_views()
    names = [n for n in views[0].totals if n != "receive_local_physical_errors"]
    w = DetailWindow("receive_errors", ("receive_local_physical_errors",), window=60)
    for i, v in enumerate(views):  # recorded without the detail, as before its first read
        fewer = {n: v.totals[n] for n in names}
        views[i] = replaced(v, totals=Totals({n: j for j, n in enumerate(names)},
                                             array("Q", fewer.values())))
        w.observe(v.identity.key, 0.0, fewer)
    grown = views[4].totals
    assert isinstance(grown, Totals)
    views[4] = replaced(views[4], totals=Totals(
        {**grown.index, "receive_local_physical_errors": len(names)},
        array("Q", [*grown.own(), 0])))
    shared = array("Q", [x for v in views if v is not views[4] for x in v.totals.own()])
    index = views[0].totals.index  # type: ignore[attr-defined]
    at = 0
    for i, v in enumerate(views):  # the others: rows of one array, as the store's
        if i != 4:
            views[i] = replaced(v, totals=Totals(index, shared, at))
            at += len(index)
    fresh = Fresh()
    fresh.extend((v.identity.key, v) for v in views)
    aggregates = [v.totals["receive_errors"] for v in views]
    want = [i == 4 for i in range(len(views))]
    assert list(map(bool, w.moves([(v.identity.key, v) for v in views], aggregates))) == want
    assert list(map(bool, w.moves(fresh, aggregates))) == want
