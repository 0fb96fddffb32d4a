"""Counter semantics: raw PMA values in, software-accumulated totals and honest rates out.

Why this module exists (docs/infiniband.md §1): narrow PortCounters fields saturate instead of
wrapping, 64-bit fields never realistically wrap, and other people (``perfquery -R``, opensm
PerfMgr, reboots) reset counters behind our back. So every decrease is a reset whose new value is
the increase since the reset, a counter pinned at its narrow maximum is losing increments and gets
no rate, data words are multiplied by 4, and the exported totals only ever go up - also across
daemon restarts, through ``dump``/``load``.

The first value seen for a counter is a baseline: its total starts at the hardware value (x4 for
data) so totals match perfquery and node_exporter until the first reset, and there is no rate yet.

This is the hot path (thousands of ports every second): per-port state lives in one slotted
object, and ``update`` allocates per port only what the published ``PortView`` needs. Raw
values and totals are packed in the order of the port's counter names (``keys``, interned with
their index by the tracker), rates too (memory per port at fabric scale). Views are
immutable once published, so they share the tracker's totals copy-on-write: a view wraps the
port's array as it is (``ibmon.track.totals.Totals``), and the tracker copies the array only when
that port's totals next change (an idle port's views share one array across polls). Resets,
saturated and stale names are replaced, never mutated, so views share them too, and a port with
none holds the shared empty ones. An idle port's view shares one all-zero ``Rates``.

Two ways, one threshold (``ibmon.runtime.sizes``): a node-sized poll (a node's few HCAs) goes port
by port and never imports numpy (15 MB of a node daemon's 40 MB); a fabric-sized poll keeps the
raw values and totals of the ports in the plain case (same counters as before, none pinned or
stale) as rows of a column store and accounts them a block at a time with numpy
(``ibmon.track.columns``: 3.8 us a port at 20,000 ports, against 13.5 us port by port); their
views (``ibmon.track.rowview.RowView``) keep where their rows of that poll's totals and rates are,
and make the mappings only when read. Every other port of such a poll, and every row the
store refuses (a reset, a counter reaching its narrow maximum, a total past 64 bits), goes
through the per-port path. Both apply the same rule functions (``increase``, ``is_reset``,
``at_maximum``, ``per_second``, ``utilization``, ``stall_share``: one counter at a time, or a
column at once), so they agree to the bit (``tests/unit/test_tracker_columns.py``; the suite
runs the column path on its small fabrics). A poll of the same ports as the last one, all of
them plain rows, finds its one batch without the port-by-port dispatch (``Tracker._repeat``).
"""

from __future__ import annotations

import functools
import itertools
import math
from array import array
from collections.abc import Collection, Container, Iterable, Mapping, MutableSequence, Sequence
from dataclasses import fields
from operator import add, attrgetter, is_, le, ne
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final

from ibmon.infiniband.counters import CATALOGUE
from ibmon.infiniband.model import GUID_RE, PortKey, PortSample, PortState, PortView, Snapshot
from ibmon.infiniband.xmitwait import WaitUnit, stall_share
from ibmon.runtime.sizes import fabric_sized
from ibmon.track.rates import NO_RATE, Rates
from ibmon.track.rowview import Layout, Rows, RowView
from ibmon.track.totals import Totals

if TYPE_CHECKING:
    from ibmon.track.columns import Block, Step

__all__ = ["STATE_VERSION", "Tracker"]

STATE_VERSION: Final = 1
"""Version of the ``dump`` format; ``load`` refuses any other."""

_EPOCH_TOLERANCE_S: Final = 5.0
"""How far ``wall - monotonic`` may move between a dump and the next sample for the persisted
monotonic time to count as the same clock (same boot). Beyond it, the first sample after a restart
updates totals but gives no rates, because ``time.monotonic`` restarts with the machine."""

_MULT: Final[dict[str, int]] = {c.name: c.multiplier for c in CATALOGUE}
#: The largest raw value (and reset count) a state file may hold: no counter is wider.
_MAX_RAW: Final = 2**64 - 1
#: The largest total a state file may hold. Totals may outgrow 64 bits (a data counter counts
#: 4-byte words), but 2**80 bytes is 16,384 wraps of a 64-bit data counter, 700,000 years at
#: 400 Gb/s: a bigger total (10**30 in a damaged or edited file) is no port's count.
_MAX_TOTAL: Final = 2**80 - 1

# Narrow maximum per counter; -1 for fields that exist only at 64 bits, which no raw value ever
# equals, so the saturation test needs no extra branch.
_NMAX: Final[dict[str, int]] = {c.name: c.max_value if c.bits < 64 else -1 for c in CATALOGUE}

_NO_NAMES: Final[frozenset[str]] = frozenset()
#: The shared empty map of every port without resets or driver counters. Never mutated: code
#: that adds to a port's map replaces it with a new dict first (``_Port`` says which).
_NO_COUNTS: Final[dict[str, int]] = {}
#: The driver-counter rates of a port without driver counters (every port of a fabric
#: source): one shared empty dict, not one per view (2.4 MB at 36,720 ports).
_NO_HW_RATES: Final[dict[str, float]] = {}
_NO_CAUSES: Final[dict[str, str]] = {}
#: The rates of a port whose interval was unusable (first sample, no time passed, not Active).
_NO_RATES: Final = Rates({}, array("d"))
_ACTIVE: Final = int(PortState.ACTIVE)
_RATE_BPS: Final = attrgetter("rate_bps")
_UNIT: Final = attrgetter("identity.xmit_wait")
_WIDTH: Final = attrgetter("active_width")
_COUNTERS: Final = attrgetter("counters")
_INDEX: Final = attrgetter("index")
_PACKED: Final = attrgetter("packed")
_BASE: Final = attrgetter("base")
_TYPECODE: Final = attrgetter("typecode")
_NO_INDEX: Final[dict[str, int]] = {}
#: What a port's own ``last`` and ``totals`` are while its ``Block`` row holds them.
_IN_BLOCK: Final[tuple[int, ...]] = ()
_IN_BLOCK_TOTALS: Final[MutableSequence[int]] = array("Q")

_VIEW_FIELDS: Final = (
    "identity", "state", "phys_state", "rate_bytes_per_second", "active_width", "active_speed",
    "link", "totals", "rates", "saturated", "resets", "hw_totals", "hw_rates", "utilization_tx",
    "utilization_rx", "xmit_wait_ratio", "symbol_error_ber", "conditions", "hw_gauges", "stale",
    "causes", "xmit_wait_seconds",
)
if tuple(f.name for f in fields(PortView))[: len(_VIEW_FIELDS)] != _VIEW_FIELDS:
    # _view passes these positionally; a reordered PortView must fail loudly, not mislabel.
    raise ImportError("PortView field order changed; update ibmon.track.tracker._view")

