"""The column store (``ibmon.track.columns``) accounts exactly as the per-port path.

A fabric-sized poll (``ibmon.runtime.sizes``) takes the plain ports through numpy a block at a time
(the tracker's rule functions on columns) and hands every other port, and any row a block
refuses (a reset, a counter reaching its narrow maximum, a total past 64 bits), to the
per-port path. The attack: every shipped scenario played through
two trackers on the same samples, one always per port and one always in columns, with ports
that do not answer now and then and a restart from the persisted state half-way, compared on
every poll (each view, field by field) and at the end (the persisted state and the counts of
resets and saturations). ``test_tracker.py`` runs its property tests through both paths too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from array import array
from typing import Any

import pytest

from ibmon.detect.columns import Fresh
from ibmon.infiniband.model import PortIdentity, PortSample, PortState, Snapshot, replaced
from ibmon.infiniband.xmitwait import WaitUnit
from ibmon.sources.mock import MockSource
from ibmon.track import columns as trackcolumns
from ibmon.track.rates import Rates
from ibmon.track.rowview import RowView
from ibmon.track.totals import Totals
from ibmon.track.tracker import Tracker
from mocks.scenario import ManualClock, list_scenarios, load_scenario
from tests.detect_views import store_views
from tests.tracker_paths import ColumnTracker, PerPortTracker


@pytest.fixture(autouse=True)
def _small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of a few dozen rows at a time (a fabric's polls take thousands), so that every
    poll here crosses chunk boundaries; ``test_tracker.py`` takes the single-chunk way."""
    monkeypatch.setattr(trackcolumns, "_CHUNK", 37)


_PerPort = PerPortTracker


class _Columns(ColumnTracker):
    #: Polls that repeated the last one (``Tracker._repeat``: no dispatch), by class.
    same_polls = 0

    @staticmethod
    def _repeat(*args: Any) -> Any:
        batch = ColumnTracker._repeat(*args)
        _Columns.same_polls += batch is not None
        return batch


def _in_store(totals: object) -> bool:
    """Whether a view's totals are a row of the column store (not the port's own array)."""
    return type(totals) is Totals and len(totals.packed) != len(totals.index)


def _restarted(tracker: Tracker, kind: type[Tracker]) -> Tracker:
    fresh = kind()
    fresh.load(json.loads(json.dumps(tracker.dump())))
    return fresh


def _as_dicts(snap: Snapshot) -> Snapshot:
    """The same poll with each port's counters as a plain dict (how ``mad`` hands them)."""
    ports = {k: dataclasses.replace(s, counters=dict(s.counters)) for k, s in snap.ports.items()}
    return Snapshot(snap.source, snap.monotonic, snap.wall, ports, list(snap.errors))


#: Every shipped scenario with the simulator's packed counters; the ones with resets and
#: saturation again with counters as dicts (the ``mad`` source's form: another way in).
CASES = [(n, False) for n in list_scenarios() if n != "scale"] + [
    (n, True) for n in ("counter-reset", "saturation", "link-errors")]


@pytest.mark.parametrize(("name", "dicts"), CASES)
def test_columns_account_exactly_as_the_per_port_rules(
    name: str, dicts: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_Columns, "same_polls", 0)
    sc = load_scenario(name)
    clock = ManualClock()
    source = MockSource.from_scenario(name, clock=clock)
    per_port: Tracker = _PerPort()
    columns: Tracker = _Columns()
    polls = in_columns = 0
    t = 0.0
    while t <= min(sc.duration, 1800.0):
        clock.t = t
        snap = asyncio.run(source.sample())
        if dicts:
            snap = _as_dicts(snap)
        polls += 1
        if polls % 4 == 0:  # a ninth of the ports do not answer: their rows wait
            for i, key in enumerate(list(snap.ports)):
                if i % 9 == polls % 9:
                    del snap.ports[key]
        if polls == 40:  # a restart from the persisted state
            per_port = _restarted(per_port, _PerPort)
            columns = _restarted(columns, _Columns)
        want = per_port.update(snap)
        got = columns.update(snap)
        assert list(got) == list(want)
        for key, view in want.items():
            assert got[key] == view, f"t={t} {key}"
        in_columns += sum(_in_store(v.totals) for v in got.values())
        t = round(t + 10.0, 6)
    assert json.dumps(columns.dump(), sort_keys=True) == json.dumps(per_port.dump(), sort_keys=True)
    assert (columns.resets_seen, columns.saturations_seen) == (
        per_port.resets_seen, per_port.saturations_seen)
    # Not a speed test: that the column store did the accounting (else this proves little).
    assert in_columns > polls * len(want) // 2
    if not dicts:  # and that polls of the last poll's ports took the way without dispatch
        assert _Columns.same_polls > 0  # (a pinned counter keeps its port on the dispatch)


