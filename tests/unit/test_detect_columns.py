"""Detectors read a counter of every answered port once per poll (``ibmon.detect.columns``):
gathered from the tracker's column store where ports are its rows, port by port elsewhere.
Both ways must read exactly what ``mapping.get`` reads (CPU per poll)."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from array import array
from operator import is_
from typing import Any

import pytest

from ibmon.detect import columns
from ibmon.detect.base import rate_column, totals_column
from ibmon.detect.columns import Fresh
from ibmon.detect.congestion import Congestion, CongestionSettings
from ibmon.detect.errors import Discards, DiscardsSettings, ReceiveErrors, ReceiveErrorsSettings
from ibmon.infiniband.counters import CATALOGUE
from ibmon.infiniband.model import PortView, replaced
from ibmon.sources.mock import MockSource
from ibmon.track import rowview
from ibmon.track.rates import NO_RATE, Rates
from ibmon.track.rowview import RowView
from ibmon.track.totals import Totals
from mocks.scenario import ManualClock
from tests.detect_views import _ColumnTracker, store_poll, store_views

pytest.importorskip("numpy", reason="the gather needs numpy (a runtime dependency)")


def _fresh(views: list[PortView]) -> Fresh:
    fresh = Fresh()
    fresh.extend((v.identity.key, v) for v in views)
    return fresh


def _views() -> list[PortView]:
    """A poll of a column tracker (rows of its store), with ports read another way among them:
    their own arrays, a plain dict, another counter order, a total past 64 bits, no rates."""
    views = store_views()
    first = views[0].totals
    assert isinstance(first, Totals) and len(first.packed) > len(first)  # a row of the store
    names = list(first.index)
    other = {n: i for i, n in enumerate(reversed(names))}
    odd = {
        3: Totals(first.index, array("Q", first.own())),  # a silent port's copy of its row
        5: dict(views[5].totals),
        7: Totals(other, array("Q", [views[7].totals[n] for n in other])),
        9: Totals(first.index, [1 << 70, *list(views[9].totals.values())[1:]]),
    }
    for i, totals in odd.items():
        views[i] = replaced(views[i], totals=totals)
    views[11] = replaced(views[11], rates={})
    return views


def _column_array_reads_what_get_reads(fresh: Fresh, views: list[PortView], name: str,
                                       *, whole: bool = False) -> None:
    """``column_array`` is every port's value (``whole``: it must give one), or None."""
    totals, rates = fresh.column_array(Totals, name), fresh.column_array(Rates, name)
    if whole:
        assert totals is not None and rates is not None, name
    if totals is not None:
        assert totals.tolist() == [v.totals.get(name) for v in views], name
    if rates is not None:
        assert [repr(x) for x in rates.tolist()] == [
            repr(v.rates.get(name, NO_RATE)) for v in views], name


@pytest.mark.parametrize("gathered", [True, False])
def test_columns_read_what_get_reads(gathered: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Gathered from the store's rows, and port by port (a process whose column store
    never loaded numpy: ``rowview.columns_numpy`` is None)."""
    store_views(polls=1)  # the column store is in use
    if not gathered:
        monkeypatch.setattr(rowview, "_numpy", None)
    views = _views()
    fresh = _fresh(views)
    for spec in CATALOGUE:
        for default in (None, -1):
            assert totals_column(fresh, spec.name, default) == [
                v.totals.get(spec.name, default) for v in views], spec.name
        got = rate_column(fresh, spec.name)
        want = [v.rates.get(spec.name, NO_RATE) for v in views]
        assert [repr(x) for x in got] == [repr(x) for x in want], spec.name
        _column_array_reads_what_get_reads(fresh, views, spec.name)
    reader = fresh._readers[Totals]
    # the store's rows are gathered; only the ports read another way go one by one
    assert (reader._shared is not None) == gathered
    if gathered:
        assert reader._odd == [3, 5, 7, 9]
        assert fresh._readers[Rates]._odd == [11]
        # the tracker's views are read in place: no mapping made for every port
        assert reader._maps is None and fresh._readers[Rates]._maps is None


@pytest.mark.parametrize("mixed", [False, True])
def test_a_poll_of_one_store_is_gathered_whole(mixed: bool,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Every port a row of the one ``Rows`` of a poll (a fabric's steady state): the rows'
    starts come from the views' row numbers at once; a single port of another ``Rows`` (a
    second tracker's poll) sends the reader back to telling them apart one by one."""
    whole: list[bool] = []  # per reader: were the rows' starts found at once?
    one_store = columns._one_store_bases

    def spy(*args: Any) -> Any:
        bases = one_store(*args)
        whole.append(bases is not None)
        return bases

    monkeypatch.setattr(columns, "_one_store_bases", spy)
    views = store_views()
    if mixed:
        views[4] = store_views(polls=2)[4]  # the same port, a row of an earlier poll's rows
    fresh = _fresh(views)
    for spec in CATALOGUE:
        assert totals_column(fresh, spec.name) == [v.totals.get(spec.name) for v in views]
        got = rate_column(fresh, spec.name)
        want = [v.rates.get(spec.name, NO_RATE) for v in views]
        assert [repr(x) for x in got] == [repr(x) for x in want], spec.name
        if spec.name in views[0].totals:
            _column_array_reads_what_get_reads(fresh, views, spec.name, whole=not mixed)
    totals, rates = fresh._readers[Totals], fresh._readers[Rates]
    assert totals._shared is not None and rates._shared is not None
    assert (totals._odd, rates._odd) == (([4], [4]) if mixed else ([], []))
    assert whole == [not mixed] * 2