# ---------------------------------------------------------------------- the rules
# What a reading means, in one place. The per-port path applies these to one counter at a time,
# the column store (``ibmon.track.columns``) to columns of rows at once (numbers or numpy arrays
# alike, with numpy's minimum and maximum): the same expressions on the same doubles, so the two
# agree to the bit. What the store cannot account plainly it hands to the per-port path.


def increase(new: Any, since: Any, mult: Any) -> Any:
    """What a reading adds to a counter's total: its increase ``since`` the last reading (0 for
    a first reading, whose total starts at the hardware's value as in perfquery, and after a
    reset), times the multiplier (4 for data counters, which count 4-byte words)."""
    return (new - since) * mult


def is_reset(new: Any, last: Any) -> Any:
    """Any decrease is a reset by someone else: counters never count down (narrow ones
    saturate, they do not wrap)."""
    return new < last


def at_maximum(new: Any, narrow_max: Any) -> Any:
    """A narrow counter at its maximum is pinned: increments are lost, so no rate is honest."""
    return new == narrow_max


def per_second(added: Any, inv_dt: Any) -> Any:
    """A rate: what was added over the interval (``inv_dt`` = 1 / seconds)."""
    return added * inv_dt


def utilization(data_rate: Any, link_bytes: Any, minimum: Any = min) -> Any:
    """The share of the link's bytes per second a data rate used, at most 1."""
    return minimum(1.0, data_rate / link_bytes)


class _Port:
    """Everything the tracker remembers about one port between polls (and across restarts).

    ``last`` holds the latest valid raw value of each counter named in ``keys``, in that
    order: an ``array('Q')`` (8 bytes a value, no int objects) unless a value does not fit.
    ``totals`` holds their accumulated totals in the same order: an ``array('Q')``, or a list
    once a total outgrows 64 bits. ``index`` is the ``Rates``/``Totals`` index of ``keys``
    (both interned by the tracker).
    ``stale`` names counters that were absent from the port's latest sample: their ``last`` value
    is older than ``monotonic``, so the next delta cannot be turned into a rate.
    ``restored`` marks state loaded from disk, whose monotonic time may belong to an earlier boot.
    ``shared`` says a published view holds ``totals``: the next change copies it first.
    ``resets``, ``saturated``, ``stale`` and the ``hw_`` maps start as the shared empty
    ``_NO_COUNTS``/``_NO_NAMES`` and are replaced (never mutated) when they change, so a view
    may hold them as they are; the ``hw_`` dicts become the port's own on its first driver
    counter. Most ports of a fabric never see a reset, a saturation or a driver counter.
    """

    __slots__ = (
        "block",
        "hw_last",
        "hw_resets",
        "hw_stale",
        "hw_totals",
        "index",
        "keys",
        "last",
        "monotonic",
        "resets",
        "restored",
        "row",
        "saturated",
        "shared",
        "stale",
        "totals",
        "wait_seconds",
        "wall",
    )

    def __init__(self) -> None:
        #: The ``Block`` whose row ``row`` holds ``last`` and ``totals`` instead (large polls,
        #: ``ibmon.track.columns``); ``row`` is -1 while the port keeps its own.
        self.block: Block | None = None
        self.row = -1
        self.keys: tuple[str, ...] = ()
        self.index: dict[str, int] = _NO_INDEX
        self.last: Sequence[int] = ()
        self.totals: MutableSequence[int] = array("Q")
        self.shared = False
        self.resets: dict[str, int] = _NO_COUNTS
        self.saturated: frozenset[str] = _NO_NAMES
        self.stale: frozenset[str] = _NO_NAMES
        self.hw_last: dict[str, int] = _NO_COUNTS
        self.hw_totals: dict[str, int] = _NO_COUNTS
        self.hw_resets: dict[str, int] = _NO_COUNTS
        self.hw_stale: frozenset[str] = _NO_NAMES
        self.monotonic: float | None = None
        self.wall: float | None = None
        self.restored = False
        #: Seconds the port stalled with data to send, summed over every interval with a
        #: transmit-wait ratio (``ratio x interval``): exported as a counter, persisted.
        self.wait_seconds = 0.0


