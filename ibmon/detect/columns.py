"""One counter of every port a poll answered for, read once per poll for all the detectors.

Why: the detectors' ``needs`` passes each read a counter or a rate of every
answered port (symbol errors, link downs, the integrity and discard counters), about ten columns
a poll. Read port by port that is a Python step per port per column (about 5 ms a column at
36,720 ports). The tracker's column store (``ibmon.track.columns``) keeps nearly every port's
totals as rows of one array, so a column is one strided gather of that array; only ports
outside it (their own arrays: a reset, a silent port, a total past 64 bits) are read one by one.
The gather uses numpy only when the tracker made its column store with it
(``ibmon.track.rowview.columns_numpy``): a node-local daemon never does.
"""

from __future__ import annotations

from array import array
from collections.abc import Collection, Container, Mapping, Sequence
from operator import attrgetter, is_, itemgetter
from typing import Any

from ibmon.infiniband.model import PortKey, PortView
from ibmon.track.rates import Rates
from ibmon.track.rowview import Layout, RowView, columns_numpy, packed, store_numpy
from ibmon.track.totals import Totals

__all__ = ["DIFF_STRETCH", "Fresh", "Memo", "PortOrder", "attribute", "differences",
           "read_column", "with_keep"]

_DTYPES = {"Q": "uint64", "d": "float64"}
_VIEW = itemgetter(1)
_TOTALS = attrgetter("totals")
_RATES = attrgetter("rates")
_ROWS = attrgetter("rows")
_ROW = attrgetter("row")
_AT = attrgetter("at")
#: Keys ``PortOrder.positions`` looks up one by one (``list.index``, then kept); from more at
#: once, one pass over all keys costs less.
_INDEX_SCANS = 8


class PortOrder:
    """The keys of a poll's answered ports, in order, and where some of them are.

    ``Fresh.order`` hands out the previous poll's object when the keys are the same in the same
    order (nearly every poll of a fabric), so a ``Memo`` tells "same ports" by identity.
    """

    __slots__ = ("_found", "keys")

    def __init__(self, keys: list[PortKey]) -> None:
        self.keys = keys
        # Only the keys asked about (the ports a detector checked or holds a condition on, a
        # few on a fabric), kept with the order: an index of every key was 2.6 MB at 36,720
        # ports. None: not among the keys.
        self._found: dict[PortKey, int | None] = {}

    def positions(self, keys: Collection[PortKey]) -> list[int]:
        """Where those of ``keys`` that are among this order's keys are."""
        found = self._found
        missing = [key for key in keys if key not in found]
        if len(found) + len(missing) > len(self.keys):  # bounded: absent keys could keep coming
            found.clear()
            missing = list(keys)
        if len(missing) > _INDEX_SCANS:
            # Many at once (a fabric's first polls touch every port): one pass over all keys,
            # not kept, so the few keys asked about poll after poll stay all that is kept.
            wanted = set(keys)
            return [i for i, key in enumerate(self.keys) if key in wanted]
        for key in missing:  # each a search in C from the start of the keys, then kept
            try:
                found[key] = self.keys.index(key)
            except ValueError:
                found[key] = None
        return [i for key in keys if (i := found[key]) is not None]


