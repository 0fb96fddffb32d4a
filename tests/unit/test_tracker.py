"""Tracker semantics (docs/infiniband.md §1): baseline, x4, resets, saturation, rates, restarts.

The unit tests pin each rule with numbers a reader can check by hand; the hypothesis tests drive
a model of the hardware (true increments, resets by other tools, fields clamping at their
maximum, several ports, driver hw_counters, reads and ports missing, time standing still or
going backwards) and check the promises users rely on: totals are exact up to what no reader
can see (increments beyond a saturated maximum or wiped by a reset before being read), never go
down, rates are exact whenever the interval is usable, and a restart changes nothing. The
model's counter widths and the x4 rule are written from the IBA tables, not read from the
catalogue under test.

Every test runs twice: with the per-port path alone (a node's), and with every poll going
through the column store first (``ibmon.track.columns``, a fabric's: ``ibmon.runtime.sizes``), which
must not change a single result.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibmon.infiniband.counters import BY_NAME, CATALOGUE
from ibmon.infiniband.model import LinkInfo, PortIdentity, PortKey, PortSample, PortView, Snapshot
from ibmon.infiniband.xmitwait import WaitUnit
from ibmon.runtime import sizes
from ibmon.track.totals import Totals
from ibmon.track.tracker import STATE_VERSION, Tracker

GUID = "0x0002c90300a1b2c3"
WALL0 = 1_700_000_000.0  # wall = WALL0 + monotonic: one consistent clock pair (same boot)
DATA_WIDE = frozenset({"transmit_data", "receive_data", "transmit_packets", "receive_packets"})


@pytest.fixture(autouse=True, params=["per-port", "columns"])
def _accounting(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
                _fabric_paths: None) -> None:
    """Both ways of accounting a poll: a node's (port by port) and a fabric's (the column
    store), chosen by the one size threshold (``ibmon.runtime.sizes``)."""
    monkeypatch.setattr(sizes, "OFFLOAD_PORTS", 1 if request.param == "columns" else 1 << 62)


def sample(
    counters: dict[str, int] | None = None,
    *,
    port: str = "1",
    wide: frozenset[str] = DATA_WIDE,
    hw: dict[str, int] | None = None,
    rate_bps: float | None = 100e9,
    **kw: Any,
) -> PortSample:
    return PortSample(
        identity=PortIdentity(guid=GUID, port=port, device="mlx5_0"),
        state=kw.pop("state", 4),
        phys_state=5,
        rate_bps=rate_bps,
        counters=dict(counters or {}),
        wide=wide,
        hw_counters=dict(hw or {}),
        **kw,
    )


def snap(t: float, *samples: PortSample, wall: float | None = None) -> Snapshot:
    return Snapshot(
        source="test",
        monotonic=t,
        wall=WALL0 + t if wall is None else wall,
        ports={s.key: s for s in samples},
    )


def one(tracker: Tracker, t: float, s: PortSample, **kw: Any) -> PortView:
    views = tracker.update(snap(t, s, **kw))
    assert list(views) == [s.key]
    return views[s.key]


# --------------------------------------------------------------------------- baseline and x4


def test_first_sample_is_a_baseline_at_the_hardware_value_times_four_for_data() -> None:
    v = one(Tracker(), 10.0, sample({"transmit_data": 1000, "transmit_packets": 7,
                                     "symbol_errors": 3}))
    # Totals equal perfquery/node_exporter (data x4) from the very first scrape ...
    assert v.totals == {"transmit_data": 4000, "transmit_packets": 7, "symbol_errors": 3}
    # ... but one sample has no interval, so no rates and no ratios yet.
    assert v.rates == {}
    assert v.utilization_tx is None
    assert v.xmit_wait_ratio is None
    assert v.resets == {}
    assert v.saturated == frozenset()


def test_increase_adds_the_delta_times_multiplier_and_gives_per_second_rates() -> None:
    t = Tracker()
    one(t, 10.0, sample({"transmit_data": 1000, "receive_data": 50, "transmit_packets": 7}))
    v = one(t, 12.0, sample({"transmit_data": 1500, "receive_data": 50, "transmit_packets": 27}))
    assert v.totals == {"transmit_data": 6000, "receive_data": 200, "transmit_packets": 27}
    assert v.rates == {"transmit_data": 1000.0, "receive_data": 0.0, "transmit_packets": 10.0}


def test_multiplier_comes_from_the_catalogue_for_every_counter() -> None:
    t = Tracker()
    base = {c.name: 10 for c in CATALOGUE}
    one(t, 0.0, sample(base, wide=frozenset(base)))
    v = one(t, 1.0, sample(dict.fromkeys(base, 11), wide=frozenset(base)))
    for c in CATALOGUE:
        assert v.totals[c.name] == 11 * (4 if c.data else 1), c.name
        assert v.rates[c.name] == (4.0 if c.data else 1.0), c.name


# --------------------------------------------------------------------------- resets


def test_decrease_of_a_64bit_counter_is_a_reset_and_the_new_value_is_the_increase() -> None:
    t = Tracker()
    one(t, 0.0, sample({"transmit_data": 10_000}))
    v = one(t, 2.0, sample({"transmit_data": 300}))  # perfquery -R, then 300 words moved
    assert v.totals == {"transmit_data": 40_000 + 1200}
    assert v.resets == {"transmit_data": 1}
    assert v.rates == {"transmit_data": 600.0}
    assert t.resets_seen == 1
    # Counting continues from the new baseline, and the reset count sticks.
    v = one(t, 3.0, sample({"transmit_data": 400}))
    assert v.totals == {"transmit_data": 41_600}
    assert v.resets == {"transmit_data": 1}
    assert v.rates == {"transmit_data": 400.0}


def test_decrease_of_a_narrow_counter_is_a_reset_not_a_wrap() -> None:
    t = Tracker()
    one(t, 0.0, sample({"symbol_errors": 65_000}))
    v = one(t, 1.0, sample({"symbol_errors": 10}))
    # A wrap would claim 65536 - 65000 + 10 = 546 new errors; narrow PMA counters never wrap.
    assert v.totals == {"symbol_errors": 65_010}
    assert v.rates == {"symbol_errors": 10.0}
    assert v.resets == {"symbol_errors": 1}


def test_resets_lists_only_counters_that_were_reset() -> None:
    t = Tracker()
    one(t, 0.0, sample({"transmit_packets": 100, "receive_packets": 100}))
    v = one(t, 1.0, sample({"transmit_packets": 5, "receive_packets": 150}))
    assert v.resets == {"transmit_packets": 1}


# --------------------------------------------------------------------------- saturation


def test_narrow_counter_pinned_at_its_maximum_is_flagged_and_gets_no_rate() -> None:
    t = Tracker()
    one(t, 0.0, sample({"link_downed": 250, "symbol_errors": 1}))
    v = one(t, 1.0, sample({"link_downed": 255, "symbol_errors": 2}))  # 8-bit maximum
    assert v.saturated == frozenset({"link_downed"})
    assert "link_downed" not in v.rates
    assert v.rates == {"symbol_errors": 1.0}
    assert v.totals["link_downed"] == 255  # the delta up to the maximum still counts
    assert t.saturations_seen == 1
    # Still pinned: no rate, no extra total, still flagged.
    v = one(t, 2.0, sample({"link_downed": 255, "symbol_errors": 2}))
    assert v.saturated == frozenset({"link_downed"})
    assert "link_downed" not in v.rates
    assert v.totals["link_downed"] == 255
    # Someone resets it (opensm PerfMgr): that is a reset, and it is no longer saturated.
    v = one(t, 3.0, sample({"link_downed": 3, "symbol_errors": 2}))
    assert v.saturated == frozenset()
    assert v.resets == {"link_downed": 1}
    assert v.totals["link_downed"] == 258
    assert v.rates["link_downed"] == 3.0
    assert t.saturations_seen == 1


@pytest.mark.parametrize("read_back", [250, 255], ids=["was-pinned", "pins-on-return"])
def test_a_pinned_counter_read_again_after_one_missed_read_has_a_rate_after_its_reset(
    read_back: int,
) -> None:
    """A missed read costs the rate of the next read only: once the counter has been read
    again (pinned or not), the poll after that has its rate, also when the value is a reset."""
    t = Tracker()
    one(t, 0.0, sample({"link_downed": 255 if read_back == 250 else 250}))
    one(t, 1.0, sample({}))  # link_downed unread (EINVAL)
    v = one(t, 2.0, sample({"link_downed": 255}))  # read again: pinned at the 8-bit maximum
    assert v.saturated == frozenset({"link_downed"})
    v = one(t, 3.0, sample({"link_downed": 3}))  # opensm PerfMgr reset it; 3 link downs since
    assert v.resets == {"link_downed": 1}
    assert v.rates == {"link_downed": 3.0}  # read at t=2, so t=2..3 is a usable interval


def test_saturated_at_the_first_sample_is_flagged_immediately() -> None:
    v = one(Tracker(), 0.0, sample({"local_link_integrity_errors": 15}))  # 4-bit maximum
    assert v.saturated == frozenset({"local_link_integrity_errors"})
    assert v.totals == {"local_link_integrity_errors": 15}


def test_counter_read_from_a_64bit_field_does_not_saturate_at_the_narrow_maximum() -> None:
    t = Tracker()
    narrow_max = BY_NAME["transmit_data"].max_value
    one(t, 0.0, sample({"transmit_data": narrow_max - 10}))
    v = one(t, 1.0, sample({"transmit_data": narrow_max}))  # read wide: just a number
    assert v.saturated == frozenset()
    assert v.rates == {"transmit_data": 40.0}
    # The same value read from the narrow 32-bit PortCounters field is pinned.
    t2 = Tracker()
    one(t2, 0.0, sample({"transmit_data": narrow_max - 10}, wide=frozenset()))
    v = one(t2, 1.0, sample({"transmit_data": narrow_max}, wide=frozenset()))
    assert v.saturated == frozenset({"transmit_data"})
    assert v.rates == {}


def test_a_pinned_counter_read_from_a_64bit_field_above_the_maximum_is_no_longer_pinned(
) -> None:
    """Pinned in the narrow PortCounters field, then read wide (the source found the 64-bit
    copy): the reading above the narrow maximum counts and has a rate, and the counter is no
    longer flagged saturated."""
    t = Tracker()
    narrow_max = BY_NAME["symbol_errors"].max_value
    one(t, 0.0, sample({"symbol_errors": narrow_max - 1}, wide=frozenset()))
    v = one(t, 1.0, sample({"symbol_errors": narrow_max}, wide=frozenset()))
    assert v.saturated == frozenset({"symbol_errors"})
    v = one(t, 2.0, sample({"symbol_errors": narrow_max + 5}, wide=frozenset({"symbol_errors"})))
    assert v.saturated == frozenset()
    assert v.rates == {"symbol_errors": 5.0}
    assert v.totals["symbol_errors"] == narrow_max + 5


def test_64bit_only_counters_never_saturate() -> None:
    t = Tracker()
    top = (1 << 64) - 1
    one(t, 0.0, sample({"unicast_transmit_packets": top - 5}, wide=frozenset()))
    v = one(t, 1.0, sample({"unicast_transmit_packets": top}, wide=frozenset()))
    assert v.saturated == frozenset()
    assert v.rates == {"unicast_transmit_packets": 5.0}


# --------------------------------------------------------------------------- rates and ratios


def test_no_rates_when_time_did_not_advance_but_totals_still_count() -> None:
    t = Tracker()
    one(t, 5.0, sample({"transmit_packets": 10}))
    v = one(t, 5.0, sample({"transmit_packets": 30}))
    assert v.rates == {}
    assert v.totals == {"transmit_packets": 30}
    v = one(t, 4.0, sample({"transmit_packets": 40}))  # clock went backwards
    assert v.rates == {}
    assert v.totals == {"transmit_packets": 40}


def test_utilization_is_data_rate_over_link_rate_in_bytes() -> None:
    t = Tracker()
    one(t, 0.0, sample({"transmit_data": 0, "receive_data": 0}, rate_bps=8e9))
    # 8 Gb/s link = 1e9 B/s. TX 125e6 words = 500e6 B in 1 s; RX 25e6 words = 100e6 B.
    v = one(t, 1.0, sample({"transmit_data": 125_000_000, "receive_data": 25_000_000},
                           rate_bps=8e9))
    assert v.rate_bytes_per_second == 1e9
    assert v.utilization_tx == pytest.approx(0.5)
    assert v.utilization_rx == pytest.approx(0.1)


def test_utilization_is_clamped_to_one_and_unknown_without_a_link_rate() -> None:
    t = Tracker()
    one(t, 0.0, sample({"transmit_data": 0}, rate_bps=8e9))
    v = one(t, 1.0, sample({"transmit_data": 10**9}, rate_bps=8e9))  # 4e9 B/s on 1e9 B/s
    assert v.utilization_tx == 1.0
    assert v.utilization_rx is None  # no receive_data counter
    v = one(t, 2.0, sample({"transmit_data": 2 * 10**9}, rate_bps=None))
    assert v.rate_bytes_per_second is None
    assert v.utilization_tx is None
    v = one(t, 3.0, sample({"transmit_data": 2 * 10**9}, rate_bps=0.0))  # "0 GB/sec", no cable
    assert v.rate_bytes_per_second == 0.0
    assert v.utilization_tx is None


QUANTUM = WaitUnit(8, False, "family", "Quantum")
SWITCH_IB2 = WaitUnit(32, True, "family", "Switch-IB 2")


def _unit_sample(counters: dict[str, int], unit: WaitUnit, *, width: str = "4X",
                 rate_bps: float | None = 200e9) -> PortSample:
    s = sample(counters, rate_bps=rate_bps, active_width=width)
    s.identity = dataclasses.replace(s.identity, xmit_wait=unit)
    return s


def test_xmit_wait_ratio_is_lost_bytes_over_the_bytes_the_link_could_send() -> None:
    # ibdiagnet: Quantum counts 8 bytes per port. A 4X HDR port (200 Gb/s, 25e9 bytes/s) that
    # lost 0.1 % of 2 s lost 50e6 bytes: 6.25e6 counts.
    t = Tracker()
    one(t, 0.0, _unit_sample({"transmit_wait": 1000}, QUANTUM))
    v = one(t, 2.0, _unit_sample({"transmit_wait": 1000 + 6_250_000}, QUANTUM))
    assert v.xmit_wait_ratio == pytest.approx(0.001)
    assert v.rates["transmit_wait"] == pytest.approx(3_125_000.0)
    assert v.xmit_wait_seconds == pytest.approx(0.002)


def test_xmit_wait_ratio_of_a_per_lane_unit_counts_every_lane_and_is_clamped() -> None:
    # Switch-IB 2 counts 32 bytes per lane: on 4X EDR (100 Gb/s, 12.5e9 bytes/s) 1e6 counts
    # in 1 s are 128e6 bytes lost, 1.024 % of the second.
    t = Tracker()
    one(t, 0.0, _unit_sample({"transmit_wait": 0}, SWITCH_IB2, rate_bps=100e9))
    v = one(t, 1.0, _unit_sample({"transmit_wait": 1_000_000}, SWITCH_IB2, rate_bps=100e9))
    assert v.xmit_wait_ratio == pytest.approx(0.01024)
    v = one(t, 2.0, _unit_sample({"transmit_wait": 1_000_000 + 10**9}, SWITCH_IB2,
                                 rate_bps=100e9))
    assert v.xmit_wait_ratio == 1.0
    assert v.xmit_wait_seconds == pytest.approx(1.01024)


def test_xmit_wait_ratio_is_unknown_without_a_link_rate_or_a_lane_count() -> None:
    t = Tracker()
    one(t, 0.0, _unit_sample({"transmit_wait": 0}, SWITCH_IB2, width=""))
    v = one(t, 1.0, _unit_sample({"transmit_wait": 500}, SWITCH_IB2, width=""))
    assert v.xmit_wait_ratio is None
    v = one(t, 2.0, _unit_sample({"transmit_wait": 900}, QUANTUM, rate_bps=None))
    assert v.xmit_wait_ratio is None
    assert v.xmit_wait_seconds == 0.0  # nothing known stalled: nothing counted


def test_stalled_seconds_survive_a_dump_and_load() -> None:
    t = Tracker()
    one(t, 0.0, _unit_sample({"transmit_wait": 0}, QUANTUM))
    one(t, 1.0, _unit_sample({"transmit_wait": 312_500_000}, QUANTUM))  # 10 % of 1 s
    state = json.loads(json.dumps(t.dump()))
    again = Tracker()
    again.load(state)
    v = one(again, 2.0, _unit_sample({"transmit_wait": 312_500_000}, QUANTUM))
    assert v.xmit_wait_seconds == pytest.approx(0.1)
    state["ports"][0]["wait_seconds"] = -1.0
    with pytest.raises(ValueError, match="wait_seconds"):
        Tracker().load(state)


def test_xmit_wait_ratio_is_unknown_while_the_narrow_counter_is_saturated() -> None:
    t = Tracker()
    top = BY_NAME["transmit_wait"].max_value
    one(t, 0.0, sample({"transmit_wait": top - 100}))
    v = one(t, 1.0, sample({"transmit_wait": top}))
    assert v.saturated == frozenset({"transmit_wait"})
    assert v.xmit_wait_ratio is None
    v = one(t, 2.0, sample({}))  # counter not read at all
    assert v.xmit_wait_ratio is None


# --------------------------------------------------------------------------- missing values


@pytest.mark.parametrize(("state", "active"), [(4, True), (None, True), (1, False), (2, False)])
def test_only_an_active_port_or_one_whose_state_is_unknown_has_rates(
    state: int | None, active: bool
) -> None:
    """A port that is not Active moves no data: no link rate, rates or ratios (left over
    from before it went down), though its totals count. A source that cannot tell the state
    (None) is taken at its word that the port works."""
    t = Tracker()
    one(t, 0.0, sample({"transmit_data": 0, "transmit_wait": 0}, state=state))
    v = one(t, 1.0, sample({"transmit_data": 1000, "transmit_wait": 10}, state=state))
    assert v.totals == {"transmit_data": 4000, "transmit_wait": 10}
    if active:
        assert v.rates == {"transmit_data": 4000.0, "transmit_wait": 10.0}
        assert v.rate_bytes_per_second == 100e9 / 8
        assert v.utilization_tx == 4000.0 / (100e9 / 8)
        assert v.xmit_wait_ratio is not None
    else:
        assert v.rates == {}
        assert v.rate_bytes_per_second is None
        assert (v.utilization_tx, v.xmit_wait_ratio) == (None, None)


def test_missing_counter_keeps_its_total_and_counts_increments_once_when_back() -> None:
    t = Tracker()
    one(t, 0.0, sample({"transmit_data": 100, "symbol_errors": 1}))
    v = one(t, 1.0, sample({"symbol_errors": 1}))  # transmit_data read failed (EINVAL)
    assert v.totals == {"transmit_data": 400, "symbol_errors": 1}  # the series stays
    assert v.rates == {"symbol_errors": 0.0}
    v = one(t, 2.0, sample({"transmit_data": 150, "symbol_errors": 1}))
    assert v.totals["transmit_data"] == 600  # the 50 words moved while unread count once
    # The 50 words span 2 s, not the 1 s since the port's last sample: no rate rather than 2x.
    assert "transmit_data" not in v.rates
    v = one(t, 3.0, sample({"transmit_data": 160, "symbol_errors": 1}))
    assert v.rates["transmit_data"] == 40.0


def test_a_counter_back_unchanged_on_an_idle_port_has_its_rate_at_the_next_move() -> None:
    """A port where nothing moved is the idle shortcut; a counter that was missing and is
    back unchanged must still leave it: its last value is older than the port's last
    sample, so no rate this poll, and, now read again, a rate at its next move."""
    t = Tracker()
    one(t, 0.0, sample({"symbol_errors": 1, "transmit_data": 100}))
    one(t, 1.0, sample({"symbol_errors": 1}))  # transmit_data unread
    v = one(t, 2.0, sample({"symbol_errors": 1, "transmit_data": 100}))  # back, unchanged
    assert v.rates == {"symbol_errors": 0.0}
    v = one(t, 3.0, sample({"symbol_errors": 1, "transmit_data": 110}))
    assert v.rates == {"symbol_errors": 0.0, "transmit_data": 40.0}


def test_a_rename_carries_the_totals_and_never_overwrites_another_port() -> None:
    """A port whose device's GUID arrived continues under its new key; a rename onto a key
    that is a port of its own is refused, and both keep their totals."""
    t = Tracker()
    other = "0x0002c90300ffffff"
    one(t, 0.0, sample({"transmit_packets": 5}, port="2"))
    t.update(snap(0.0, PortSample(identity=PortIdentity(guid=other, port="1"), state=4,
                                  counters={"transmit_packets": 70})))
    assert t.rename((GUID, "2"), (GUID, "1")) is True
    assert t.rename((GUID, "1"), (other, "1")) is False
    assert t.rename((GUID, "2"), (GUID, "3")) is False  # nothing left under the old key
    v = one(t, 1.0, sample({"transmit_packets": 6}))
    assert v.totals == {"transmit_packets": 6} and v.rates == {"transmit_packets": 1.0}
    w = t.update(snap(1.0, PortSample(identity=PortIdentity(guid=other, port="1"), state=4,
                                      counters={"transmit_packets": 71})))[(other, "1")]
    assert w.totals == {"transmit_packets": 71} and w.rates == {"transmit_packets": 1.0}


def test_missing_port_keeps_its_state_and_its_view_is_absent() -> None:
    t = Tracker()
    a, b = sample({"transmit_packets": 10}, port="1"), sample({"transmit_packets": 50}, port="2")
    t.update(snap(0.0, a, b))
    views = t.update(snap(1.0, sample({"transmit_packets": 20}, port="1")))
    assert list(views) == [(GUID, "1")]
    views = t.update(snap(4.0, sample({"transmit_packets": 80}, port="2")))
    v = views[(GUID, "2")]
    assert v.totals == {"transmit_packets": 80}
    assert v.rates == {"transmit_packets": 7.5}  # 30 packets over the 4 s since its last sample
    assert len(t) == 2
    assert t.forget((GUID, "1")) is True
    assert t.forget((GUID, "1")) is False
    assert len(t) == 1


def test_unknown_and_negative_values_are_ignored_not_accumulated() -> None:
    t = Tracker()
    v = one(t, 0.0, sample({"bogus": 5, "transmit_packets": 10, "symbol_errors": -1}))
    assert v.totals == {"transmit_packets": 10}
    assert t.unknown_counters_seen == 1
    v = one(t, 1.0, sample({"transmit_packets": -3}))
    assert v.totals == {"transmit_packets": 10}
    assert v.rates == {}
    assert v.resets == {}
    v = one(t, 2.0, sample({"transmit_packets": 20}))
    assert v.totals == {"transmit_packets": 20}
    assert v.rates == {}  # the last good value is 2 s old, not 1 s


# --------------------------------------------------------------------------- hw_counters


def test_hw_counters_accumulate_as_64bit_with_resets() -> None:
    t = Tracker()
    v = one(t, 0.0, sample(hw={"out_of_buffer": 100, "np_cnp_sent": 5}))
    assert v.hw_totals == {"out_of_buffer": 100, "np_cnp_sent": 5}
    assert v.hw_rates == {}
    v = one(t, 2.0, sample(hw={"out_of_buffer": 140, "np_cnp_sent": 2}))
    assert v.hw_totals == {"out_of_buffer": 140, "np_cnp_sent": 7}
    assert v.hw_rates == {"out_of_buffer": 20.0, "np_cnp_sent": 1.0}
    assert v.resets == {"hw:np_cnp_sent": 1}  # the driver's, in a namespace of its own
    assert t.resets_seen == 1
    v = one(t, 3.0, sample(hw={"np_cnp_sent": 3}))
    assert v.hw_totals == {"out_of_buffer": 140, "np_cnp_sent": 8}  # unread, not lost
    assert v.hw_rates == {"np_cnp_sent": 1.0}
    v = one(t, 4.0, sample(hw={"out_of_buffer": 150, "np_cnp_sent": 3}))
    assert v.hw_totals == {"out_of_buffer": 150, "np_cnp_sent": 8}
    assert v.hw_rates == {"np_cnp_sent": 0.0}  # out_of_buffer's last read is 2 s old


def test_hw_gauges_pass_through_as_read_never_accumulated() -> None:
    """A setting or level going down is its new value, not a reset, and never a total."""
    t = Tracker()
    v = one(t, 0.0, sample(hw={"np_cnp_sent": 5}, hw_gauges={"lifespan": 10, "active_qps": 7}))
    assert v.hw_gauges == {"lifespan": 10, "active_qps": 7}
    v = one(t, 1.0, sample(hw={"np_cnp_sent": 6}, hw_gauges={"lifespan": 10, "active_qps": 3}))
    assert v.hw_gauges == {"lifespan": 10, "active_qps": 3}
    assert v.hw_totals == {"np_cnp_sent": 6}
    assert set(v.hw_rates) == {"np_cnp_sent"}
    assert t.resets_seen == 0
    assert "active_qps" not in json.dumps(t.dump())  # nothing to resume after a restart
    v = one(t, 2.0, sample(hw={"np_cnp_sent": 6}))
    assert v.hw_gauges == {}  # not read this poll: not reported (a level cannot be carried)


# --------------------------------------------------------------------------- the view


def test_view_carries_identity_state_and_link_and_leaves_detection_fields_empty() -> None:
    link = LinkInfo(remote_guid="0x0002c90300000001", remote_port="7", active_width="4X",
                    active_speed="EDR")
    s = sample({"transmit_data": 1}, link=link, active_width="4X", active_speed="EDR")
    v = one(Tracker(), 0.0, s)
    assert v.identity is s.identity
    assert v.key == (GUID, "1")
    assert (v.state, v.phys_state) == (4, 5)
    assert v.rate_bytes_per_second == 12.5e9
    assert (v.active_width, v.active_speed) == ("4X", "EDR")
    assert v.link is link
    assert v.symbol_error_ber is None
    assert v.conditions == frozenset()


def test_published_views_are_not_changed_by_later_updates() -> None:
    t = Tracker()
    first = one(t, 0.0, sample({"transmit_data": 1}, hw={"out_of_buffer": 1}))
    before = copy.deepcopy(first)
    one(t, 1.0, sample({"transmit_data": 0}, hw={"out_of_buffer": 9}))
    one(t, 2.0, sample({"transmit_data": 255, "link_downed": 255}, hw={"out_of_buffer": 9}))
    assert first == before


def test_a_view_keeps_its_totals_while_the_same_counters_keep_moving() -> None:
    # The usual poll (same counters, same order) accumulates in place into the port's packed
    # totals: a view published before must still read what it read then.
    t = Tracker()
    one(t, 0.0, sample({"transmit_data": 10, "symbol_errors": 1}))
    second = one(t, 1.0, sample({"transmit_data": 20, "symbol_errors": 1}))
    idle = one(t, 2.0, sample({"transmit_data": 20, "symbol_errors": 1}))
    one(t, 3.0, sample({"transmit_data": 35, "symbol_errors": 4}))
    assert second.totals == {"transmit_data": 80, "symbol_errors": 1}
    assert idle.totals == {"transmit_data": 80, "symbol_errors": 1}


def test_totals_past_64_bits_keep_counting_and_survive_a_restart() -> None:
    t = Tracker()
    top = (1 << 64) - 1
    one(t, 0.0, sample({"transmit_data": top - 10, "symbol_errors": 0}))
    v = one(t, 1.0, sample({"transmit_data": top, "symbol_errors": 0}))
    assert v.totals == {"transmit_data": 4 * top, "symbol_errors": 0}  # 66 bits
    assert v.rates["transmit_data"] == 40.0
    restored = roundtrip(t)
    v = one(restored, 2.0, sample({"transmit_data": 5, "symbol_errors": 2}))  # a reset
    assert v.totals == {"transmit_data": 4 * top + 20, "symbol_errors": 2}
    assert v.resets == {"transmit_data": 1}
    v = one(restored, 3.0, sample({"transmit_data": 6, "symbol_errors": 2}))
    assert v.totals == {"transmit_data": 4 * top + 24, "symbol_errors": 2}


# --------------------------------------------------------------------------- dump / load


def roundtrip(t: Tracker) -> Tracker:
    fresh = Tracker()
    fresh.load(json.loads(json.dumps(t.dump())))
    return fresh


def test_restart_counts_increments_made_while_down_exactly_once() -> None:
    t = Tracker()
    one(t, 0.0, sample({"transmit_data": 1000, "link_downed": 2}, hw={"out_of_buffer": 4}))
    one(t, 1.0, sample({"transmit_data": 1100, "link_downed": 2}, hw={"out_of_buffer": 5}))
    restored = roundtrip(t)
    # Daemon was down for 60 s: 900 more words and one link down happened meanwhile.
    v = one(restored, 61.0, sample({"transmit_data": 2000, "link_downed": 3},
                                   hw={"out_of_buffer": 6}))
    assert v.totals == {"transmit_data": 8000, "link_downed": 3}
    assert v.hw_totals == {"out_of_buffer": 6}
    assert v.rates == {"transmit_data": 60.0, "link_downed": 1 / 60}  # same boot: usable dt
    assert v.resets == {}


def test_decrease_across_a_restart_is_a_reset() -> None:
    t = Tracker()
    one(t, 0.0, sample({"transmit_packets": 500}))
    restored = roundtrip(t)
    v = one(restored, 10.0, sample({"transmit_packets": 20}))
    assert v.totals == {"transmit_packets": 520}
    assert v.resets == {"transmit_packets": 1}


def test_after_a_reboot_the_old_monotonic_time_gives_no_rates_but_totals_count() -> None:
    t = Tracker()
    one(t, 100.0, sample({"transmit_packets": 500}))
    restored = roundtrip(t)
    # Rebooted and up for 5000 s; wall time moved on by a day. 5000 - 100 is not an interval.
    later = WALL0 + 86_400.0
    v = one(restored, 5000.0, sample({"transmit_packets": 800}), wall=later)
    assert v.totals == {"transmit_packets": 800}
    assert v.rates == {}
    v = one(restored, 5001.0, sample({"transmit_packets": 810}), wall=later + 1.0)
    assert v.rates == {"transmit_packets": 10.0}


def test_only_the_first_poll_after_a_restart_compares_the_clocks() -> None:
    """Within one run intervals are monotonic time alone: once the restart's first poll has
    matched the saved times to this boot, a wall-clock step (NTP correcting an hour) costs
    no rate."""
    t = Tracker()
    one(t, 100.0, sample({"transmit_packets": 500}))
    restored = roundtrip(t)
    v = one(restored, 110.0, sample({"transmit_packets": 600}), wall=WALL0 + 110.0)
    assert v.rates == {"transmit_packets": 10.0}  # same boot: the interval since the save
    v = one(restored, 111.0, sample({"transmit_packets": 610}), wall=WALL0 + 3711.0)
    assert v.rates == {"transmit_packets": 10.0}


def test_dump_keeps_resets_saturation_and_missing_counters() -> None:
    t = Tracker()
    one(t, 0.0, sample({"transmit_packets": 50, "link_downed": 255, "symbol_errors": 9}))
    one(t, 1.0, sample({"transmit_packets": 5, "link_downed": 255}))  # symbol_errors unread
    data = t.dump()
    assert data["version"] == STATE_VERSION
    (port,) = data["ports"]
    assert (port["guid"], port["port"]) == (GUID, "1")
    assert (port["monotonic"], port["wall"]) == (1.0, WALL0 + 1.0)
    assert port["last"] == {"transmit_packets": 5, "link_downed": 255, "symbol_errors": 9}
    assert port["total"] == {"transmit_packets": 55, "link_downed": 255, "symbol_errors": 9}
    assert port["resets"] == {"transmit_packets": 1}
    assert port["saturated"] == ["link_downed"]
    assert port["stale"] == ["symbol_errors"]
    restored = roundtrip(t)
    v = one(restored, 2.0, sample({"transmit_packets": 6, "link_downed": 255, "symbol_errors": 10}))
    assert v.resets == {"transmit_packets": 1}
    assert v.saturated == frozenset({"link_downed"})
    assert v.rates == {"transmit_packets": 1.0}  # symbol_errors stale, link_downed pinned
    assert v.totals == {"transmit_packets": 56, "link_downed": 255, "symbol_errors": 10}


def test_a_saved_reset_count_of_zero_is_no_reset() -> None:
    """A state file may list a counter with 0 resets (written by hand, or by a tool): it
    loads as no reset, so no ``ibmon_port_resets_total`` series appears for it."""
    t = Tracker()
    one(t, 0.0, sample({"transmit_packets": 5, "symbol_errors": 0}))
    data = t.dump()
    data["ports"][0]["resets"] = {"transmit_packets": 0, "symbol_errors": 2}
    restored = Tracker()
    restored.load(data)
    v = one(restored, 1.0, sample({"transmit_packets": 6, "symbol_errors": 0}))
    assert v.resets == {"symbol_errors": 2}


def _valid_dump() -> dict[str, Any]:
    t = Tracker()
    one(t, 0.0, sample({"transmit_data": 10, "symbol_errors": 1}, hw={"out_of_buffer": 1}))
    return t.dump()


def _port0(d: dict[str, Any]) -> dict[str, Any]:
    port: dict[str, Any] = d["ports"][0]
    return port


def _break(change: str) -> Any:
    d = _valid_dump()
    p = _port0(d)
    match change:
        case "not a dict":
            return [d]
        case "no version":
            del d["version"]
        case "future version":
            d["version"] = STATE_VERSION + 1
        case "ports not a list":
            d["ports"] = {"0": p}
        case "port not a dict":
            d["ports"] = ["0x0002c90300a1b2c3/1"]
        case "uncanonical guid":
            p["guid"] = "0002:c903:00a1:b2c3"
        case "bad port":
            p["port"] = "1; rm -rf /"
        case "integer port":
            p["port"] = 1
        case "duplicate port":
            d["ports"].append(copy.deepcopy(p))
        case "no monotonic":
            del p["monotonic"]
        case "nan wall":
            p["wall"] = math.nan
        case "string wall":
            p["wall"] = "yesterday"
        case "no last":
            del p["last"]
        case "no total":
            del p["total"]
        case "last not a dict":
            p["last"] = [10]
        case "unknown counter":
            p["last"]["bogus"] = 1
            p["total"]["bogus"] = 1
        case "total for a counter without last":
            p["total"]["receive_data"] = 4
        case "last without total":
            del p["total"]["transmit_data"]
        case "negative last":
            p["last"]["transmit_data"] = -1
        case "float total":
            p["total"]["transmit_data"] = 40.0
        case "bool last":
            p["last"]["symbol_errors"] = True
        case "total below last x4":
            p["total"]["transmit_data"] = 39
        case "string resets":
            p["resets"]["transmit_data"] = "1"
        case "resets for an unknown counter":
            p["resets"]["receive_data"] = 1
        case "saturated not a list":
            p["saturated"] = "symbol_errors"
        case "saturated unknown counter":
            p["saturated"] = ["receive_data"]
        case "no stale":
            del p["stale"]
        case "hw total below last":
            p["hw_total"]["out_of_buffer"] = 0
        case "hw empty name":
            p["hw_last"][""] = 1
            p["hw_total"][""] = 1
        case "no hw_last":
            del p["hw_last"]
        case _:
            raise AssertionError(change)
    return d


MALFORMED = [
    "not a dict", "no version", "future version", "ports not a list", "port not a dict",
    "uncanonical guid", "bad port", "integer port", "duplicate port", "no monotonic",
    "nan wall", "string wall", "no last", "no total", "last not a dict", "unknown counter",
    "total for a counter without last", "last without total", "negative last", "float total",
    "bool last", "total below last x4", "string resets", "resets for an unknown counter",
    "saturated not a list", "saturated unknown counter", "no stale", "hw total below last",
    "hw empty name", "no hw_last",
]


def test_the_valid_dump_used_for_the_malformed_cases_loads() -> None:
    t = Tracker()
    t.load(_valid_dump())
    assert len(t) == 1


@pytest.mark.parametrize("change", MALFORMED)
def test_load_rejects_malformed_state_and_keeps_the_current_state(change: str) -> None:
    t = Tracker()
    one(t, 0.0, sample({"transmit_packets": 7}, port="9"))
    before = t.dump()
    with pytest.raises(ValueError, match="tracker state"):
        t.load(_break(change))
    assert t.dump() == before


# --------------------------------------------------------------------------- the IBA tables
#
# Counter widths and the x4 rule, written here from the InfiniBand Architecture Specification
# (PMA PortCounters, attribute 0x12, and PortCountersExtended, 0x1D; docs/infiniband.md §1), not
# read from ibmon.infiniband.counters: the hardware model below must not inherit a mistake from the
# catalogue it checks.

IBA_PORT_COUNTERS_BITS: dict[str, int] = {
    "SymbolErrorCounter": 16,
    "LinkErrorRecoveryCounter": 8,
    "LinkDownedCounter": 8,
    "PortRcvErrors": 16,
    "PortRcvRemotePhysicalErrors": 16,
    "PortRcvSwitchRelayErrors": 16,
    "PortXmitDiscards": 16,
    "PortXmitConstraintErrors": 8,
    "PortRcvConstraintErrors": 8,
    "LocalLinkIntegrityErrors": 4,
    "ExcessiveBufferOverrunErrors": 4,
    "VL15Dropped": 16,
    "QP1Dropped": 16,
    "PortXmitData": 32,
    "PortRcvData": 32,
    "PortXmitPkts": 32,
    "PortRcvPkts": 32,
    "PortXmitWait": 32,
    # PortRcvErrorDetails and PortXmitDiscardDetails: every field 16 bits
    "PortLocalPhysicalErrors": 16,
    "PortMalformedPktErrors": 16,
    "PortBufferOverrunErrors": 16,
    "PortDLIDMappingErrors": 16,
    "PortVLMappingErrors": 16,
    "PortLoopingErrors": 16,
    "PortInactiveDiscards": 16,
    "PortNeighborMTUDiscards": 16,
    "PortSwLifetimeLimitDiscards": 16,
    "PortSwHOQLifetimeLimitDiscards": 16,
}
#: Fields that exist only in PortCountersExtended: 64 bits, no narrow copy to saturate.
IBA_EXTENDED_ONLY = frozenset({
    "PortUnicastXmitPkts", "PortUnicastRcvPkts", "PortMulticastXmitPkts", "PortMulticastRcvPkts",
})
#: PortXmitData / PortRcvData count 4-octet words, whatever the link width.
IBA_WORD_COUNTERS = frozenset({"PortXmitData", "PortRcvData"})
U64_MAX = (1 << 64) - 1


def iba_bits(pma: str) -> int:
    """The field's width in PortCounters, or 64 for a PortCountersExtended-only field."""
    if pma in IBA_EXTENDED_ONLY:
        return 64
    assert pma in IBA_PORT_COUNTERS_BITS, f"{pma}: add its IBA width to this test's table"
    return IBA_PORT_COUNTERS_BITS[pma]