class Tracker:
    """Turns successive snapshots of one source into ``PortView``s.

    ``xmit_wait_ratio`` is the stall fraction of the interval, from the PortXmitWait counts
    in the unit the source decided for the port (``PortIdentity.xmit_wait``) and the port's
    data rate (``ibmon.infiniband.xmitwait.stall_share``).
    ``resets_seen``, ``saturations_seen`` and ``unknown_counters_seen`` count, over this
    process's lifetime, counter decreases, transitions into saturation and samples of names
    missing from the catalogue (a source bug), for self-metrics and logs.
    """

    __slots__ = (
        "_blocks",
        "_keys",
        "_layout",
        "_ports",
        "_same",
        "_zeros",
        "resets_seen",
        "saturations_seen",
        "unknown_counters_seen",
    )

    def __init__(self) -> None:
        self._ports: dict[PortKey, _Port] = {}
        #: The column store of ports in the plain case, one ``Block`` per counter names.
        self._blocks: dict[tuple[str, ...], Block] = {}
        #: Interned ``_Port.keys`` and their ``Rates`` index: the ports of a source share a
        #: handful of counter sets.
        self._keys: dict[tuple[str, ...], tuple[tuple[str, ...], dict[str, int]]] = {}
        #: The rates of an idle port, per ``keys``: shared by every idle port's view.
        self._zeros: dict[tuple[str, ...], Rates] = {}
        #: The last update's views as rows of one store, when they all are (``take_layout``).
        self._layout: Layout | None = None
        #: The last poll's ports when each was a plain row of one block (``_repeat``).
        self._same: _Same | None = None
        self.resets_seen = 0
        self.saturations_seen = 0
        self.unknown_counters_seen = 0

    def __len__(self) -> int:
        return len(self._ports)

    def take_layout(self) -> Layout | None:
        """Where the last ``update`` put its views, when every one is a row of one store
        (``ibmon.track.rowview.Layout``), for the detectors' column readers; handed over once, so
        the tracker holds no list of a poll's views between polls (2 MB at 118,400 ports)."""
        layout, self._layout = self._layout, None
        return layout

    def rename(self, old: PortKey, new: PortKey) -> bool:
        """The port ``old`` is ``new`` from now on (its device's GUID arrived): its raw values,
        totals and resets move along, so the next sample continues them. Refused (False) when
        ``new`` is already a port of its own."""
        if old not in self._ports or new in self._ports:
            return False
        self._same = None
        self._ports[new] = self._ports.pop(old)
        return True

    def forget(self, key: PortKey) -> bool:
        """Drop a port that left the fabric for good, so state does not grow without bound.

        Ports merely missing from one snapshot are kept (they may come back); only the caller
        knows, from topology, when a port is really gone.
        """
        self._same = None
        st = self._ports.pop(key, None)
        if st is not None and st.block is not None:
            st.block.release(st.row)
        return st is not None

    # ------------------------------------------------------------------ hot path

    def update(self, snapshot: Snapshot) -> dict[PortKey, PortView]:
        """Account one poll; return views for exactly the ports in ``snapshot``.

        A fabric-sized poll (``ibmon.runtime.sizes``) accounts its ports in columns; a node's few
        ports go through the per-port rules alone, without importing numpy."""
        self._layout = None
        if fabric_sized(len(snapshot.ports)) and (cols := _columns()) is not None:
            return self._update_columns(snapshot, cols)
        self._same = None
        mono = snapshot.monotonic
        wall = snapshot.wall
        ports = self._ports
        views: dict[PortKey, PortView] = {}
        for key, sample in snapshot.ports.items():
            st = ports.get(key)
            if st is None:
                st = ports[key] = _Port()
            views[key] = self._port(st, sample, self._interval(st, mono, wall))
        return views

    @staticmethod
    def _interval(st: _Port, mono: float, wall: float) -> float:
        """``1 / seconds`` since the port's last sample (0.0 when unusable); marks it read."""
        prev = st.monotonic
        if st.restored:
            st.restored = False
            if (
                prev is not None
                and st.wall is not None
                and abs((st.wall - prev) - (wall - mono)) > _EPOCH_TOLERANCE_S
            ):
                prev = None
        st.monotonic = mono
        st.wall = wall
        return 1.0 / (mono - prev) if prev is not None and mono > prev else 0.0

    def _port(self, st: _Port, sample: PortSample, inv_dt: float) -> PortView:
        """One port through the per-port rules (the definition of the semantics)."""
        if st.block is not None:
            self._evict(st)
        rates = self._counters(st, sample.counters, sample.wide, inv_dt)
        hw = sample.hw_counters
        hw_rates = self._hw_counters(st, hw, inv_dt) if hw or st.hw_last else _NO_HW_RATES
        st.shared = True  # the view holds st.totals: the tracker copies before changing it
        return self._view(st, sample, Totals(st.index, st.totals), rates, hw_rates, inv_dt)

    # ------------------------------------------------------------------ columns

    def _update_columns(self, snapshot: Snapshot, cols: ModuleType) -> dict[PortKey, PortView]:
        """``update`` for a fabric-sized poll: the ports in the plain case (``_aligned``) are
        accounted a block at a time (``ibmon.track.columns``), the others, and any row the
        block refuses, by the per-port rules. Views come in the snapshot's order.

        The ports go to their blocks by ``_dispatch``, a port at a time, unless the poll
        repeats the last one (``_repeat``): then the last poll's one batch is this one's."""
        mono = snapshot.monotonic
        same, self._same = self._same, None
        keys = list(snapshot.ports)
        arrivals: dict[int, list[tuple[int, _Port, PortSample]]] = {}
        slow: list[tuple[int, _Port, PortSample, float]] = []
        repeated = None if same is None else self._repeat(snapshot, keys, same)
        batches = ([repeated] if repeated is not None
                   else self._dispatch(snapshot, cols, arrivals, slow))
        for block in self._blocks.values():
            block.begin()
        out: list[PortView | None] = [None] * len(keys)
        for batch in batches:
            arriving = [st for st in batch.ports if st.block is None]
            if arriving:  # ports new to the store: room for all of them at once
                batch.block.reserve(len(arriving))
                for st in arriving:
                    self._admit(st, batch.block)
            store, all_rows = self._account(batch, cols, out)
            if store is not None and len(batches) == 1 and not arrivals and not slow:
                if all_rows:
                    self._layout = Layout(store, batch.rows, out)  # type: ignore[arg-type]
                self._same = _Same(keys, batch.ports, batch.block, store.index, mono)
        for group in arrivals.values():
            self._arrive(group, cols, out, slow)
        for pos, st, sample, inv_dt in slow:
            out[pos] = self._port(st, sample, inv_dt)
        return dict(zip(keys, out, strict=True))  # type: ignore[arg-type]

    def _dispatch(
        self, snapshot: Snapshot, cols: ModuleType,
        arrivals: dict[int, list[tuple[int, _Port, PortSample]]],
        slow: list[tuple[int, _Port, PortSample, float]],
    ) -> list[_Batch]:
        """Each port of the poll to its block's batch (the plain case, ``_aligned``), to
        ``arrivals`` (a first sample, packed: by the source's index, ``_arrive``) or to
        ``slow`` (the per-port rules)."""
        mono = snapshot.monotonic
        wall = snapshot.wall
        ports = self._ports
        batches: dict[tuple[str, ...], _Batch] = {}
        # The ports of a fabric share one interned tuple of counter names (``_intern``): the
        # previous port's batch is found by identity, without hashing 20-40 names a port.
        keys: tuple[str, ...] | None = None
        batch: _Batch | None = None
        for pos, (key, sample) in enumerate(snapshot.ports.items()):
            st = ports.get(key)
            if st is None:
                st = ports[key] = _Port()
            inv_dt = self._interval(st, mono, wall)
            values = self._aligned(st, sample.counters, inv_dt)
            if values is None:
                counters = sample.counters
                if st.keys or not _first_packed(counters):
                    slow.append((pos, st, sample, inv_dt))
                else:
                    index = counters.index  # type: ignore[attr-defined]  # a Totals
                    arrivals.setdefault(id(index), []).append((pos, st, sample))
                continue
            if st.keys is not keys or batch is None:
                keys = st.keys
                batch = batches.get(keys)
                if batch is None:
                    batch = batches[keys] = _Batch(self._block(keys, cols))
            # Appended here rather than by a method of the batch: a call less per port (and
            # no tuple a port, which the cyclic GC would scan).
            batch.pos.append(pos)
            batch.ports.append(st)
            batch.samples.append(sample)
            batch.values.append(values)
            # a row of an array the source's ports share: only a Totals has one (``_aligned``)
            batch.bases.append(
                sample.counters.base if len(values) != len(keys) else 0)  # type: ignore[attr-defined]
            batch.inv_dt.append(inv_dt)
        return list(batches.values())

    @staticmethod
    def _repeat(snapshot: Snapshot, keys: list[PortKey], same: _Same) -> _Batch | None:
        """The poll's one batch when it repeats the last: the same ports in the same order,
        each a plain row of one block (``_Same``), each sample a row of 64-bit values on
        that block's index. That is what ``_dispatch`` would find for every port, found by
        passes in C; None when a check fails (nothing changed: ``_dispatch`` decides).

        Why: nearly every poll of a fabric is such a poll, and the dispatch (the interval,
        ``_aligned`` and a batch's six lists, a port at a time) was a third of ``track``:
        1.2 us a port, 140 ms a poll at 118,400 ports. What it would find is known: the ports
        are the block's rows on one index, with nothing pinned, stale or restored (those are
        the per-port rules', and a refused row ends this state; a port that is not Active is
        a plain row all the same), and their last reading was the last poll's
        (``_Same.monotonic``), so all share one interval.
        """
        mono = snapshot.monotonic
        n = len(same.ports)
        if len(keys) != n or not mono > same.monotonic or keys != same.keys:
            return None
        samples = list(snapshot.ports.values())
        counters = list(map(_COUNTERS, samples))
        if not (all(map(is_, map(type, counters), itertools.repeat(Totals)))
                and all(map(is_, map(_INDEX, counters), itertools.repeat(same.index)))):
            return None
        values = list(map(_PACKED, counters))
        bases = list(map(_BASE, counters))
        if not _rows_of_64_bits(values, bases, same.block.width):
            return None
        inv_dt = 1.0 / (mono - same.monotonic)  # ``_interval``'s, for every port
        wall = snapshot.wall
        for st in same.ports:
            st.monotonic = mono
            st.wall = wall
        batch = _Batch(same.block)
        batch.pos = range(n)  # type: ignore[assignment]  # read, never appended to
        batch.ports = same.ports
        batch.samples = samples
        batch.values = values
        batch.bases = bases
        batch.inv_dt = [inv_dt] * n
        return batch

    def _account(self, batch: _Batch, cols: ModuleType,
                 out: list[PortView | None]) -> tuple[Rows | None, bool]:
        """One block's ports of a poll: ``advance`` them, and make their views (into ``out``,
        at each port's position in the snapshot); a refused row takes the per-port rules.
        Returns the ``Rows`` of every port when no row was refused and all share one index
        (else None), and whether every view is a ``RowView`` of it (``batch.rows`` then lists
        their rows in order: ``Layout``; a port that is not Active has a view of its own)."""
        block = batch.block
        # The view's link rate, one float a port shared by the view and the ratios (where it
        # is None, ``advance`` reads NaN: no utilization).
        links = list(map(_link_bytes, map(_RATE_BPS, batch.samples)))
        units = list(map(_wait_bytes, map(_UNIT, batch.samples), map(_WIDTH, batch.samples)))
        batch.rows = [st.row for st in batch.ports]
        step: Step = cols.advance(block, batch.rows, batch.values, batch.inv_dt,
                                  bases=batch.bases, link_bytes=links, wait_bytes=units)
        batch.values.clear()  # the sample's arrays: not kept past the poll
        width = block.width
        totals_of = block.totals
        rates_of = step.rates
        rates_index = step.rates_index
        rates_width = step.rates_width
        # the ports' shared index, from the first
        ratios = {"util_tx": step.util_tx, "util_rx": step.util_rx,
                  "wait_ratio": step.wait_ratio}
        waits = step.wait_ratio
        counted = "transmit_wait" in block.index
        rows = Rows(_NO_INDEX, totals_of, rates_of, rates_index,
                    width=width, rates_width=rates_width, **ratios)
        k = 0  # the row among the accounted ones
        stores = refused = others = 0  # the ``Rows`` made, rows refused, other views
        for pos, st, sample, inv_dt, ok, link in zip(
            batch.pos, batch.ports, batch.samples, batch.inv_dt, step.ok, links, strict=True
        ):
            if not ok:
                out[pos] = self._port(st, sample, inv_dt)
                refused += 1
                continue
            if st.index is not rows.index:  # the block's ports share one (equal ones: rarely)
                rows = Rows(st.index, totals_of, rates_of, rates_index,
                            width=width, rates_width=rates_width, **ratios)
                stores += 1
            hw = sample.hw_counters
            hw_rates = self._hw_counters(st, hw, inv_dt) if hw or st.hw_last else _NO_HW_RATES
            state = sample.state
            if state is not None and state != _ACTIVE:
                out[pos] = self._view(st, sample, Totals(st.index, totals_of, st.row * width),
                                      _NO_RATES, hw_rates)
                others += 1
            else:
                wait = waits[k]
                if wait == wait:  # noqa: PLR0124 - NaN: no ratio, nothing stalled that we know
                    st.wait_seconds += wait / inv_dt
                # Positional, like _build's PortView: the rows' mappings are made when read.
                out[pos] = RowView(
                    rows, st.row, k, sample.identity, sample.state,
                    sample.phys_state, link, sample.active_width, sample.active_speed,
                    sample.link, st.saturated, _resets(st) if st.hw_resets else st.resets,
                    dict(st.hw_totals) if st.hw_totals else _NO_COUNTS, hw_rates, None,
                    _NO_NAMES, sample.hw_gauges or _NO_COUNTS, False, _NO_CAUSES,
                    st.wait_seconds if counted else None)
            k += 1
        if stores != 1 or refused:
            return None, False
        return rows, not others

    def _arrive(self, group: list[tuple[int, _Port, PortSample]], cols: ModuleType,
                out: list[PortView | None],
                slow: list[tuple[int, _Port, PortSample, float]]) -> None:
        """Ports on their first sample, packed on one index (``_first_packed``): straight
        into rows of the store, with the raw values as read and the totals the per-port rules
        give a first reading (the raw value times the multiplier); no rates yet. A port the
        rules must see (a counter outside the catalogue, a value at its narrow maximum, a
        total past 64 bits) goes to ``slow``.

        Why: through the per-port rules a port's first sample made
        dicts, lists and two arrays of its own (about 3 KB a port), and its second moved the
        arrays into the store and freed them. At 36,720 ports those were 100 MB of small
        allocations between the objects that live on (ports, detectors' state, labels): the
        allocator's pools they left half-used kept RSS up for the daemon's whole life.
        """
        first = group[0][2].counters
        names = tuple(first)
        index = first.index  # type: ignore[attr-defined]  # the source's, shared by its ports
        if (not names or not _MULT.keys() >= set(names)  # unknown counters: the rules count them
                or list(index.values()) != list(range(len(names)))):
            slow.extend((pos, st, sample, 0.0) for pos, st, sample in group)
            return
        block = self._block(names, cols)
        keys = self._intern(names)[0]
        rows = block.arrive([s.counters.packed for _, _, s in group],  # type: ignore[attr-defined]
                            [s.counters.base for _, _, s in group])  # type: ignore[attr-defined]
        totals = block.totals
        width = block.width
        for (pos, st, sample), row in zip(group, rows, strict=True):
            if row < 0:
                slow.append((pos, st, sample, 0.0))
                continue
            st.keys = keys
            st.index = index
            _placed(st, block, row)
            hw = sample.hw_counters
            hw_rates = self._hw_counters(st, hw, 0.0) if hw or st.hw_last else _NO_HW_RATES
            out[pos] = self._view(st, sample, Totals(index, totals, row * width), _NO_RATES,
                                  hw_rates)

    @staticmethod
    def _aligned(st: _Port, counters: Mapping[str, int], inv_dt: float) -> array[int] | None:
        """The sample's raw values packed in the order of the port's counters, if the port is
        in the plain case a ``Block`` accounts: the same counters in the same order, none
        pinned or stale, a usable interval, and its state in 64-bit arrays. Else None."""
        if not inv_dt or st.saturated or st.stale or not st.keys:
            return None
        if st.block is None and (type(st.last) is not array or type(st.totals) is not array):
            return None  # a value or total past 64 bits: the per-port rules keep it
        values: array[int]
        if type(counters) is Totals:
            if counters.index is not st.index:
                if tuple(counters.index) != st.keys:
                    return None
                st.index = counters.index  # equal: take the source's, shared by its ports
            # its own array, or a row of one the source's ports share (``_Batch.bases``)
            return _row_of_64_bits(counters, len(st.keys))
        if tuple(counters) != st.keys:
            return None
        try:
            values = array("Q", list(counters.values()))
        except (OverflowError, TypeError):  # an invalid (negative) or oversized value
            return None
        return values if len(values) == len(st.keys) else None

    def _block(self, keys: tuple[str, ...], cols: ModuleType) -> Block:
        block: Block | None = self._blocks.get(keys)
        if block is None:
            names, index = self._intern(keys)
            block = self._blocks[names] = cols.Block(
                index, [_MULT[n] for n in names], [_NMAX[n] for n in names]
            )
        return block

    @staticmethod
    def _admit(st: _Port, block: Block) -> None:
        """Move a port's raw values and totals into a row of ``block``."""
        assert isinstance(st.last, array)
        assert isinstance(st.totals, array)
        _placed(st, block, block.take(st.last, st.totals))

    @staticmethod
    def _evict(st: _Port) -> None:
        """Give the port its own arrays again, for the per-port rules."""
        assert st.block is not None
        st.last, st.totals = st.block.release(st.row)
        st.block = None
        st.row = -1
        st.shared = False

    def _intern(self, names: tuple[str, ...]) -> tuple[tuple[str, ...], dict[str, int]]:
        """One tuple and one ``Rates`` index per distinct sequence of counter names."""
        found = self._keys.get(names)
        if found is None:
            found = self._keys[names] = (names, {n: i for i, n in enumerate(names)})
        return found

    def _zero_rates(self, names: tuple[str, ...]) -> Rates:
        zeros = self._zeros.get(names)
        if zeros is None:
            _, index = self._intern(names)
            zeros = self._zeros[names] = Rates(index, array("d", bytes(8 * len(names))))
        return zeros

    def _counters(
        self, st: _Port, counters: Mapping[str, int], wide: frozenset[str], inv_dt: float
    ) -> Rates:
        """Account one sample's counters; its rates (empty when the interval was unusable).

        ``last`` is kept packed (``_pack``) in the order of ``keys``. The usual sample names
        the same counters in the same order with valid raw values: its own values, packed,
        are then the new ``last`` and each counter's previous value is at the same position.
        A source that hands its values packed already (``Totals`` over an ``array('Q')``, with
        the port's index) skips the packing. Any other sample (first one, a counter appearing
        or missing, an invalid or unknown value) goes through a dict of the old values,
        updated as the rules say, repacked.
        """
        old = st.last
        new: array[int] | None = None
        if type(counters) is Totals:
            values: Sequence[int] = counters.own()  # a copy of a row of a shared array
            names = st.keys
            if type(values) is array and values.typecode == "Q":
                if counters.index is not st.index and tuple(counters.index) == names:
                    st.index = counters.index  # equal: take the source's, shared by its ports
                if counters.index is st.index:
                    new = values
            if new is None:
                names = tuple(counters)
        else:
            names = tuple(counters)
            values = list(counters.values())
            if names == st.keys:
                try:
                    new = array("Q", values)  # from a list: 1.5x faster than from the view
                except (OverflowError, TypeError):  # an invalid (negative) or oversized value
                    new = None
        if new is not None:
            if new == old and not (st.saturated or st.stale):
                # An idle port: nothing moved, nothing to accumulate (C-level compare).
                # Its rates are all zero: one Rates shared by every idle port with these
                # counters (views never change them).
                return self._zero_rates(names) if inv_dt else _NO_RATES
            if st.shared:  # a published view holds these totals: change a copy
                st.totals = st.totals[:]
                st.shared = False
            rates = self._deltas(st, names, values, old, wide=wide, inv_dt=inv_dt)
            if isinstance(old, array):
                # Copied in place: the port keeps the array its first poll allocated, and the
                # sample's is freed with the sample, so a poll leaves no new long-lived object
                # behind for it (fewer half-used allocator pools).
                old[:] = new
            else:
                st.last = new[:]  # never the source's own array
            return Rates(st.index, rates) if inv_dt else _NO_RATES
        last = dict(zip(st.keys, old, strict=True))
        if counters == last and not (st.saturated or st.stale):
            return self._zero_rates(names) if inv_dt else _NO_RATES
        unknown_before = self.unknown_counters_seen
        last_get = last.get
        # Accumulate in the sample's order, then repack in the order of the new ``keys``.
        totals = dict(zip(st.keys, st.totals, strict=True))
        totals_get = totals.get
        st.totals = [totals_get(n, 0) for n in counters]
        st.shared = False
        prevs = [last_get(n) for n in counters]
        rates = self._deltas(st, names, values, prevs, wide=wide, inv_dt=inv_dt)
        totals.update(zip(counters, st.totals, strict=True))
        # What the rules keep as the last raw value: every known counter read validly.
        for name, value in counters.items():
            if value >= 0 and name in _MULT:
                last[name] = value
        if len(last) != len(counters) - (self.unknown_counters_seen - unknown_before):
            missing = last.keys() - counters.keys()
            if not missing <= st.stale:
                st.stale = st.stale | missing
        # In the sample's order (names it lacked after), so the next sample like it takes the
        # aligned path: after a restore the saved order may differ from the source's.
        ordered = {n: last[n] for n in counters if n in last}
        if len(ordered) != len(last):
            ordered.update(last)
        st.keys, st.index = self._intern(tuple(ordered))
        st.last = _pack(ordered.values())
        # Every name kept has a total (the rules add both or neither); the others' are dropped.
        st.totals = _pack_totals([totals[n] for n in ordered])
        # Rates were computed unconditionally (one branch less per counter); drop them if the
        # interval was unusable. They follow the sample's order, not (yet) ``keys``.
        return Rates(self._intern(names)[1], rates) if inv_dt else _NO_RATES

    def _deltas(
        self,
        st: _Port,
        names: tuple[str, ...],
        values: Sequence[int],
        prevs: Sequence[int | None],
        *,
        wide: frozenset[str],
        inv_dt: float,
    ) -> array[float]:
        """Totals, saturation, staleness and rates of the counters ``names`` read as
        ``values`` against ``prevs`` (the previous raw value of each, in the same order; None
        for a first one). ``st.totals`` is the port's own (not shared) and in the same order
        as well. The rates come in that order, ``NO_RATE`` for a counter without one.

        Most counters of a port do not move between polls (error counters), and an unchanged
        counter's rate is 0.0 unless it is pinned or stale. So when the port has no pinned or
        stale counter, a C-level pass (``map(ne, ...)``) picks the counters that moved and
        only those are visited: a third faster than one loop over all of them at 32
        counters, 9 moving. Measured as well: C-level passes for the arithmetic (sub, mul,
        add) cost more than this loop, each pass paying its call for 32 values.
        """
        mult_of = _MULT
        nmax_of = _NMAX
        added_by, pinned, rate_of = increase, at_maximum, per_second  # the rules, bound locally
        # The names pinned or stale when the poll starts. Each iteration asks only about its
        # own name, which no earlier iteration changed, so these answer as the live sets
        # would; changes go to st.saturated / st.stale, which are replaced, never mutated.
        sat = st.saturated
        stale = st.stale
        flagged = bool(sat) or bool(stale)
        totals = st.totals
        rates = array("d", bytes(8 * len(values)))  # 0.0: the rate of an unchanged counter
        visit: Iterable[int] = range(len(values))
        if not flagged:
            visit = itertools.compress(visit, map(ne, values, prevs))
        for i in visit:
            name = names[i]
            value = values[i]
            prev = prevs[i]
            if value == prev:  # only visited when flagged
                if name in sat:
                    self._unstale(st, name)  # read this poll: no longer stale, still pinned
                    rates[i] = NO_RATE  # still pinned at its maximum
                elif name in stale:
                    self._unstale(st, name)  # last value predates the previous sample
                    rates[i] = NO_RATE
                continue
            if prev is None or is_reset(value, prev):
                scaled = self._odd(st, i, name, value, prev, wide=wide)
                totals = st.totals  # _odd may have widened it
                if scaled is None:
                    rates[i] = NO_RATE
                    continue
            else:
                scaled = added_by(value, prev, mult_of[name])
                try:
                    totals[i] += scaled
                except OverflowError:  # a total outgrew 64 bits: ints from now on
                    totals = st.totals = list(totals)
                    totals[i] += scaled
                if pinned(value, nmax_of[name]) and name not in wide:
                    self._pin(st, name)
                    self._unstale(st, name)  # read this poll: a later reset gets its rate
                    rates[i] = NO_RATE
                    continue
                if flagged:
                    if name in sat:  # read 64-bit now, so no longer pinned
                        st.saturated = st.saturated - {name}
                    if name in stale:
                        self._unstale(st, name)
                        rates[i] = NO_RATE
                        continue
            rates[i] = rate_of(scaled, inv_dt)
        return rates

    @staticmethod
    def _unstale(st: _Port, name: str) -> None:
        if name in st.stale:
            st.stale = st.stale - {name}

    def _odd(
        self, st: _Port, i: int, name: str, value: int, prev: int | None, *, wide: frozenset[str]
    ) -> int | None:
        """Baseline, reset or invalid value. Returns the scaled delta to rate, None for no rate.

        ``st.totals[i]`` is the total of ``name``, in the port's own (not shared) totals; the
        caller keeps ``value`` as the last raw value when it is known and not negative."""
        mult = _MULT.get(name)
        if mult is None:
            # Not in the catalogue: a source bug. Nothing downstream could name the series.
            self.unknown_counters_seen += 1
            return None
        if value < 0:
            if prev is not None and name not in st.stale:
                st.stale = st.stale | {name}
            return None
        added: int = increase(value, 0, mult)  # since the reset, or the hardware's from its start
        try:
            st.totals[i] += added
        except OverflowError:  # a total outgrew 64 bits: ints from now on
            st.totals = list(st.totals)
            st.totals[i] += added
        if prev is not None:
            # Any decrease is a reset by someone else; the new value is the increase since.
            st.resets = {**st.resets, name: st.resets.get(name, 0) + 1}
            self.resets_seen += 1
            if name in st.saturated:
                st.saturated = st.saturated - {name}
        if at_maximum(value, _NMAX[name]) and name not in wide:
            self._pin(st, name)
            return None
        if prev is None or name in st.stale:
            self._unstale(st, name)
            return None
        return added

    def _pin(self, st: _Port, name: str) -> None:
        """Pinned at the narrow maximum: increments are being lost, so no rate is honest."""
        if name not in st.saturated:
            st.saturated = st.saturated | {name}
            self.saturations_seen += 1

    def _hw_counters(
        self, st: _Port, counters: dict[str, int], inv_dt: float
    ) -> dict[str, float]:
        """Driver hw_counters: names vary by driver, so no catalogue; treated as 64-bit."""
        if st.hw_last is _NO_COUNTS:  # the port's first driver counters: its own dicts
            st.hw_last = {}
            st.hw_totals = {}
        last = st.hw_last
        totals = st.hw_totals
        stale = st.hw_stale
        rates: dict[str, float] = {}
        invalid = 0
        for name, value in counters.items():
            prev = last.get(name)
            if value < 0:
                invalid += 1
                if prev is not None and name not in st.hw_stale:
                    st.hw_stale = st.hw_stale | {name}
                continue
            if prev is None:
                last[name] = value
                totals[name] = totals.get(name, 0) + increase(value, 0, 1)
                continue
            if not is_reset(value, prev):
                delta = increase(value, prev, 1)
            else:
                delta = increase(value, 0, 1)
                st.hw_resets = {**st.hw_resets, name: st.hw_resets.get(name, 0) + 1}
                self.resets_seen += 1
            last[name] = value
            if delta:
                totals[name] += delta
            if stale and name in stale:
                st.hw_stale = st.hw_stale - {name}
                continue
            if inv_dt:
                rates[name] = per_second(delta, inv_dt)
        if len(last) != len(counters) - invalid:
            missing = last.keys() - counters.keys()
            if not missing <= st.hw_stale:
                st.hw_stale = st.hw_stale | missing
        return rates

    def _view(  # noqa: PLR0917 - per port per poll: positional arguments cost less
        self,
        st: _Port,
        sample: PortSample,
        totals: Totals,
        rates: Rates,
        hw_rates: dict[str, float],
        inv_dt: float = 0.0,
    ) -> PortView:
        """The published view. A port that is not Active carries no link rate, no rates, no
        utilization and no transmit-wait ratio: its link moves no data, so any figure would be
        left over from before it went down (decided here once, for every output). Its totals
        still accumulate. A state of ``None`` (a source that cannot tell) counts as Active.
        The interval's stall (ratio / ``inv_dt`` seconds) adds to the port's stalled seconds."""
        rate_bps = sample.rate_bps
        util_tx: float | None = None
        util_rx: float | None = None
        if sample.state is not None and sample.state != _ACTIVE:
            rates = _NO_RATES
            hw_rates = _NO_HW_RATES
            rate_bps = None
        wait_ratio: float | None = None
        link_bytes = _link_bytes(rate_bps)
        if link_bytes is not None and link_bytes > 0:
            tx = rates.get("transmit_data")
            if tx is not None:
                util_tx = utilization(tx, link_bytes)
            rx = rates.get("receive_data")
            if rx is not None:
                util_rx = utilization(rx, link_bytes)
            wait = rates.get("transmit_wait")
            unit = _wait_bytes(sample.identity.xmit_wait, sample.active_width)
            if wait is not None and unit is not None:
                # The rate is counts per second: the stall fraction of one second.
                wait_ratio = stall_share(wait, unit, link_bytes)
                if inv_dt:
                    st.wait_seconds += wait_ratio / inv_dt
        return self._build(st, sample, link_bytes, totals, rates, hw_rates, util_tx, util_rx,
                           wait_ratio)

    @staticmethod
    def _build(  # noqa: PLR0917 - per port per poll: positional arguments cost less
        st: _Port,
        sample: PortSample,
        link_bytes: float | None,
        totals: Totals,
        rates: Rates,
        hw_rates: dict[str, float],
        util_tx: float | None,
        util_rx: float | None,
        wait_ratio: float | None,
    ) -> PortView:
        # Positional: half the cost of keywords at 20,000 ports; _VIEW_FIELDS pins the order.
        return PortView(
            sample.identity,
            sample.state,
            sample.phys_state,
            link_bytes,
            sample.active_width,
            sample.active_speed,
            sample.link,
            totals,
            rates,
            st.saturated,
            _resets(st) if st.hw_resets else st.resets,
            dict(st.hw_totals) if st.hw_totals else _NO_COUNTS,
            hw_rates,
            util_tx,
            util_rx,
            wait_ratio,
            None,  # symbol_error_ber and conditions: the detection engine fills them
            _NO_NAMES,
            # settings and levels pass through as read (the sample is fresh)
            sample.hw_gauges or _NO_COUNTS,
            False,  # stale: the pipeline marks views of ports that did not answer
            _NO_CAUSES,  # the detection engine replaces it on ports that carry a condition
            st.wait_seconds if "transmit_wait" in st.index else None,
        )

    # ------------------------------------------------------------------ persistence

    def dump(self) -> dict[str, Any]:
        """Everything needed to resume counting exactly once after a restart, as JSON types.

        One object per port mirroring the in-memory state (plain dict copies, so dumping a
        large fabric stays cheap enough to do periodically)::

            {"version": 1, "ports": [{"guid": "0x...", "port": "1",
              "monotonic": 812.5, "wall": 1700000000.0,
              "last": {counter: raw value}, "total": {counter: accumulated, x4 for data},
              "resets": {counter: n > 0}, "saturated": [counter], "stale": [counter],
              "hw_last": {...}, "hw_total": {...}, "hw_resets": {...}, "hw_stale": [...],
              "wait_seconds": stalled seconds}]}

        ``stale`` lists counters missing from the port's latest sample (no rate on return).
        The result shares nothing mutable with the tracker, so it may be serialised in another
        thread while polling goes on.
        """
        ports: list[dict[str, Any]] = []
        for (guid, port), st in self._ports.items():
            if st.monotonic is None or st.wall is None:
                continue
            last, totals = (st.last, st.totals) if st.block is None else st.block.row(st.row)
            ports.append(
                {
                    "guid": guid,
                    "port": port,
                    "monotonic": st.monotonic,
                    "wall": st.wall,
                    "last": dict(zip(st.keys, last, strict=True)),
                    "total": dict(zip(st.keys, totals, strict=True)),
                    "resets": dict(st.resets),
                    "saturated": sorted(st.saturated),
                    "stale": sorted(st.stale),
                    "hw_last": dict(st.hw_last),
                    "hw_total": dict(st.hw_totals),
                    "hw_resets": dict(st.hw_resets),
                    "hw_stale": sorted(st.hw_stale),
                    "wait_seconds": st.wait_seconds,
                }
            )
        return {"version": STATE_VERSION, "ports": ports}

    def load(self, data: dict[str, Any]) -> None:
        """Replace all state with a ``dump``; ValueError (and no change) if anything is off.

        The persisted raw values become the baselines, so increments made while the daemon was
        down are counted once, and a decrease across the restart is a reset as usual.
        """
        if not isinstance(data, dict):
            raise ValueError("tracker state: expected an object")
        if data.get("version") != STATE_VERSION:
            raise ValueError(f"tracker state: unsupported version {data.get('version')!r}")
        raw_ports = data.get("ports")
        if not isinstance(raw_ports, list):
            raise ValueError("tracker state: 'ports' must be a list")
        ports: dict[PortKey, _Port] = {}
        for i, raw in enumerate(raw_ports):
            where = f"tracker state: ports[{i}]"
            key, st = _load_port(raw, where)
            if key in ports:
                raise ValueError(f"{where}: duplicate port {key[0]} {key[1]}")
            st.keys, st.index = self._intern(st.keys)
            ports[key] = st
        self._ports = ports
        self._blocks = {}
        self._same = None