class Fresh(list[tuple[PortKey, PortView]]):
    """The engine's ``fresh``: this poll's answered ports, in order, as (key, view) pairs.

    Built once per poll and not changed while the detectors read it; it remembers, per kind of
    mapping (totals, rates), how to read a column of all its ports (``column``), and the order
    of its ports (``order``), the previous poll's (``previous``) when it is the same.
    """

    __slots__ = ("_attributes", "_laid", "_order", "_previous", "_readers", "_views", "layout")

    def __init__(self, previous: PortOrder | None = None, layout: Layout | None = None) -> None:
        super().__init__()
        self._readers: dict[type, _Reader] = {}
        self._attributes: dict[str, list[Any]] = {}
        self._previous = previous
        self._order: PortOrder | None = None
        self._views: list[PortView] | None = None
        #: Where the tracker put the poll's views, if it says (``ibmon.track.rowview.Layout``).
        self.layout = layout
        self._laid: bool | None = None  # whether ``layout`` lays out these views

    def column(self, kind: type[Totals | Rates], name: str, default: Any) -> list[Any]:
        """``mapping.get(name, default)`` of every port's totals (``Totals``) or rates."""
        return self._reader(kind).column(name, default)

    def column_array(self, kind: type[Totals | Rates], name: str) -> Any | None:
        """``column`` as a numpy array (totals int64/uint64, rates float64 with NaN for no
        rate), when every port's mapping is a row of one shared array; else None. For a
        ``needs`` that compares a whole column with a threshold: no object a port."""
        return self._reader(kind).array(name)

    def attribute(self, name: str) -> list[Any]:
        """Every view's attribute ``name``: one list a poll, however many detectors read it
        (and keep it in their memos)."""
        values = self._attributes.get(name)
        if values is None:
            values = self._attributes[name] = list(map(attrgetter(name), self.views()))
        return values

    def views(self) -> list[PortView]:
        """The views alone, in order: listed once a poll, then every column read from them
        is one ``map`` in C."""
        if self._views is None:
            self._views = list(map(_VIEW, self))
        return self._views

    def laid_out(self) -> Layout | None:
        """The tracker's ``layout`` when it lays out these very views (the same objects in
        the same order; the ports that did not answer are not among either), for the
        readers; else None."""
        layout = self.layout
        if self._laid is None:
            self._laid = (layout is not None and len(layout.views) == len(self)
                          and all(map(is_, layout.views, self.views())))
        return layout if self._laid else None

    def ratios(self, name: str) -> Any | None:
        """Every port's ``util_tx``, ``util_rx`` or ``wait_ratio`` (``ibmon.track.rowview.Rows``)
        as a float64 numpy array, NaN where the view has none (``None``), when the tracker
        laid the poll out (the store's own array: row ``i`` is port ``i``); else None."""
        layout = self.laid_out()
        np = columns_numpy()
        if layout is None or np is None:
            return None
        values = getattr(layout.store, name)
        if type(values) is not array or values.typecode != "d" or len(values) != len(self):
            return None
        return np.array(values, dtype=np.float64)  # a copy: no buffer held on the store

    def sizes(self, kind: type[Totals | Rates]) -> list[int]:
        """How many counters every port's totals (``Totals``) or rates have."""
        return self._reader(kind).sizes()

    def order(self) -> PortOrder:
        """This poll's ``PortOrder``: the previous poll's object when its keys are equal."""
        if self._order is None:
            keys = [key for key, _ in self]
            previous = self._previous
            self._order = previous if previous is not None and previous.keys == keys else (
                PortOrder(keys))
            self._previous = None
        return self._order

    @property
    def known_order(self) -> PortOrder | None:
        """The order if a reader asked for it this poll (the engine keeps it for the next)."""
        return self._order

    def _reader(self, kind: type[Totals | Rates]) -> _Reader:
        reader = self._readers.get(kind)
        if reader is None:
            reader = self._readers[kind] = _Reader(self, kind)
        return reader


class Memo:
    """A ``needs`` pass's per-port answers of the last poll (is the port picked?), reused this
    poll for every port whose inputs compare equal and whose answer was "no".

    Why: a ``needs`` pass looked every port up in the detector's dicts (a tuple key hashed per
    port per detector, 8-20 ms a detector at 36,720 ports), though on a fabric nearly every
    port's inputs (its error totals, its identity and link) are the ones of the previous poll.

    Correct without being told what ``check`` changed, from ``needs``' contract: a port it
    leaves out is one ``check`` would leave as it is, so what the detector keeps about a port
    answered "no" last poll is still what that answer was computed from, and a port answered
    "yes" (which ``check`` may have changed) is computed again. What changes the detector's
    state outside a poll empties the memo (``clear``: the base class's ``load`` and
    ``forget``). A port the detector drops while the poll does not include it (a vanished
    port) changes the poll's order when it comes back, which computes every answer again.
    Used with a ``Fresh`` (every poll the engine runs, whatever its size); with a plain list
    (a caller other than the engine) every answer is computed.
    """

    __slots__ = ("_answers", "_inputs", "_order")

    def __init__(self) -> None:
        self._order: PortOrder | None = None
        self._inputs: tuple[Sequence[object], ...] = ()
        self._answers = bytearray()  # 1 where ``needs`` picked the port

    def clear(self) -> None:
        """The detector's state changed outside a poll: compute every answer again."""
        self._order = None
        self._inputs = ()
        self._answers = bytearray()

    def redo(self, fresh: Sequence[tuple[PortKey, PortView]], *inputs: Sequence[object]
             ) -> tuple[bytearray, list[int]] | None:
        """A copy of last poll's answers and the positions whose answer must be computed
        again (inputs that changed, answers that were "yes"), or None when every answer
        must be. Either way the caller then ``keep``s this poll's answers."""
        order = fresh.order() if type(fresh) is Fresh else None
        old = self._inputs
        same = order is not None and order is self._order and len(old) == len(inputs)
        self._order = order
        self._inputs = inputs if order is not None else ()
        if not same:
            return None
        redo: set[int] = set()
        for new, prev in zip(inputs, old, strict=True):
            if new != prev:  # in C, identity first; else find where
                redo.update(differences(new, prev))
        answers = self._answers
        at = answers.find(1)
        while at >= 0:  # memchr: as fast as the "yes" answers are few
            redo.add(at)
            at = answers.find(1, at + 1)
        return answers.copy(), list(redo)

    def keep(self, answers: bytearray) -> None:
        """This poll's answers (before ``with_keep``), for the next poll."""
        self._answers = answers if self._order is not None else bytearray()


