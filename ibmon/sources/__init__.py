"""Sources read hardware and parse; they know nothing about rates, thresholds or exports.

Each source lives in its own module behind the small ``Source`` protocol and is listed in the
explicit ``SOURCES`` registry (filled by ``ibmon.sources.registry`` to keep imports lazy).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ibmon.model import Snapshot, Topology

__all__ = ["Source"]


@runtime_checkable
class Source(Protocol):
    """A poller of one kind of hardware view.

    ``sample`` never raises for a bad value: it records a ``SourceError`` in the snapshot and
    carries on. It raises only when the whole source is unusable (no devices, tool missing), which
    the daemon reports as ``source_failed`` and retries on the next interval.
    """

    name: str

    async def discover(self) -> Topology: ...

    async def sample(self) -> Snapshot: ...

    async def close(self) -> None: ...