def _rows_of_64_bits(values: list[Sequence[int]], bases: list[int], width: int) -> bool:
    """Whether each sample's values are an ``array('Q')`` with its row of ``width`` from its
    base on (``_row_of_64_bits`` of each, in C-level passes), and a row of its own starts at
    0 (as ``_Batch.bases`` has it); one array the rows share (the simulator's) is tested
    once."""
    if min(bases) < 0:
        return False
    first = values[0]
    if all(map(is_, values, itertools.repeat(first))):
        return (type(first) is array and first.typecode == "Q"
                and max(bases) + width <= len(first))
    if set(map(type, values)) != {array} or set(map(_TYPECODE, values)) != {"Q"}:
        return False
    if bases.count(0) == len(bases) and set(map(len, values)) == {width}:
        return True  # rows of their own (``ibmon.track.totals.packed_counters``)
    return all(map(le, map(add, bases, itertools.repeat(width)), map(len, values)))


class _Same:
    """A poll whose every port was a plain row of ``block`` (on ``index``), read at
    ``monotonic``: its ports' ``keys`` and ``ports`` in order, for ``Tracker._repeat``.
    Any change to the tracker's ports but a poll (``forget``, ``load``) drops it."""

    __slots__ = ("block", "index", "keys", "monotonic", "ports")

    def __init__(self, keys: list[PortKey], ports: list[_Port], block: Block,
                 index: dict[str, int], monotonic: float) -> None:
        self.keys = keys
        self.ports = ports
        self.block = block
        self.index = index
        self.monotonic = monotonic