#: Values compared in C at a time by ``differences`` before any is compared in Python.
DIFF_STRETCH = 512


def differences(new: Sequence[object], prev: Sequence[object]) -> list[int]:
    """Positions where ``new`` and ``prev`` (as long) hold values that are neither the same
    object nor equal. Stretch by stretch: a stretch that compares equal in C (identity
    first, about 2 ns a value) is skipped, so a column in which a few ports changed costs
    about 1 ms at 118,400 ports, not the 11 ms of comparing every pair in Python (on a
    fabric some error total moves somewhere nearly every poll)."""
    out: list[int] = []
    for at in range(0, len(new), DIFF_STRETCH):
        a = new[at : at + DIFF_STRETCH]
        b = prev[at : at + DIFF_STRETCH]
        if a != b:
            out.extend([i for i, (x, y) in enumerate(zip(a, b, strict=True), start=at)
                        if x is not y and x != y])
    return out


def attribute(fresh: Sequence[tuple[PortKey, PortView]], name: str) -> list[Any]:
    """Every view's attribute ``name`` (shared for the poll when ``fresh`` is a ``Fresh``)."""
    if type(fresh) is Fresh:
        return fresh.attribute(name)
    return [getattr(view, name) for _, view in fresh]


def with_keep(fresh: Sequence[tuple[PortKey, PortView]], answers: bytearray,
              keep: Container[PortKey]) -> Sequence[int]:
    """``answers`` with every port in ``keep`` (the conditions a detector holds) picked too."""
    if not keep:
        return answers
    order = fresh.known_order if type(fresh) is Fresh else None
    if order is None or not isinstance(keep, Collection):
        return [a or key in keep for (key, _), a in zip(fresh, answers, strict=True)]
    out = answers.copy()
    for i in order.positions(keep):
        out[i] = True
    return out


def read_column(maps: Sequence[Any], kind: type[Totals | Rates], name: str, default: Any
                ) -> list[Any]:
    """``m.get(name, default)`` of every one of ``maps``, port by port. The tracker's packed
    mappings of ports with the same counters share one index: for those (nearly every port of a
    fabric) the counter's position is looked up once, not through a method call per port."""
    index: Mapping[str, int] = next((m.index for m in maps if type(m) is kind and m.index), {})
    pos = index.get(name)
    if pos is None:
        return [m.get(name, default) for m in maps]
    return [m.packed[m.base + pos] if type(m) is kind and m.index is index
            else m.get(name, default) for m in maps]


def _one_store_bases(views: list[PortView], shared: array[Any], index: Mapping[str, int],
                     in_rows: bool, np: Any) -> Any:
    """Where each view's row starts in ``shared`` when every view is a ``RowView`` of one
    ``Rows`` on it (a fabric's poll: one block, every port answered), from the views' row
    numbers in C; else None (``_Reader`` then tells them apart one by one).

    Why: telling them apart was a Python step a port for each of the
    two readers a poll, 16-23 ms at 118,400 ports, for an answer that is nearly always "all
    of them".
    """
    if type(views[0]) is not RowView:
        return None
    try:
        stores = list(map(_ROWS, views))
    except AttributeError:  # a view that is not a RowView (its own mappings)
        return None
    store = stores[0]
    if stores.count(store) != len(stores):  # identity first, in C
        return None
    if in_rows:
        if store.totals is not shared or store.index is not index:
            return None
        where, width = _ROW, store.width
    else:
        if store.rates is not shared or store.rates_index is not index:
            return None
        where, width = _AT, store.rates_width
    return np.fromiter(map(where, views), dtype=np.intp, count=len(views)) * width


