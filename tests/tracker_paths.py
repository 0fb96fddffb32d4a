"""Trackers that take one path whatever the size of a poll, to compare the two.

``ibmon.runtime.sizes.OFFLOAD_PORTS`` decides per poll whether the tracker accounts in columns (a
fabric) or port by port (a node); these set it around each of their own polls only, so two of
them side by side account the same samples each its own way.
"""

from __future__ import annotations

from typing import ClassVar

from ibmon.infiniband.model import PortKey, PortView, Snapshot
from ibmon.runtime import sizes
from ibmon.track.tracker import Tracker

__all__ = ["ColumnTracker", "PerPortTracker"]


class _Sized(Tracker):
    #: ``OFFLOAD_PORTS`` while this tracker accounts a poll.
    threshold: ClassVar[int] = sizes.OFFLOAD_PORTS

    def update(self, snapshot: Snapshot) -> dict[PortKey, PortView]:
        saved, sizes.OFFLOAD_PORTS = sizes.OFFLOAD_PORTS, self.threshold
        try:
            return super().update(snapshot)
        finally:
            sizes.OFFLOAD_PORTS = saved


class PerPortTracker(_Sized):
    """Every poll port by port, as a node's daemon accounts its HCAs."""

    threshold = 1 << 62


class ColumnTracker(_Sized):
    """Every poll through the column store, as a fabric's daemon accounts it."""

    threshold = 1
