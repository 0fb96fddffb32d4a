"""One counter of every port a poll answered for, read once per poll for all the detectors.

Why (issue 12, target 4): the detectors' ``needs`` passes each read a counter or a rate of every
answered port (symbol errors, link downs, the integrity and discard counters), about ten columns
a poll. Read port by port that is a Python step per port per column (about 5 ms a column at
36,720 ports). The tracker's column store (``ibmon.trackcolumns``) keeps nearly every port's
totals as rows of one array, so a column is one strided gather of that array; only ports
outside it (their own arrays: a reset, a silent port, a total past 64 bits) are read one by one.
The gather uses numpy only when the tracker already loaded it: a node-local daemon never does.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Mapping, Sequence
from typing import Any

from ibmon.model import PortKey, PortView
from ibmon.rates import Rates
from ibmon.totals import Totals

__all__ = ["GATHER_FROM", "Fresh", "read_column"]

#: Below this many ports a column is read port by port: the gather's setup costs more.
GATHER_FROM = 512

_DTYPES = {"Q": "uint64", "d": "float64"}


class Fresh(list[tuple[PortKey, PortView]]):
    """The engine's ``fresh``: this poll's answered ports, in order, as (key, view) pairs.

    Built once per poll and not changed while the detectors read it; it remembers, per kind of
    mapping (totals, rates), how to read a column of all its ports (``column``).
    """

    __slots__ = ("_readers",)

    def __init__(self) -> None:
        super().__init__()
        self._readers: dict[type, _Reader] = {}

    def column(self, kind: type[Totals | Rates], name: str, default: Any) -> list[Any]:
        """``mapping.get(name, default)`` of every port's totals (``Totals``) or rates."""
        reader = self._readers.get(kind)
        if reader is None:
            reader = self._readers[kind] = _Reader(self, kind)
        return reader.column(name, default)


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


class _Reader:
    """Columns of one kind of mapping of a ``Fresh``: gathered from the array most of its ports
    share (``_shared``), the other ports read one by one (``_odd``)."""

    __slots__ = ("_bases", "_index", "_kind", "_maps", "_odd", "_shared")

    def __init__(self, fresh: Fresh, kind: type[Totals | Rates]) -> None:
        # Any: ``Totals``/``Rates`` or, from a caller other than the tracker, plain mappings
        maps: list[Any] = (
            [v.totals for _, v in fresh] if kind is Totals else [v.rates for _, v in fresh])
        self._maps = maps
        self._kind = kind
        self._index: Mapping[str, int] = next(
            (m.index for m in maps if type(m) is kind and m.index), {})
        self._shared: array[Any] | None = None
        self._bases: Any = None
        self._odd: list[int] = []
        np = sys.modules.get("numpy")
        if np is None or len(maps) < GATHER_FROM or not self._index:
            return
        index = self._index
        # The store's array is much longer than a port's own: take the longest of three probes.
        probes: list[Any] = [m for m in (maps[0], maps[len(maps) // 2], maps[-1])
                              if type(m) is kind and m.index is index and type(m.packed) is array
                              and m.packed.typecode in _DTYPES]
        if not probes:
            return
        shared: array[Any] = max((m.packed for m in probes), key=len)
        bases: list[int] = []
        odd = self._odd
        for i, m in enumerate(maps):
            if type(m) is kind and m.index is index and m.packed is shared:
                bases.append(m.base)
            else:
                bases.append(0)
                odd.append(i)
        self._shared = shared
        self._bases = np.array(bases, dtype=np.intp)

    def column(self, name: str, default: Any) -> list[Any]:
        shared = self._shared
        index = self._index
        pos = index.get(name)
        if shared is None or pos is None:
            return read_column(self._maps, self._kind, name, default)
        np = sys.modules["numpy"]
        # A view of the array only while gathering: an exported buffer would stop the tracker
        # from growing it.
        values: list[Any] = np.frombuffer(shared, dtype=_DTYPES[shared.typecode])[
            self._bases + pos].tolist()
        kind = self._kind
        maps = self._maps
        for i in self._odd:
            m = maps[i]
            values[i] = (m.packed[m.base + pos] if type(m) is kind and m.index is index
                         else m.get(name, default))
        return values
