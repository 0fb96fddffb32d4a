"""Views whose totals and rates stay rows of the tracker's store (``ibmon.track.rowview``): they
read and compare exactly like the plain views the per-port rules make, and a poll makes no mapping
object per port (what the cyclic GC tracks and a generation of views holds)."""

from __future__ import annotations

import asyncio
import copy
import gc
import math
import pickle
import subprocess
import sys
from array import array
from pathlib import Path

import pytest

from ibmon.infiniband.model import PortIdentity, PortView, replaced
from ibmon.sources.mock import MockSource
from ibmon.track.rates import NO_RATE, Rates
from ibmon.track.rowview import Rows, RowView
from ibmon.track.totals import Totals
from mocks.scenario import ManualClock
from tests.detect_views import store_views
from tests.tracker_paths import ColumnTracker

INDEX = {"transmit_data": 0, "symbol_errors": 1}


#: A RowView's ratios and where its rows keep them.
RATIOS = {"utilization_tx": "util_tx", "utilization_rx": "util_rx",
          "xmit_wait_ratio": "wait_ratio"}


def _row_view(**fields: object) -> RowView:
    # Two ports' rows; this view is the second one of each array.
    values = {"identity": PortIdentity("0x0000000000000001", "1"), "state": 4,
              "phys_state": 5, "rate_bytes_per_second": 5e10, "active_width": "4X",
              "active_speed": "25.78125 Gbps", "link": None, "saturated": frozenset(),
              "resets": {}, "hw_totals": {}, "hw_rates": {}, "utilization_tx": 0.5,
              "utilization_rx": None, "xmit_wait_ratio": 0.0, "symbol_error_ber": None,
              "conditions": frozenset(), "hw_gauges": {}, "stale": False, "causes": {},
              "xmit_wait_seconds": 1.5}
    values.update(fields)
    ratios = {}
    for name, column in RATIOS.items():
        ratio = values.pop(name)
        ratios[column] = array("d", [0.75, math.nan if ratio is None else ratio])  # type: ignore[list-item]
    rows = Rows(INDEX, array("Q", [1, 2, 40, 0]), array("d", [9.0, 9.0, 4.0, NO_RATE]),
                **ratios)
    return RowView(rows, 1, 1, *values.values())  # type: ignore[arg-type]


def _plain(view: RowView) -> PortView:
    return replaced(view, totals={"transmit_data": 40, "symbol_errors": 0},
                    rates={"transmit_data": 4.0})


def test_a_row_view_reads_its_rows_as_mappings() -> None:
    view = _row_view()
    assert dict(view.totals) == {"transmit_data": 40, "symbol_errors": 0}
    assert dict(view.rates) == {"transmit_data": 4.0}  # NaN: no rate
    assert "symbol_errors" not in view.rates and view.rates.get("symbol_errors") is None
    assert type(view.totals) is Totals and type(view.rates) is Rates


def test_a_row_view_reads_its_ratios_from_its_rows() -> None:
    """Utilization and transmit-wait ratio are rows' values, NaN read as None (no ratio)."""
    view = _row_view(utilization_tx=1.0, utilization_rx=None, xmit_wait_ratio=0.0)
    assert (view.utilization_tx, view.utilization_rx, view.xmit_wait_ratio) == (1.0, None, 0.0)
    assert view.rows.util_tx[view.at] == 1.0 and math.isnan(view.rows.util_rx[view.at])
    assert replaced(view, stale=True).utilization_tx == 1.0
    assert copy.copy(view).utilization_rx is None


def test_a_row_view_equals_the_plain_view_of_the_same_values() -> None:
    view = _row_view()
    plain = _plain(view)
    assert type(plain) is PortView
    assert view == plain and plain == view and view == _row_view()
    assert view != replaced(plain, totals={"transmit_data": 41, "symbol_errors": 0})
    assert view != replaced(plain, rates={})
    assert view != _row_view(state=1) and view != _row_view(utilization_tx=0.25)
    assert view != "a view"
    with pytest.raises(TypeError):
        hash(view)
    with pytest.raises(TypeError):
        hash(plain)


def test_equality_keeps_identical_non_finite_values_equal() -> None:
    """As the dataclass's did (a tuple compares identical items equal): a view with a NaN
    field equals itself."""
    nan = math.nan
    view = _row_view(symbol_error_ber=nan)
    assert view == view
    assert view == _plain(view)


