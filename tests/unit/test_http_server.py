"""The HTTP server (``exporters.server``) on real loopback sockets, attacked as clients do:
routing answers (404, 405 with Allow, HEAD), keep-alive and pipelining, HTTP/1.0, bodies on GET,
malformed and oversize heads, request smuggling framing, a client that never reads, one that
leaves mid-answer, and a handler bug."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

import exporters.prometheus
import exporters.server
from exporters.prometheus import CONTENT_TYPE, PrometheusExporter
from exporters.server import Request, Response, Route
from ibmon.runtime.selfmetrics import SelfMetrics


@dataclass
class Served:
    exporter: PrometheusExporter
    metrics: SelfMetrics
    produced: list[int] = field(default_factory=list)
    finished: list[bool] = field(default_factory=list)

    @property
    def port(self) -> int:
        return self.exporter.port

    def bad_requests(self) -> float:
        return self.metrics.registry.get_sample_value("ibmon_http_bad_requests_total") or 0.0


PIECE = 64 * 1024
PIECES = 1000  # 64 MB, far beyond any socket buffer


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    metrics = SelfMetrics()
    exporter = PrometheusExporter(listen="127.0.0.1:0", self_metrics=metrics)
    s = Served(exporter, metrics)

    async def echo(request: Request) -> Response:
        text = f"{request.method} {request.path} {dict(request.query)} {request.match_info}"
        return Response(text.encode())

    async def big(request: Request) -> Response:
        def pieces() -> Iterator[bytes]:
            try:
                for _ in range(PIECES):
                    s.produced.append(PIECE)
                    yield b"x" * PIECE
            finally:
                s.finished.append(True)

        return Response(pieces(), length=PIECE * PIECES, stream=True)

    async def bug(request: Request) -> Response:
        raise RuntimeError("a bug in a handler")

    async def parts(request: Request) -> Response:
        count, size = int(request.match_info["count"]), int(request.match_info["size"])
        body = [bytes([65 + i % 26]) * size for i in range(count)]
        declared = sum(map(len, body)) + int(request.query.get("off", "0"))
        return Response(body, length=declared)

    exporter.add_routes([Route("/echo", echo), Route("/items/{a}/{b}", echo),
                         Route("/big", big), Route("/bug", bug),
                         Route("/parts/{count}/{size}", parts)])
    async with exporter:
        yield s


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


async def _read_answer(reader: asyncio.StreamReader, *, head: bool = False) -> Answer:
    raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = raw.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    length = 0 if head else int(headers.get("content-length", "0"))
    body = await asyncio.wait_for(reader.readexactly(length), 10)
    return Answer(status, headers, body)


async def _eof(reader: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1), 10) == b""
    except ConnectionResetError:
        return True


@contextlib.asynccontextmanager
async def _client(port: int | None, **kw: Any) -> AsyncIterator[tuple[asyncio.StreamReader,
                                                                      asyncio.StreamWriter]]:
    host = None if port is None else "127.0.0.1"
    reader, writer = await asyncio.open_connection(host, port, **kw)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def _get(path: str, *extra: str, method: str = "GET", version: str = "1.1") -> bytes:
    lines = [f"{method} {path} HTTP/{version}", "Host: x", *extra, "", ""]
    return "\r\n".join(lines).encode()


async def test_routes_404_405_and_head(served: Served) -> None:
    async with _client(served.port) as (reader, writer):
        writer.write(_get("/nope"))
        missing = await _read_answer(reader)
        assert (missing.status, missing.body) == (404, b"404: Not Found")
        writer.write(_get("/nope", method="POST"))
        assert (await _read_answer(reader)).status == 404
        writer.write(_get("/metrics", method="POST"))
        answer = await _read_answer(reader)
        assert answer.status == 405
        assert answer.headers["allow"] == "GET, HEAD"
        writer.write(_get("/metrics/"))  # exact paths only
        assert (await _read_answer(reader)).status == 404
        writer.write(_get("/metrics", "Accept-Encoding: identity", method="HEAD"))
        head = await _read_answer(reader, head=True)
        writer.write(_get("/metrics", "Accept-Encoding: identity"))
        full = await _read_answer(reader)  # HEAD sent no body: this is the next answer
        assert head.status == full.status == 200
        assert head.headers["content-type"] == full.headers["content-type"] == CONTENT_TYPE
        assert int(head.headers["content-length"]) > 0
        assert full.body.startswith(b"# HELP")
        writer.write(_get("/items/0x1/%32?x=%C2%B2&x=2&y="))
        echoed = await _read_answer(reader)
        assert echoed.body == b"GET /items/0x1/2 {'x': '\xc2\xb2', 'y': ''} {'a': '0x1', 'b': '2'}"
        writer.write(_get("/items/0x1/"))  # an empty segment matches no pattern
        assert (await _read_answer(reader)).status == 404
        for deeper in ("/items/0x1/2/3", "/items/0x1"):  # nor more or fewer segments
            writer.write(_get(deeper))
            assert (await _read_answer(reader)).status == 404
        writer.write(_get("http://example/echo?q=1"))  # absolute form
        assert (await _read_answer(reader)).body == b"GET /echo {'q': '1'} {}"
        # a header sent twice is one list (RFC 9110 5.3): gzip was offered
        writer.write(_get("/metrics", "Accept-Encoding: gzip", "Accept-Encoding: br"))
        assert (await _read_answer(reader)).headers["content-encoding"] == "gzip"


async def test_pipelined_requests_are_answered_in_order_on_one_connection(
    served: Served,
) -> None:
    async with _client(served.port) as (reader, writer):
        writer.write(b"".join(_get(f"/items/{i}/{i}") for i in range(20)))
        for i in range(20):
            answer = await _read_answer(reader)
            assert answer.body.endswith(f"{{'a': '{i}', 'b': '{i}'}}".encode())
        writer.write(_get("/echo", "Connection: close"))
        answer = await _read_answer(reader)
        assert answer.headers["connection"] == "close"
        assert await _eof(reader)


async def test_junk_pipelined_after_a_request_is_refused_once_that_one_is_answered(
    served: Served,
) -> None:
    async with _client(served.port) as (reader, writer):
        writer.write(_get("/echo") + b"A" * 64)  # a first word longer than any method
        assert (await _read_answer(reader)).status == 200
        refused = await asyncio.wait_for(_read_answer(reader), 3)  # at once, not at a timeout
        assert refused.status == 400
        assert await _eof(reader)
    assert served.bad_requests() == 1


async def test_http_10_gets_its_answer_then_the_connection_closes(served: Served) -> None:
    async with _client(served.port) as (reader, writer):
        writer.write(b"GET /echo HTTP/1.0\r\n\r\n")
        answer = await _read_answer(reader)
        assert (answer.status, answer.body) == (200, b"GET /echo {} {}")
        assert await _eof(reader)
    async with _client(served.port) as (reader, writer):
        writer.write(b"GET /echo HTTP/1.0\r\n\r\n")
        writer.write_eof()  # a client that half-closes still gets its answer
        assert (await _read_answer(reader)).status == 200


#: One write with the head; just over the native send's threshold; hundreds of parts.
@pytest.mark.parametrize(("count", "size"), [(3, 1000), (20, 20_000), (330, 26_000)])
async def test_a_body_in_parts_arrives_whole_and_in_order(served: Served, count: int,
                                                          size: int) -> None:
    want = b"".join(bytes([65 + i % 26]) * size for i in range(count))
    async with _client(served.port) as (reader, writer):
        for _ in range(2):  # keep-alive: the next answer is framed right after it
            writer.write(_get(f"/parts/{count}/{size}"))
            answer = await _read_answer(reader)
            assert (answer.status, answer.body) == (200, want)
    async with _client(served.port) as (reader, writer):
        writer.write(_get(f"/parts/{count}/{size}", version="1.0"))
        assert (await _read_answer(reader)).body == want
        assert await _eof(reader)


@pytest.mark.parametrize("off", [-1, 1])
async def test_parts_that_disagree_with_their_length_are_never_a_complete_answer(
    served: Served, off: int,
) -> None:
    async with _client(served.port) as (reader, writer):
        writer.write(_get(f"/parts/3/1000?off={off}"))
        data = await asyncio.wait_for(reader.read(), 10)  # until the server closes
    head, _, body = data.partition(b"\r\n\r\n")
    if head:  # too little: the head went out, the body stops short of it
        assert int(head.split(b"content-length: ")[1].split(b"\r\n")[0]) > len(body)


async def test_a_small_body_on_get_is_drained_a_big_one_closes(served: Served) -> None:
    async with _client(served.port) as (reader, writer):
        writer.write(_get("/echo", "Content-Length: 5") + b"hello" + _get("/echo"))
        assert (await _read_answer(reader)).status == 200
        assert (await _read_answer(reader)).status == 200  # same connection, next request
        writer.write(_get("/echo", "Transfer-Encoding: chunked") + b"5\r\nhello\r\n0\r\n\r\n")
        assert (await _read_answer(reader)).status == 200
    async with _client(served.port) as (reader, writer):
        writer.write(_get("/echo", "Content-Length: 100000000") + b"x" * 100_000)
        answer = await _read_answer(reader)
        assert answer.status == 200
        assert answer.headers["connection"] == "close"
        assert await _eof(reader)
    assert served.exporter._guard.open == 0


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (_get("/echo", "X: " + "a" * 20_000), 431),  # a header flood
        (b"GET /" + b"a" * 20_000, 431),  # a request line that never ends
        (_get("/echo", "Content-Length: 3", "Transfer-Encoding: chunked") + b"0\r\n\r\n", 400),
        (_get("/echo", "Content-Length: 3", "Content-Length: 4") + b"abcd", 400),
        (_get("/echo", version="9.9"), 400),
        (_get("/echo", version="2.0"), 400),  # HTTP/2 is a binary protocol, never this text
        (b"GET /echo HTTP/1.1\r\n\r\n", 400),  # HTTP/1.1 without Host
        (b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + b"A" * 15, 400),  # TLS hello
        (b"\x00\x01\x02", 400),
        (b"A" * 64, 400),  # a "method" longer than any: not HTTP, refused without waiting
        (b"GET\x00/ HTTP/1.1\r\n", 400),
        (_get("/echo", "Transfer-Encoding: gzip"), 501),
    ],
)
async def test_malformed_requests_are_answered_and_closed(served: Served, raw: bytes,
                                                          status: int) -> None:
    async with _client(served.port) as (reader, writer):
        writer.write(raw)
        answer = await _read_answer(reader)
        assert answer.status == status
        assert answer.headers["connection"] == "close"
        assert await _eof(reader)
    assert served.bad_requests() == 1
    assert served.exporter._guard.open == 0


@pytest.mark.parametrize(
    "body",
    [b"zz\r\nhello\r\n0\r\n\r\n",  # a chunk size that is not hex
     b"5\r\nhelloXX0\r\n\r\n",  # a chunk not followed by its CRLF
     b"-5\r\nhello\r\n0\r\n\r\n",  # a negative chunk size
     b"5\r\nhello\r\n0\r\nBad Trailer\r\n\r\n"],  # a trailer that is no header line
)
async def test_a_malformed_chunked_body_is_answered_400_and_closed(served: Served,
                                                                   body: bytes) -> None:
    """The head is valid (its handler has been started), the body that came with it is not:
    the client gets the promised 400, not a silent close, and nothing else."""
    async with _client(served.port) as (reader, writer):
        writer.write(_get("/echo", "Transfer-Encoding: chunked") + body)
        answer = await _read_answer(reader)
        assert answer.status == 400
        assert answer.headers["connection"] == "close"
        assert await _eof(reader)
    assert served.bad_requests() == 1


async def test_a_client_that_never_reads_holds_back_the_answer_not_memory(
    served: Served,
) -> None:
    """Backpressure: the answer stops at the socket buffers (pause_writing), it is not produced
    into the process's memory; reading it all later gets every byte."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", served.port))
    async with _client(None, sock=sock, limit=1 << 20) as (reader, writer):
        writer.write(_get("/big"))
        for _ in range(5):  # let the server write as much as it will
            await asyncio.sleep(0.1)
        held = sum(served.produced)
        assert held < 16 * 1024 * 1024  # socket buffers and a piece, far from 64 MB
        answer = await _read_answer(reader)
        assert len(answer.body) == PIECE * PIECES
        assert served.finished == [True]


