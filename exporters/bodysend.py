"""Big response bodies leave from a worker thread, in one blocking ``sendmsg``.

Why (issue 12, target 5): a fabric daemon's gzip ``/metrics`` is megabytes in a few hundred
deflate parts (8.5 MB in about 330 at 36,720 ports). Written by the event loop, every part was a
``send`` and every ``send`` gives the GIL away; while a poll's tracking, detection and rendering
run in worker threads, getting it back waited out each worker's switch interval or a long C
call. A scrape was hundreds of such waits: 99 ms at the median while polls ran back to back,
against 9 ms idle. One blocking ``sendmsg`` of all the parts, from a thread, gives the GIL away
once and lets the kernel copy the body as fast as the client reads it: the loop thread is not
involved at all, and the same scrape takes 12 ms.

What the socket takes at once (a fresh local connection takes megabytes) the loop sends
itself, without blocking, before the hand-over: the client reads that while the sender thread
waits for the GIL and a CPU to start, instead of waiting for it. That wait was up to 4-8 ms
while polls ran back to back; the p99 of 200 busy scrapes went from 14.6 / 12.3 ms to
11.1 / 10.5 ms (issue 12, target 5; ``benchmarks/README.md``, twenty-seventh round).

The connection's socket is the asyncio transport's. The sender works on a duplicate of its
descriptor, made blocking only while it sends (``O_NONBLOCK`` belongs to the shared open file,
so the transport must not do I/O meanwhile: its write buffer is empty and the caller pauses its
reading). ``SO_SNDTIMEO`` bounds each wait for the client: a client that takes nothing for
``STALL_SECONDS`` gets the rest of its body from the loop, with the usual write backpressure,
so a slow reader never holds a thread and is served exactly as before. The thread owns the
duplicate and closes it, so a cancelled answer (the client went away, the listener stops) never
closes a descriptor another thread is using. At most ``THREADS`` bodies are in flight this way;
more at once go through the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Final

__all__ = ["MIN_BYTES", "STALL_SECONDS", "THREADS", "BodySender"]

#: Bodies at least this big are worth the thread hand-over (smaller ones are one ``send``).
MIN_BYTES: Final = 256 * 1024
#: Bodies sent by threads at once; the next big answer is sent by the loop.
THREADS: Final = 4
#: Seconds a client may take no data before the rest of its body goes back to the loop.
STALL_SECONDS: Final = 1.0
#: ``sendmsg`` takes at most IOV_MAX (1,024 on Linux) buffers per call.
_IOV_MAX: Final = 1024


class BodySender:
    """Sends bodies from its own small thread pool (never the loop's default executor, which
    a poll's tracking uses: a slow client must never delay a poll)."""

    def __init__(self, threads: int = THREADS, stall_seconds: float = STALL_SECONDS) -> None:
        self._threads = threads
        self._slots = threading.BoundedSemaphore(threads)
        self._timeout = struct.pack("@ll", int(stall_seconds), int(stall_seconds % 1 * 1e6))
        self._pool: ThreadPoolExecutor | None = None

    async def send(
        self, transport: asyncio.Transport, parts: Sequence[bytes | memoryview]
    ) -> list[memoryview] | None:
        """Send ``parts`` on ``transport``'s socket: what it takes at once from here, the rest
        from a thread.

        Returns what the client did not take in time (empty when everything was sent), or None
        when nothing was attempted (no socket, every thread busy): the caller then writes all
        of ``parts`` itself. OSError when the connection failed (the client went away).
        The caller guarantees the transport has nothing buffered and is not reading.
        """
        sock = transport.get_extra_info("socket")
        if sock is None or not self._slots.acquire(blocking=False):
            return None
        try:
            dup = socket.socket(fileno=os.dup(sock.fileno()))
        except OSError:
            self._slots.release()
            return None
        try:
            views = [memoryview(p) for p in parts if p]
            with contextlib.suppress(BlockingIOError):  # still non-blocking: what fits now
                _advance(views, dup.sendmsg(views[:_IOV_MAX]))
            if not views:
                _restore(dup)
                self._slots.release()
                return []
            dup.setblocking(True)
            dup.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, self._timeout)
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="ibmon-send")
            future = self._pool.submit(_send_blocking, dup, views, self._slots)
        except BaseException:
            _restore(dup)
            self._slots.release()
            raise
        return await asyncio.wrap_future(future)


def _send_blocking(
    sock: socket.socket, views: list[memoryview], slots: threading.BoundedSemaphore
) -> list[memoryview]:
    """Runs in a sender thread, which owns ``sock`` (a duplicate) and ``views`` (what is left
    is returned), and releases the slot."""
    try:
        while views:
            batch = views[:_IOV_MAX]
            want = sum(len(v) for v in batch)
            try:
                sent = sock.sendmsg(batch)
            except BlockingIOError:  # SO_SNDTIMEO ran out before the client took anything
                return views
            _advance(views, sent)
            if sent < want:  # the client stalled (or a signal): the loop sends the rest
                return views
        return views
    finally:
        _restore(sock)
        slots.release()


def _advance(views: list[memoryview], sent: int) -> None:
    """Drop ``sent`` bytes from the front of ``views``."""
    done = 0
    while done < len(views) and sent >= len(views[done]):
        sent -= len(views[done])
        done += 1
    del views[:done]
    if sent:
        views[0] = views[0][sent:]


def _restore(sock: socket.socket) -> None:
    """Give the shared open file back to the transport non-blocking, close the duplicate."""
    with contextlib.suppress(OSError):  # gone: the transport finds out on its own
        sock.setblocking(False)
    sock.close()
