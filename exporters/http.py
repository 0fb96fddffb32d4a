"""HTTP plumbing of the exporter: listen addresses, basic auth, TLS, spliced gzip and limits.

Kept apart from ``exporters.prometheus`` so each piece is small and testable without a server.
The limits (``ConnectionGuard``, ``ServerLog``) keep the listener answering
while clients misbehave: see "connection limits" below.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import hashlib
import hmac
import resource
import socket
import struct
import time
import weakref
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from exporters.deflate import compressobj
from exporters.server import HttpConnection, peer_address
from ibmon.config import parse_listen  # the one listen-address rule, shared with config checks
from ibmon.runtime.metrics import Counter, Registry
from ibmon.runtime.sslgate import enable_tls

if TYPE_CHECKING:
    import ssl

__all__ = [
    "KEEPALIVE_TIMEOUT",
    "LINGER_TIME",
    "MAX_CONNECTIONS",
    "PUBLIC_PATHS",
    "READ_TIMEOUT",
    "BasicAuth",
    "ConnectionGuard",
    "Deflated",
    "HttpMetrics",
    "RateLimitedLog",
    "ServerLog",
    "accepts_gzip",
    "concat",
    "connection_cap",
    "crc32_combine",
    "crc32_combine_py",
    "deflate_chunks",
    "gzip_parts",
    "hash_password",
    "http_metrics",
    "inflate",
    "parse_listen",
    "tls_context",
]


def hash_password(password: str) -> str:
    """The hash a basic auth file line holds for ``password`` (same as ``sha256sum``)."""
    return hashlib.sha256(password.encode("utf-8")).hexdigest()


_DUMMY_HASH = hash_password("ibmon: user does not exist")


class BasicAuth:
    """Users and password hashes from a basic auth file.

    Format, one user per line; blank lines and lines starting with ``#`` are ignored::

        # user:sha256(password) in hex, e.g. printf %s 'secret' | sha256sum
        prometheus:2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b

    Unsalted SHA-256 only protects against reading the file, not against guessing weak
    passwords: use long random passwords (Prometheus stores them in its config anyway) and TLS,
    since basic auth over plain HTTP sends the password in clear.
    """

    def __init__(self, users: dict[str, str]) -> None:
        if not users:
            raise ValueError("basic auth file has no users")
        self._users = dict(users)

    @classmethod
    def from_file(cls, path: Path) -> BasicAuth:
        users: dict[str, str] = {}
        text = path.read_text(encoding="utf-8")
        for number, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            user, sep, digest = line.partition(":")
            digest = digest.lower()
            if (
                not sep
                or not user
                or len(digest) != 64
                or any(ch not in "0123456789abcdef" for ch in digest)
            ):
                raise ValueError(f"{path}:{number}: expected user:<sha256 hex of the password>")
            if user in users:
                raise ValueError(f"{path}:{number}: user {user!r} listed twice")
            users[user] = digest
        return cls(users)

    def check(self, authorization: str | None) -> bool:
        """True when the ``Authorization`` header names a user with the right password."""
        if not authorization:
            return False
        scheme, _, encoded = authorization.strip().partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return False
        user, sep, password = decoded.partition(":")
        if not sep:
            return False
        stored = self._users.get(user)
        # Compare against a dummy for unknown users too, so timing does not reveal user names.
        ok = hmac.compare_digest(hash_password(password), stored or _DUMMY_HASH)
        return ok and stored is not None


def tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A server context with the platform's secure defaults and at least TLS 1.2."""
    enable_tls()  # ssl is imported only here: a node daemon without TLS never loads OpenSSL
    import ssl

    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(certfile=str(cert), keyfile=str(key))
    return ctx


def accepts_gzip(accept_encoding: str | None) -> bool:
    """Whether ``Accept-Encoding`` allows gzip (explicitly or via ``*``), honouring ``q=0``."""
    if not accept_encoding:
        return False
    gzip_q: float | None = None
    star_q: float | None = None
    for item in accept_encoding.split(","):
        name, *params = (part.strip() for part in item.split(";"))
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        name = name.lower()
        if name in ("gzip", "x-gzip"):
            gzip_q = q
        elif name == "*":
            star_q = q
    if gzip_q is not None:
        return gzip_q > 0
    return star_q is not None and star_q > 0


