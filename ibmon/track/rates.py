"""One port's per-second counter rates, packed: a read-only mapping over an ``array('d')``.

Why not a dict: every port of a busy fabric gets new rates every poll,
and as a dict of 22-32 floats they were 1.6 KB a port (the dict and one float object per
value): 59 MB at 36,720 ports, twice that while a poll's views replace the last. Packed, they
are about 300 bytes. The counter names and their positions are one dict shared by every port
with the same counters (the tracker interns it); a NaN marks a counter without a rate
(baseline, saturated, stale), which a rate never is, so it behaves exactly like the dict it
replaces: same keys in the same order, same values, equal to that dict.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from math import isnan
from typing import Any, Final, overload

__all__ = ["NO_RATE", "Rates"]

NO_RATE: Final = float("nan")
"""The packed value of a counter that has no rate."""


class Rates(Mapping[str, float]):
    """``index`` maps each counter name to its position in ``packed`` after ``base`` (shared,
    never changed; several names may share a position of 0.0); ``packed`` holds the rate or
    ``NO_RATE``: only this port's, or from ``base`` on, this port's row of a poll's rates
    (``ibmon.track.columns``). Neither is changed after construction."""

    __slots__ = ("base", "index", "packed")

    def __init__(self, index: dict[str, int], values: Sequence[float], base: int = 0) -> None:
        self.index = index
        self.packed = values
        self.base = base

    def __getitem__(self, name: str) -> float:
        value = self.packed[self.base + self.index[name]]
        if isnan(value):  # no rate
            raise KeyError(name)
        return value

    @overload
    def get(self, name: str, /) -> float | None: ...
    @overload
    def get(self, name: str, /, default: float | Any) -> float | Any: ...
    def get(self, name: str, /, default: Any = None) -> Any:
        i = self.index.get(name)
        if i is None:
            return default
        value = self.packed[self.base + i]
        return default if isnan(value) else value

    def __contains__(self, name: object) -> bool:
        i = self.index.get(name)  # type: ignore[call-overload]
        return i is not None and not isnan(self.packed[self.base + i])

    def own(self) -> Sequence[float]:
        """Only this port's rates, in the order of ``index``. A row of the tracker's store
        may leave counters that did not move out and point their names at one column of 0.0
        (``ibmon.track.columns``): positions are read through the index, not as a slice."""
        packed = self.packed
        base = self.base
        return [packed[base + i] for i in self.index.values()]

    def __iter__(self) -> Iterator[str]:
        return (n for n, v in zip(self.index, self.own(), strict=True) if not isnan(v))

    def __len__(self) -> int:
        return sum(1 for v in self.own() if not isnan(v))

    def __repr__(self) -> str:
        return repr(dict(self.items()))
