"""A port's view whose totals and rates stay rows of the tracker's column store until read.

Why: every view of a fabric poll held a ``Totals`` and a ``Rates``,
two small objects a port that only pointed into that poll's arrays of the column store
(``ibmon.track.columns``). At 36,720 ports they were 73,440 objects a poll that the cyclic GC
tracks and scans until the next poll frees them: about 35 ms of a poll and 6.4 MB a generation
of views. A ``RowView`` keeps where its rows are instead (one ``Rows`` a block and poll, shared
by its ports, and two ints) and makes the mappings when they are read. The readers of whole
columns (the detectors' ``ibmon.detect.columns``, the renderer) take the rows as they are
(``packed``) and make no mapping at all.

A ``RowView`` is a ``PortView`` in every other respect, equal to one with the same values.
``replaced`` (``ibmon.infiniband.model``; not ``dataclasses.replace``, which would call its
constructor) makes a changed copy of any view.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields
from itertools import repeat
from operator import attrgetter, is_
from types import ModuleType
from typing import Any

from ibmon.infiniband.model import LinkInfo, PortIdentity, PortKey, PortView, view_values
from ibmon.track.rates import Rates
from ibmon.track.totals import Totals

__all__ = ["Layout", "RowView", "Rows", "Span", "adopt_numpy", "as_run", "columns_numpy", "packed",
           "ratio_arrays", "ratio_columns", "span_ratio_arrays", "store_numpy"]

_numpy: ModuleType | None = None


def columns_numpy() -> ModuleType | None:
    """numpy once the tracker's column store uses it (``ibmon.track.columns`` hands it over as
    it loads, for the first fabric-sized poll), else None.

    The one way the readers of columns (the detectors' ``ibmon.detect.columns``, the
    renderer, ``exporters.valuetext``) reach numpy: they never import it, so a node-local
    daemon, whose tracker never makes a column store, never loads it (15 MB of its 40 MB
    budget), and a reader given arrays of the store knows numpy is there to read them.
    """
    return _numpy


def adopt_numpy(module: ModuleType) -> None:
    """Called by ``ibmon.track.columns`` when it loads: its columns are numpy's to read."""
    global _numpy  # noqa: PLW0603 - set once, by the module that imports numpy
    _numpy = module


def store_numpy() -> ModuleType:
    """``columns_numpy`` for a caller that holds the store's arrays (so it is set)."""
    np = columns_numpy()
    assert np is not None, "a column store exists only once ibmon.track.columns loaded numpy"
    return np


class Rows:
    """The arrays one block's ports share in one poll: totals by row of ``width`` with their
    name ``index``, rates by row of ``rates_width`` with theirs (``rates_index``: the same
    names, positions in a row that may be narrower, ``ibmon.track.columns``; ``index`` and
    ``width`` when not given). Never changed once views hold it (the tracker copies its
    totals before it next accumulates into them)."""

    __slots__ = ("index", "rates", "rates_index", "rates_width", "totals", "util_rx",
                 "util_tx", "wait_ratio", "width")

    def __init__(self, index: dict[str, int], totals: Sequence[int],
                 rates: Sequence[float], rates_index: dict[str, int] | None = None, *,
                 width: int | None = None, rates_width: int | None = None,
                 util_tx: Sequence[float] = (), util_rx: Sequence[float] = (),
                 wait_ratio: Sequence[float] = ()) -> None:
        self.index = index
        self.totals = totals
        self.rates = rates
        self.rates_index = index if rates_index is None else rates_index
        self.width = len(index) if width is None else width
        self.rates_width = self.width if rates_width is None else rates_width
        #: By rates row: each view's utilization and transmit-wait ratio, NaN for None.
        self.util_tx = util_tx
        self.util_rx = util_rx
        self.wait_ratio = wait_ratio