async def test_a_client_that_never_reads_a_big_ready_body_gets_no_copy_of_it_buffered(
    served: Served,
) -> None:
    """A body already in memory (the deflated /metrics parts) is handed to the socket as the
    client reads, not copied into the transport's buffer all at once: a scraper that stalls
    must not cost the process another copy of the body."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", served.port))
    count, size = 1000, 64 * 1024  # 64 MB
    async with _client(None, sock=sock, limit=1 << 20) as (reader, writer):
        writer.write(_get(f"/parts/{count}/{size}"))
        for _ in range(5):  # let the server write as much as it will
            await asyncio.sleep(0.1)
        (conn,) = served.exporter._guard._open
        assert conn.transport is not None
        assert conn.transport.get_write_buffer_size() < 4 * 1024 * 1024
        answer = await _read_answer(reader)
        assert len(answer.body) == count * size


async def test_a_client_leaving_mid_answer_frees_its_place(served: Served) -> None:
    async with _client(served.port) as (reader, writer):
        writer.write(_get("/big"))
        await reader.readexactly(PIECE)
    for _ in range(100):
        if served.finished:
            break
        await asyncio.sleep(0.05)
    assert served.finished == [True]  # the body's producer was closed, not run to the end
    assert sum(served.produced) < PIECE * PIECES
    assert served.exporter._guard.open == 0
    async with _client(served.port) as (reader, writer):
        writer.write(_get("/echo"))
        assert (await _read_answer(reader)).status == 200


async def test_a_handler_bug_is_a_500_and_one_logged_line(
    served: Served, monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines: list[tuple[str, dict[str, Any]]] = []

    class Recorder:
        def error(self, event: str, **kw: Any) -> None:
            lines.append((event, kw))

    monkeypatch.setattr(served.exporter._limited_log, "_log", Recorder())
    async with _client(served.port) as (reader, writer):
        for _ in range(3):
            writer.write(_get("/bug"))
            assert (await _read_answer(reader)).status == 500
        writer.write(_get("/echo"))  # the connection goes on
        assert (await _read_answer(reader)).status == 200
    assert [event for event, _ in lines] == ["http_handler_error"]
    assert isinstance(lines[0][1]["exc_info"], RuntimeError)


async def test_an_idle_keep_alive_connection_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exporters.prometheus, "KEEPALIVE_TIMEOUT", 0.2)
    async with PrometheusExporter(listen="127.0.0.1:0", self_metrics=SelfMetrics()) as exp:
        async with _client(exp.port) as (reader, writer):
            writer.write(_get("/"))
            assert (await _read_answer(reader)).status == 200
            assert await _eof(reader)
        assert exp._guard.open == 0


async def test_a_request_that_comes_back_before_the_keep_alive_timeout_keeps_the_connection(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The idle timer stops when the client comes back: a request that takes a moment to
    arrive whole is answered, not cut off when the idle timeout would have expired."""
    monkeypatch.setattr(exporters.prometheus, "KEEPALIVE_TIMEOUT", 1.0)
    async with (PrometheusExporter(listen="127.0.0.1:0", self_metrics=SelfMetrics()) as exp,
                _client(exp.port) as (reader, writer)):
        writer.write(_get("/"))
        assert (await _read_answer(reader)).status == 200
        await asyncio.sleep(0.1)
        request = _get("/")
        writer.write(request[:5])  # back within the timeout, the rest after it
        await asyncio.sleep(1.2)
        writer.write(request[5:])
        assert (await _read_answer(reader)).status == 200