class _Batch:
    """One poll's ports of one ``Block``, in the snapshot's order: where each goes in the
    result (``pos``), and what ``advance`` takes."""

    __slots__ = ("bases", "block", "inv_dt", "ports", "pos", "rows", "samples", "values")

    def __init__(self, block: Block) -> None:
        self.block = block
        self.pos: list[int] = []
        self.ports: list[_Port] = []
        self.samples: list[PortSample] = []
        self.values: list[array[int]] = []  # the row's own array, or one rows share
        self.bases: list[int] = []  # where the row starts in it
        self.inv_dt: list[float] = []
        self.rows: list[int] = []  # each port's row of the block (``_account``)


@functools.cache
def _columns() -> ModuleType | None:
    """``ibmon.track.columns``, imported on first use; None without numpy (then every port
    takes the per-port rules, which give the same results)."""
    try:
        from ibmon.track import columns as trackcolumns
    except ImportError:  # pragma: no cover - numpy is a dependency
        return None
    return trackcolumns


def _resets(st: _Port) -> dict[str, int]:
    """The resets a view reports: the catalogue's counters by name, the driver's as
    ``hw:<name>`` (their own namespace: a driver may reuse a catalogue name), so a driver reset
    shows in ``ibmon_port_resets_total`` and raises ``counter_reset`` like any other."""
    return {**st.resets, **{f"hw:{name}": n for name, n in st.hw_resets.items()}}


