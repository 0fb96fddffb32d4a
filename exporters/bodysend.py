"""Big response bodies leave without the GIL changing hands (``exporters._sendbody``).

Why (issue 12, target 5): a fabric daemon's gzip ``/metrics`` is megabytes in a few hundred
deflate parts (8.5 MB in about 330 at 36,720 ports). While a poll's tracking, detection and
rendering run in worker threads, every time the event loop gives the GIL away (each ``send``
made through Python does) it waits to get it back: the worker's switch interval, or a long C
call. Written part by part by the loop, a scrape was hundreds of such waits (99 ms at the
median while polls ran back to back, against 9 ms idle); sent by a Python thread in one blocking
``sendmsg`` it was still a few (the loop's ``sendmsg`` and ``setblocking``, and the thread's
own start), at the scrape's tail.

So the loop sends the first ``FIRST_BYTES`` (the head and the start of the body) in C, keeping
the GIL for the tenth of a millisecond the kernel copies (the socket is non-blocking: the call
cannot block). Not all the socket would take: a fresh local connection takes 4 MB, and that one
call held the loop for 2.5 ms and the client's first byte until it ended. The rest goes to a
native thread that never takes the GIL: it sends on a duplicate of the descriptor with ``poll``
and non-blocking ``sendmsg`` for at most ``STALL_SECONDS``, then hands back what the client has
not taken, which the loop writes with the usual backpressure (a slow reader never holds a
thread). Its end is an eventfd the loop watches. The socket stays non-blocking throughout, so
the transport may go on reading (a pipelined next request waits in h11); its write buffer is
empty while the thread sends (the caller's duty). At most ``THREADS`` bodies are in flight this
way; more at once go through the loop.

``_sendbody`` is optional: where it was not built (no C compiler at install time) ``send``
returns None and the loop writes every body itself, as it does for TLS connections.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import Final

__all__ = ["BACKEND", "FIRST_BYTES", "MIN_BYTES", "STALL_SECONDS", "THREADS", "BodySender"]

try:
    from exporters import _sendbody
except ImportError:  # built without a C compiler
    _sendbody = None  # type: ignore[assignment]

#: "c" when bodies leave through ``exporters._sendbody``; "loop" when the loop writes them.
BACKEND: Final = "loop" if _sendbody is None else "c"
#: Bodies at least this big are worth the native send (smaller ones are one ``send``).
MIN_BYTES: Final = 256 * 1024
#: Bytes the loop sends itself (the head and the start of the body), the thread the rest.
FIRST_BYTES: Final = 256 * 1024
#: Bodies sent by native threads at once; the next big answer is sent by the loop.
THREADS: Final = 4
#: Seconds a native thread sends one body at most; the loop writes what is left then.
STALL_SECONDS: Final = 1.0


def _start(fd: int, views: list[memoryview], seconds: float) -> _sendbody.Send:
    """A native thread sending ``views`` on ``fd`` (a seam the tests count hand-overs at)."""
    return _sendbody.Send(fd, views, seconds)


class BodySender:
    """Sends the bodies of one event loop's connections (only the loop calls it)."""

    def __init__(self, threads: int = THREADS, stall_seconds: float = STALL_SECONDS) -> None:
        self._threads = threads
        self._stall = stall_seconds
        # in flight (a job of a loop that closed stops running on its own)
        self._jobs: list[_sendbody.Send] = []

    async def send(
        self, transport: asyncio.Transport, parts: Sequence[bytes | memoryview]
    ) -> list[memoryview] | None:
        """Send ``parts`` on ``transport``'s socket: what it takes at once from here, the rest
        from a native thread when one is free.

        Returns what is left for the caller to write (empty when everything was sent), or
        None when nothing was attempted (no C module, no socket): the caller then writes all
        of ``parts`` itself. OSError when the connection failed (the client went away).
        The caller guarantees the transport has nothing buffered.
        """
        sock = transport.get_extra_info("socket")
        if _sendbody is None or sock is None:
            return None
        fd = sock.fileno()
        views = [memoryview(p) for p in parts if p]
        _advance(views, _sendbody.send_now(fd, views, FIRST_BYTES))
        if not views:
            return views
        self._jobs = [job for job in self._jobs if job.running]
        if len(self._jobs) >= self._threads:
            return views
        try:
            job = _start(fd, views, self._stall)
        except OSError:  # no descriptor or thread to spare: the loop writes the rest
            return views
        sent, error = await self._in_thread(job)
        if error:
            raise OSError(error, os.strerror(error))
        _advance(views, sent)
        return views

    async def _in_thread(self, job: _sendbody.Send) -> tuple[int, int]:
        """Wait for ``job``'s end; cancelled, the job still ends (and is finished) on its own
        time: the thread's duplicate descriptor and the body's buffers are let go then."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[int, int]] = loop.create_future()
        event = job.fileno()

        def ended() -> None:
            loop.remove_reader(event)
            if job in self._jobs:
                self._jobs.remove(job)
            result = job.finish()
            if not done.done():
                done.set_result(result)

        loop.add_reader(event, ended)
        self._jobs.append(job)
        return await done


def _advance(views: list[memoryview], sent: int) -> None:
    """Drop ``sent`` bytes from the front of ``views``."""
    done = 0
    while done < len(views) and sent >= len(views[done]):
        sent -= len(views[done])
        done += 1
    del views[:done]
    if sent:
        views[0] = views[0][sent:]
