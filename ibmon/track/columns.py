"""The tracker's counter state in columns: one row per port, one column per counter, and the
poll's arithmetic done for all rows at once (numpy).

Why: on a fabric every port's counters move every poll, and the
tracker visited each moved counter in Python (delta, x4, total, rate: about 4 us a port at
36,720 ports), then copied the port's totals and built a rates array for its view. Here a
``Block`` holds the raw values and totals of every port with the same counter names as rows of
two flat ``array('Q')``s, and ``advance`` takes one poll's rows through the same rules in a few
vector operations. Views read their row in place (``Totals`` and ``Rates`` take an offset),
so nothing is copied or allocated per port but the two small mappings.

Only the plain case is done here: a port whose sample names the same counters in the same
order as its row, with no counter pinned or stale, and a usable interval. A row where any
counter decreased (a reset), reached its narrow maximum, or would make a total outgrow 64 bits
is refused untouched, and the tracker takes that port through its per-port path instead. The
arithmetic is the tracker's own rule functions (``ibmon.track.tracker.increase`` and the others),
applied to columns: one definition of what a reading means.

Views must never change once published: the totals array is copied at the start of every poll
(``begin``: one ``memcpy``), so the views of the previous poll keep the generation they read.
numpy is imported only here, and the tracker imports this module only for fabric-sized polls
(``ibmon.runtime.sizes``): a node-local daemon never loads it (its memory budget is 40 MB).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from itertools import repeat
from operator import is_
from typing import Final, cast

import numpy as np
import numpy.typing as npt

from ibmon.infiniband.xmitwait import stall_share
from ibmon.track.rowview import adopt_numpy
from ibmon.track.tracker import at_maximum, increase, is_reset, per_second, utilization

__all__ = ["Block", "Step", "advance"]

adopt_numpy(np)  # the readers of these columns reach numpy through ibmon.track.rowview alone

_ZERO: Final = (0.0,)
_TEMPORARY: Final = 96 << 10
"""Bytes of each vector temporary of a chunk of rows (``_chunk``): under the 128 KiB mmap
threshold the daemon sets (``ibmon.runtime.tuning``), so glibc serves them from its free lists,
reused chunk after chunk (1 MB temporaries, mapped afresh each time, cost 5 % of the tracker's time
in page faults at 36,720 ports)."""
_CHUNK: Final = 0
"""Rows taken through the vector operations at a time; 0: as many as fit ``_TEMPORARY``."""
_U64_MAX: Final = (1 << 64) - 1
_DELTA_LIMIT: Final = 1 << 62
"""A delta from here up could overflow 64 bits once multiplied by 4 (only made-up values can
move that much between two polls): such a row goes to the per-port rules, which widen."""


class Block:
    """Raw values (``last``) and totals of the ports with the counters of ``index`` (name:
    column): row ``r`` is ``[r * width, (r + 1) * width)`` of each array.

    ``totals`` is replaced, never changed, once a view reads a row of it: ``begin`` starts
    each poll on a copy. ``mult`` are the columns' multipliers. A block has at least one
    counter (ports without any never get a row).
    """

    __slots__ = ("free", "index", "last", "moved", "mult", "nmax", "rx", "spreads", "totals",
                 "tx", "wait", "width")

    def __init__(self, index: dict[str, int], mult: list[int], nmax: list[int]) -> None:
        self.index = index
        self.width = len(index)
        #: The rates' indexes by the columns that moved (``_Spread``), made once each.
        self.spreads: dict[tuple[int, ...], dict[str, int]] = {}
        #: The columns whose rates were not all 0.0 in the last poll (``_Spread``).
        self.moved: tuple[int, ...] = ()
        self.last: array[int] = array("Q")
        self.totals: array[int] = array("Q")
        self.free: list[int] = []
        self.mult = np.array(mult, dtype=np.uint64)
        #: Each column's narrow maximum (where it saturates); 0 for 64-bit-only counters.
        self.nmax = np.array([max(m, 0) for m in nmax], dtype=np.uint64)
        #: Columns of the counters that make the view's ratios, -1 where not counted.
        self.tx = index.get("transmit_data", -1)
        self.rx = index.get("receive_data", -1)
        self.wait = index.get("transmit_wait", -1)

    def begin(self) -> None:
        """A new generation of totals for this poll; the last one stays with its views."""
        self.totals = self.totals[:]

    def reserve(self, rows: int) -> None:
        """Room for ``rows`` more ports: exactly that, as a fabric's ports arrive in one poll
        (every spare row is copied each poll and kept twice)."""
        if len(self.free) < rows:
            self._grow(rows - len(self.free))

    def take(self, last: array[int], totals: array[int]) -> int:
        """A row for a port, filled with its raw values and totals."""
        if not self.free:
            self._grow(1 + len(self.last) // (8 * self.width))  # an eighth more
        row = self.free.pop()
        at = row * self.width
        self.last[at : at + self.width] = last
        self.totals[at : at + self.width] = totals
        return row

    def arrive(self, values: list[array[int]], bases: list[int]) -> list[int]:
        """Rows for ports on their first sample, read as ``values`` from ``bases`` (as
        ``advance`` reads them), in order: the raw values as read, the totals what the
        tracker's rules count for a first reading (raw value times multiplier). -1 for a port
        the rules must see: a value at its narrow maximum (pinned, or read at 64 bits: the
        rules tell) or a total past 64 bits."""
        self.reserve(len(values))
        width = self.width
        last = np.frombuffer(self.last, dtype=np.uint64).reshape(-1, width)
        totals = np.frombuffer(self.totals, dtype=np.uint64).reshape(-1, width)
        narrow = self.nmax != 0
        limit = np.uint64(_U64_MAX) // self.mult  # a larger raw value's total passes 64 bits
        rows: list[int] = []
        free = self.free
        chunk = _CHUNK or max(64, _TEMPORARY // (8 * width))
        for at in range(0, len(values), chunk):
            raw = _raw(values[at : at + chunk], bases[at : at + chunk], width)
            refused = ((at_maximum(raw, self.nmax) & narrow) | (raw > limit)).any(axis=1)
            ok = ~refused
            taken = [-1 if bad else free.pop() for bad in refused.tolist()]
            rows += taken
            into = np.array(taken, dtype=np.intp)[ok]
            last[into] = raw[ok]
            totals[into] = increase(raw[ok], 0, self.mult)
        return rows

    def release(self, row: int) -> tuple[array[int], array[int]]:
        """Give a row back; the port's raw values and totals, as its own arrays."""
        own = self.row(row)
        self.free.append(row)
        return own

    def row(self, row: int) -> tuple[array[int], array[int]]:
        """A copy of one row's raw values and totals (for ``dump``)."""
        at = row * self.width
        return self.last[at : at + self.width], self.totals[at : at + self.width]

    def _grow(self, more: int) -> None:
        # New arrays rather than resized ones: views (and numpy) may hold the current ones.
        rows = len(self.last) // self.width
        pad = bytes(8 * self.width * more)
        last = self.last[:]
        last.frombytes(pad)
        totals = self.totals[:]
        totals.frombytes(pad)
        self.last, self.totals = last, totals
        self.free.extend(range(rows + more - 1, rows - 1, -1))