def test_replaced_changes_only_what_it_is_given() -> None:
    view = _row_view()
    stale = replaced(view, stale=True, rates={})
    assert type(stale) is PortView and stale.stale and dict(stale.rates) == {}
    assert stale.totals == view.totals and stale.identity is view.identity
    assert replaced(stale) == stale


def test_copies_and_pickles_are_plain_views_of_the_same_values() -> None:
    view = _row_view()
    for twin in (copy.copy(view), copy.deepcopy(view), pickle.loads(pickle.dumps(view))):
        assert type(twin) is PortView and twin == view


_Columns = ColumnTracker


def test_a_poll_makes_no_mapping_object_per_port() -> None:
    """A large poll's views are RowViews: the number of live Totals and Rates objects does not
    grow with the ports (it did by two a port)."""
    clock = ManualClock()
    source = MockSource.from_scenario("healthy", clock=clock)
    tracker = _Columns()
    kept = []
    for t in range(3):
        clock.t = float(t * 10)
        kept.append(tracker.update(asyncio.run(source.sample())))

    def mappings() -> int:
        return sum(1 for o in gc.get_objects() if type(o) in (Totals, Rates))

    views = kept[-1]
    assert len(views) > 100
    assert all(type(v) is RowView for v in views.values())
    before = mappings()
    clock.t = 30.0
    kept.append(tracker.update(asyncio.run(source.sample())))
    assert mappings() - before < len(views) // 10


@pytest.mark.parametrize("stretch", [256, 4])
def test_ratio_columns_read_every_view_as_its_own_attributes(
        stretch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The renderer reads the ratios of a block of views as columns: slices of the rows
    where the views are consecutive rows of one poll, view by view otherwise (ports in
    another order, plain views among them); always what each view reads. With short
    stretches a block mixes both ways."""
    from ibmon.track import rowview
    from ibmon.track.rowview import ratio_columns

    monkeypatch.setattr(rowview, "_STRETCH", stretch)
    views = store_views()
    plain = replaced(views[3], utilization_rx=None)
    odd = _row_view(utilization_tx=None)
    for case in (views, views[::-1], [*views[:3], plain, *views[4:]], [odd, *views], [], [odd]):
        want = tuple([getattr(v, name) for v in case] for name in RATIOS)
        assert ratio_columns(case) == want
    assert all(type(v) is RowView for v in views)
    assert any(x is None for x in ratio_columns([odd, *views])[0])


@pytest.mark.parametrize("stretch", [256, 4])
def test_ratio_arrays_are_the_ratio_columns_with_nan_for_none(
        stretch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The renderer spells the ratios from float64 arrays (``ratio_arrays``): the same values
    as ``ratio_columns``, NaN where a view has None, whether copied from the rows of a run or
    read view by view; a view whose own ratio is NaN (a line of its own, unlike None) leaves
    the block to the columns."""
    import numpy as np

    from ibmon.track import rowview
    from ibmon.track.rowview import ratio_arrays, ratio_columns

    monkeypatch.setattr(rowview, "_STRETCH", stretch)
    views = store_views()
    plain = replaced(views[3], utilization_rx=None)
    odd = _row_view(utilization_tx=None)
    for case in (views, views[::-1], [*views[:3], plain, *views[4:]], [odd, *views], [], [odd]):
        arrays = ratio_arrays(case)
        assert arrays is not None
        for got, want in zip(arrays, ratio_columns(case), strict=True):
            assert got.dtype == np.float64
            assert [None if math.isnan(x) else x for x in got.tolist()] == want
    assert math.isnan(ratio_arrays([odd, *views])[0][0])  # type: ignore[index]
    assert ratio_arrays([*views[:5], replaced(views[5], xmit_wait_ratio=math.nan)]) is None
    monkeypatch.setattr(rowview, "_numpy", None)  # a process without a column store
    assert ratio_arrays(views) is None


def test_column_readers_take_numpy_from_the_tracker_s_store_alone() -> None:
    """The detectors' and the renderer's column readers reach numpy through one accessor of
    ibmon's: None until the tracker's column store loads (numpy imported by anything else, a
    library or a plugin, does not switch them to arrays), the store's numpy from then on."""
    program = (
        "import numpy\n"
        "import exporters.render, ibmon.detect.engine\n"
        "from ibmon.track.rowview import columns_numpy\n"
        "assert columns_numpy() is None\n"
        "import ibmon.track.columns\n"
        "assert columns_numpy() is numpy\n"
    )
    subprocess.run([sys.executable, "-c", program], check=True, timeout=60,
                   cwd=Path(__file__).resolve().parents[2])