def test_a_gather_leaves_the_store_free_to_grow(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gather reads the store's array through a buffer view only while it copies: an
    exported buffer would make the tracker's next growth fail (BufferError)."""
    views = _views()
    fresh = _fresh(views)
    totals_column(fresh, CATALOGUE[0].name)
    shared = fresh._readers[Totals]._shared
    assert isinstance(shared, array)
    shared.extend(array("Q", [0] * 64))


def _laid_out_poll(polls: int = 3) -> tuple[list[PortView], Any]:
    """The views of the last of ``polls`` polls through a column tracker, and its layout."""
    views, tracker = store_poll(polls)
    return views, tracker.take_layout()


@pytest.mark.parametrize("swap", [False, True])
def test_the_tracker_lays_out_a_poll_and_the_readers_take_it_only_for_its_views(
        swap: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A poll whose every port is a row of one store: the tracker says where each view's rows
    are (``Tracker.take_layout``) and the readers take that instead of reading every view; views
    that are not those very ones, in that order (one swapped for another poll's view of the
    same port, equal or not), send them back to reading the views. Either way every column is
    what ``get`` reads."""
    read_views: list[bool] = []
    one_store = columns._one_store_bases

    def spy(*args: Any) -> Any:
        read_views.append(True)
        return one_store(*args)

    monkeypatch.setattr(columns, "_one_store_bases", spy)
    views, layout = _laid_out_poll()
    assert layout is not None and all(map(is_, layout.views, views))
    if swap:
        views[4] = _laid_out_poll(polls=2)[0][4]
    fresh = Fresh(layout=layout)
    fresh.extend((v.identity.key, v) for v in views)
    for spec in CATALOGUE:
        assert totals_column(fresh, spec.name) == [v.totals.get(spec.name) for v in views]
        got = rate_column(fresh, spec.name)
        want = [v.rates.get(spec.name, NO_RATE) for v in views]
        assert [repr(x) for x in got] == [repr(x) for x in want], spec.name
    assert read_views == ([True, True] if swap else [])


def test_a_poll_with_a_port_the_rules_take_has_no_layout() -> None:
    """A reset on one port: that port's view is not a row of the poll's store, so the tracker
    lays out nothing (the readers then read the views)."""
    clock = ManualClock()
    source = MockSource.from_scenario("healthy", clock=clock)
    tracker = _ColumnTracker()
    for t in range(3):
        clock.t = float(t * 10)
        snap = asyncio.run(source.sample())
        if t == 2:
            key, sample = next(iter(snap.ports.items()))
            counters = dict.fromkeys(sample.counters, 0)  # every counter reset
            snap.ports[key] = dataclasses.replace(sample, counters=counters)
        views = tracker.update(snap)
        assert (tracker.take_layout() is not None) == (t == 1)
        assert tracker.take_layout() is None  # handed over once
    assert tracker.resets_seen > 0 and type(views[key]) is not RowView


@pytest.mark.parametrize("odd", ["a counter missing", "a port new to the fabric"])
def test_a_poll_with_a_port_off_the_rows_has_no_layout(odd: str) -> None:
    """A port whose sample the per-port rules take (a counter missing from it) or one that
    arrives in this poll: its view is not among the rows the store accounted, so the tracker
    lays out nothing for that poll, and again once every port is a row."""
    clock = ManualClock()
    source = MockSource.from_scenario("healthy", clock=clock)
    tracker = _ColumnTracker()
    laid: list[bool] = []
    for t in range(6):
        clock.t = float(t * 10)
        snap = asyncio.run(source.sample())
        if t == 2:
            key, sample = next(iter(snap.ports.items()))
            if odd == "a counter missing":
                counters = dict(sample.counters)
                del counters["symbol_errors"]
                snap.ports[key] = dataclasses.replace(sample, counters=counters)
            else:
                new = dataclasses.replace(sample.identity, guid="0x00000000000fffff")
                snap.ports[new.key] = dataclasses.replace(sample, identity=new)
        tracker.update(snap)
        laid.append(tracker.take_layout() is not None)
    assert laid[1] and not laid[2] and laid[-1], laid  # the first poll: every port arrives


def test_congestion_picks_from_a_laid_out_poll_what_it_picks_from_the_views(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``congestion`` reads a laid-out poll's ratios from the store's array, and looks up only
    the ports it holds something on: it must pick exactly the ports the view-by-view way
    picks: a ratio at ``clear`` and above, a run under way, a condition, a RoCE port."""
    views, layout = _laid_out_poll()
    assert layout is not None
    det = Congestion(CongestionSettings())
    clear = det._s.clear
    wait = layout.store.wait_ratio
    wait[5], wait[6], wait[7] = clear, math.nextafter(clear, 0.0), 0.9  # at, below, above
    wait[8] = math.nan  # no ratio
    det._runs[views[20].identity.key] = [1, 0, 0]
    views[40].identity = dataclasses.replace(views[40].identity, link_layer="Ethernet")
    active = {views[30].identity.key: None, ("0xffff", "1"): None}  # one not in the poll
    pairs = [(v.identity.key, v) for v in views]
    fresh = Fresh(layout=layout)
    fresh.extend(pairs)
    want = det.needs(pairs, 0.0, active)  # a plain list: the view-by-view way
    assert [p[0] for p in want] == [views[i].identity.key for i in (5, 7, 20, 30, 40)]
    assert det.needs(fresh, 0.0, active) == want
    assert fresh.ratios("wait_ratio") is not None  # the laid-out way was taken


@pytest.mark.parametrize("kind", ["receive_errors", "discards"])
def test_rate_detectors_pick_from_a_laid_out_poll_what_they_pick_from_the_views(
        kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``receive_errors`` and ``discards`` compare a laid-out poll's rates with the threshold
    as one numpy column: they must pick exactly the ports the view-by-view way picks: a rate
    above the threshold (not one at it), no rate (NaN), a total the window would record, a
    condition held."""
    views, layout = _laid_out_poll()
    assert layout is not None
    det = (ReceiveErrors(ReceiveErrorsSettings(threshold=5.0)) if kind == "receive_errors"
           else Discards(DiscardsSettings(threshold=5.0)))
    store = layout.store
    pos = store.rates_index[det.counter]
    rates = store.rates
    for row, value in ((5, 5.0), (6, math.nextafter(5.0, 9.0)), (7, 1e9), (8, math.nan)):
        rates[row * store.rates_width + pos] = value
    for v in views:  # every total recorded: only what changes below is picked
        det._window.observe(v.identity.key, 0.0, v.totals)
    key = views[20].identity.key
    rec = det._window._last[key]
    det._window._last[key] = (rec[0], rec[1] - 1, *rec[2:])  # its total moved since
    active = {views[30].identity.key: None, ("0xffff", "1"): None}  # one not in the poll
    pairs = [(v.identity.key, v) for v in views]
    fresh = Fresh(layout=layout)
    fresh.extend(pairs)
    want = det.needs(pairs, 0.0, active)  # a plain list: the view-by-view way
    assert [p[0] for p in want] == [views[i].identity.key for i in (6, 7, 20, 30)]
    assert fresh.column_array(Rates, det.counter) is not None  # the numpy way is taken
    assert det.needs(fresh, 0.0, active) == want
