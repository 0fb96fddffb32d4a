"""The job watcher: asks the job source every interval, in its own task, and keeps the latest table.

A query never blocks a poll: polls read ``JobWatcher.table`` (swapped whole) and never wait for
the scheduler. The source's ``fetch`` never raises for a scheduler problem (it returns a table
with ``known`` False and the reason); anything else it raises is a bug, logged with its
traceback at most every few minutes, and the jobs are unknown until a query works again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, runtime_checkable

import structlog

from ibmon.jobs.model import JobTable
from ibmon.runtime.metrics import Counter, Gauge, Registry

__all__ = ["QUERY_ERRORS", "JobMetrics", "JobWatcher", "SimulatedScheduler"]

log = structlog.get_logger(__name__)

#: Every reason a query can fail with (``ibmon.jobs.slurm``), plus ``bug``.
QUERY_ERRORS = ("missing", "failed", "timeout", "junk", "too_large", "bug")
_BUG_LOG_SECONDS = 300.0


@runtime_checkable
class SimulatedScheduler(Protocol):
    """A source that plays a scheduler too (the simulated fabric, ``ibmon demo``)."""

    name: str

    @property
    def places_jobs(self) -> bool:
        """Whether its scenario runs any job (else no watcher is started for it)."""

    def squeue_json(self) -> str | None:
        """Its running jobs as ``squeue --json`` prints them; None: it places no jobs."""


class JobMetrics:
    """The job source's health, in the daemon's registry (made once, kept across reloads)."""

    def __init__(self, registry: Registry) -> None:
        self.errors = Counter(
            "ibmon_jobs_query_errors",
            "Job scheduler queries that failed, by reason: missing (squeue not found), failed "
            "(it exited non-zero), timeout (killed), junk (unreadable output), too_large, bug. "
            "While the latest failed, ibmon_jobs_known is 0.",
            ["reason"],
            registry=registry,
        )
        for reason in QUERY_ERRORS:
            self.errors.labels(reason)
        self.last_success = Gauge(
            "ibmon_jobs_last_success_timestamp_seconds",
            "Wall-clock time of the latest job scheduler query that worked (0: none yet).",
            registry=registry,
        )


class JobWatcher:
    """Runs ``fetch`` every ``interval`` seconds; ``table`` is the latest answer."""

    def __init__(
        self,
        fetch: Callable[[], Awaitable[JobTable]],
        interval: float,
        metrics: JobMetrics,
        *,
        close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._fetch = fetch
        self._close = close
        self.interval = interval
        self.metrics = metrics
        #: Unknown until the first query ends (never the no-job-source ``UNKNOWN_JOBS``).
        self.table = JobTable(known=False, error="starting")
        self._bug_logged = -_BUG_LOG_SECONDS

    async def run(self) -> None:
        try:
            while True:
                started = time.monotonic()
                await self.refresh()
                await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))
        finally:
            if self._close is not None:
                await asyncio.shield(self._close())

    async def refresh(self) -> JobTable:
        """One query; the table it gives becomes ``table``."""
        try:
            table = await self._fetch()
        except asyncio.CancelledError:
            raise
        except Exception:
            now = time.monotonic()
            if now - self._bug_logged >= _BUG_LOG_SECONDS:
                self._bug_logged = now
                log.exception("jobs_query_bug", consequence="jobs are unknown until a query works")
            table = JobTable(known=False, error="bug", fetched=time.time())
        if table.known:
            self.metrics.last_success.set(table.fetched)
        else:
            self.metrics.errors.labels(table.error or "failed").inc()
        self.table = table
        return table
