"""Big bodies sent from a sender thread (``exporters.bodysend``), attacked as clients do: every
byte arrives in order, a client that stops reading gets the rest from the loop (and frees the
thread), one that leaves mid-body frees its thread, descriptor and place, every thread busy
falls back to the loop, and the connection's socket is non-blocking again afterwards (a
blocking one would let a non-reading client freeze the whole loop)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import random
import socket
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
#: Above ``bodysend.MIN_BYTES`` and far below what a fresh local socket takes at once.
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
async def served(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Served]:
    s = Served(PrometheusExporter(listen="127.0.0.1:0", self_metrics=SelfMetrics()))
    real = bodysend._send_blocking

    def counted(sock: socket.socket, parts: Any, slots: Any) -> Any:
        s.sends.append(len(parts))
        return real(sock, parts, slots)

    monkeypatch.setattr(bodysend, "_send_blocking", counted)
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


async def test_a_big_body_the_socket_takes_at_once_needs_no_thread(served: Served) -> None:
    async with _client(served.port) as (reader, writer):
        writer.write(_get("/small-blob"))
        assert await _body(reader) == SMALL_BLOB
    assert served.sends == []


async def test_a_client_that_stops_reading_gets_the_rest_from_the_loop(served: Served) -> None:
    async with _client(served.port, rcvbuf=4096) as (reader, writer):
        writer.write(_get("/blob"))
        await asyncio.sleep(0.8)  # the thread gives up after 0.2 s without progress
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


async def test_the_socket_is_non_blocking_again_after_a_thread_send(served: Served) -> None:
    """After a thread send, the same connection's next answer is written by the loop to a
    client that does not read: were the socket still blocking, that write would freeze the
    loop and no other client would be answered."""
    async with _client(served.port, rcvbuf=4096) as (reader, writer):
        writer.write(_get("/blob"))
        assert await _body(reader) == BLOB
        for _ in range(100):  # the thread hands the socket back just after the last byte
            if not _blocking_sockets(served.port):
                break
            await asyncio.sleep(0.01)
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
