"""How a poll is done by size: the one port count that decides it (``OFFLOAD_PORTS``), and the
threads a fabric-sized poll's bulk work runs in (``run_bulk``, ``submit_bulk``).

Below it a poll is node-sized (a compute node's few HCAs): everything runs on the event loop,
port by port, and nothing imports numpy, because a node-local daemon must stay within 40 MB
of RSS and numpy alone costs about 15 MB. At and above it the poll is fabric-sized: the
simulator steps, tracking and detection run in a bulk thread (below), so scrapes never
wait behind a poll, and the stages work in columns (the tracker's column
store, the detectors' column readers, the renderer's cached blocks), because port-by-port
Python costs 13.5 us a port in the tracker alone at 20,000 ports against 3.8 us in columns,
and a 100,000-port poll must be tracked, detected and published within a second.

Both sides give the same answers; only the cost differs. Read the threshold at call time
(``fabric_sized``, or ``sizes.OFFLOAD_PORTS``), never copy it into another module's constant:
tests move it with one ``monkeypatch.setattr(ibmon.runtime.sizes, "OFFLOAD_PORTS", 1)`` so a 20-port
test fabric runs the paths a 20,000-port one does.

This module imports no other ibmon module, so any module may use it without an import cycle.

Bulk threads run a fabric-sized poll's work (the simulator's step, tracking and detection,
rendering, freeing the last poll's views) at a lower CPU priority than the event loop. They
keep a CPU or two busy while polls follow each other; the event loop, which answers scrapes,
wakes up after every system call of a scrape and would wait for a CPU behind those threads as
often as for the GIL: on two CPUs the p99 of 200 scrapes during back-to-back polls was 20-21
ms with the bulk threads at the process's priority and 15-16 ms with them ``NICE`` steps
below it. The scheduler still gives them every CPU nobody else wants, so a poll is as fast on
an idle host; on a busy one, the loop and other programs (the subnet manager on a management
node) go first.

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

__all__ = ["NICE", "OFFLOAD_PORTS", "fabric_sized", "run_bulk", "submit_bulk"]

#: Polls of at least this many ports are fabric-sized (see the module's docstring).
OFFLOAD_PORTS = 200


def fabric_sized(ports: int) -> bool:
    """Whether a poll of ``ports`` ports is done the fabric's way (columns, off the loop)."""
    return ports >= OFFLOAD_PORTS


#: Nice steps the bulk threads run below the process (capped at 19, the lowest priority).
NICE: Final = 10

log = structlog.get_logger("ibmon.runtime.sizes")

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