class _Reader:
    """Columns of one kind of mapping of a ``Fresh``: gathered from the array most of its ports
    share (``_shared``), the other ports read one by one (``_odd``). The tracker's views keep
    their rows in that array (``ibmon.track.rowview.RowView``): those are read in place, no mapping
    is made for them."""

    __slots__ = ("_attr", "_bases", "_index", "_kind", "_maps", "_odd", "_shared", "_sizes",
                 "_views")

    def __init__(self, fresh: Fresh, kind: type[Totals | Rates]) -> None:
        views = fresh.views()
        self._views = views
        self._kind = kind
        self._attr = _TOTALS if kind is Totals else _RATES
        # Any: ``Totals``/``Rates`` or, from a caller other than the tracker, plain mappings;
        # made only where a column is read port by port (``maps``)
        self._maps: list[Any] | None = None
        self._shared: array[Any] | None = None
        self._bases: Any = None
        self._odd: list[int] = []
        self._sizes: list[int] | None = None
        np = columns_numpy()
        rows = [r for v in (views[0], views[len(views) // 2], views[-1])
                if (r := packed(v, kind)) is not None and r[0]] if views else []
        self._index: Mapping[str, int] = rows[0][0] if rows else next(
            (m.index for m in self.maps() if type(m) is kind and m.index), {})
        if np is None or not self._index:
            return
        if self._laid_out(fresh.laid_out(), np):
            return
        index = self._index
        # The store's array is much longer than a port's own: take the longest of three probes.
        probes = [a for i, a, _ in rows
                  if i is index and type(a) is array and a.typecode in _DTYPES]
        if not probes:
            return
        shared: array[Any] = max(probes, key=len)
        self._shared = shared
        self._bases = _one_store_bases(views, shared, index, kind is Totals, np)
        if self._bases is not None:
            return
        bases: list[int] = []
        odd = self._odd
        attr = self._attr
        in_rows = kind is Totals
        for i, v in enumerate(views):
            if type(v) is RowView:
                store = v.rows
                if (store.totals is shared and store.index is index if in_rows
                        else store.rates is shared and store.rates_index is index):
                    bases.append(v.row * store.width if in_rows
                                 else v.at * store.rates_width)
                    continue
            else:
                m = attr(v)
                if type(m) is kind and m.index is index and m.packed is shared:
                    bases.append(m.base)
                    continue
            bases.append(0)
            odd.append(i)
        self._bases = np.array(bases, dtype=np.intp)

    def _laid_out(self, layout: Layout | None, np: Any) -> bool:
        """Take the shared array and each view's place in it from the tracker's ``layout``
        of these views (``Fresh.laid_out``); False without one."""
        if layout is None:
            return False
        views = self._views
        store = layout.store
        shared: Sequence[object]
        if self._kind is Totals:
            shared, index = store.totals, store.index
            bases = np.array(layout.rows, dtype=np.intp) * store.width
        else:
            shared, index = store.rates, store.rates_index
            bases = np.arange(len(views), dtype=np.intp) * store.rates_width
        if (index is not self._index or type(shared) is not array
                or shared.typecode not in _DTYPES):
            return False
        self._shared = shared
        self._bases = bases
        return True

    def maps(self) -> list[Any]:
        """Every port's mapping (made for a ``RowView``), for a port-by-port read."""
        if self._maps is None:
            self._maps = list(map(self._attr, self._views))
        return self._maps

    def sizes(self) -> list[int]:
        """Once a poll: the memos of all detectors that read it keep the same list."""
        if self._sizes is not None:
            return self._sizes
        kind = self._kind
        if self._shared is None:
            sizes = [len(m.index) if type(m) is kind else len(m) for m in self.maps()]
        else:
            sizes = [len(self._index)] * len(self._views)
            for i in self._odd:
                m = self._attr(self._views[i])
                sizes[i] = len(m.index) if type(m) is kind else len(m)
        self._sizes = sizes
        return sizes

    def array(self, name: str) -> Any | None:
        """The column gathered into a new numpy array when no port is read on its own (the
        ``odd`` ones) and the shared rows have ``name``; else None."""
        shared = self._shared
        pos = self._index.get(name)
        if shared is None or self._odd or pos is None:
            return None
        np = store_numpy()  # ``_shared`` is set only where it is in use
        return np.frombuffer(shared, dtype=_DTYPES[shared.typecode])[self._bases + pos]

    def column(self, name: str, default: Any) -> list[Any]:
        shared = self._shared
        if shared is None:
            return read_column(self.maps(), self._kind, name, default)
        index = self._index
        pos = index.get(name)
        values: list[Any]
        if pos is None:  # not a counter of the shared rows: only odd ports may have it
            values = [default] * len(self._views)
        else:
            np = store_numpy()  # ``_shared`` is set only where it is in use
            # A view of the array only while gathering: an exported buffer would stop the
            # tracker from growing it.
            values = np.frombuffer(shared, dtype=_DTYPES[shared.typecode])[
                self._bases + pos].tolist()
        kind = self._kind
        views = self._views
        attr = self._attr
        for i in self._odd:
            m = attr(views[i])
            values[i] = (m.packed[m.base + pos] if pos is not None and type(m) is kind
                         and m.index is index else m.get(name, default))
        return values