async def test_a_body_that_never_completes_is_closed_a_linger_after_the_answer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A GET that promises a body and stops sending it gets its answer, then ``linger_time``
    for the rest, then the connection is closed: it cannot hold a place by trickling nothing."""
    monkeypatch.setattr(exporters.prometheus, "LINGER_TIME", 0.2)
    async with PrometheusExporter(listen="127.0.0.1:0", self_metrics=SelfMetrics()) as exp:
        async with _client(exp.port) as (reader, writer):
            writer.write(_get("/", "Content-Length: 10") + b"12345")
            assert (await _read_answer(reader)).status == 200
            assert await asyncio.wait_for(_eof(reader), 3)
        assert exp._guard.open == 0


async def test_stop_lets_the_answer_in_progress_finish(served: Served) -> None:
    async with _client(served.port) as (reader, writer):
        writer.write(_get("/big"))
        head = await reader.readuntil(b"\r\n\r\n")
        assert b" 200 " in head
        async with _client(served.port) as (idle_reader, idle_writer):
            idle_writer.write(_get("/echo"))
            await _read_answer(idle_reader)
            stopping = asyncio.ensure_future(served.exporter.stop())
            assert await _eof(idle_reader)  # idle: closed at once
            got = 0
            while chunk := await reader.read(1 << 20):
                got += len(chunk)
            # done as soon as the last connection is: not at the end of the shutdown timeout
            await asyncio.wait_for(stopping, exporters.prometheus.SHUTDOWN_TIMEOUT / 3)
    assert got == PIECE * PIECES


async def test_a_client_leaving_mid_request_is_not_a_bad_request(served: Served) -> None:
    async with _client(served.port) as (reader, writer):
        writer.write(b"GET /echo HTTP/1.1\r\nHost: x\r\n")
        writer.write_eof()
        assert await _eof(reader)
    assert served.bad_requests() == 0
    assert served.exporter._guard.open == 0


async def test_a_big_body_gives_the_loop_a_turn_between_writes(
    served: Served, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While a body leaves in batches, timers and other clients run between them: taking the
    GIL back after each send can wait for a bulk thread, so batches written back to back in one
    turn held the loop (the probe saw 100-400 ms with a fabric's 30 MB gzip body)."""
    monkeypatch.setattr(exporters.server, "COALESCE", 16 * 1024)  # batches the socket takes whole
    order: list[str] = []
    transport_type: Any = asyncio.selector_events._SelectorSocketTransport  # type: ignore[attr-defined]
    original = transport_type.writelines

    def writelines(self: Any, data: Any) -> None:
        data = list(data)
        if sum(map(len, data)) >= 16 * 1024:
            order.append("write")
        original(self, data)

    monkeypatch.setattr(transport_type, "writelines", writelines)

    async def ticker() -> None:
        while True:
            order.append("turn")
            await asyncio.sleep(0)

    tick = asyncio.create_task(ticker())
    try:
        async with _client(served.port) as (reader, writer):
            writer.write(_get("/parts/40/10000"))  # 400 kB in parts: the batched path
            answer = await _read_answer(reader)
    finally:
        tick.cancel()
    assert answer.body == b"".join(bytes([65 + i % 26]) * 10000 for i in range(40))
    writes = [i for i, what in enumerate(order) if what == "write"]
    assert len(writes) >= 20
    assert all(b - a > 1 for a, b in itertools.pairwise(writes)), "two batches in one turn"


def test_an_answer_has_the_floor_or_one_second_per_mebibyte_to_leave() -> None:
    """A scraper on a busy host gets ``SEND_FLOOR`` for any answer; a big plain-text body gets
    as long as it takes at 1 MiB/s, so a slow but steady reader is never cut off."""
    floor, rate = exporters.server.SEND_FLOOR, exporters.server.SEND_RATE
    assert exporters.server.send_deadline(0) == floor
    assert exporters.server.send_deadline(1024) == floor
    assert exporters.server.send_deadline(62 * rate) == pytest.approx(62.0)
