"""One port's software-accumulated counter totals, packed: a read-only mapping over an array.

Why not a dict: a busy port's totals change every poll, and as a dict of
32 ints they were about 1.1 KB a port (the dict and one int object per value that is not
tiny): 40 MB at 36,720 ports, and up to twice that while a poll's views replace the last.
Packed in an ``array('Q')`` they are about 350 bytes. The counter names and their positions
are one dict shared by every port with the same counters (the tracker interns it, as for
``ibmon.track.rates.Rates``), so the exporter can read a block of ports column by column without
looking a name up per port.

A total that no longer fits in 64 bits (only made-up values can: 2**64 bytes is 11 years of
400 Gb/s) makes the tracker keep that port's totals in a list of ints instead; ``packed`` is
then that list. Either way it is equal to the dict it replaces: same keys in the same order,
same values.
"""

from __future__ import annotations

from array import array
from collections.abc import ItemsView, Iterator, KeysView, Mapping, Sequence, ValuesView
from typing import Any, overload

__all__ = ["Totals", "packed_counters"]


class Totals(Mapping[str, int]):
    """``index`` maps each counter name to its position in ``packed`` after ``base`` (shared
    between ports, never changed); ``packed`` holds the totals: only this port's, or, from
    ``base`` on, this port's row of the tracker's column store (``ibmon.track.columns``).
    Neither is changed once a view holds them: the tracker copies ``packed`` before it next
    accumulates into it."""

    __slots__ = ("base", "index", "packed")

    def __init__(self, index: dict[str, int], packed: Sequence[int], base: int = 0) -> None:
        self.index = index
        self.packed = packed
        self.base = base

    def __getitem__(self, name: str) -> int:
        return self.packed[self.base + self.index[name]]

    @overload
    def get(self, name: str, /) -> int | None: ...
    @overload
    def get(self, name: str, /, default: int | Any) -> int | Any: ...
    def get(self, name: str, /, default: Any = None) -> Any:
        i = self.index.get(name)
        return default if i is None else self.packed[self.base + i]

    def __contains__(self, name: object) -> bool:
        return name in self.index

    def __iter__(self) -> Iterator[str]:
        return iter(self.index)

    def __len__(self) -> int:
        return len(self.index)

    def own(self) -> Sequence[int]:
        """Only this port's totals, in the order of ``index`` (``packed`` itself, or a copy
        of its row)."""
        packed = self.packed
        if self.base or len(packed) != len(self.index):
            return packed[self.base : self.base + len(self.index)]
        return packed

    def as_dict(self) -> dict[str, int]:
        """A plain dict of the same totals, built in C (for JSON and comparisons)."""
        return dict(zip(self.index, self.own(), strict=True))

    # The mixins' views read item by item through __getitem__; these are built in C.
    def keys(self) -> KeysView[str]:
        return self.index.keys()

    def items(self) -> ItemsView[str, int]:
        return self.as_dict().items()

    def values(self) -> ValuesView[int]:
        return self.as_dict().values()

    def __repr__(self) -> str:
        return repr(self.as_dict())


#: One name index per distinct sequence of counter names that ``packed_counters`` has seen.
_INDEXES: dict[tuple[str, ...], dict[str, int]] = {}


def packed_counters(counters: dict[str, int]) -> Mapping[str, int]:
    """A source's counters for its sample: a ``Totals`` over one ``array('Q')``, with a name
    index shared by every port with the same counters; ``counters`` itself if a value does
    not fit 64 bits (the tracker's per-port rules take it as it is).

    Why: as a dict a port's 22-40 counters are about 0.9 KB (the dict
    and an int object per value that is not tiny), alive for every port of a fabric while a
    poll is tracked; packed they are about 0.4 KB, and the tracker's column store reads them
    without a dict lookup or an int object per value (as it does the simulator's).
    """
    names = tuple(counters)
    index = _INDEXES.get(names)
    if index is None:
        if len(_INDEXES) >= 256:  # kinds of ports on a fabric: a few; bounded all the same
            _INDEXES.clear()
        index = _INDEXES[names] = {name: i for i, name in enumerate(names)}
    try:
        return Totals(index, array("Q", counters.values()))
    except (OverflowError, TypeError):  # negative, past 64 bits, or not an int
        return counters