# --- gzip splicing -------------------------------------------------------------------------------
# The port series are compressed once per state, when it is published, and only the compressed
# stream is kept; the small self-metrics head changes per scrape.
# A gzip member is header + raw deflate + CRC-32 + length: the head is deflated per scrape and
# ended with a sync flush (byte aligned, not final), the cached port stream follows unchanged (a
# fresh deflate stream never refers back before its start), and the CRC of the whole is combined
# from the two parts' CRCs without reading the 40 MB of ports again.

_POLY = 0xEDB88320
GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # deflate, no name, mtime 0, OS unknown


def _multmodp(a: int, b: int) -> int:
    """a * b modulo the CRC-32 polynomial (reflected bit order), as in zlib's crc32.c."""
    m = 1 << 31
    p = 0
    while True:
        if a & m:
            p ^= b
            if not a & (m - 1):
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


def _x2n_table() -> tuple[int, ...]:
    table = [1 << 30]  # x^1
    for _ in range(31):
        table.append(_multmodp(table[-1], table[-1]))
    return tuple(table)


_X2N = _x2n_table()


@functools.lru_cache(maxsize=16)
def _shift(len2: int) -> int:
    """x^(8 * len2) modulo the polynomial: the operator that moves a CRC past len2 bytes.

    Cached because every scrape splices its head before the same tail (a publish's length):
    computing it is most of a combine (50 us of Python per scrape; the multiply alone is 3 us).
    """
    p = 1 << 31  # x^0
    n, k = len2, 3  # multiply by x^(8 * len2)
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return p


def crc32_combine_py(crc1: int, crc2: int, len2: int) -> int:
    """CRC-32 of A+B from crc32(A), crc32(B) and len(B) (zlib's crc32_combine, pure Python)."""
    return _multmodp(_shift(len2), crc1) ^ crc2


#: ``crc32_combine_py`` in C where python-isal is installed (0.4 against 7-30 us a call: a
#: fabric publish combines one per segment, 2,300 at 36,720 ports); the same results.
crc32_combine: Callable[[int, int, int], int] = crc32_combine_py
with contextlib.suppress(ImportError):  # no wheel for this platform: the Python one
    from isal.isal_zlib import crc32_combine

#: CRC-32 of the body as it is compressed: ISA-L's where installed (its folding with carry-less
#: multiplication: 0.014 against 0.2 ms for 730 kB, about 10 ms a publish at 36,720 ports),
#: else zlib's; the same values.
crc32: Callable[[bytes, int], int] = zlib.crc32
with contextlib.suppress(ImportError):
    from isal.isal_zlib import crc32


@dataclass(frozen=True, slots=True)
class Deflated:
    """Raw deflate data of some chunks, with their CRC-32 and total size.

    ``parts`` concatenated are the deflate stream. A ``final`` stream ends with the last block;
    a non-final one (a segment) ends byte-aligned after a sync flush and never refers back before
    its own start, so a segment followed by any other deflate stream is one valid stream
    (``concat``): the exporter keeps the rarely changing ``_info`` families as such a segment.
    """

    parts: tuple[bytes, ...]
    crc: int
    size: int
    final: bool = True

    @property
    def compressed_size(self) -> int:
        return sum(len(p) for p in self.parts)


def deflate_chunks(chunks: Iterable[bytes], level: int, *, final: bool = True) -> Deflated:
    """Compress chunks as they come (a generator never has the whole body in memory).

    Runs in a worker thread for big fabrics; the compressor releases the GIL while it works.
    """
    comp = compressobj(level)
    parts: list[bytes] = []
    crc = 0
    size = 0
    for chunk in chunks:
        if piece := comp.compress(chunk):
            parts.append(piece)
        crc = crc32(chunk, crc)
        size += len(chunk)
        del chunk  # a lazy producer builds the next chunk without this one alive
    parts.append(comp.flush(zlib.Z_FINISH if final else zlib.Z_SYNC_FLUSH))
    # One contiguous block per stream: zlib's small outputs would otherwise each cost a
    # separate allocation for as long as the state is served.
    return Deflated((b"".join(parts),), crc, size, final)


def concat(segment: Deflated, tail: Deflated) -> Deflated:
    """``segment`` then ``tail`` as one stream, without recompressing either."""
    if segment.final:
        raise ValueError("only a non-final (sync-flushed) segment can be followed by more data")
    return Deflated(
        segment.parts + tail.parts,
        crc32_combine(segment.crc, tail.crc, tail.size),
        segment.size + tail.size,
        tail.final,
    )


