"""Big bodies sent natively (``exporters.bodysend``, ``exporters._sendbody``), attacked as
clients do: every byte arrives in order, a client that stops reading gets the rest from the loop
(and frees the thread), one that leaves mid-body frees its thread, descriptor and place, every
thread busy falls back to the loop, the connection's socket is never blocking (a blocking one
would let a non-reading client freeze the whole loop), a pipelined request waits for the body
before it, and without the C module the loop sends every body itself."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import random
import shutil
import socket
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

import exporters.server
from exporters import bodysend
from exporters.prometheus import PrometheusExporter
from exporters.server import Request, Response, Route
from ibmon.selfmetrics import SelfMetrics
from tests.unit.test_http_server import _client as http_client

#: 8 MB in 300 parts of varying sizes, like a large fabric's deflated /metrics.
_RNG = random.Random(12)
PARTS = [_RNG.randbytes(_RNG.randrange(1, 56_000)) for _ in range(300)]
BLOB = b"".join(PARTS)
#: Just above ``bodysend.MIN_BYTES`` (and ``FIRST_BYTES``, what the loop sends itself).
SMALL_PARTS = PARTS[:12]
SMALL_BLOB = b"".join(SMALL_PARTS)


@dataclass
class Served:
    exporter: PrometheusExporter
    sends: list[int] = field(default_factory=list)  # parts handed to a sender thread
    produced: list[int] = field(default_factory=list)

    @property
    def port(self) -> int:
        return self.exporter.port


@pytest.fixture
def native() -> None:
    if bodysend.BACKEND != "c":
        pytest.skip("exporters._sendbody was not built (no C compiler when ibmon was installed)")


@pytest.fixture
async def served(monkeypatch: pytest.MonkeyPatch, native: None) -> AsyncIterator[Served]:
    s = Served(PrometheusExporter(listen="127.0.0.1:0", self_metrics=SelfMetrics()))
    real = bodysend._start

    def counted(fd: int, parts: Any, seconds: float) -> Any:
        s.sends.append(len(parts))
        return real(fd, parts, seconds)

    monkeypatch.setattr(bodysend, "_start", counted)
    monkeypatch.setattr(exporters.server, "_SENDER",
                        bodysend.BodySender(threads=2, stall_seconds=0.2))

    async def blob(request: Request) -> Response:
        return Response(list(PARTS), length=len(BLOB))

    async def small_blob(request: Request) -> Response:
        return Response(list(SMALL_PARTS), length=len(SMALL_BLOB))

    async def stream(request: Request) -> Response:
        def pieces() -> Iterator[bytes]:
            for _ in range(1000):
                s.produced.append(1)
                yield b"s" * 65536

        return Response(pieces(), length=65536 * 1000, stream=True)

    async def echo(request: Request) -> Response:
        return Response(b"echo")

    s.exporter.add_routes([Route("/blob", blob), Route("/small-blob", small_blob),
                           Route("/stream", stream), Route("/echo", echo)])
    async with s.exporter:
        yield s


def small_send_buffers(monkeypatch: pytest.MonkeyPatch, size: int = 64 * 1024) -> None:
    """The server's connections take at most about ``size`` bytes at once (a scraper at the
    far end of a slower link), so what the loop sends before the hand-over is a small part of
    a big body and the sender thread sends the rest, whatever ``tcp_wmem`` allows here."""
    made = exporters.server.HttpConnection.connection_made

    def limited(self: exporters.server.HttpConnection, transport: asyncio.BaseTransport) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
        made(self, transport)

    monkeypatch.setattr(exporters.server.HttpConnection, "connection_made", limited)


@contextlib.asynccontextmanager
async def _client(port: int, *, rcvbuf: int | None = None) -> AsyncIterator[
        tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A connection whose receive buffer can be made small (a slow reader's)."""
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    async with http_client(None, sock=sock, limit=1 << 20) as pair:
        yield pair


def _get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()


async def _body(reader: asyncio.StreamReader) -> bytes:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 200 ")
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    return await asyncio.wait_for(reader.readexactly(length), 10)


