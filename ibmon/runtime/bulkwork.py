"""The threads that do a large poll's bulk work, at a lower CPU priority than the event loop.

Why: a fabric daemon's poll runs in worker threads (the simulator's
step, tracking and detection, rendering, freeing the last poll's views) that keep a CPU or
two busy while polls follow each other. The event loop, which answers scrapes, wakes up after
every system call of a scrape and would wait for a CPU behind those threads as often as for
the GIL: on two CPUs the p99 of 200 scrapes during back-to-back polls was 20-21 ms with the
bulk threads at the process's priority and 15-16 ms with them ``NICE`` steps below it. The
scheduler still gives them every CPU nobody else wants, so a poll is as fast on an idle host;
on a busy one, the loop and other programs (the subnet manager on a management node) go first.

Linux keeps a nice value per thread, so this lowers only the pool's threads; raising it back
would need privileges, which is why they are a pool of their own and never the loop's default
executor (state saves, the API, reloads stay at the process's priority). Elsewhere, or where
the call is refused, the threads run at the process's priority.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Final, TypeVar

import structlog

__all__ = ["NICE", "run_bulk", "submit_bulk"]

#: Nice steps the bulk threads run below the process (capped at 19, the lowest priority).
NICE: Final = 10

log = structlog.get_logger("ibmon.runtime.bulkwork")

_T = TypeVar("_T")
_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def _lower_priority() -> None:
    """A bulk thread's first act: its own nice value ``NICE`` steps above the process's."""
    try:
        tid = threading.get_native_id()
        nice = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, nice + NICE))
    except (AttributeError, OSError):  # no per-thread priority here: run at the process's
        pass


def _executor() -> ThreadPoolExecutor:
    global _pool  # noqa: PLW0603 - one pool for the process, made when first needed
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(min(32, (os.cpu_count() or 1) + 4),
                                       thread_name_prefix="ibmon-bulk",
                                       initializer=_lower_priority)
        return _pool


async def run_bulk(func: Callable[..., _T], /, *args: object) -> _T:
    """``asyncio.to_thread``, in a bulk thread (the caller's context variables go along)."""
    call = functools.partial(contextvars.copy_context().run, func, *args)
    return await asyncio.get_running_loop().run_in_executor(_executor(), call)


def submit_bulk(func: Callable[..., _T], /, *args: object) -> Future[_T]:
    """``func(*args)`` in a bulk thread, not awaited (freeing what the last poll made); an
    exception it raises is logged with its traceback, never lost with the future."""
    future = _executor().submit(func, *args)
    future.add_done_callback(_log_failure)
    return future


def _log_failure(future: Future[Any]) -> None:
    exc = None if future.cancelled() else future.exception()
    if exc is not None:
        log.error("bulk_work_failed", error=f"{type(exc).__name__}: {exc}", exc_info=exc)