def inflate(deflated: Deflated, piece_size: int = 256 * 1024) -> Iterator[bytes]:
    """Decompress ``deflated`` in pieces of at most ``piece_size`` bytes (plain-text scrapes).

    Memory stays at one piece plus zlib's 32 KB window however big the body is.
    """
    decomp = zlib.decompressobj(-zlib.MAX_WBITS)
    for part in deflated.parts:
        data = part
        while data:
            piece = decomp.decompress(data, piece_size)
            data = decomp.unconsumed_tail
            if piece:
                yield piece
    if tail := decomp.flush():
        yield tail


def gzip_parts(head: bytes, tail: Deflated, level: int) -> list[bytes]:
    """One gzip member holding ``head`` followed by the already-deflated, final ``tail``."""
    if not tail.final:
        raise ValueError("the tail of a gzip member must be a final deflate stream")
    comp = compressobj(level)
    head_deflated = comp.compress(head) + comp.flush(zlib.Z_SYNC_FLUSH)
    crc = crc32_combine(zlib.crc32(head), tail.crc, tail.size)
    trailer = struct.pack("<II", crc, (len(head) + tail.size) & 0xFFFFFFFF)
    return [GZIP_HEADER, head_deflated, *tail.parts, trailer]


# --- connection limits ---------------------------------------------------------------------------
# An HTTP server without limits (aiohttp, as ibmon used it) reads request headers without a
# deadline and accepts every connection the kernel hands it. 1,100 clients that each trickle a
# header line every few seconds then held every descriptor of a 1024-fd process: /metrics
# stopped answering, state saves failed, and asyncio logged a traceback for every refused
# accept (36,000 lines in 12 s). So each listener:
#
# - caps its open connections (``max_connections``, lowered to fit RLIMIT_NOFILE), so the
#   process never runs out of descriptors;
# - gives every request ``READ_TIMEOUT`` to arrive complete (headers, from the moment the
#   connection opened or its next request started; a TLS handshake counts against the first);
# - at the cap, makes room for a new client by closing the connection that has waited longest
#   without a request in progress (a slow or idle client), else the one whose answer has been
#   stuck longest (writing paused for at least ``STALL_EVICT``: a client that does not read),
#   so a scraper that connects and sends its request at once is served;
# - past the cap, keeps ``HEALTH_RESERVE`` more places that answer only ``PUBLIC_PATHS``
#   (``/healthz``, ``/readyz``; anything else gets 503), so a liveness probe is answered while
#   the cap is full of busy answers; only when those are taken too is a new client refused;
# - every answer has a send deadline (``exporters.server.send_deadline``), so a client that
#   never reads is closed (``send_timeout``) and its place and buffers freed;
# - counts all of this in ``ibmon_http_connections_closed_total{reason}`` and logs it at most
#   once a minute per reason.

#: Seconds a client has to deliver a complete request (and the TLS handshake) once it starts.
READ_TIMEOUT = 10.0
#: Open connections per listener; Prometheus needs one per scraper, ``ibmon top`` one each.
MAX_CONNECTIONS = 256
#: Descriptors left for everything else (state file, tool pipes, MQTT, umad) under the cap.
FD_RESERVE = 128
#: An idle keep-alive connection is closed after this long (Prometheus scrapes far more often).
KEEPALIVE_TIMEOUT = 75.0
#: After answering, how long an unread request body is drained before the connection closes.
LINGER_TIME = 2.0
#: Bytes of a TLS client's first request kept while the handshake hands over (one request).
EARLY_BYTES = 64 * 1024
#: Rate-limited log lines: at most one per event (and reason) per this many seconds.
LOG_INTERVAL = 60.0
#: Answer without basic auth (Kubernetes probes cannot send credentials); see ``exporters.api``.
PUBLIC_PATHS = frozenset({"/healthz", "/readyz"})
#: Places past the cap for health checks only: a probe every few seconds needs one or two.
HEALTH_RESERVE = 8
#: Seconds an answer's writes must have been paused before its connection can be evicted: a
#: client reading a big body pauses writing for a moment at a time; one that does not read
#: stays paused.
STALL_EVICT = 1.0

log = structlog.get_logger("ibmon.http")