def iba_multiplier(pma: str) -> int:
    return 4 if pma in IBA_WORD_COUNTERS else 1


def test_catalogue_widths_and_multipliers_are_the_iba_ones() -> None:
    got = {c.pma: (c.bits, c.multiplier) for c in CATALOGUE}
    assert got == {pma: (iba_bits(pma), iba_multiplier(pma)) for pma in got}


@pytest.mark.parametrize("spec", CATALOGUE, ids=lambda c: c.pma)
def test_a_narrow_read_saturates_exactly_at_its_iba_maximum(spec: Any) -> None:
    """One below the field's maximum counts on; the maximum itself is pinned (no rate)."""
    bits = iba_bits(spec.pma)
    top = (1 << bits) - 1
    t = Tracker()
    one(t, 0.0, sample({spec.name: top - 2}, wide=frozenset()))
    v = one(t, 1.0, sample({spec.name: top - 1}, wide=frozenset()))
    assert v.saturated == frozenset()
    assert v.rates == {spec.name: float(iba_multiplier(spec.pma))}
    v = one(t, 2.0, sample({spec.name: top}, wide=frozenset()))
    if bits == 64:  # a 64-bit field never realistically reaches its maximum: just a number
        assert v.saturated == frozenset()
        assert v.rates == {spec.name: float(iba_multiplier(spec.pma))}
    else:
        assert v.saturated == frozenset({spec.name})
        assert v.rates == {}
    assert v.totals == {spec.name: top * iba_multiplier(spec.pma)}