class Layout:
    """A poll's views when every one is a ``RowView`` of one ``Rows`` (``store``), in order:
    the ``i``-th is row ``rows[i]`` of its totals and row ``i`` of its rates.

    Why: the detectors' column readers (``ibmon.detect.columns``) found
    where each view's rows start by reading every view (its ``rows``, then its ``row`` or
    ``at``): two passes over a poll's views for each of the totals and the rates, 30-35 ms at
    118,400 ports with the views no longer in the CPU's cache. The tracker, which made them,
    says so instead (``Tracker.take_layout``); a reader takes it after checking that it reads
    those very views (a comparison of pointers).
    """

    __slots__ = ("rows", "store", "views")

    def __init__(self, store: Rows, rows: list[int], views: list[PortView]) -> None:
        self.store = store
        self.rows = rows
        self.views = views


class Span:
    """A poll's views, as the pipeline publishes them (``ports``), that are consecutive rows
    of one ``Rows`` in their order: the ``i``-th view's totals are row ``first + i`` of
    ``store.totals`` and its rates and ratios row ``i``.

    Why: the renderer found the runs of rows of each block of its views
    by reading every view (``rows``, ``row``, ``at``): 40-50 ms a publish at 118,400 ports.
    A ``Layout`` says where they are, but holds two lists of a poll's size; a ``Span`` holds
    nothing the pipeline does not hold already (the mapping it publishes), and a reader checks
    that it reads those very views, in that order (``holds``, ``positions``: comparisons of
    pointers).
    """

    __slots__ = ("first", "ports", "store")

    def __init__(self, store: Rows, first: int, ports: Mapping[PortKey, PortView]) -> None:
        self.store = store
        self.first = first
        self.ports = ports

    @classmethod
    def of(cls, layout: Layout, ports: Mapping[PortKey, PortView]) -> Span | None:
        """The span of ``layout``'s views when ``ports`` holds exactly them, in order, and
        their totals are consecutive rows; else None."""
        rows = layout.rows
        if not rows or len(rows) != len(ports) or len(layout.views) != len(ports):
            return None
        first = rows[0]
        if rows != list(range(first, first + len(rows))):
            return None
        if not all(map(is_, ports.values(), layout.views)):
            return None
        return cls(layout.store, first, ports)

    def holds(self, views: Sequence[PortView]) -> bool:
        """Whether ``views`` are this span's views, in its order."""
        ports = self.ports
        return len(views) == len(ports) and all(map(is_, views, ports.values()))

    def positions(self, views: Sequence[PortView], order: Sequence[int] | None) -> Any:
        """Where each of ``views`` is among this span's (its rates row; its totals row is
        ``first`` more): a ``range`` when they are in the span's order (``order`` None), else
        ``order`` as a numpy array (the position in ``ports`` of each view: the exporter lists
        them in port order, ``ibmon.state.PortSorter.ordered``). None unless ``views`` are
        exactly the span's views in that order."""
        if order is None:
            return range(len(views)) if self.holds(views) else None
        ports = list(self.ports.values())
        np = store_numpy()
        at = np.asarray(order, dtype=np.intp)
        if len(views) != len(ports) or len(at) != len(ports) or (len(at) and at.min() < 0):
            return None
        try:
            if not all(map(is_, views, map(ports.__getitem__, order))):
                return None
        except IndexError:
            return None
        return at