def connection_cap(wanted: int) -> int:
    """``wanted``, lowered so the cap plus ``FD_RESERVE`` fits the soft descriptor limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft - FD_RESERVE))


@dataclass(frozen=True, slots=True)
class HttpMetrics:
    """The listener's series, created once per registry (listeners come and go on reload)."""

    closed: Counter
    bad_requests: Counter


_HTTP_METRICS: weakref.WeakKeyDictionary[Registry, HttpMetrics] = (
    weakref.WeakKeyDictionary()
)


def http_metrics(registry: Registry) -> HttpMetrics:
    """The ``ibmon_http_*`` series in ``registry``, registered on first use."""
    found = _HTTP_METRICS.get(registry)
    if found is None:
        found = _HTTP_METRICS[registry] = HttpMetrics(
            closed=Counter(
                "ibmon_http_connections_closed",
                "Connections the listener closed or refused to protect itself: read_timeout (no"
                " complete request in time), send_timeout (an answer not read in time),"
                " evicted (made room for a new client at the cap), refused (at the cap with"
                " every connection busy, or past it for anything but a health check).",
                ["reason"], registry=registry,
            ),
            bad_requests=Counter(
                "ibmon_http_bad_requests",
                "Requests that were not valid HTTP (answered 400, connection closed).",
                registry=registry,
            ),
        )
        for reason in ("read_timeout", "send_timeout", "evicted", "refused"):
            found.closed.labels(reason)
    return found