# --------------------------------------------------------------------------- properties
#
# A hardware model. Each counter has a true running count (everything that really happened,
# including the value it starts at) and the value the PMA shows: other tools may reset it, and a
# field clamps at its maximum (narrow fields visibly; 64-bit ones are modelled the same way, as a
# counter near 2**64 - 1 can only stop). The model also books what no reader can ever recover:
# increments beyond the maximum, increments a reset wiped before anyone read them, and, when a
# reset is hidden (the next read is not lower than the last), the part an honest reader must
# take for an ordinary increase (``value - last``). Everything else must be counted exactly.


@dataclass
class HwCounter:
    """One counter: catalogue (``hw=False``) or a driver hw_counter (``hw=True``, 64-bit)."""

    name: str
    hw: bool
    wide: bool  # read from a 64-bit field
    value: int
    top: int = 0
    mult: int = 1
    true: int = 0  # every event, including those before monitoring (the start value)
    lost: int = 0  # events no reader can recover (see above)
    pending: int = 0  # events that reached ``value`` since the last read
    reset_pending: bool = False
    last: int | None = None  # the value at the last read
    resets: int = 0  # resets a reader can see (the value went down)
    read_last_sample: bool = True  # read in the port's previous sample (else: no rate now)

    def __post_init__(self) -> None:
        pma = "" if self.hw else BY_NAME[self.name].pma
        bits = 64 if self.hw or self.wide else iba_bits(pma)
        self.top = (1 << bits) - 1
        self.mult = 1 if self.hw else iba_multiplier(pma)
        self.value = min(self.value, self.top)
        self.true = self.value

    @property
    def narrow(self) -> bool:
        """Saturation is visible: a narrow field pinned at its maximum."""
        return self.top < U64_MAX

    @property
    def pinned(self) -> bool:
        return self.narrow and self.value == self.top

    @property
    def key(self) -> tuple[bool, str]:
        return (self.hw, self.name)

    def apply(self, op: tuple[str, int]) -> None:
        kind, n = op
        if kind == "reset":  # cleared by someone else, then n more events before we look
            self.lost += self.pending
            self.pending = 0
            self.value = 0
            self.reset_pending = True
        self.true += n
        new = min(self.value + n, self.top)
        self.lost += self.value + n - new
        self.pending += new - self.value
        self.value = new

    def read(self) -> int | None:
        """The value is read now; returns the increase a reader can see (None: baseline)."""
        prev, self.last = self.last, self.value
        seen = self.pending
        self.pending = 0
        if self.reset_pending and prev is not None:
            if self.value < prev:
                self.resets += 1
            else:  # hidden reset: to any reader an increase of value - prev
                self.lost += seen - (self.value - prev)
                seen = self.value - prev
        self.reset_pending = False
        return None if prev is None else seen

    @property
    def expected_total(self) -> int:
        """What a reader has seen so far: everything but the lost and the not yet read."""
        return (self.true - self.lost - self.pending) * self.mult