@pytest.mark.parametrize("name", ["counter-reset", "flap"])
def test_a_poll_of_the_last_polls_ports_accounts_as_the_dispatch_would(
    name: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``Tracker._repeat`` (the poll of the same ports, in the same order, as the last
    one, all plain rows) against the per-port rules, poll after poll, across what ends that
    state between polls: a port forgotten while it still answers, state loaded into the same
    tracker, a poll with no time passed, a counter reset, a link going down and up, samples
    that are rows of their own (as ``mad`` hands them) or not of 64-bit values (dicts, a
    list), the same ports in another order, the same counters in another column order.
    Views of earlier polls never change meanwhile."""
    monkeypatch.setattr(_Columns, "same_polls", 0)
    clock = ManualClock()
    source = MockSource.from_scenario(name, clock=clock)
    per_port: Tracker = _PerPort()
    columns: Tracker = _Columns()
    kept: list[tuple[dict[str, int], dict[str, float], Any]] = []
    down = 0  # views of ports that were not Active
    snap = asyncio.run(source.sample())
    for poll in range(1, 60):
        if poll % 7 != 0:  # every seventh poll: the same instant again (no interval)
            clock.t += 10.0
            snap = asyncio.run(source.sample())
        if poll % 11 == 0:  # a poll of plain dicts: not rows of 64-bit values
            snap = _as_dicts(snap)
        if poll % 13 == 0 or 25 <= poll < 31:  # rows of a list, or of their own (``mad``'s)
            snap = Snapshot(snap.source, snap.monotonic, snap.wall, {k: dataclasses.replace(
                s, counters=Totals(s.counters.index,  # type: ignore[attr-defined]
                                   list(s.counters.own()) if poll % 13 == 0  # type: ignore[attr-defined]
                                   else array("Q", s.counters.own())))  # type: ignore[attr-defined]
                for k, s in snap.ports.items()}, list(snap.errors))
        if poll % 17 == 0:  # the same ports in another order
            snap = Snapshot(snap.source, snap.monotonic, snap.wall,
                            dict(reversed(snap.ports.items())), list(snap.errors))
        if poll % 19 == 0:  # the same counters in another column order, one index for all
            first = next(iter(snap.ports.values())).counters
            names = list(reversed(list(first)))
            index = {name: i for i, name in enumerate(names)}
            snap = Snapshot(snap.source, snap.monotonic, snap.wall, {k: dataclasses.replace(
                s, counters=Totals(index, array("Q", [s.counters[n] for n in names])))
                for k, s in snap.ports.items()}, list(snap.errors))
        if poll == 20:  # forgotten (left the fabric for good), yet it answers again
            key = next(iter(snap.ports))
            per_port.forget(key)
            columns.forget(key)
        if poll == 40:  # state loaded into the running trackers
            saved = json.loads(json.dumps(per_port.dump()))
            per_port.load(saved)
            columns.load(saved)
        want = per_port.update(snap)
        got = columns.update(snap)
        assert list(got) == list(want)
        for key, view in want.items():
            assert got[key] == view, f"poll {poll} {key}"
        kept += [(v.totals.as_dict(), dict(v.rates), v)  # type: ignore[attr-defined]
                 for v in list(got.values())[:: max(1, len(got) // 50)]]
        down += sum(v.state not in (None, PortState.ACTIVE) for v in got.values())
    assert json.dumps(columns.dump(), sort_keys=True) == json.dumps(per_port.dump(), sort_keys=True)
    assert columns.resets_seen == per_port.resets_seen
    assert _Columns.same_polls > 15
    assert (down if name == "flap" else columns.resets_seen) > 0  # what each case is for
    assert all(view.totals.as_dict() == totals and dict(view.rates) == rates
               for totals, rates, view in kept)


def test_published_column_views_never_change() -> None:
    """Views of earlier polls keep their totals and rates while later polls (and growth,
    and ports leaving and coming back) rewrite the store."""
    tracker = _Columns()

    def sample(port: int, value: int) -> PortSample:
        return PortSample(PortIdentity(f"0x{port + 1:016x}", "1"), state=4, rate_bps=8e9,
                          counters={"transmit_data": value, "symbol_errors": 0})

    kept: list[tuple[dict[str, int], dict[str, float], Any]] = []
    for step in range(1, 40):
        ports = range(step * 20)  # more ports every poll: the blocks grow
        snap = Snapshot("x", float(step), 1e9 + step,
                        {(f"0x{p + 1:016x}", "1"): sample(p, step * (p + 1)) for p in ports
                         if (p + step) % 7})  # some missing now and then
        for view in tracker.update(snap).values():
            kept.append((view.totals.as_dict(), dict(view.rates), view))  # type: ignore[attr-defined]
        if step % 10 == 0:
            for p in ports[::3]:
                tracker.forget((f"0x{p + 1:016x}", "1"))
    assert all(view.totals.as_dict() == totals and dict(view.rates) == rates
               for totals, rates, view in kept)
    assert any(_in_store(v.totals) for _, _, v in kept)


def test_a_poll_with_its_counters_in_another_order_is_read_by_name() -> None:
    """A poll of the last poll's ports whose samples pack the counters in another order (one
    index for all, as a source hands them) is read by name, not as the last order: both
    counters rise under either reading here, so no refusal would catch the mix-up."""
    a, b = _PerPort(), _Columns()
    order = ("receive_packets", "transmit_packets")

    def poll(step: int, values: dict[str, int], names: tuple[str, ...]) -> Snapshot:
        index = {name: i for i, name in enumerate(names)}
        return Snapshot("x", float(step), 1e9 + step, {
            (f"0x{p + 1:016x}", "1"): PortSample(
                PortIdentity(f"0x{p + 1:016x}", "1"), state=4,
                counters=Totals(index, array("Q", [values[n] for n in names])))
            for p in range(4)})

    steps = [({"receive_packets": 10, "transmit_packets": 10}, order),
             ({"receive_packets": 11, "transmit_packets": 11}, order),
             ({"receive_packets": 13, "transmit_packets": 12}, order[::-1])]
    for step, (values, names) in enumerate(steps, 1):
        snap = poll(step, values, names)
        want, got = a.update(snap), b.update(snap)
        assert got == want, step
    assert all(v.totals["transmit_packets"] == 12 and v.totals["receive_packets"] == 13
               for v in got.values())


#: Link rates a source may report: unknown, zero, nonsense, and real ones (float and int).
ODD_RATES: list[float | int | None] = [None, 0.0, -8e9, float("nan"), float("inf"), 8e9, 10**11]


def test_odd_link_rates_give_the_per_port_rules_link_rate_and_ratios() -> None:
    """The columns take each view's link rate from the sample once and hand it to the
    ratios; an unknown, zero or nonsensical rate must give no utilization there exactly as
    the per-port rules decide it, and the same ``rate_bytes_per_second``."""
    a, b = _PerPort(), _Columns()

    def poll(step: int) -> Snapshot:
        return Snapshot("x", float(step), 1e9 + step, {
            (f"0x{p + 1:016x}", "1"): PortSample(
                PortIdentity(f"0x{p + 1:016x}", "1"), state=4,
                rate_bps=ODD_RATES[p % len(ODD_RATES)],
                counters={"transmit_data": 1000 * step * (p + 1),
                          "receive_data": 500 * step * (p + 1), "transmit_wait": 7 * step})
            for p in range(3 * len(ODD_RATES))})

    for step in range(1, 4):
        snap = poll(step)
        want, got = a.update(snap), b.update(snap)
        assert got == want
    assert any(_in_store(v.totals) for v in got.values())
    by_rate = {repr(ODD_RATES[i % len(ODD_RATES)]): v for i, v in enumerate(got.values())}
    assert by_rate["8000000000.0"].utilization_tx is not None
    assert by_rate["0.0"].rate_bytes_per_second == 0.0
    for odd in ("None", "0.0", "-8000000000.0", "nan", "inf"):
        assert by_rate[odd].utilization_tx is None, odd
        assert by_rate[odd].utilization_rx is None, odd


_WIDE = frozenset({"transmit_data", "transmit_packets", "symbol_errors"})

#: Sequences of one port's readings (counter: raw value; all read at 64 bits where ``wide``)
#: that a block must refuse at some step, each for one of its reasons.
REFUSALS = {
    "reset": [{"transmit_data": 10}, {"transmit_data": 20}, {"transmit_data": 5},
              {"transmit_data": 6}],
    "narrow counter reaching its maximum": [
        {"symbol_errors": 1}, {"symbol_errors": 2}, {"symbol_errors": 65535},
        {"symbol_errors": 0}, {"symbol_errors": 3}],
    "64-bit read at the narrow maximum": [
        {"symbol_errors": 1, "wide": 1}, {"symbol_errors": 65535, "wide": 1},
        {"symbol_errors": 65536, "wide": 1}],
    # delta x 4 wraps 64 bits to exactly 0: only the delta limit sees it
    "data delta past 64 bits once multiplied": [
        {"transmit_data": 1, "wide": 1}, {"transmit_data": 2**62 + 1, "wide": 1},
        {"transmit_data": 2**62 + 2, "wide": 1}],
    # a total near 2**64 after a reset, then a small increase: only the total check sees it
    "total past 64 bits": [
        {"transmit_packets": 2**64 - 10, "wide": 1}, {"transmit_packets": 0, "wide": 1},
        {"transmit_packets": 100, "wide": 1}, {"transmit_packets": 200, "wide": 1}],
    "reset from the top of 64 bits": [
        {"transmit_packets": 2**64 - 1, "wide": 1}, {"transmit_packets": 5, "wide": 1},
        {"transmit_packets": 6, "wide": 1}],
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_block_refuses_what_the_per_port_rules_must_decide(case: str) -> None:
    """Each reason a block refuses a row, on its own: the row is left to the per-port rules,
    so both trackers agree at every step and in what they persist."""
    key = ("0x0000000000000001", "1")
    a, b = _PerPort(), _Columns()
    for t, reading in enumerate(REFUSALS[case]):
        counters = {k: v for k, v in reading.items() if k != "wide"}
        wide = _WIDE if reading.get("wide") else frozenset()
        snap = Snapshot("x", float(t), 1e9 + t, {key: PortSample(
            PortIdentity(*key), state=4, counters=counters, wide=wide)})
        want = a.update(snap)[key]
        got = b.update(snap)[key]
        assert got == want, t
        assert b.dump() == a.dump(), t


def test_the_renderer_reads_column_store_totals_as_packed_columns() -> None:
    """The exposition reads a block of ports' totals column by column (``_packed_columns``);
    rows of the column store must take that way, not the per-port fallback."""
    from exporters.render import _columns, _packed_columns

    rows = store_views()
    assert all(type(v) is RowView and _in_store(v.totals) for v in rows)
    # rows of the store, and the same with one port's own copy among them (a silent port's)
    own = rows[5].totals
    assert isinstance(own, Totals)
    mixed = [*rows[:5], replaced(rows[5], totals=Totals(own.index, own.own())), *rows[6:]]
    for case in (rows, mixed, rows[::-1]):
        packed = _packed_columns(case)
        assert packed is not None
        assert {k: list(v) for k, v in packed.items()} == {
            k: list(v) for k, v in _columns([v.totals for v in case]).items() if k in packed}


def test_a_refused_row_among_rows_read_in_place_leaves_the_others_where_they_are() -> None:
    """Rows in order are read in place (a slice, not an index array); when one of them is
    refused the others must still be written to their own rows, wherever the run starts."""
    a, b = _PerPort(), _Columns()
    keys = [(f"0x{p:016x}", "1") for p in range(1, 6)]

    def snap(t: float, readings: dict[int, int]) -> Snapshot:
        return Snapshot("x", t, 1e9 + t, {keys[p]: PortSample(
            PortIdentity(*keys[p]), state=4, counters={"transmit_data": v})
            for p, v in readings.items()})

    plan = [
        {0: 10, 1: 10, 2: 10, 3: 10, 4: 10},
        {0: 20, 1: 20, 2: 20, 3: 20, 4: 20},  # every port in its row
        {1: 30, 2: 5, 3: 30},  # rows 1-3 in order, the middle one reset
        {0: 40, 1: 40, 2: 40, 3: 40, 4: 40},
    ]
    for t, readings in enumerate(plan):
        want = a.update(snap(float(t), readings))
        got = b.update(snap(float(t), readings))
        assert got == want, t
    assert b.dump() == a.dump()


def test_rates_keep_only_the_columns_that_moved_and_read_as_the_per_port_rules() -> None:
    """A poll's rates keep the columns where some port's rate is not 0.0, plus one column of
    0.0 that every other counter reads (most of a fabric's counters are error counters that
    did not move). Every view must read exactly what the per-port rules give (names, order,
    values), the detectors' column gather too, and views of earlier polls keep theirs while
    other columns move. The rows are laid out a chunk at a time as the last poll's columns
    moved: a column that starts moving in the poll's last chunk and one that stops moving
    must both end up as if the poll had been laid out at once."""
    names = ("transmit_data", "receive_data", "symbol_errors", "link_downed", "receive_errors")
    # enough ports for several chunks (``_small_chunks``), the last one partly filled
    keys = [(f"0x{p:016x}", "1") for p in range(1, 4 * 37 + 2)]
    middle, last = len(keys) // 2, len(keys) - 1
    a, b = _PerPort(), _Columns()

    def snap(t: int) -> Snapshot:
        def counters(p: int) -> dict[str, int]:
            return {"transmit_data": t * (p + 1),  # moves on every port
                    "receive_data": 0,  # never moves
                    "symbol_errors": t if p == middle else 0,  # one port, from poll 2
                    "link_downed": 1 if p == last and t >= 3 else 0,  # one port, at poll 3
                    "receive_errors": 5}  # constant: never a rate
        return Snapshot("x", float(t), 1e9 + t, {key: PortSample(
            PortIdentity(*key), state=4, rate_bps=8e9, counters=counters(p))
            for p, key in enumerate(keys)})

    kept: list[tuple[dict[str, float], Any]] = []
    widths = []
    for t in range(1, 6):
        want = a.update(snap(t))
        got = b.update(snap(t))
        assert got == want, t
        for key, view in got.items():
            assert list(view.rates) == list(want[key].rates) == (list(names) if t > 1 else [])
            kept.append((dict(want[key].rates), view))
        if t == 1:  # the baseline: no rates yet, and the per-port rules' views
            continue
        view = got[keys[0]]
        assert type(view) is RowView
        widths.append(len(view.rows.rates) // len(keys))
        fresh = Fresh()
        fresh.extend(got.items())
        for name in names:
            assert fresh.column(Rates, name, None) == [v.rates.get(name) for v in want.values()]
    # transmit_data and symbol_errors moved, then link_downed too, then no longer; and the
    # column of 0.0
    assert widths == [3, 4, 3, 3], widths
    assert all(dict(view.rates) == rates for rates, view in kept)


def test_raw_values_read_from_one_shared_array_or_rows_of_their_own_alike() -> None:
    """A source may keep a poll's values as rows of one array (the simulator) or give each
    port its own (``packed_counters``, dicts): every mix reads the same matrix."""
    width = 3
    rows = [[10 * r + c for c in range(width)] for r in range(6)]
    flat = array("Q", [v for row in rows for v in row])
    own = [array("Q", row) for row in rows]

    def read(values: list[array[int]], bases: list[int]) -> list[list[int]]:
        return trackcolumns._raw(values, bases, width).tolist()  # type: ignore[no-any-return]

    assert read([flat] * 6, [r * width for r in range(6)]) == rows  # in order: in place
    picked = [4, 1, 5]  # ports missing, others in another order: gathered
    assert read([flat] * 3, [r * width for r in picked]) == [rows[r] for r in picked]
    assert read(own, [0] * 6) == rows  # rows of their own: joined
    mixed = [own[0], flat, own[2], flat]
    assert read(mixed, [0, 1 * width, 0, 3 * width]) == [rows[0], rows[1], rows[2], rows[3]]


def test_the_simulator_hands_a_poll_as_rows_of_one_array() -> None:
    """What the tracker's shared-array path is for: the simulator's samples share one array
    (one block of memory a poll instead of an array a port), and one empty mapping of driver
    counters and gauges (the PMA has none) instead of two new dicts a port."""
    source = MockSource.from_scenario("demo", hosts=100, clock=ManualClock())
    snap = asyncio.run(source.sample())
    packed = {id(s.counters.packed) for s in snap.ports.values()}  # type: ignore[attr-defined]
    assert len(packed) == 1
    assert [s.counters.base for s in snap.ports.values()][:3] == [  # type: ignore[attr-defined]
        0, len(next(iter(snap.ports.values())).counters),
        2 * len(next(iter(snap.ports.values())).counters)]
    empty = {id(s.hw_counters) for s in snap.ports.values()} | {
        id(s.hw_gauges) for s in snap.ports.values()}
    assert len(empty) == 1 and not next(iter(snap.ports.values())).hw_gauges


def test_ports_on_their_first_packed_sample_go_straight_into_the_store() -> None:
    """A new port whose first sample is packed (the simulator's rows of one array, a fabric
    source's ``packed_counters``) gets its row of the store on that poll, with the totals
    and views the per-port rules give a first reading; a first reading the rules must judge
    (a narrow counter at its maximum, read narrow or wide; a data counter whose total would
    pass 64 bits; a counter outside the catalogue) takes the rules, alone. Ports arriving
    later, among ports already in the store, as well. Both trackers agree on every poll and
    in what they persist."""
    names = ("transmit_data", "receive_data", "symbol_errors", "transmit_wait")
    index = {n: i for i, n in enumerate(names)}
    odd_index = {**index, "not_a_counter": len(names)}
    firsts = {  # port -> its first reading, where it is odd
        3: {"symbol_errors": 65535},  # pinned at the narrow maximum
        4: {"symbol_errors": 65535, "wide": 1},  # the narrow maximum read at 64 bits
        5: {"transmit_data": 2**62},  # x4 passes 64 bits
        6: {"transmit_data": 2**62 // 4 * 4 - 1},  # x4 just fits
    }
    ports = 12
    per_port, columns = _PerPort(), _Columns()
    for poll in range(4):
        present = range(ports if poll else ports - 4)  # four ports arrive on the second poll
        flat = array("Q")
        samples = {}
        for p in present:
            reading = {n: 1000 * (p + 1) + 10 * poll + i for i, n in enumerate(names)}
            first = poll == 0 or (poll == 1 and p >= ports - 4)
            if first:
                reading.update({k: v for k, v in firsts.get(p % 8, {}).items() if k != "wide"})
            wide = _WIDE if first and firsts.get(p % 8, {}).get("wide") else frozenset()
            key = (f"0x{p + 1:016x}", "1")
            odd = p == 7  # a counter no catalogue knows
            base = len(flat)
            flat.extend([reading[n] for n in names] + ([7] if odd else []))
            samples[key] = (key, odd, base, wide)
        snap = Snapshot("x", float(poll), 1e9 + poll, {key: PortSample(
            PortIdentity(*key), state=4, rate_bps=8e9,
            counters=Totals(odd_index if odd else index, flat, base), wide=wide)
            for key, odd, base, wide in samples.values()})
        want = per_port.update(snap)
        got = columns.update(snap)
        assert got == want, poll
        assert json.dumps(columns.dump(), sort_keys=True) == json.dumps(
            per_port.dump(), sort_keys=True), poll
        if poll <= 1:  # the plain first readings were given rows on their first poll
            arrived = [k for k in got if int(k[0], 16) - 1 >= (0 if poll == 0 else ports - 4)]
            plain = [k for k in arrived if (int(k[0], 16) - 1) % 8 in (0, 1, 2, 6)]
            assert plain and all(_in_store(got[k].totals) for k in plain), poll
            assert not any(_in_store(got[k].totals) for k in arrived if k not in plain), poll
    assert (columns.saturations_seen, columns.unknown_counters_seen) == (
        per_port.saturations_seen, per_port.unknown_counters_seen)


def test_a_first_packed_sample_after_driver_counters_alone_reads_as_the_rules() -> None:
    """A port that reported only driver counters so far, then its first PMA counters packed
    (and no driver counters): the store takes it, and its driver counters go stale as the
    per-port rules say."""
    key = ("0x0000000000000001", "1")
    index = {"transmit_data": 0, "symbol_errors": 1}
    readings: list[tuple[Any, dict[str, int]]] = [
        ({}, {"rx_write_requests": 5}), (Totals(index, array("Q", [10, 0])), {}),
        (Totals(index, array("Q", [20, 1])), {"rx_write_requests": 9})]
    a, b = _PerPort(), _Columns()
    for t, (counters, hw) in enumerate(readings):
        snap = Snapshot("x", float(t), 1e9 + t, {key: PortSample(
            PortIdentity(*key), state=4, counters=counters, hw_counters=hw)})
        assert b.update(snap) == a.update(snap), t
        assert b.dump() == a.dump(), t
    assert b._ports[key].block is not None  # the store took it on its first PMA counters


def test_a_published_view_keeps_its_driver_totals_through_later_polls() -> None:
    """Views never change once published: the driver totals of a port the store took on its
    first sample are the view's own, not the tracker's running dict."""
    key = ("0x0000000000000001", "1")
    index = {"transmit_data": 0, "symbol_errors": 1}
    tracker = _Columns()
    views = []
    for t, (data, hw) in enumerate([(10, 5), (20, 9), (30, 12)]):
        snap = Snapshot("x", float(t), 1e9 + t, {key: PortSample(
            PortIdentity(*key), state=4, counters=Totals(index, array("Q", [data, 0])),
            hw_counters={"rx_write_requests": hw})})
        views.append(tracker.update(snap)[key])
        assert tracker._ports[key].block is not None  # in the store from its first sample
    assert [dict(v.hw_totals) for v in views] == [
        {"rx_write_requests": n} for n in (5, 9, 12)]


def test_ports_forgotten_give_their_rows_back() -> None:
    """A fabric whose ports come and go (each one gone for good is forgotten) keeps a store
    the size of the ports it has, not of every port it ever saw."""
    tracker = _Columns()
    index = {"transmit_data": 0, "symbol_errors": 1}

    def poll(t: int, ports: range) -> None:
        tracker.update(Snapshot("x", float(t), 1e9 + t, {
            (f"0x{p + 1:016x}", "1"): PortSample(
                PortIdentity(f"0x{p + 1:016x}", "1"), state=4,
                counters=Totals(index, array("Q", [t, 0])))
            for p in ports}))

    for t in range(40):
        ports = range(t * 8, t * 8 + 64)  # eight leave and eight new arrive each poll
        poll(t, ports)
        for p in range(t * 8, t * 8 + 8):
            tracker.forget((f"0x{p + 1:016x}", "1"))
    (block,) = tracker._blocks.values()
    assert len(block.last) // block.width <= 2 * 64


def test_rows_of_one_shared_array_are_read_where_each_port_says() -> None:
    """A source whose poll is one array (as the simulator's) may list its ports in another
    order than their rows: each port is read from its own row, as the per-port rules read
    it, even when the first and last rows are as far apart as rows in order would be."""
    index = {"transmit_data": 0, "symbol_errors": 1}
    width = len(index)
    order = [0, 2, 1, 3, 5, 4, 6, 7]  # the snapshot's order of the array's rows
    per_port, columns = _PerPort(), _Columns()
    for t in range(3):
        flat = array("Q")
        for row in range(len(order)):
            flat.extend([1000 * (row + 1) + t * (row + 1), row * t])
        snap = Snapshot("x", float(t), 1e9 + t, {
            (f"0x{row + 1:016x}", "1"): PortSample(
                PortIdentity(f"0x{row + 1:016x}", "1"), state=4, rate_bps=8e9,
                counters=Totals(index, flat, row * width))
            for row in order})
        assert columns.update(snap) == per_port.update(snap), t


def test_ratios_after_a_refused_row_are_of_each_ports_own_link() -> None:
    """A row the store refuses (a reset) leaves the chunk: the utilization and transmit-wait
    ratio of the rows after it are still of their own link rates and units."""
    index = {"transmit_data": 0, "transmit_wait": 1}
    per_port, columns = _PerPort(), _Columns()
    for t in range(3):
        snap = Snapshot("x", float(t), 1e9 + t, {
            (f"0x{p + 1:016x}", "1"): PortSample(
                PortIdentity(f"0x{p + 1:016x}", "1", xmit_wait=WaitUnit(32, True, "lane")),
                state=4, rate_bps=8e9 * (p + 1), active_width="4X" if p % 2 else "1X",
                counters=Totals(index, array("Q", [
                    3 if (t == 2 and p == 1) else 10_000_000 * t * (p + 1), 1000 * t])))
            for p in range(6)})
        got, want = columns.update(snap), per_port.update(snap)
        assert got == want, t
    assert got[("0x0000000000000002", "1")].resets == {"transmit_data": 1}
    for ratio in ("utilization_tx", "xmit_wait_ratio"):
        values = [getattr(v, ratio) for v in got.values()]
        assert None not in values and len(set(values)) > 1, ratio