class RateLimitedLog:
    """At most one line per key every ``interval`` seconds; the next says how many were skipped.

    What a hostile or broken client can trigger at will must not be able to flood the journal;
    the metrics count every occurrence, the log shows that it happens and one example.
    """

    def __init__(self, logger: Any = log, *, interval: float = LOG_INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self._interval = interval
        self._clock = clock
        self._next: dict[str, float] = {}
        self._skipped: dict[str, int] = {}

    def __call__(self, level: str, event: str, *, key: str | None = None, **fields: Any) -> bool:
        """Log ``event`` at ``level`` unless one with the same key was logged lately."""
        key = key or event
        now = self._clock()
        if now < self._next.get(key, float("-inf")):
            self._skipped[key] = self._skipped.get(key, 0) + 1
            return False
        self._next[key] = now + self._interval
        if skipped := self._skipped.pop(key, 0):
            fields["suppressed"] = skipped
        getattr(self._log, level)(event, **fields)
        return True


def _one_line(text: str, limit: int = 200) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class ServerLog:
    """Reports of one listener's clients: malformed requests and handler bugs.

    A request that is not valid HTTP is counted (``ibmon_http_bad_requests_total``) and logged
    as one structured line, rate-limited, without a traceback (aiohttp logged 550 bytes of
    traceback per 26-byte malformed request); a bug in a handler keeps its traceback
    (rate-limited too). A client that went away mid-answer is not an error and is not reported.
    """

    def __init__(self, metrics: HttpMetrics, limited: RateLimitedLog) -> None:
        self._metrics = metrics
        self._limited = limited

    def bad_request(self, peer: str | None, error: str, *, tls: bool = False) -> None:
        """A request that was not valid HTTP (answered 400 or 431, connection closed)."""
        self._metrics.bad_requests.inc()
        fields: dict[str, Any] = {"peer": peer, "error": _one_line(error)}
        if tls:
            fields["hint"] = "a TLS client on a plain HTTP listener (https:// vs http://)?"
        self._limited("warning", "http_bad_request", **fields)

    def handler_error(self, peer: str | None, exc: BaseException) -> None:
        """A handler raised: a bug in ibmon (the client got a 500)."""
        if isinstance(exc, ConnectionError | asyncio.CancelledError):
            return  # the client went away; nothing is wrong with ibmon or its config
        self._limited("error", "http_handler_error", peer=peer,
                      error=f"{type(exc).__name__}: {_one_line(str(exc))}", exc_info=exc)


def _abort(transport: asyncio.BaseTransport) -> None:
    """Close at once (RST: the descriptor is free now, not after a FIN handshake).

    With ``SO_LINGER`` 0, so the kernel drops what the socket still had to send as well: a
    client that never reads would otherwise keep it (and up to a send buffer of kernel memory)
    in FIN_WAIT1 for minutes of zero-window probes."""
    if isinstance(transport, asyncio.Transport):
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
    else:
        transport.close()


class _GuardedConnection(asyncio.Protocol):
    """Wraps the HTTP protocol of one connection: admission, the read deadline, eviction.

    With TLS the guard does the handshake itself (``loop.start_tls``) after admitting the TCP
    connection, so a client that never completes the handshake holds a counted, evictable
    place under the same deadline instead of an uncounted descriptor.
    """

    def __init__(self, guard: ConnectionGuard, make_inner: InnerFactory) -> None:
        self._guard = guard
        self._make_inner = make_inner
        self.inner: HttpConnection | None = None
        self.transport: asyncio.BaseTransport | None = None  # TCP: what ``close`` aborts
        self.peer: str | None = None
        self.busy = 0
        #: Admitted past the cap: only health checks are answered here.
        self.reserved = False
        self._timer: asyncio.TimerHandle | None = None
        self._handshake: asyncio.Task[None] | None = None
        self._early: list[bytes] = []
        self.closed = False

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.transport is not None:  # a TLS layer that announces itself (not start_tls's)
            self._start_inner(transport)
            return
        self.transport = transport
        self.peer = peer_address(transport)
        if not self._guard._admit(self):
            self.closed = True
            _abort(transport)
            return
        self._arm()  # the deadline covers the TLS handshake and the first request
        if self._guard.ssl_context is None:
            self._start_inner(transport)
        else:
            # Not a byte may be read before the TLS layer is in place (start_tls resumes).
            assert isinstance(transport, asyncio.ReadTransport)
            transport.pause_reading()
            self._handshake = asyncio.ensure_future(self._start_tls(transport))

    async def _start_tls(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        assert self._guard.ssl_context is not None
        app: asyncio.BaseTransport | None = None
        try:
            # Our own read deadline (armed at accept) closes a slow handshake and counts it;
            # asyncio's handshake timeout is only the backstop.
            app = await asyncio.get_running_loop().start_tls(
                transport, self, self._guard.ssl_context, server_side=True,
                ssl_handshake_timeout=2 * self._guard.read_timeout,
            )
        except asyncio.CancelledError:
            pass  # the listener stops, or our deadline closed the connection
        except OSError as exc:  # a failed handshake; asyncio logs it at debug level only
            self._guard._failed_handshake(self, exc)
        finally:
            self._handshake = None
        if app is not None and not self.closed:
            self._start_inner(app)
        else:  # never got as far as a request: give the place back
            self._drop()
            _abort(transport)

    def _start_inner(self, transport: asyncio.BaseTransport) -> None:
        if self.closed or self.inner is not None:
            return
        self.inner = self._make_inner(self)
        self.inner.connection_made(transport)
        early, self._early = self._early, []
        for data in early:
            self.data_received(data)

    def data_received(self, data: bytes) -> None:
        if self.inner is None:
            # Decrypted bytes can arrive between the end of the handshake and the moment
            # start_tls hands us the transport: keep them (a request's worth at most).
            self._early.append(data)
            if sum(map(len, self._early)) > EARLY_BYTES:
                self.close("read_timeout")
            return
        if not self.busy and self._timer is None:
            self._arm()  # the next request started: it has READ_TIMEOUT to arrive whole
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return None if self.inner is None else self.inner.eof_received()

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._drop()
        inner, self.inner = self.inner, None
        if inner is not None:
            inner.connection_lost(exc)

    # -- guard -----------------------------------------------------------------------------

    def _drop(self) -> None:
        self.closed = True
        self._disarm()
        self._guard._forget(self)

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._guard.read_timeout, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None  # (never armed while a request is answered: ``begin`` disarms it)
        self.close("read_timeout")

    def close(self, reason: str) -> None:
        """Close now, counted and (rate-limited) logged under ``reason``."""
        if self.closed or self.transport is None:
            return
        self._guard._closed(reason, self)
        self._drop()
        _abort(self.transport)

    def close_when_idle(self) -> None:
        """The listener stops: close now unless a request is being answered (then after it)."""
        if self.inner is not None:
            self.inner.close_when_idle()
        elif self.transport is not None and not self.closed:
            self._drop()
            _abort(self.transport)

    def abort(self) -> None:
        if self.transport is not None:
            self._drop()
            _abort(self.transport)

    def begin(self, path: str) -> bool:
        """A complete request reached the application: no read deadline while it is answered.
        False (and counted as refused) for anything but a health check on a reserved place."""
        if self.reserved and path not in PUBLIC_PATHS:
            self._guard._closed("refused", self)
            return False
        self.busy += 1
        self._disarm()
        self._guard._idle.pop(self, None)
        return True

    def end(self) -> None:
        self.busy -= 1
        if not self.busy and not self.closed:
            self._guard._idle[self] = None  # the most recently active idle connection


#: Makes the HTTP protocol of a connection, given the guard's side of it (``begin``/``end``).
InnerFactory = Callable[[_GuardedConnection], HttpConnection]


class ConnectionGuard:
    """One listener's connection accounting (see "connection limits" above)."""

    def __init__(self, *, metrics: HttpMetrics, max_connections: int = MAX_CONNECTIONS,
                 read_timeout: float = READ_TIMEOUT, limited: RateLimitedLog | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        if max_connections < 1 or read_timeout <= 0:
            raise ValueError("max_connections and read_timeout must be positive")
        self.max_connections = max_connections
        self.read_timeout = read_timeout
        self.ssl_context = ssl_context
        self._metrics = metrics
        self._limited = limited or RateLimitedLog()
        self._open: set[_GuardedConnection] = set()
        #: Admitted past the cap (``HEALTH_RESERVE``), a subset of ``_open``.
        self._reserved: set[_GuardedConnection] = set()
        #: Connections without a request in progress, the longest waiting first.
        self._idle: OrderedDict[_GuardedConnection, None] = OrderedDict()
        self._all_closed: asyncio.Event | None = None

    @property
    def open(self) -> int:
        return len(self._open)

    def factory(self, inner: InnerFactory) -> Callable[[], asyncio.Protocol]:
        """The protocol factory for ``loop.create_server`` (plain TCP: the guard does TLS)."""
        return lambda: _GuardedConnection(self, inner)

    async def shutdown(self, timeout: float) -> None:
        """Close idle connections now, the others after their answer or after ``timeout``."""
        self._all_closed = asyncio.Event()
        for conn in list(self._open):
            conn.close_when_idle()
        if self._open:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._all_closed.wait()
        for conn in list(self._open):
            conn.abort()

    def _admit(self, conn: _GuardedConnection) -> bool:
        if len(self._open) - len(self._reserved) >= self.max_connections:
            victim = next(iter(self._idle), None) or self._stalled_writer()
            if victim is not None:
                victim.close("evicted")
            elif len(self._reserved) < HEALTH_RESERVE:
                conn.reserved = True
                self._reserved.add(conn)
            else:
                self._closed("refused", conn)
                return False
        self._open.add(conn)
        self._idle[conn] = None
        return True

    def _stalled_writer(self) -> _GuardedConnection | None:
        """The connection whose answer has waited longest for its client to read, if that
        is at least ``STALL_EVICT`` (a reserved place is not one: it holds a health check)."""
        oldest: tuple[float, _GuardedConnection] | None = None
        for conn in self._open:
            since = None if conn.inner is None or conn.reserved else conn.inner.stalled_since
            if since is not None and (oldest is None or since < oldest[0]):
                oldest = (since, conn)
        if oldest is None or asyncio.get_running_loop().time() - oldest[0] < STALL_EVICT:
            return None
        return oldest[1]

    def _forget(self, conn: _GuardedConnection) -> None:
        self._idle.pop(conn, None)
        self._open.discard(conn)
        self._reserved.discard(conn)
        if not self._open and self._all_closed is not None:
            self._all_closed.set()

    def _failed_handshake(self, conn: _GuardedConnection, exc: OSError) -> None:
        """A client that did not speak TLS (plain HTTP to the TLS port, most likely), or
        broke off the handshake: a bad request, counted and logged like one."""
        import ssl  # loaded already: this listener has a TLS context

        if not isinstance(exc, ssl.SSLError):
            return  # the connection dropped (reset, timeout): nothing malformed was received
        fields: dict[str, Any] = {"peer": conn.peer, "error": _one_line(str(exc))}
        if exc.reason == "HTTP_REQUEST":
            fields["hint"] = "a plain HTTP client on a TLS listener (http:// vs https://)?"
        self._metrics.bad_requests.inc()
        self._limited("warning", "http_bad_request", **fields)

    def _closed(self, reason: str, conn: _GuardedConnection) -> None:
        self._idle.pop(conn, None)
        self._metrics.closed.labels(reason).inc()
        self._limited("warning", "http_connection_closed", key=f"closed:{reason}",
                      reason=reason, peer=conn.peer, open=len(self._open),
                      max_connections=self.max_connections, read_timeout=self.read_timeout)