class Step:
    """What ``advance`` answers for one poll's rows: whether each was accounted (``ok``), the
    rates of the accounted ones packed one row of ``rates_width`` after the other, where
    ``rates_index`` finds each counter (no ``NaN``: every counter of such a row has a rate;
    ``_Spread``), and for each accounted row its transmit and receive utilization and
    transmit-wait ratio (``NaN`` where the view has none: a ratio of a known link is never
    ``NaN``)."""

    __slots__ = ("ok", "rates", "rates_index", "rates_width", "util_rx", "util_tx",
                 "wait_ratio")

    def __init__(self, ok: list[bool], rates: array[float]) -> None:
        self.ok = ok
        self.rates = rates
        self.rates_index: dict[str, int] = {}
        self.rates_width = 0
        self.util_tx: array[float] = array("d")
        self.util_rx: array[float] = array("d")
        self.wait_ratio: array[float] = array("d")


def advance(
    block: Block,
    rows: list[int],
    values: list[array[int]],
    inv_dt: list[float],
    *,
    bases: list[int],
    link_bytes: Sequence[float | None],
    wait_bytes: Sequence[float | None],
) -> Step:
    """Account one poll for ``rows`` of ``block``, read as ``values`` from ``bases`` (an array
    per row in the block's column order: the row's own, base 0, or one the source's rows
    share), ``inv_dt`` apart from their last reading, on links of ``link_bytes`` per second
    whose PortXmitWait counts stand for ``wait_bytes`` each (None where unknown). A row that
    is not accounted is untouched.

    The arithmetic is the tracker's for a port without pinned or stale counters: a counter
    that moved adds ``delta * multiplier`` to its total and has the rate ``delta * multiplier
    * inv_dt``, one that did not has the rate 0.0; utilization is ``min(1, data rate / link
    rate)`` on a link of known, non-zero rate (else None), and the transmit-wait ratio
    ``ibmon.infiniband.xmitwait.stall_fraction`` of the wait rate over one second: the same
    operations on the same doubles, so the same results to the bit.
    """
    width = block.width
    n = len(rows)
    step = Step([], array("d"))
    spread = _Spread(block, n)
    chunk = _CHUNK or max(64, _TEMPORARY // (8 * width))
    for at in range(0, n, chunk):
        end = min(n, at + chunk)
        ok, rates = _chunk(block, rows[at:end], _raw(values[at:end], bases[at:end], width),
                           inv_dt[at:end])
        step.ok += ok
        _ratios(block, rates, link_bytes[at:end], wait_bytes[at:end], ok, step=step)
        spread.put(rates)
    step.rates, step.rates_index, step.rates_width = spread.packed()
    return step


class _Spread:
    """A poll's rates, packed with only the columns where some row's rate is not 0.0 and one
    column of 0.0 that every other counter's name points at, filled a chunk at a time.

    Why: most counters of a fabric are error counters that did not
    move on any port (22 of 32 in the demo), so most of a poll's rates are 0.0: 9.4 MB a
    poll at 36,720 ports, kept twice while a poll's views replace the last, of which 3.2 MB
    are other values. A rate is never -0.0 (deltas are not negative); the test is on the
    bits, so only +0.0 is left out, and a value reads back exactly as it was computed.

    Why a chunk at a time: the rates of every row at full width first, packed
    afterwards, were a second array as large as the totals (30 MB a poll at 118,400 ports),
    zeroed and faulted in page by page each poll, then copied from: 10-100 ms of a poll on
    this project's machines. The columns are laid out as the block's last poll moved them
    (which columns move rarely changes between polls); a chunk that moves another one lays
    the rows out again with it, copying the rows so far, and so does the end of a poll
    where a column no longer moved (both rare: a fault's counter starting or stopping).
    """

    __slots__ = ("block", "done", "index", "laid", "moved", "out", "rows", "seen", "take",
                 "view")

    def __init__(self, block: Block, rows: int) -> None:
        self.block = block
        self.rows = rows  # at most: a refused row has no rates
        self.done = 0
        #: By column: whether it moved in this poll, and whether it is laid out.
        self.seen = np.zeros(block.width, dtype=np.bool_)
        self.laid = np.zeros(block.width, dtype=np.bool_)
        self.moved: tuple[int, ...] = ()  # the columns laid out, in order; all: no 0.0 column
        self.take = np.zeros(0, dtype=np.intp)  # ``moved``, to index with
        self.index = block.index
        self.out = array("d")
        #: ``out`` as rows; None until the first chunk lays them out.
        self.view: npt.NDArray[np.float64] | None = None

    def put(self, rates: npt.NDArray[np.float64]) -> None:
        """The next accounted rows' rates (a row a port, the block's columns)."""
        moved = (rates.view(np.uint64) != 0).any(axis=0)
        self.seen |= moved
        view = self.view
        if view is None:
            view = self._lay_out(_columns(self.seen).union(self.block.moved))
        elif (moved > self.laid).any():  # a column moved that is not laid out
            view = self._lay_out(_columns(self.seen).union(self.moved))
        into = view[self.done : self.done + len(rates)]
        if len(self.moved) == self.block.width:
            into[:] = rates
        elif self.moved:  # in place: no temporary of the chunk's moved columns
            np.take(rates, self.take, axis=1, out=into[:, : len(self.moved)], mode="clip")
        self.done += len(rates)

    def packed(self) -> tuple[array[float], dict[str, int], int]:
        """The rates array, its index (the block's names in the block's order) and its row
        width; the block remembers which columns moved, for its next poll."""
        seen = _columns(self.seen)
        self.block.moved = tuple(sorted(seen))
        view = self._lay_out(seen)  # without a column that moved only in the last poll
        width = int(view.shape[1])
        self.view = None  # with ``view``, the hold on ``out``: it cannot be resized while held
        del view
        if self.done < self.rows:  # refused rows: no room for them
            del self.out[self.done * width :]
        return self.out, self.index, width

    def _lay_out(self, columns: set[int]) -> npt.NDArray[np.float64]:
        """``view``, with room for every row with ``columns`` (and one of 0.0), the rows so
        far moved in; the same view if it has those columns already."""
        block = self.block
        width = block.width
        moved = tuple(sorted(columns))
        if len(moved) + 1 >= width:  # nothing to gain
            moved = tuple(range(width))
        if self.view is not None and moved == self.moved:
            return self.view
        if len(moved) == width:
            index = block.index
            row = width
        else:
            found = block.spreads.get(moved)
            if found is None:
                if len(block.spreads) > 64:  # which columns move changes with the fabric
                    block.spreads.clear()
                zero = len(moved)  # the column of 0.0 after the moved ones
                found = block.spreads[moved] = {
                    name: moved.index(column) if column in moved else zero
                    for name, column in block.index.items()}
            index = found
            row = len(moved) + 1
        out = array("d", _ZERO) * (row * self.rows)
        view = np.frombuffer(out, dtype=np.float64).reshape(-1, row)
        if self.view is not None and self.done:  # the rows so far, each column where it goes
            kept = [(i, moved.index(c)) for i, c in enumerate(self.moved) if c in moved]
            view[: self.done, [j for _, j in kept]] = self.view[: self.done, [i for i, _ in kept]]
        self.moved, self.index, self.out, self.view = moved, index, out, view
        self.take = np.array(moved, dtype=np.intp)
        self.laid[:] = False
        self.laid[self.take] = True
        return view


def _columns(mask: npt.NDArray[np.bool_]) -> set[int]:
    return set(np.flatnonzero(mask).tolist())


def _raw(values: list[array[int]], bases: list[int], width: int) -> npt.NDArray[np.uint64]:
    """A chunk's raw values as a matrix, a row a port. A source that keeps a poll's values in
    one array (the simulator: a row a port, in order) is read in place or gathered; rows of
    their own are joined.

    Why: an array of its own a port is 0.3 KB of small allocations a
    port while a poll is held, which the allocator keeps afterwards; one array a poll is a
    single block, returned to the system when the poll is done.
    """
    n = len(values)
    first = values[0]
    if len(first) != width and all(map(is_, values, repeat(first))):  # one shared array
        flat = np.frombuffer(first, dtype=np.uint64)
        start = bases[0]
        at = np.array(bases, dtype=np.intp)
        if bases[-1] - start == (n - 1) * width and bool((np.diff(at) == width).all()):
            return flat[start : start + n * width].reshape(n, width)
        gathered: npt.NDArray[np.uint64] = flat[at[:, None] + np.arange(width)]
        return gathered
    if set(map(len, values)) == {width}:  # every row its own
        return np.frombuffer(b"".join(values), dtype=np.uint64).reshape(n, width)
    rows = [v if len(v) == width else memoryview(v)[b : b + width]
            for v, b in zip(values, bases, strict=True)]
    return np.frombuffer(b"".join(rows), dtype=np.uint64).reshape(n, width)


def _chunk(
    block: Block,
    rows: list[int],
    new: npt.NDArray[np.uint64],
    inv_dt: list[float],
) -> tuple[list[bool], npt.NDArray[np.float64]]:
    """``advance`` for a chunk of rows (temporaries under the mmap threshold, in cache), read
    as ``new``: whether each row was accounted, and the accounted rows' rates."""
    width = block.width
    n = len(rows)
    last = np.frombuffer(block.last, dtype=np.uint64).reshape(-1, width)
    totals = np.frombuffer(block.totals, dtype=np.uint64).reshape(-1, width)
    rows_at = np.array(rows, dtype=np.intp)
    at: slice | npt.NDArray[np.intp] = rows_at
    if rows[-1] - rows[0] == n - 1 and bool((np.diff(rows_at) == 1).all()):
        at = slice(rows[0], rows[0] + n)  # the usual poll: rows in order, read in place
    old = last[at]
    # The rows the per-port rules must see, refused. A reset (the checks below would catch
    # it too: a wrapped delta is past the limit, or, as a total is never less than its last
    # raw value times the multiplier, wraps the total; this one says so without the argument).
    bad = is_reset(new, old)
    delta = new - old  # 0 where unchanged; wraps where new < old: refused already
    bad |= delta >= _DELTA_LIMIT
    # A narrow counter that moved onto its maximum: pinned, or read at 64 bits (the rules
    # tell). A 64-bit-only column's "maximum" is 0: moving onto it is a reset anyway.
    bad |= at_maximum(new, block.nmax) & (delta != 0)
    scaled = increase(new, old, block.mult)
    if isinstance(at, slice):
        grown = totals[at]
        grown += scaled  # in place: this poll's generation (``begin``), no view holds it yet
    else:
        grown = totals[at] + scaled
    bad |= grown < scaled  # a total past 64 bits
    refused = cast("npt.NDArray[np.bool_]", bad.any(axis=1))
    ok = ~refused
    inv = np.array(inv_dt, dtype=np.float64)
    if refused.any():
        grown[refused] -= scaled[refused]  # as they were: modulo 2**64, exactly
        totals[at] = grown
        last[rows_at[ok]] = new[ok]
        scaled = scaled[ok]
        inv = inv[ok]
    else:
        last[at] = new
        totals[at] = grown  # a no-op in place
    rates: npt.NDArray[np.float64] = per_second(scaled, inv[:, None])
    return cast("list[bool]", ok.tolist()), rates


def _ratios(
    block: Block,
    rates: npt.NDArray[np.float64],
    link_bytes: Sequence[float | None],
    wait_bytes: Sequence[float | None],
    ok: list[bool],
    *,
    step: Step,
) -> None:
    """The utilization and transmit-wait ratio of the accounted rows (``rates``), onto
    ``step``'s arrays (``NaN``: none).

    Arrays, not lists of floats: a float object a ratio was three a view,
    3.5 MB a generation of views at 36,720 ports; ``ibmon.track.rowview.RowView`` reads them
    here."""
    link = np.array(link_bytes, dtype=np.float64)  # None becomes NaN: not > 0, no ratio
    if len(rates) != len(link):
        link = link[np.array(ok, dtype=np.bool_)]
    unknown = ~(link > 0.0)
    for column, out in ((block.tx, step.util_tx), (block.rx, step.util_rx)):
        if column < 0:
            out.frombytes(_nan(len(link)))
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = utilization(rates[:, column], link, np.minimum)
        ratio[unknown] = np.nan
        out.frombytes(ratio.tobytes())
    if block.wait < 0:
        step.wait_ratio.frombytes(_nan(len(link)))
        return
    unit = np.array(wait_bytes, dtype=np.float64)  # None (a per-lane unit, width unknown): NaN
    if len(rates) != len(unit):
        unit = unit[np.array(ok, dtype=np.bool_)]
    with np.errstate(divide="ignore", invalid="ignore"):
        wait = stall_share(rates[:, block.wait], unit, link, np.minimum, np.maximum)
    wait[unknown | np.isnan(unit)] = np.nan
    step.wait_ratio.frombytes(wait.tobytes())


def _nan(n: int) -> bytes:
    return np.full(n, np.nan).tobytes()
