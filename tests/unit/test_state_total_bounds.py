"""A state file's counts are refused beyond what a port can have counted.

A restored total is served as it is (``ibmon_port_*_total``) and only grows from there: a total
of 10^30 in a damaged or hand-edited file would be a number no port ever counted, kept for the
daemon's life. Raw values and reset counts are at most 64 bits (the widest counter); totals may
outgrow 64 bits (data counters count 4-byte words, and they survive wraps and resets) but not
2**80 (a 64-bit counter wrapping 65,536 times). The tracker's loader refuses anything beyond,
so the state file is moved aside like any corrupt one.
"""

from __future__ import annotations

from typing import Any

import pytest

from ibmon.track.tracker import STATE_VERSION, Tracker

GUID = "0x0002c90300a1b2c3"


def port(**fields: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "guid": GUID, "port": "1", "monotonic": 10.0, "wall": 1_700_000_000.0,
        "last": {"symbol_errors": 5}, "total": {"symbol_errors": 5}, "resets": {},
        "saturated": [], "stale": [], "hw_last": {}, "hw_total": {}, "hw_resets": {},
        "hw_stale": [],
    }
    doc.update(fields)
    return doc


def load(**fields: Any) -> Tracker:
    tracker = Tracker()
    tracker.load({"version": STATE_VERSION, "ports": [port(**fields)]})
    return tracker


@pytest.mark.parametrize("fields", [
    {"total": {"symbol_errors": 10**30}},
    {"total": {"symbol_errors": 2**80}},
    {"last": {"symbol_errors": 2**64}, "total": {"symbol_errors": 2**64}},
    {"hw_last": {"out_of_buffer": 1}, "hw_total": {"out_of_buffer": 10**30}},
    {"resets": {"symbol_errors": 2**64}},
])
def test_counts_no_port_can_have_counted_are_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"expected an integer from 0 to at most 2\*\*\d+-1"):
        load(**fields)


@pytest.mark.parametrize(("last", "total"), [(2**64 - 1, 4 * (2**64 - 1)), (2**62, 2**64),
                                             (5, 2**80 - 1)])
def test_the_largest_real_counts_are_restored(last: int, total: int) -> None:
    tracker = load(last={"transmit_data": last}, total={"transmit_data": total})
    (saved,) = tracker.dump()["ports"]
    assert saved["last"] == {"transmit_data": last}
    assert saved["total"] == {"transmit_data": total}