class RowView(PortView):
    """A ``PortView`` whose ``totals`` are row ``row`` of ``rows.totals`` and whose ``rates``
    row ``at`` of ``rows.rates``; the mappings are made on each read.

    Row numbers, not offsets: ``row`` is the tracker's own int for the port's row, shared, where
    an offset would be a new int a port a poll (32 bytes a view). The utilization
    and transmit-wait ratio are read from ``rows`` as well, row ``at``: a float object each
    was 96 bytes a view."""

    __slots__ = ("at", "row", "rows")

    def __init__(  # noqa: PLR0917 - per port per poll: positional, as PortView's
        self,
        rows: Rows,
        row: int,
        at: int,
        identity: PortIdentity,
        state: int | None,
        phys_state: int | None,
        rate_bytes_per_second: float | None,
        active_width: str,
        active_speed: str,
        link: LinkInfo | None,
        saturated: frozenset[str],
        resets: dict[str, int],
        hw_totals: dict[str, int],
        hw_rates: dict[str, float],
        symbol_error_ber: float | None,
        conditions: frozenset[str],
        hw_gauges: dict[str, int],
        stale: bool,
        causes: dict[str, str],
        xmit_wait_seconds: float | None,
    ) -> None:
        # PortView's own __init__ would set ``totals`` and ``rates``, which are read-only here.
        self.rows = rows
        self.row = row
        self.at = at
        self.identity = identity
        self.state = state
        self.phys_state = phys_state
        self.rate_bytes_per_second = rate_bytes_per_second
        self.active_width = active_width
        self.active_speed = active_speed
        self.link = link
        self.saturated = saturated
        self.resets = resets
        self.hw_totals = hw_totals
        self.hw_rates = hw_rates
        self.symbol_error_ber = symbol_error_ber
        self.conditions = conditions
        self.hw_gauges = hw_gauges
        self.stale = stale
        self.causes = causes
        self.xmit_wait_seconds = xmit_wait_seconds

    def __reduce__(self) -> tuple[Any, ...]:
        # copy and pickle give a plain view of the same values: the rows belong to the poll
        return PortView, view_values(self)

    @property
    def totals(self) -> Totals:  # type: ignore[override]  # read-only: made from the rows
        rows = self.rows
        return Totals(rows.index, rows.totals, self.row * rows.width)

    @property
    def rates(self) -> Rates:  # type: ignore[override]
        rows = self.rows
        return Rates(rows.rates_index, rows.rates, self.at * rows.rates_width)

    # NaN is the rows' None: a ratio of a known link is never NaN (``ibmon.track.columns``).
    @property
    def utilization_tx(self) -> float | None:  # type: ignore[override]
        x = self.rows.util_tx[self.at]
        return None if x != x else x  # noqa: PLR0124 - NaN

    @property
    def utilization_rx(self) -> float | None:  # type: ignore[override]
        x = self.rows.util_rx[self.at]
        return None if x != x else x  # noqa: PLR0124 - NaN

    @property
    def xmit_wait_ratio(self) -> float | None:  # type: ignore[override]
        x = self.rows.wait_ratio[self.at]
        return None if x != x else x  # noqa: PLR0124 - NaN


_PLAIN_FIELDS = tuple(f.name for f in fields(PortView) if f.name not in (
    "totals", "rates", "utilization_tx", "utilization_rx", "xmit_wait_ratio"))
if RowView.__init__.__code__.co_varnames[4 : 4 + len(_PLAIN_FIELDS)] != _PLAIN_FIELDS:
    # The tracker passes them positionally; a reordered PortView must fail loudly.
    raise ImportError("PortView's fields changed; update ibmon.track.rowview.RowView")


def packed(view: PortView, kind: type[Totals | Rates]) -> tuple[Mapping[str, int], Any, int] | None:
    """(index, array, start) of ``view``'s totals (``Totals``) or rates (``Rates``) where they
    are packed, without making a mapping of a ``RowView``'s rows; None for a plain mapping."""
    if type(view) is RowView:
        rows = view.rows
        if kind is Totals:
            return rows.index, rows.totals, view.row * rows.width
        return rows.rates_index, rows.rates, view.at * rows.rates_width
    m = view.totals if kind is Totals else view.rates
    if type(m) is kind:
        return m.index, m.packed, m.base
    return None


_RATIOS = attrgetter("utilization_tx", "utilization_rx", "xmit_wait_ratio")
_ROWS = attrgetter("rows")
_AT = attrgetter("at")