async def _echo_answers(port: int, within: float = 2.0) -> bool:
    """The loop still answers another client promptly."""
    async with _client(port) as (reader, writer):
        writer.write(_get("/echo"))
        try:
            return await asyncio.wait_for(_body(reader), within) == b"echo"
        except TimeoutError:
            return False


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _blocking_sockets(port: int) -> list[int]:
    """The server's sockets (local ``port``) without O_NONBLOCK: asyncio makes every one of
    them non-blocking, and the loop relies on it."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            with socket.socket(fileno=os.dup(int(name))) as sock:
                if sock.family not in (socket.AF_INET, socket.AF_INET6):
                    continue
                if sock.getsockname()[1] == port and not (
                    fcntl.fcntl(sock.fileno(), fcntl.F_GETFL) & os.O_NONBLOCK
                ):
                    found.append(int(name))
    return found


def test_the_native_sender_is_built_where_a_c_compiler_is() -> None:
    """CI has a compiler: the fast path must really be taken there, not skipped."""
    if shutil.which("cc") or shutil.which("gcc"):
        assert bodysend.BACKEND == "c"


async def test_a_big_body_arrives_whole_from_a_sender_thread(
    served: Served, monkeypatch: pytest.MonkeyPatch,
) -> None:
    small_send_buffers(monkeypatch)
    async with _client(served.port) as (reader, writer):
        for _ in range(3):  # keep-alive: the same connection, again and again
            writer.write(_get("/blob"))
            assert await _body(reader) == BLOB
        writer.write(_get("/echo"))
        assert await _body(reader) == b"echo"
    # What the socket did not take at once, in one hand-over each:
    assert len(served.sends) == 3 and all(0 < n <= len(PARTS) + 1 for n in served.sends)


async def test_the_loop_sends_the_start_and_a_thread_the_rest(served: Served) -> None:
    async with _client(served.port) as (reader, writer):
        writer.write(_get("/small-blob"))
        assert await _body(reader) == SMALL_BLOB
    assert len(served.sends) == 1  # 320 KB: the loop sends 256 KB, a thread the rest


async def test_a_client_that_stops_reading_gets_the_rest_from_the_loop(served: Served) -> None:
    async with _client(served.port, rcvbuf=4096) as (reader, writer):
        writer.write(_get("/blob"))
        await asyncio.sleep(0.8)  # the thread sends for 0.2 s at most
        # Its thread is free again: two more stalled clients at once get one thread each.
        async with _client(served.port, rcvbuf=4096) as (r2, w2), \
                _client(served.port, rcvbuf=4096) as (r3, w3):
            w2.write(_get("/blob"))
            w3.write(_get("/blob"))
            await asyncio.sleep(0.1)
            assert len(served.sends) == 3
            assert await _echo_answers(served.port)
            for r in (reader, r2, r3):  # the slow clients still get every byte, in order
                assert await _body(r) == BLOB


async def test_the_socket_is_never_blocking(served: Served) -> None:
    """While the thread sends and after, the connection's socket stays non-blocking: the same
    connection's next answer is written by the loop to a client that does not read, and were
    the socket blocking, that write would freeze the loop and no other client be answered."""
    async with _client(served.port, rcvbuf=4096) as (reader, writer):
        writer.write(_get("/blob"))
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        first = await reader.readexactly(100_000)
        assert served.sends and _blocking_sockets(served.port) == []  # mid-body
        rest = await asyncio.wait_for(reader.readexactly(len(BLOB) - len(first)), 10)
        assert first + rest == BLOB
        assert _blocking_sockets(served.port) == []
        writer.write(_get("/stream"))
        await asyncio.sleep(0.3)
        assert await _echo_answers(served.port)
        assert sum(served.produced) < 1000  # held back by the client, not produced ahead


async def test_a_client_leaving_mid_body_frees_thread_descriptor_and_place(
    served: Served,
) -> None:
    before = _fds()
    for _ in range(4):  # more than the two threads: each one must come back
        async with _client(served.port, rcvbuf=4096) as (reader, writer):
            writer.write(_get("/blob"))
            await reader.readexactly(100_000)
    for _ in range(100):
        if served.exporter._guard.open == 0 and _fds() <= before:
            break
        await asyncio.sleep(0.05)
    assert served.exporter._guard.open == 0
    assert _fds() <= before
    assert len(served.sends) == 4
    async with _client(served.port) as (reader, writer):
        writer.write(_get("/blob"))
        assert await _body(reader) == BLOB


async def test_every_thread_busy_falls_back_to_the_loop(served: Served) -> None:
    async with contextlib.AsyncExitStack() as stack:
        slow = [await stack.enter_async_context(_client(served.port, rcvbuf=4096))
                for _ in range(2)]
        for _, writer in slow:
            writer.write(_get("/blob"))
        await asyncio.sleep(0.05)  # both threads now wait for their clients
        async with _client(served.port) as (reader, writer):
            writer.write(_get("/blob"))
            assert await _body(reader) == BLOB  # written by the loop
        assert len(served.sends) == 2
        for reader, _ in slow:
            assert await _body(reader) == BLOB


async def test_stop_lets_a_thread_send_finish(served: Served) -> None:
    async with _client(served.port) as (reader, writer):
        writer.write(_get("/blob"))
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        stopping = asyncio.ensure_future(served.exporter.stop())
        got = await asyncio.wait_for(reader.read(len(BLOB) + 1), 10)
        while len(got) < len(BLOB) and (more := await reader.read(1 << 20)):
            got += more
        await asyncio.wait_for(stopping, 10)
    assert b" 200 " in head
    assert got == BLOB


async def test_a_pipelined_request_waits_for_the_body_before_it(
    served: Served, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The transport keeps reading while the thread sends: the next request, sent at once,
    is answered after every byte of the body before it, never in its middle."""
    small_send_buffers(monkeypatch)
    async with _client(served.port, rcvbuf=4096) as (reader, writer):
        writer.write(_get("/blob") + _get("/echo") + _get("/small-blob"))
        assert await _body(reader) == BLOB
        assert await _body(reader) == b"echo"
        assert await _body(reader) == SMALL_BLOB
    assert len(served.sends) == 2


