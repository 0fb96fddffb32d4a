"""Sources read hardware and parse; they know nothing about rates, thresholds or exports.

Each source lives in its own module (its config model, its factory and the source itself) behind
the small ``Source`` protocol, and is listed on one line of the ``SOURCES`` registry in
``ibmon.sources.registry``, which imports a source's module only when a config uses it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # not at run time: the MAD worker process imports this package on every start
    from ibmon.infiniband.model import Snapshot, Topology

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