def _placed(st: _Port, block: Block, row: int) -> None:
    """The port's raw values and totals are row ``row`` of ``block`` from now on."""
    st.block = block
    st.row = row
    st.last = _IN_BLOCK
    st.totals = _IN_BLOCK_TOTALS
    st.shared = False


def _first_packed(counters: Mapping[str, int]) -> bool:
    """Whether a new port's first sample can go straight into the store (``_arrive``):
    packed in 64 bits, its row within its array."""
    return (type(counters) is Totals
            and _row_of_64_bits(counters, len(counters.index)) is not None)


def _row_of_64_bits(counters: Totals, width: int) -> array[int] | None:
    """The array a sample's values are a row of ``width`` 64-bit values in (an
    ``array('Q')``, its own or one the source's ports share), which a block reads in place;
    None when they are not."""
    packed = counters.packed
    if type(packed) is array and packed.typecode == "Q" and counters.base + width <= len(packed):
        return packed
    return None


@functools.lru_cache(maxsize=256)
def _wait_bytes(unit: WaitUnit, width: str) -> float | None:
    """Bytes one PortXmitWait count stands for on a port of ``unit`` at ``width``. Cached:
    a fabric has a handful of units and widths."""
    return unit.bytes_per_count(width)


@functools.lru_cache(maxsize=64, typed=True)
def _link_bytes(rate_bps: float | None) -> float | None:
    """The view's link rate in bytes per second, None unless ``rate_bps`` is a real rate.

    Cached: a fabric has a handful of link rates, and each view holds one float of them
    instead of its own (32 bytes a view)."""
    if rate_bps is not None and math.isfinite(rate_bps) and rate_bps >= 0:
        return rate_bps / 8.0
    return None