async def test_a_thread_that_cannot_start_leaves_the_body_to_the_loop(
    served: Served, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Out of descriptors or threads (EMFILE, EAGAIN): the scrape is still answered whole."""
    def cannot(fd: int, parts: Any, seconds: float) -> Any:
        served.sends.append(len(parts))
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(bodysend, "_start", cannot)
    small_send_buffers(monkeypatch)
    async with _client(served.port, rcvbuf=4096) as (reader, writer):
        for _ in range(2):
            writer.write(_get("/blob"))
            assert await _body(reader) == BLOB
    assert len(served.sends) == 2


async def test_without_the_c_module_the_loop_sends_every_body(
    served: Served, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bodysend, "_sendbody", None)
    small_send_buffers(monkeypatch)
    async with _client(served.port, rcvbuf=4096) as (reader, writer):
        for path in ("/blob", "/small-blob", "/blob"):
            writer.write(_get(path))
            assert await _body(reader) == (SMALL_BLOB if path == "/small-blob" else BLOB)
    assert served.sends == []


# -- the C module itself ----------------------------------------------------------------------


def _pair(sndbuf: int = 64 * 1024) -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    a.setblocking(False)
    return a, b


def _drain(sock: socket.socket, size: int) -> bytes:
    got = bytearray()
    sock.settimeout(10)
    while len(got) < size:
        got += sock.recv(1 << 20)
    return bytes(got)


def test_send_now_takes_what_fits_and_never_blocks(native: None) -> None:
    a, b = _pair()
    with a, b:
        start = time.monotonic()
        assert bodysend._sendbody.send_now(a.fileno(), list(PARTS), 1000) == 1000  # its limit
        sent = 1000 + bodysend._sendbody.send_now(a.fileno(), list(PARTS), len(BLOB))
        assert 1000 < sent < len(BLOB)
        assert time.monotonic() - start < 0.5
        assert bodysend._sendbody.send_now(a.fileno(), [BLOB[sent:]], len(BLOB)) == 0  # full
        assert _drain(b, sent) == BLOB[:1000] + BLOB[:sent - 1000]


def test_send_now_reports_a_closed_peer(native: None) -> None:
    a, b = _pair()
    b.close()
    with a, pytest.raises(BrokenPipeError):
        bodysend._sendbody.send_now(a.fileno(), list(PARTS), len(BLOB))


def test_a_send_delivers_every_byte_and_reports_them(native: None) -> None:
    a, b = _pair()
    with a, b:
        views = [memoryview(p) for p in PARTS]
        job = bodysend._sendbody.Send(a.fileno(), views, 10.0)
        assert _drain(b, len(BLOB)) == BLOB
        for _ in range(500):
            if not job.running:
                break
            time.sleep(0.01)
        assert job.finish() == (len(BLOB), 0)


def test_a_send_hands_back_the_rest_after_its_time(native: None) -> None:
    a, b = _pair()
    with a, b:
        start = time.monotonic()
        job = bodysend._sendbody.Send(a.fileno(), list(PARTS), 0.2)
        sent, error = job.finish()  # the client reads nothing
        assert 0.15 < time.monotonic() - start < 2.0
        assert error == 0 and 0 < sent < len(BLOB)
        assert _drain(b, sent) == BLOB[:sent]


def test_a_send_reports_a_client_that_went_away(native: None) -> None:
    a, b = _pair()
    with a:
        job = bodysend._sendbody.Send(a.fileno(), list(PARTS), 5.0)
        b.close()
        start = time.monotonic()
        sent, error = job.finish()
        assert error != 0 and sent < len(BLOB)
        assert time.monotonic() - start < 1.0  # not its whole time


def test_a_dropped_send_stops_its_thread_and_frees_its_descriptors(native: None) -> None:
    before = _fds()
    a, b = _pair()
    with a, b:
        job = bodysend._sendbody.Send(a.fileno(), list(PARTS), 30.0)
        assert job.running and _fds() == before + 4  # the pair, the duplicate, the eventfd
        start = time.monotonic()
        del job  # the client reads nothing: only stopping ends the thread
        assert time.monotonic() - start < 1.0
        assert _fds() == before + 2