def ratio_columns(views: Sequence[PortView]) -> tuple[list[float | None], ...]:
    """Every view's transmit and receive utilization and transmit-wait ratio, as three
    columns. Views that are consecutive rows of one ``Rows`` (a poll's ports in the order the
    tracker made them) are read as slices of its arrays, in C, where a property read a view
    costs three times a plain attribute; a stretch with any other view (a port that is down,
    one of another block) is read view by view. The renderer reads every port's every poll."""
    columns: tuple[list[float | None], ...] = ([], [], [])
    for at in range(0, len(views), _STRETCH):
        part = views[at : at + _STRETCH]
        run = _run(part)
        if run is None:
            for column, values in zip(columns, zip(*map(_RATIOS, part), strict=True),
                                      strict=True):
                column.extend(values)
            continue
        rows, start = run
        end = start + len(part)
        for column, ratios in zip(columns, (rows.util_tx, rows.util_rx, rows.wait_ratio),
                                  strict=True):
            column.extend(_none_for_nan(ratios[start:end]))
    return columns


def ratio_arrays(views: Sequence[PortView]) -> tuple[Any, Any, Any] | None:
    """``ratio_columns`` as three float64 numpy arrays, NaN for None: the runs of rows copied
    from the tracker's arrays without a float object a value, for the renderer to spell in C
    (``exporters.valuetext.array_texts``). None where numpy is not loaded (a node-local
    daemon), or where a view's own ratio is NaN, which is not None and has a line of its own."""
    np = columns_numpy()
    if np is None:
        return None
    n = len(views)
    arrays = (np.empty(n), np.empty(n), np.empty(n))
    for at in range(0, n, _STRETCH):
        part = views[at : at + _STRETCH]
        end = at + len(part)
        run = _run(part)
        if run is None:
            for column, values in zip(arrays, zip(*map(_RATIOS, part), strict=True),
                                      strict=True):
                column[at:end] = values  # None is NaN
                if int(np.isnan(column[at:end]).sum()) != values.count(None):
                    return None
            continue
        rows, start = run
        for column, ratios in zip(arrays, (rows.util_tx, rows.util_rx, rows.wait_ratio),
                                  strict=True):
            column[at:end] = np.frombuffer(ratios, dtype=np.float64)[start : start + len(part)]
    return arrays


def span_ratio_arrays(span: Span, at: Any) -> tuple[Any, Any, Any]:
    """``ratio_arrays`` of the views of ``span`` at ``at`` (``Span.positions``, a part of it):
    read from its store's arrays without reading a view (slices of them, no copy, for a
    ``range``)."""
    np = store_numpy()
    rows = span.store
    run = as_run(at)
    pick = at if run is None else slice(run.start, run.stop)
    return tuple(np.frombuffer(ratios, dtype=np.float64)[pick]
                 for ratios in (rows.util_tx, rows.util_rx, rows.wait_ratio))


def as_run(at: Any) -> range | None:
    """``at`` (a part of ``Span.positions``) as a ``range`` when its positions are consecutive,
    else None."""
    if isinstance(at, range):
        return at
    n = len(at)
    if n and int(at[-1]) - int(at[0]) == n - 1 and bool((at[1:] - at[:-1] == 1).all()):
        return range(int(at[0]), int(at[0]) + n)
    return None


_STRETCH = 256
"""Views checked for one run at a time: a port that breaks a run costs its stretch the view by
view read, not the whole block."""


def _run(views: Sequence[PortView]) -> tuple[Rows, int] | None:
    """(rows, first row) when ``views`` are consecutive rows of one ``Rows``, else None."""
    first = views[0]
    if type(first) is not RowView or not all(map(is_, map(type, views), repeat(RowView))):
        return None
    rows = first.rows
    start = first.at
    if (all(map(is_, map(_ROWS, views), repeat(rows)))
            and list(map(_AT, views)) == list(range(start, start + len(views)))):
        return rows, start
    return None


def _none_for_nan(column: Sequence[float]) -> list[float | None]:
    """A column of ratios, NaN (none) as None."""
    values: list[float | None] = list(column)
    total = sum(values)  # type: ignore[arg-type]  # floats in [0, 1]: NaN only from a NaN
    if total != total:  # noqa: PLR0124 - NaN
        values = [None if x != x else x for x in values]  # noqa: PLR0124
    return values