def _pack(values: Collection[int]) -> Sequence[int]:
    """Raw values as an ``array('Q')``, or a tuple when one does not fit in 64 bits unsigned
    (only a test's made-up value can: the PMA's fields are at most 64 bits)."""
    try:
        return array("Q", list(values))
    except (OverflowError, TypeError):
        return tuple(values)


def _pack_totals(values: list[int]) -> MutableSequence[int]:
    """Totals as an ``array('Q')``, or the list itself when one has outgrown 64 bits."""
    try:
        return array("Q", values)
    except OverflowError:
        return values


# ---------------------------------------------------------------------- load validation


def _time(obj: dict[str, Any], field: str, where: str) -> float:
    value = obj.get(field)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{where}.{field}: expected a finite number, got {value!r}")
    return float(value)


def _counts(
    obj: dict[str, Any], field: str, where: str, names: Container[Any], top: int = _MAX_RAW
) -> dict[str, int]:
    """A {counter: int from 0 to ``top``} object whose names all belong to ``names``."""
    value = obj.get(field)
    if not isinstance(value, dict):
        raise ValueError(f"{where}.{field}: expected an object")
    for name, count in value.items():
        if name not in names:
            raise ValueError(f"{where}.{field}: unexpected counter {name!r}")
        if type(count) is not int or not 0 <= count <= top:
            raise ValueError(f"{where}.{field}.{name}: expected an integer from 0 to at most"
                             f" 2**{top.bit_length()}-1")
    return value