@dataclass
class HwPort:
    number: str
    counters: list[HwCounter]
    last_sample: float = 0.0  # monotonic time of the port's previous sample

    def sample(self, missing: frozenset[tuple[bool, str]]) -> PortSample:
        return sample(
            {c.name: c.value for c in self.counters if not c.hw and c.key not in missing},
            port=self.number,
            wide=frozenset(c.name for c in self.counters if not c.hw and c.wide),
            hw={c.name: c.value for c in self.counters if c.hw and c.key not in missing},
        )


@dataclass
class Step:
    dt: float
    ops: dict[tuple[str, bool, str], tuple[str, int]]  # (port, hw, name) -> op
    missing: frozenset[tuple[str, bool, str]]  # counters not read in this sample
    absent: frozenset[str]  # ports missing from this snapshot


@dataclass
class Scenario:
    ports: list[HwPort]
    steps: list[Step] = field(default_factory=list)


NAMES = [c.name for c in CATALOGUE]
HW_NAMES = ["out_of_buffer", "np_cnp_sent", "rp_cnp_handled", "rx_write_requests"]
LEFT_64 = 13 << 40  # headroom that 12 increments of at most 2**40 never use up


@functools.cache
def _starts(top: int, odd: bool) -> st.SearchStrategy[int]:
    """Start values: small or right under 2**64 - 1 for 64-bit fields; up to the maximum for
    narrow ones (only with ``odd``, since a pinned start loses increments)."""
    if top == U64_MAX:
        near = (st.integers(U64_MAX - (1 << 44), U64_MAX) if odd
                else st.integers(U64_MAX - (1 << 48), U64_MAX - LEFT_64))
        return st.one_of(st.integers(0, 1 << 40), near)
    return st.integers(0, top if odd else top // 2)


@functools.cache
def _ops(top: int, odd: bool) -> st.SearchStrategy[tuple[str, int]]:
    """One poll interval's change. Built once per width: constructing strategies inside the
    draw loop made generation, and so shrinking a failure, many times slower."""
    if not odd:  # stays below the maximum over 12 steps
        return st.tuples(st.just("inc"), st.integers(0, (1 << 40) if top == U64_MAX else top // 30))
    small = st.integers(0, 20)
    big = st.integers(0, 1 << 40) if top == U64_MAX else st.integers(0, 2 * top)
    inc = st.tuples(st.just("inc"), st.one_of(small, big, st.integers(0, 1 << 65)))
    # cleared by someone else, then small, anything up to the maximum, or re-saturated at once
    reset = st.tuples(st.just("reset"),
                      st.one_of(small, st.integers(0, top), st.integers(top - 2, top + 5)))
    return st.one_of(inc, inc, inc, reset)


@st.composite
def _port(draw: st.DrawFn, *, odd: bool) -> list[HwCounter]:
    """One port's counters: 1-4 catalogue counters (narrow or wide) and 0-2 hw_counters."""
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=4, unique=True))
    hw_names = draw(st.lists(st.sampled_from(HW_NAMES), max_size=2, unique=True))
    counters = []
    for hw, name in [(False, n) for n in names] + [(True, n) for n in hw_names]:
        wide = hw or iba_bits(BY_NAME[name].pma) == 64 or draw(st.booleans())
        c = HwCounter(name, hw, wide, 0)
        c.value = c.true = draw(_starts(c.top, odd))
        if not hw and wide and BY_NAME[name].bits < 64 and draw(st.booleans()):
            # a 64-bit read equal to the narrow field's maximum: just a number, never pinned
            c.value = c.true = BY_NAME[name].max_value
        counters.append(c)
    return counters


@st.composite
def scenarios(draw: st.DrawFn, *, odd: bool) -> Scenario:
    """``odd``: resets, saturation, missing reads and ports, time standing still or going back.
    Without it nothing is lost or hidden, so every total is the true count.

    Ports and steps are drawn as lists so that a failure shrinks quickly to few of each."""
    ports = [HwPort(str(i), counters) for i, counters in
             enumerate(draw(st.lists(_port(odd=odd), min_size=1, max_size=3)), start=1)]
    keys = [(p.number, c.hw, c.name) for p in ports for c in p.counters]
    ops = st.fixed_dictionaries({(p.number, c.hw, c.name): _ops(c.top, odd)
                                 for p in ports for c in p.counters})
    if odd:
        step = st.builds(Step, st.sampled_from([-7.0, -0.5, 0.0, 0.25, 1.0, 7.0]), ops,
                         st.frozensets(st.sampled_from(keys)),
                         st.frozensets(st.sampled_from([p.number for p in ports])))
    else:
        step = st.builds(Step, st.sampled_from([0.5, 1.0, 3.0]), ops,
                         st.just(frozenset()), st.just(frozenset()))
    return Scenario(ports, draw(st.lists(step, min_size=1, max_size=12)))


def check_view(v: PortView, port: HwPort, now: float, missing: frozenset[tuple[bool, str]],
               before: PortView | None) -> None:
    """Everything one view must say about the model port that was just sampled at ``now``."""
    dt = now - port.last_sample
    for c in port.counters:
        read = c.key not in missing
        seen = c.read() if read else None
        totals, rates = (v.hw_totals, v.hw_rates) if c.hw else (v.totals, v.rates)
        # exact: the start value x4 for data plus every increment a reader can see
        assert totals[c.name] == c.expected_total, (c, totals)
        if before is not None:
            assert totals[c.name] >= (before.hw_totals if c.hw else before.totals)[c.name]
        if not c.hw:
            assert v.resets.get(c.name, 0) == c.resets
            if read:
                assert (c.name in v.saturated) == c.pinned
        has_rate = read and seen is not None and dt > 0 and c.read_last_sample and not c.pinned
        if has_rate:
            assert seen is not None
            assert rates[c.name] == pytest.approx(seen * c.mult / dt, rel=1e-12), c
        else:
            assert c.name not in rates
        c.read_last_sample = read
    port.last_sample = now
    wait = v.rates.get("transmit_wait")
    if wait is None:
        assert v.xmit_wait_ratio is None
    else:
        assert v.xmit_wait_ratio == pytest.approx(min(1.0, wait * 8 / v.rate_bytes_per_second))
        assert 0.0 <= v.xmit_wait_ratio <= 1.0
    if v.utilization_tx is not None:
        assert 0.0 <= v.utilization_tx <= 1.0


def run_model(sc: Scenario) -> list[dict[PortKey, PortView]]:
    """Drive a tracker with the scenario and check every view against the model."""
    tracker = Tracker()
    now = 100.0
    first = tracker.update(snap(now, *(p.sample(frozenset()) for p in sc.ports)))
    for p in sc.ports:
        check_view(first[(GUID, p.number)], p, now, frozenset(), None)
    out = [first]
    last: dict[PortKey, PortView] = dict(first)
    for s in sc.steps:
        now += s.dt
        for p in sc.ports:
            for c in p.counters:
                c.apply(s.ops[(p.number, c.hw, c.name)])
        present = [p for p in sc.ports if p.number not in s.absent]
        missing = {p.number: frozenset((hw, n) for (num, hw, n) in s.missing if num == p.number)
                   for p in present}
        views = tracker.update(snap(now, *(p.sample(missing[p.number]) for p in present)))
        assert set(views) == {(GUID, p.number) for p in present}
        for p in present:
            key = (GUID, p.number)
            check_view(views[key], p, now, missing[p.number], last[key])
            last[key] = views[key]
        out.append(views)
    return out


@settings(max_examples=200, deadline=None)
@given(scenarios(odd=True))
def test_totals_are_exact_up_to_what_no_reader_can_see_and_rates_match(sc: Scenario) -> None:
    run_model(sc)


@settings(max_examples=100, deadline=None)
@given(scenarios(odd=False))
def test_without_resets_or_saturation_totals_are_the_true_counts(sc: Scenario) -> None:
    views = run_model(sc)
    for p in sc.ports:
        for c in p.counters:
            assert c.lost == 0 and c.resets == 0
            final = views[-1][(GUID, p.number)]
            assert (final.hw_totals if c.hw else final.totals)[c.name] == c.true * c.mult
    assert all(v.resets == {} and v.saturated == frozenset() for vs in views for v in vs.values())


def packed(s: PortSample, indexes: dict[tuple[str, ...], dict[str, int]] | None) -> PortSample:
    """The sample as a source that keeps its values packed hands it over: ``Totals`` over an
    ``array('Q')`` (a list when a value does not fit), with one index per set of names
    (``indexes``) or a new one every time (None)."""
    names = tuple(s.counters)
    index = {n: i for i, n in enumerate(names)}
    if indexes is not None:
        index = indexes.setdefault(names, index)
    values = list(s.counters.values())
    try:
        row: Sequence[int] = array("Q", values)
    except OverflowError:
        row = values
    return dataclasses.replace(s, counters=Totals(index, row))


def play(sc: Scenario, *, restart_at: int | None = None, pack: bool | None = None,
         ) -> list[dict[PortKey, PortView]]:
    """Run the scenario through a tracker (restarting it via JSON at ``restart_at``); with
    ``pack`` its samples are packed (True: one index per set of names, False: a new index for
    every sample)."""
    sc = copy.deepcopy(sc)
    tracker = Tracker()
    indexes: dict[tuple[str, ...], dict[str, int]] | None = {} if pack else None

    def poll(t: float, samples: list[PortSample]) -> dict[PortKey, PortView]:
        if pack is not None:
            samples = [packed(x, indexes) for x in samples]
        return tracker.update(snap(t, *samples))

    now = 100.0
    out = [poll(now, [p.sample(frozenset()) for p in sc.ports])]
    for i, s in enumerate(sc.steps):
        if i == restart_at:
            tracker = roundtrip(tracker)
        now += s.dt
        for p in sc.ports:
            for c in p.counters:
                c.apply(s.ops[(p.number, c.hw, c.name)])
        present = [p for p in sc.ports if p.number not in s.absent]
        samples = [p.sample(frozenset((hw, n) for (num, hw, n) in s.missing if num == p.number))
                   for p in present]
        out.append(poll(now, samples))
    return out


@settings(max_examples=150, deadline=None)
@given(scenarios(odd=True), st.integers(0, 11))
def test_a_restart_at_any_point_changes_nothing(sc: Scenario, at: int) -> None:
    straight = play(sc)
    restarted = play(sc, restart_at=at % len(sc.steps))
    # Same boot, consistent clocks: totals, resets, saturation and even rates carry over.
    assert restarted == straight


@settings(max_examples=150, deadline=None)
@given(scenarios(odd=True), st.booleans(), st.integers(0, 11))
def test_packed_counters_are_read_exactly_as_a_dict_of_them(
    sc: Scenario, shared_index: bool, at: int
) -> None:
    """A source may hand its counters packed (the simulator does); the tracker's shortcut
    for them must report what it reports for the same values in a dict, through resets,
    saturation, missing counters and a restart."""
    straight = play(sc)
    assert play(sc, pack=shared_index) == straight
    assert play(sc, pack=shared_index, restart_at=at % len(sc.steps)) == straight
