"""The likely-cause table, written out independently of the code under test.

A person routes an alert on ``details.cause``: a detail counter mapped to the wrong cause
sends the on-call to the wrong place (an MTU mismatch reported as a cable). The expected
cause of each counter is spelled here literally, never read back from ``RECEIVE_DETAILS`` or
``DISCARD_DETAILS``, so remapping one in ``ibmon.detect.cause`` fails a test. So are the
fallbacks used when no detail counter moved, and which cause wins when several apply.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from detect_views import view
from test_detect_cause import host_view, leaf_view, receive_errors, step

from ibmon.detect.cause import Cause, dominant, preferred
from ibmon.detect.engine import Engine
from ibmon.detect.errors import Discards, DiscardsSettings, ReceiveErrors, ReceiveErrorsSettings

#: PortRcvErrorDetails (IBA 16.1.4.x) and what each points to; literal on purpose.
RECEIVE_EXPECTED: list[tuple[str, Cause]] = [
    ("receive_local_physical_errors", "physical"),
    ("receive_malformed_packet_errors", "mtu_mismatch"),
    ("receive_buffer_overrun_errors", "buffer_overrun"),
    ("receive_dlid_mapping_errors", "routing"),
    ("receive_vl_mapping_errors", "routing"),
    ("receive_looping_errors", "routing"),
]
#: PortXmitDiscardDetails and their causes; literal on purpose.
DISCARD_EXPECTED = [
    ("transmit_inactive_discards", "link_down"),
    ("transmit_neighbor_mtu_discards", "mtu_mismatch"),
    ("transmit_sw_lifetime_limit_discards", "congestion_victim"),
    ("transmit_sw_hoq_lifetime_limit_discards", "congestion_victim"),
]
_ALL_RECEIVE = [c for c, _ in RECEIVE_EXPECTED]
_ALL_DISCARD = [c for c, _ in DISCARD_EXPECTED]


@pytest.mark.parametrize(("counter", "cause"), RECEIVE_EXPECTED)
def test_receive_detail_counter_names_its_literal_cause(counter: str, cause: str) -> None:
    (ev,) = receive_errors(Engine(), {counter: 1200})
    assert (ev.type, ev.details["cause"]) == ("receive_errors", cause)
    assert ev.details["breakdown"][counter] == 1200


@pytest.mark.parametrize(("counter", "cause"), DISCARD_EXPECTED)
def test_discard_detail_counter_names_its_literal_cause(counter: str, cause: str) -> None:
    engine = Engine()
    base = dict.fromkeys(_ALL_DISCARD, 0)
    step(engine, [leaf_view(totals={"transmit_discards": 0, **base})], 0)
    (ev,) = step(engine, [leaf_view(totals={"transmit_discards": 500, **base, counter: 500},
                                    rates={"transmit_discards": 500.0})], 1)
    assert (ev.type, ev.details["cause"]) == ("discards", cause)


@pytest.mark.parametrize(("counter", "cause"), [
    ("local_link_integrity_errors", "physical"),
    ("excessive_buffer_overrun_errors", "buffer_overrun"),
])
def test_link_integrity_counter_names_its_literal_cause(counter: str, cause: str) -> None:
    """No detail attribute exists for these two: the counter itself is the verdict."""
    engine = Engine()
    zero = {"local_link_integrity_errors": 0, "excessive_buffer_overrun_errors": 0}
    step(engine, [leaf_view(totals=zero)], 0)
    (ev,) = step(engine, [leaf_view(totals={**zero, counter: 3})], 1)
    assert (ev.type, ev.details["cause"]) == ("link_integrity", cause)


def test_flapping_without_bit_errors_is_the_link_going_down_with_them_the_cable() -> None:
    engine = Engine({"link_flapping": {"count": 2}})
    step(engine, [leaf_view(totals={"link_downed": 0})], 0)
    (ev,) = step(engine, [leaf_view(totals={"link_downed": 2})], 1)
    assert (ev.type, ev.details["cause"]) == ("link_flapping", "link_down")
    engine = Engine({"link_flapping": {"count": 2}, "high_ber": {"window": 10}})
    step(engine, [leaf_view(totals={"link_downed": 0, "symbol_errors": 0})], 0)
    evs = step(engine, [leaf_view(totals={"link_downed": 2, "symbol_errors": 50_000})], 1)
    (flap,) = [e for e in evs if e.type == "link_flapping"]
    assert flap.details["cause"] == "physical"


def test_receive_errors_fallback_without_details() -> None:
    """No detail counters: bit errors on the port mean the wire; integrity errors from buffer
    overruns mean flow control (PortRcvErrors counts the packets an overrun drops)."""
    det = ReceiveErrors(ReceiveErrorsSettings())
    integrity = frozenset({"link_integrity"})
    assert det.fallback(view()) == "unknown"
    assert det.fallback(view(symbol_error_ber=1e-9)) == "physical"
    assert det.fallback(view(conditions=frozenset({"high_ber"}))) == "physical"
    assert det.fallback(view(conditions=integrity,
                             causes={"link_integrity": "physical"})) == "physical"
    assert det.fallback(view(conditions=integrity,
                             causes={"link_integrity": "buffer_overrun"})) == "buffer_overrun"
    assert det.fallback(view(conditions=frozenset({"flapping"}))) == "unknown"


def test_discards_fallback_without_details_and_which_wins() -> None:
    """Stalled for credits at the warning level (10 %) means a congestion victim, and beats a
    link that was down; below it a down or flapping link means link_down."""
    det = Discards(DiscardsSettings())
    assert det.fallback(view()) == "unknown"
    assert det.fallback(view(xmit_wait_ratio=0.10)) == "congestion_victim"
    assert det.fallback(view(xmit_wait_ratio=0.0999)) == "unknown"
    assert det.fallback(view(conditions=frozenset({"congestion"}))) == "congestion_victim"
    assert det.fallback(view(conditions=frozenset({"flapping"}))) == "link_down"
    assert det.fallback(view(conditions=frozenset({"down"}))) == "link_down"
    assert det.fallback(view(xmit_wait_ratio=0.3,
                             conditions=frozenset({"flapping"}))) == "congestion_victim"


def test_a_moved_detail_counter_beats_the_fallback() -> None:
    """Symbol errors on the port would say physical; the malformed packets say MTU."""
    engine = Engine()
    base = dict.fromkeys(_ALL_RECEIVE, 0)
    step(engine, [leaf_view(totals={"receive_errors": 0, "symbol_errors": 0, **base})], 0)
    evs = step(engine, [leaf_view(totals={"receive_errors": 900, "symbol_errors": 90_000,
                                          **base, "receive_malformed_packet_errors": 900},
                                  rates={"receive_errors": 900.0})], 1)
    (ev,) = [e for e in evs if e.type == "receive_errors"]
    assert ev.details["cause"] == "mtu_mismatch"


def test_ties_and_preference_are_literal() -> None:
    """Equal shares go to the cheapest thing to check (the cable); two ends of a link naming
    different causes: the more specific one wins, unknown last."""
    table: dict[str, Cause] = dict(RECEIVE_EXPECTED)
    assert dominant({"receive_buffer_overrun_errors": 5, "receive_local_physical_errors": 5},
                    table) == ("physical", 0.5)
    assert dominant({"receive_buffer_overrun_errors": 5, "receive_looping_errors": 5},
                    table)[0] == "buffer_overrun"
    assert dominant({"receive_malformed_packet_errors": 5, "receive_looping_errors": 5},
                    table)[0] == "routing"
    assert preferred("link_down", "physical") == "physical"
    assert preferred("unknown", "link_down") == "link_down"
    assert preferred("speed_negotiation", "link_down") == "speed_negotiation"
    assert preferred("congestion_victim", "mtu_mismatch") == "mtu_mismatch"
    assert preferred("routing", "buffer_overrun") == "buffer_overrun"


def test_the_more_specific_end_decides_a_link_fault() -> None:
    """Flapping seen at both ends, bit errors only at the host end: the link's cause is the
    cable, though the switch end alone would say link_down."""
    engine = Engine({"link_flapping": {"count": 2}, "high_ber": {"window": 10}})
    step(engine, [leaf_view(totals={"link_downed": 0, "symbol_errors": 0}),
                  host_view(totals={"link_downed": 0, "symbol_errors": 0})], 0)
    evs = step(engine, [leaf_view(totals={"link_downed": 2, "symbol_errors": 0}),
                        host_view(totals={"link_downed": 2, "symbol_errors": 50_000})], 1)
    (flap,) = [e for e in evs if e.type == "link_flapping"]
    assert flap.details["cause"] == "physical"