def _names(
    obj: dict[str, Any], field: str, where: str, names: dict[str, int]
) -> frozenset[str]:
    value = obj.get(field)
    if not isinstance(value, list) or not all(isinstance(n, str) and n in names for n in value):
        raise ValueError(f"{where}.{field}: expected a list of known counters")
    return frozenset(value) if value else _NO_NAMES


def _load_counters(
    raw: dict[str, Any],
    prefix: str,
    where: str,
    known: Container[Any],
    mult: dict[str, int] | None,
) -> tuple[dict[str, int], dict[str, int], dict[str, int], frozenset[str]]:
    last = _counts(raw, f"{prefix}last", where, known)
    total = _counts(raw, f"{prefix}total", where, last, _MAX_TOTAL)
    if total.keys() != last.keys():
        raise ValueError(f"{where}.{prefix}total: counters differ from {prefix}last")
    for name, value in last.items():
        # Totals start at the raw value and only grow; smaller means the file is corrupt.
        if total[name] < value * (mult[name] if mult is not None else 1):
            raise ValueError(f"{where}.{prefix}total.{name}: smaller than the last raw value")
    resets = {n: c for n, c in _counts(raw, f"{prefix}resets", where, last).items() if c}
    stale = _names(raw, f"{prefix}stale", where, last)
    return dict(last), dict(total), resets or _NO_COUNTS, stale


class _AnyName:
    """Driver hw_counter names are free-form: any non-empty string is acceptable."""

    def __contains__(self, name: Any) -> bool:
        return isinstance(name, str) and bool(name)


def _load_port(raw: Any, where: str) -> tuple[PortKey, _Port]:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected an object")
    guid = raw.get("guid")
    port = raw.get("port")
    if not isinstance(guid, str) or not GUID_RE.match(guid):
        raise ValueError(f"{where}.guid: not a canonical GUID: {guid!r}")
    if not isinstance(port, str) or not (port.isascii() and port.isdigit()):
        raise ValueError(f"{where}.port: not a port number: {port!r}")
    st = _Port()
    st.monotonic = _time(raw, "monotonic", where)
    st.wall = _time(raw, "wall", where)
    st.restored = True
    last, totals, st.resets, st.stale = _load_counters(raw, "", where, _MULT, _MULT)
    st.keys = tuple(last)
    st.last = _pack(last.values())
    st.totals = _pack_totals([totals[n] for n in st.keys])
    st.saturated = _names(raw, "saturated", where, last)
    st.hw_last, st.hw_totals, st.hw_resets, st.hw_stale = _load_counters(
        raw, "hw_", where, _AnyName(), None
    )
    # Absent from a state file written before the counter existed: it starts at 0.
    wait = raw.get("wait_seconds", 0.0)
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not (
            math.isfinite(wait) and wait >= 0):
        raise ValueError(f"{where}.wait_seconds: expected a finite number >= 0, got {wait!r}")
    st.wait_seconds = float(wait)
    return (guid, port), st
