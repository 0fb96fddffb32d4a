"""A small asyncio HTTP/1.1 server: one ``h11.Connection`` per connection, a table of routes.

ibmon serves a handful of GET routes (``/metrics``, the JSON API, health checks) to scrapers
and operators; it never needs a client, cookies, multipart, websockets or middleware stacks.
aiohttp brought all of those at import (10.9 MB of resident memory on every compute node) and
its request machinery was a good part of the CPU of a scrape. ``h11`` (python-hyper's HTTP/1.1
state machine, 0.4 MB) parses and frames; this module adds what ibmon relies on around it:

- routes: exact paths plus patterns with ``{name}`` segments (``/api/v1/ports/{guid}/{port}``);
  404 for an unknown path, 405 with ``Allow`` for a method other than GET/HEAD, HEAD answers
  the headers of GET without the body;
- keep-alive (closed after ``keepalive_timeout`` idle), ``Connection: close``, HTTP/1.0,
  pipelined requests (answered in order, one at a time; reading pauses meanwhile, so a client
  cannot queue unbounded data);
- a request body (meaningless on GET) is read and dropped, at most ``MAX_BODY`` bytes for at
  most ``linger_time`` after the answer; a bigger one, or a slower one, closes the connection;
- write backpressure: a client that does not read stops the answer at the transport's high-water
  mark (``pause_writing``) instead of growing the buffer; a client that goes away mid-answer
  cancels its handler;
- a send deadline: every answer has ``send_deadline(length)`` seconds (``SEND_FLOOR``, or
  ``length / SEND_RATE`` for a big body) to leave; a client that reads slower than that is cut
  off (``send_timeout``), so one that never reads cannot hold a connection, its buffers and its
  place under the cap for ever;
- the loop writes every body itself through the transport, ``COALESCE`` bytes at a time;
- malformed requests (including ``Transfer-Encoding`` together with ``Content-Length``, a
  request smuggling vector, and HTTP versions other than 1.x) are answered 400 (431 for an
  oversize head) and the connection is closed; ``ServerLog`` counts and logs them.

Admission, the read deadline and eviction are the ``ConnectionGuard``'s (``exporters.http``),
which wraps each ``HttpConnection`` and is told when a request begins and ends.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, cast
from urllib.parse import parse_qsl, unquote, urlsplit

import h11

__all__ = [
    "MAX_BODY",
    "MAX_HEAD",
    "Handler",
    "HttpApp",
    "HttpConnection",
    "HttpError",
    "Request",
    "Response",
    "Route",
    "peer_address",
    "send_deadline",
]

#: Bytes of request line plus headers; more is answered 431 (aiohttp allowed 8 KB per line).
MAX_HEAD = 16 * 1024
#: Bytes of request body read and dropped before the connection is closed instead.
MAX_BODY = 64 * 1024
#: A body in pieces up to this size is joined and sent with its head in one write.
ONE_WRITE = 256 * 1024
#: Bytes per write of a bigger body that the loop sends (``_write_coalesced``).
COALESCE = 1024 * 1024
#: Seconds any answer may take to leave, however small: a scraper on a busy host or a slow
#: link gets this long; Prometheus's own scrape_timeout defaults to 10 s.
SEND_FLOOR = 10.0
#: Bytes per second a big answer is allowed at the slowest (1 MiB/s: a 62 MB plain-text
#: fabric body gets 62 s, a 5 MB gzip one the floor). A reader slower than this is cut off.
SEND_RATE = 1024 * 1024
#: Characters a method token may hold (RFC 9110 ``tchar``): anything else is not HTTP.
_TCHAR = frozenset(b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
#: A request's first bytes are checked once this many have arrived without a space.
_METHOD_MAX = 32
TEXT = "text/plain; charset=utf-8"
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
            405: "Method Not Allowed", 413: "Payload Too Large", 431:
            "Request Header Fields Too Large", 500: "Internal Server Error",
            501: "Not Implemented", 503: "Service Unavailable"}


class Request:
    """What a handler sees of one request: method, decoded path, query, headers (lower-case
    names), the ``{name}`` parts of a pattern route, and whether basic auth was skipped."""

    __slots__ = ("_query", "anonymous", "headers", "match_info", "method", "path", "peer",
                 "query_string")

    def __init__(self, method: str, path: str, query_string: str, headers: dict[str, str],
                 peer: str | None = None) -> None:
        self.method = method
        self.path = path
        self.query_string = query_string
        self.headers = headers
        self.peer = peer
        self.match_info: dict[str, str] = {}
        #: Set on a request to a public path that came without valid credentials while basic
        #: auth is on: such answers leave out anything descriptive (source names, errors).
        self.anonymous = False
        self._query: dict[str, str] | None = None

    @property
    def query(self) -> Mapping[str, str]:
        """The query parameters, percent-decoded; the first of a repeated name wins."""
        if self._query is None:
            query: dict[str, str] = {}
            for name, value in parse_qsl(self.query_string, keep_blank_values=True):
                query.setdefault(name, value)
            self._query = query
        return self._query


class Response:
    """Status, headers and a body: bytes, or pieces (``stream``: produced as they are sent,
    the loop gets a turn between pieces). ``length`` is the Content-Length, which HEAD keeps."""

    __slots__ = ("body", "headers", "length", "status", "stream")

    def __init__(self, body: bytes | Iterable[bytes] = b"", *, status: int = 200,
                 content_type: str = TEXT, headers: Iterable[tuple[str, str]] = (),
                 length: int | None = None, stream: bool = False) -> None:
        self.status = status
        self.body = body
        self.stream = stream
        if length is None:
            if not isinstance(body, bytes):
                raise ValueError("a body in pieces needs its length")
            length = len(body)
        self.length = length
        self.headers: list[tuple[str, str]] = [("content-type", content_type), *headers]


class HttpError(Exception):
    """Raised by a handler to answer with ``status`` (400, 401, 404, ...) instead."""

    def __init__(self, status: int, body: bytes | str | None = None, *,
                 content_type: str = TEXT, headers: Iterable[tuple[str, str]] = ()) -> None:
        if body is None:
            body = f"{status}: {_REASONS.get(status, 'Error')}"
        self.status = status
        self.body = body.encode() if isinstance(body, str) else body
        self.content_type = content_type
        self.headers = tuple(headers)
        super().__init__(status, self.body[:100])

    def response(self) -> Response:
        return Response(self.body, status=self.status, content_type=self.content_type,
                        headers=self.headers)


Handler = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True, slots=True)
class Route:
    """A GET (and HEAD) route: an exact path, or one with ``{name}`` segments."""

    path: str
    handler: Handler


def send_deadline(length: int) -> float:
    """Seconds an answer with a body of ``length`` bytes has to leave, from its first write."""
    return max(SEND_FLOOR, length / SEND_RATE)


class _Log(Protocol):
    def bad_request(self, peer: str | None, error: str, *, tls: bool = False) -> None: ...
    def handler_error(self, peer: str | None, exc: BaseException) -> None: ...


class _Hooks(Protocol):
    """What the connection tells its guard: a request is being answered (False: not on
    this connection, answer 503), or is done; or that an answer missed its send deadline."""

    def begin(self, path: str) -> bool: ...
    def end(self) -> None: ...
    def close(self, reason: str) -> None: ...


#: Answers a request that needs credentials it lacks (or None to go on); may set ``anonymous``.
Authorize = Callable[[Request], Response | None]


class HttpApp:
    """The routes and per-listener settings every connection of a listener shares."""

    def __init__(self, log: _Log, *, keepalive_timeout: float, linger_time: float,
                 authorize: Authorize | None = None) -> None:
        self.log = log
        self.keepalive_timeout = keepalive_timeout
        self.linger_time = linger_time
        self.authorize = authorize
        self.frozen = False
        self._exact: dict[str, Handler] = {}
        self._patterns: list[tuple[tuple[str | None, ...], tuple[str, ...], Handler]] = []

    def add(self, route: Route) -> None:
        if self.frozen:
            raise RuntimeError("add routes before start()")
        parts = route.path.split("/")
        if not any(p.startswith("{") for p in parts):
            self._exact[route.path] = route.handler
            return
        segments = tuple(None if p.startswith("{") and p.endswith("}") else p for p in parts)
        names = tuple(p[1:-1] for p in parts if p.startswith("{") and p.endswith("}"))
        self._patterns.append((segments, names, route.handler))

    def resolve(self, path: str) -> tuple[Handler, dict[str, str]] | None:
        handler = self._exact.get(path)
        if handler is not None:
            return handler, {}
        parts = path.split("/")
        for segments, names, found in self._patterns:
            if len(segments) != len(parts):
                continue
            values: list[str] = []
            for want, got in zip(segments, parts, strict=True):
                if want is None:
                    if not got:
                        break
                    values.append(got)
                elif want != got:
                    break
            else:
                return found, dict(zip(names, values, strict=True))
        return None

    async def handle(self, request: Request) -> Response:
        """Authorization, routing and the handler; errors become their answers."""
        try:
            if self.authorize is not None and (refused := self.authorize(request)) is not None:
                return refused
            found = self.resolve(request.path)
            if found is None:
                raise HttpError(404)
            if request.method not in ("GET", "HEAD"):
                raise HttpError(405, headers=(("allow", "GET, HEAD"),))
            request.match_info = found[1]
            return await found[0](request)
        except HttpError as exc:
            return exc.response()


_date_cache: list[tuple[int, str]] = [(0, "")]


def _date() -> str:
    """The ``Date`` header, formatted once a second."""
    now = int(time.time())
    if _date_cache[0][0] != now:
        _date_cache[0] = (now, time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(now)))
    return _date_cache[0][1]


def _raw_error(status: int, message: str) -> bytes:
    """A complete answer written without h11 (whose state is an error by then)."""
    body = f"{status}: {message}\n".encode()
    return (f"HTTP/1.1 {status} {_REASONS.get(status, 'Bad Request')}\r\n"
            f"Content-Type: {TEXT}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
            f"Date: {_date()}\r\n\r\n").encode() + body


def peer_address(transport: asyncio.BaseTransport) -> str | None:
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and peer:
        return str(peer[0])
    return None if peer is None else str(peer)


class _Placeholder:
    """Stands for a whole body in one h11 ``Data`` event: h11 needs only its length and hands
    the object back where the bytes go (h11's documented support for ``sendfile``)."""

    __slots__ = ("length",)

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length


def _framed(conn: h11.Connection, pieces: list[bytes]) -> list[bytes | memoryview]:
    """``pieces`` as h11 frames them, told to h11 as one event: a gzip ``/metrics`` body is a
    few hundred deflate parts, and an h11 event per part was 0.8 ms of the loop's time per
    scrape. h11 still checks the total against ``Content-Length``."""
    placeholder = _Placeholder(sum(len(p) for p in pieces))
    framed: list[object] = list(
        conn.send_with_data_passthrough(h11.Data(data=cast(bytes, placeholder))) or ())
    out: list[bytes | memoryview] = []
    for item in framed:
        if item is placeholder:
            out.extend(pieces)
        else:
            out.append(cast(bytes, item))
    return out


class HttpConnection(asyncio.Protocol):
    """One client connection: h11 parses, one request is answered at a time.

    ``hooks`` (the guard) learn when a request begins (no read deadline while it is answered;
    evicted at the cap only once its writes have stalled) and ends. ``close_when_idle`` is how
    a stopping listener lets the answer in progress finish before the connection closes.
    """

    def __init__(self, app: HttpApp, hooks: _Hooks) -> None:
        self._app = app
        self._hooks = hooks
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        self._transport: asyncio.Transport | None = None
        self._peer: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._writable = asyncio.Event()
        self._writable.set()
        self._timer: asyncio.TimerHandle | None = None
        self._start = b""  # first bytes of the next request, until its method is checked
        self._checked = False
        self._fresh = True  # no request has arrived on this connection yet
        self._body = 0  # bytes of request body dropped so far
        self._reading = True
        self._closing = False
        self._close_after = False  # the listener stops: close once this answer is sent
        self._eof = False  # the client closed its side
        self._tls = False
        self.lost = False
        #: Loop time since when writing has been paused (the client is not reading), or None.
        self.stalled_since: float | None = None

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._peer = peer_address(transport)
        self._tls = transport.get_extra_info("ssl_object") is not None

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        self._cancel_timer()  # a keep-alive connection came back
        if not self._checked and not self._check_start(data):
            return
        self._h11.receive_data(data)
        self._process()

    def eof_received(self) -> bool | None:
        """The client closed its side: an answer in progress is still sent (HTTP/1.0 clients
        and ``shutdown(SHUT_WR)`` do this), then the connection closes."""
        self._eof = True
        self._h11.receive_data(b"")
        if self._task is None or self._tls:
            self._process()
            return None  # (a TLS transport cannot stay half-open)
        return True  # keep the transport open for the answer

    def pause_writing(self) -> None:
        self._writable.clear()
        self.stalled_since = asyncio.get_running_loop().time()

    def resume_writing(self) -> None:
        self._writable.set()
        self.stalled_since = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._closing = True
        self._cancel_timer()
        if self._task is not None and not self._task.done():
            self._task.cancel()

    # -- parsing ---------------------------------------------------------------------------

    def _check_start(self, data: bytes) -> bool:
        """Refuse at once what cannot be a request line (TLS to a plain port, binary junk):
        h11 would wait for a line end that never comes."""
        self._start += data[: _METHOD_MAX - len(self._start) + 1]
        method, space, _ = self._start.partition(b" ")
        if not space and len(self._start) <= _METHOD_MAX and all(b in _TCHAR for b in method):
            return True  # nothing wrong yet; wait for more
        self._checked = True
        if method and all(b in _TCHAR for b in method) and space:
            self._start = b""
            return True
        tls = self._start.startswith(b"\x16\x03")
        self._bad(400, f"not an HTTP request line: {self._start[:_METHOD_MAX]!r}", tls=tls)
        return False

    def _process(self) -> None:
        """Take the events h11 has: a request starts an answer, body data is dropped."""
        conn = self._h11
        while not self._closing:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                if self._eof:  # went away mid-request: not a malformed request
                    self._close()
                else:
                    self._bad(exc.error_status_hint, str(exc))
                return
            if event is h11.NEED_DATA:
                if not self._reading and conn.their_state is h11.SEND_BODY:
                    self._resume_reading()
                return
            if event is h11.PAUSED:
                # The next request is buffered: wait until this answer is sent.
                self._pause_reading()
                return
            if isinstance(event, h11.Request):
                self._request(event)
            elif isinstance(event, h11.Data):
                self._body += len(event.data)
                if self._body > MAX_BODY:  # a GET does not need a body this big: no more
                    self._close_after = True  # reading; the answer (if any) ends with close
                    self._pause_reading()
                    if self._task is None:
                        self._close()
                    return
            elif isinstance(event, h11.EndOfMessage):
                if self._task is None and conn.our_state is h11.DONE:
                    self._next_cycle()  # the body ended after the answer (lingering)
                    return
            elif isinstance(event, h11.ConnectionClosed):
                self._close()
                return

    def _request(self, event: h11.Request) -> None:
        if event.http_version not in (b"1.1", b"1.0"):
            self._bad(400, f"unsupported HTTP version {event.http_version!r}")
            return
        size = len(event.method) + len(event.target) + 12
        size += sum(len(name) + len(value) + 4 for name, value in event.headers)
        if size > MAX_HEAD:  # h11 only bounds a head that arrives in several pieces
            self._bad(431, f"request head of {size} bytes")
            return
        headers: dict[str, str] = {}
        for name, value in event.headers:
            key = name.decode("latin-1")
            text = value.decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        if "transfer-encoding" in headers and "content-length" in headers:
            self._bad(400, "both Transfer-Encoding and Content-Length (request smuggling?)")
            return
        target = event.target.decode("ascii", "replace")
        if "://" in target and not target.startswith("/"):  # absolute form (proxies)
            split = urlsplit(target)
            target, query = split.path or "/", split.query
        else:
            target, _, query = target.partition("?")
        request = Request(event.method.decode("ascii"), unquote(target), query, headers,
                          self._peer)
        self._body = 0
        self._fresh = False
        if not self._hooks.begin(request.path):
            if self._transport is not None:
                self._transport.write(_raw_error(503, "only health checks are answered on a"
                                                      " connection past the cap"))
            self._close()
            return
        self._task = asyncio.ensure_future(self._answer(request))

    # -- answering -------------------------------------------------------------------------

    async def _answer(self, request: Request) -> None:
        try:
            try:
                response = await self._app.handle(request)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug in a handler: answer 500, keep the traceback
                self._app.log.handler_error(self._peer, exc)
                response = HttpError(500).response()
            try:
                async with asyncio.timeout(send_deadline(response.length)):
                    await self._send(request, response)
            except TimeoutError:
                self._send_timeout()
        except (asyncio.CancelledError, ConnectionError, h11.LocalProtocolError):
            self._close()
        finally:
            self._task = None
            self._hooks.end()
        if not self._closing:
            self._after_answer()

    async def _send(self, request: Request, response: Response) -> None:
        transport = self._transport
        if transport is None:
            raise ConnectionResetError("closed before the answer")
        conn = self._h11
        headers = [*response.headers, ("content-length", str(response.length)),
                   ("date", _date())]
        if self._close_after or (conn.their_state is h11.SEND_BODY
                                 and self._unbounded_body(request)):
            headers.append(("connection", "close"))  # stopping, or a body not worth draining
        head = conn.send(h11.Response(status_code=response.status, headers=headers,
                                      reason=_REASONS.get(response.status, "")))
        body = response.body
        if request.method == "HEAD" or not response.length:
            transport.write(head + conn.send(h11.EndOfMessage()))
            return
        if not response.stream and response.length <= ONE_WRITE:
            # Head, body and end in one write: one send() for the typical scrape, not six.
            # (Bigger bodies are not joined: that would copy megabytes per answer.)
            data = body if isinstance(body, bytes) else b"".join(body)
            transport.writelines([head, *(conn.send_with_data_passthrough(h11.Data(data=data))
                                          or ()), conn.send(h11.EndOfMessage())])
            if not self._writable.is_set():
                await self._writable.wait()  # the next request waits for this answer's room
            return
        pieces: Iterable[bytes] = (body,) if isinstance(body, bytes) else body
        if response.stream:
            transport.write(head)
            for piece in pieces:
                self._check_open()
                if piece:
                    transport.writelines(
                        conn.send_with_data_passthrough(h11.Data(data=piece)) or ())
                if not self._writable.is_set():
                    await self._writable.wait()  # the client reads slower than we write
                else:
                    await asyncio.sleep(0)  # a big body never holds the loop for long
        else:
            parts: list[bytes | memoryview] = [head, *_framed(conn, [p for p in pieces if p])]
            await self._write_coalesced(transport, parts)
        self._check_open()
        transport.write(conn.send(h11.EndOfMessage()))
        if not self._writable.is_set():
            await self._writable.wait()  # the deadline covers the end of the body too

    def _send_timeout(self) -> None:
        """The answer missed its deadline: drop the connection and what it had buffered."""
        self._hooks.close("send_timeout")  # counted, logged, aborted by the guard
        self._close()  # and nothing more happens on this connection

    async def _write_coalesced(
        self, transport: asyncio.Transport, parts: list[bytes | memoryview]
    ) -> None:
        """Write ``parts`` about ``COALESCE`` bytes at a time, one write per turn of the loop.

        Not part by part: each write is a ``send``, and each gives the GIL away (a gzip body
        is a few hundred parts). Not all in one turn either: while a bulk thread runs, taking
        the GIL back after a ``send`` can wait several switch intervals, so a 30 MB body
        written in one turn held the loop's timers for 100-400 ms."""
        batch: list[bytes | memoryview] = []
        size = 0
        for i, part in enumerate(parts):
            batch.append(part)
            size += len(part)
            if size < COALESCE and i + 1 < len(parts):
                continue
            self._check_open()
            transport.writelines(batch)
            batch = []
            size = 0
            if not self._writable.is_set():
                await self._writable.wait()  # the client reads slower than we write
            elif i + 1 < len(parts):
                await asyncio.sleep(0)

    def _check_open(self) -> None:
        if self.lost or self._transport is None:
            raise ConnectionResetError("client went away")

    @staticmethod
    def _unbounded_body(request: Request) -> bool:
        length = request.headers.get("content-length")
        return length is None or not length.isdigit() or int(length) > MAX_BODY

    def _after_answer(self) -> None:
        conn = self._h11
        if conn.our_state is h11.MUST_CLOSE or self._close_after:
            self._close()
        elif conn.their_state is h11.DONE:
            self._next_cycle()
        elif conn.their_state is h11.SEND_BODY:
            # Read what is left of the body (bounded), then the next request.
            self._resume_reading()
            self._arm(self._app.linger_time)
            self._process()
        else:
            self._close()

    def _next_cycle(self) -> None:
        conn = self._h11
        self._cancel_timer()
        conn.start_next_cycle()
        self._checked = False
        self._start = b""
        pending = conn.trailing_data[0]
        if pending and not self._check_start(pending):
            return
        self._resume_reading()
        self._process()
        if self._task is None and not self._closing and conn.their_state is h11.IDLE:
            self._arm(self._app.keepalive_timeout)

    # -- closing ---------------------------------------------------------------------------

    def _bad(self, status: int, error: str, *, tls: bool = False) -> None:
        """Answer a malformed request and close; counted and logged by the listener."""
        self._app.log.bad_request(self._peer, error, tls=tls)
        task = self._task
        if task is not None and self._h11.our_state is h11.SEND_RESPONSE:
            # The head was valid and its answer has begun, but the body is malformed (a bad
            # chunk): nothing has been sent yet, so the client still gets its 400.
            task.cancel()
            task = None
        if self._transport is not None and task is None:
            self._transport.write(_raw_error(status, _REASONS.get(status, "Bad Request")))
        self._close()

    def close_when_idle(self) -> None:
        """Close now if no request is being answered, else right after its answer.

        A connection no request has arrived on yet is answered once first: its request may be
        on its way (a reload's new listener took over the socket just after the old one
        accepted it), and a client whose first request is dropped unanswered does not retry.
        The read deadline and the shutdown timeout still bound it."""
        self._close_after = True
        if self._task is None and not self._fresh:
            self._close()

    def _close(self) -> None:
        if self._closing and self._transport is None:
            return
        self._closing = True
        self._cancel_timer()
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.close()  # sends what is buffered first

    def _pause_reading(self) -> None:
        if self._reading and self._transport is not None:
            self._reading = False
            self._transport.pause_reading()

    def _resume_reading(self) -> None:
        if not self._reading and self._transport is not None and not self._closing:
            self._reading = True
            self._transport.resume_reading()

    def _arm(self, delay: float) -> None:
        self._cancel_timer()
        self._timer = asyncio.get_running_loop().call_later(delay, self._close)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
