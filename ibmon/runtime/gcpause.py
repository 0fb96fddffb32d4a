"""The cyclic GC paused while a large poll's work runs in worker threads, and what that work
made kept out of later collections.

Why: a fabric's poll makes a few container objects a port that live until the next poll
replaces them (the source's sample and its totals, the tracker's view): 355,000 at 118,400
ports. With automatic collection on, each was traversed as it went through the young and then
the middle generation (700 and 7,000 objects at a time), and each traversal is a few cache
misses (the object, then the identity and link it points to): 0.1-0.3 s of CPU a poll at
118,400 ports, a tenth of track + detect + publish, and a full collection about every ten
polls that stopped every thread, the event loop included, for 135 ms. None of that work leaves
reference cycles behind: the traversals found next to nothing.

How: while any window is open (nested and concurrent ones are counted) automatic collection is
off; the last one out moves every tracked object to the permanent generation (``gc.freeze``,
which relinks two lists: no traversal) and turns collection back on, unless it was off before
the first one came in. Frozen objects are still freed by reference counting when the next poll
drops them; they are only never traversed.

The price: a reference cycle that is already garbage when the last window closes (the event
loop's: an exception kept with its traceback, a closed connection) is frozen too, where the
GC would have found it. So once every ``SWEEP_SECONDS`` the last one out first takes every
object back out of the permanent generation and runs a full collection (``sweep``): garbage
lives at most that long, for one stop of every thread a sweep, longer than the GC's own full
collections were (every tracked object is traversed: 0.23-0.39 s at 118,400 ports) but once
an hour instead of every ten polls.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Iterator
from typing import Final

import structlog

__all__ = ["SWEEP_SECONDS", "paused_gc", "sweep"]

log = structlog.get_logger(__name__)

#: How long a reference cycle frozen with a window's objects can stay before a sweep finds it.
SWEEP_SECONDS: Final = 3600.0

_lock = threading.Lock()
_open = 0  # windows open now, in every thread
_was_enabled = False  # automatic collection was on when the first of them opened
_next_sweep = time.monotonic() + SWEEP_SECONDS  # when the next window to close sweeps first


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """No automatic collection while the body runs; see the module's docstring."""
    global _open, _was_enabled, _next_sweep  # noqa: PLW0603 - process-wide, under _lock
    with _lock:
        if _open == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _open += 1
    try:
        yield
    finally:
        with _lock:
            _open -= 1
            if _open == 0:
                now = time.monotonic()
                if now >= _next_sweep:
                    _next_sweep = now + SWEEP_SECONDS
                    sweep()
                gc.freeze()
                if _was_enabled:
                    gc.enable()


def sweep() -> int:
    """Everything frozen back into the GC's oldest generation, and a full collection: the
    reference cycles frozen as they were are freed. Returns how many objects it found
    unreachable. Every thread waits while it runs."""
    started = time.perf_counter()
    gc.unfreeze()
    found = gc.collect()
    log.info("gc_sweep", unreachable=found, seconds=round(time.perf_counter() - started, 3))
    return found
