"""The Prometheus endpoint: port series pre-rendered once per FabricState, served to any scraper.

Polling never waits on a scrape: ``publish``/``publish_now`` render the ports when a new state
exists and swap one reference; a scrape takes that reference once and streams it, so a publish in
the middle of a scrape cannot mix two states in one body. Self metrics are small and rendered per
scrape, so they are always current.

Only the deflated port series are kept (20,000 ports: 5.8 MB instead of 62.5 MB of text).
Rendering feeds each metric family straight into the compressor, so the plain body never exists
in memory as a whole; the ``_info`` families, which change only with topology, are kept as a
separately compressed segment and reused. Gzip scrapes (Prometheus always asks for gzip) get the
stream spliced behind the per-scrape self-metrics head (see ``exporters.http``); the rare plain
scrape is decompressed piece by piece as it is sent.

The aiohttp application is exposed (``app``, ``add_routes``) so the JSON API and health checks
can share the listener, its TLS and its basic auth.
"""

from __future__ import annotations

import asyncio
import ctypes
import itertools
import socket
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType

import structlog
from aiohttp import hdrs, web
from aiohttp.typedefs import Handler

from exporters.http import (
    ANONYMOUS,
    KEEPALIVE_TIMEOUT,
    LINGER_TIME,
    MAX_CONNECTIONS,
    PUBLIC_PATHS,
    READ_TIMEOUT,
    BasicAuth,
    ConnectionGuard,
    Deflated,
    GuardedSite,
    RateLimitedLog,
    ServerLog,
    accepts_gzip,
    concat,
    connection_cap,
    deflate_chunks,
    gzip_parts,
    http_metrics,
    inflate,
    parse_listen,
    tls_context,
)
from exporters.render import PortRenderer
from ibmon.model import PortView
from ibmon.selfmetrics import SelfMetrics
from ibmon.state import FabricState, in_port_order

__all__ = ["CONTENT_TYPE", "PrometheusExporter", "exposition"]

log = structlog.get_logger("ibmon.prometheus")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Level 1 compresses 62 MB of exposition about 11:1 in about a fifth of a second; level 6 gains
#: ~15% in size for 2.5x the CPU, once per state on a 2-core collector host.
GZIP_LEVEL = 1
#: Plain scrapes are decompressed and sent in pieces of this size, yielding to the loop in between.
PLAIN_PIECE = 256 * 1024

_INDEX = b"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>ibmon</title></head>
<body><h1>ibmon</h1><p><a href="metrics">Metrics</a></p></body></html>
"""


_EMPTY = deflate_chunks((), GZIP_LEVEL)


def _load_malloc_trim() -> Callable[[int], object] | None:
    """glibc's ``malloc_trim``, or None elsewhere (musl, macOS): trimming is an optimisation.

    Looked up among the symbols already loaded (``CDLL(None)``: libc is), not with
    ``ctypes.util.find_library``, which runs ``ldconfig -p`` in a subprocess at every start."""
    try:
        trim: Callable[[int], object] | None = getattr(ctypes.CDLL(None), "malloc_trim", None)
    except OSError:
        return None
    return trim


_MALLOC_TRIM = _load_malloc_trim()


def release_free_memory() -> None:
    """Hand free heap pages back to the OS after a publish (about 1 ms at 20,000 ports).

    Each publish allocates and frees family texts of a few MB; glibc raises its mmap threshold
    after the first such free and then serves them from the heap, where the holes they leave stay
    resident (about 10 MB at 20,000 ports). ``malloc_trim(0)`` returns whole free pages anywhere
    in every arena, so RSS tracks live memory again.
    """
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


class _Compressor:
    """Renders ports straight into deflate, keeping the ``_info`` families as a reusable segment.

    One per exporter; not re-entrant (``lock``), like the renderer whose label cache it owns.
    """

    def __init__(self) -> None:
        self.renderer = PortRenderer(keep_descriptive=False)
        self.lock = threading.Lock()
        self._descriptive: Deflated | None = None

    def compress(self, views: list[PortView]) -> Deflated:
        renderer = self.renderer
        if renderer.prepare(views) or self._descriptive is None:
            self._descriptive = None  # release the old segment before building the new one
            self._descriptive = deflate_chunks(renderer.descriptive_chunks(), GZIP_LEVEL,
                                               final=False)
        tail = renderer.series_deflated(views, GZIP_LEVEL)
        return concat(self._descriptive, tail)


class PrometheusExporter:
    """An ``exporters.base.Exporter``: serves ``/metrics`` (self metrics + pre-rendered port
    series) and ``/``.

    ``publish_now`` renders and compresses in the calling thread (the event loop): fine for
    node-local fabrics; ``publish`` (the ``exporters.base.Exporter`` method the daemon calls)
    renders in a worker thread so the loop never stalls on a large fabric.
    Both must be called from the event loop thread. ``basic_auth_file`` (format in
    ``exporters.http.BasicAuth``) and ``tls_cert``/``tls_key`` are read here, so a bad file is a
    config error at startup, not a failing scrape later. ``max_connections`` and
    ``read_timeout`` bound what clients can hold (``exporters.http``, "connection limits");
    ``/healthz`` and ``/readyz`` answer without basic auth, for probes.
    """

    def __init__(
        self,
        *,
        listen: str = "127.0.0.1:9683",
        self_metrics: SelfMetrics,
        tls_cert: Path | None = None,
        tls_key: Path | None = None,
        basic_auth_file: Path | None = None,
        max_connections: int = MAX_CONNECTIONS,
        read_timeout: float = READ_TIMEOUT,
    ) -> None:
        self.name = "prometheus"
        self._listen = listen
        self._host, self._port = parse_listen(listen)
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("tls_cert and tls_key must be given together")
        self._ssl = tls_context(tls_cert, tls_key) if tls_cert and tls_key else None
        self._auth = BasicAuth.from_file(basic_auth_file) if basic_auth_file else None
        self._self_metrics = self_metrics
        self._compressor = _Compressor()
        self._exposition = _EMPTY
        self._state: FabricState | None = None
        self._seq = itertools.count(1)
        self._installed_seq = 0
        self._runner: web.AppRunner | None = None
        self._http_metrics = http_metrics(self_metrics.registry)
        self._limited_log = RateLimitedLog()
        cap = connection_cap(max_connections)
        if cap < max_connections:
            log.warning("connection_cap_lowered", wanted=max_connections, cap=cap,
                        reason="the open-file limit (RLIMIT_NOFILE) is too low; raise"
                               " LimitNOFILE")
        self._guard = ConnectionGuard(metrics=self._http_metrics, max_connections=cap,
                                      read_timeout=read_timeout, limited=self._limited_log,
                                      ssl_context=self._ssl)
        middlewares = [self._guard.middleware]
        if self._auth:
            middlewares.append(self._basic_auth)
        self._app = web.Application(middlewares=middlewares)
        self._app.router.add_get("/", self._index)
        self._app.router.add_get("/metrics", self._metrics)

    # --- application ----------------------------------------------------------------------------

    @property
    def app(self) -> web.Application:
        """The aiohttp application; routes can be added until ``start``."""
        return self._app

    def add_routes(self, routes: Iterable[web.AbstractRouteDef]) -> None:
        """Serve more routes (JSON API, health checks) behind the same listener, TLS and auth."""
        if self._runner is not None:
            raise RuntimeError("add routes before start()")
        self._app.add_routes(routes)

    # --- publishing -----------------------------------------------------------------------------

    def _render(self, state: FabricState, *, wait: bool) -> Deflated:
        views = in_port_order(state.ports.values())
        compressor = self._compressor
        if not compressor.lock.acquire(blocking=wait):
            # A worker thread holds the cached renderer; never block the loop on it.
            fresh = PortRenderer(keep_descriptive=False)
            body = deflate_chunks(fresh.iter_chunks(views), GZIP_LEVEL)
        else:
            try:
                body = compressor.compress(views)
            finally:
                compressor.lock.release()
        return body

    def _install(self, seq: int, state: FabricState, body: Deflated) -> None:
        if seq > self._installed_seq:  # a slower, older render never replaces a newer one
            self._installed_seq = seq
            self._state = state
            self._exposition = body
            # The previous body is released just above unless a scrape still streams it.
            release_free_memory()

    def publish_now(self, state: FabricState) -> None:
        """Render ``state``'s ports now, in the calling thread, and serve them from the next
        scrape on (tests, benchmarks, small node-local fabrics)."""
        if state is self._state:
            return
        seq = next(self._seq)
        self._install(seq, state, self._render(state, wait=False))

    async def publish(self, state: FabricState) -> None:
        """Like ``publish_now``, rendering in a worker thread while the loop keeps running."""
        if state is self._state:
            return
        seq = next(self._seq)
        body = await asyncio.to_thread(self._render, state, wait=True)
        self._install(seq, state, body)

    @property
    def exposition_size(self) -> int:
        """Bytes of port series currently served (without self metrics), uncompressed."""
        return self._exposition.size

    @property
    def exposition_compressed_size(self) -> int:
        """Bytes the port series currently served occupy in memory (deflated)."""
        return self._exposition.compressed_size

    # --- serving --------------------------------------------------------------------------------

    @web.middleware
    async def _basic_auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        assert self._auth is not None
        if not self._auth.check(request.headers.get(hdrs.AUTHORIZATION)):
            if request.path in PUBLIC_PATHS:
                request[ANONYMOUS] = True
                return await handler(request)
            raise web.HTTPUnauthorized(
                headers={hdrs.WWW_AUTHENTICATE: 'Basic realm="ibmon", charset="UTF-8"'}
            )
        return await handler(request)

    async def _index(self, request: web.Request) -> web.StreamResponse:
        return web.Response(body=_INDEX, content_type="text/html", charset="utf-8")

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        body = self._exposition  # the one state this whole response is made of
        head = self._self_metrics.render()
        response = web.StreamResponse(
            headers={hdrs.CONTENT_TYPE: CONTENT_TYPE, hdrs.VARY: hdrs.ACCEPT_ENCODING}
        )
        send = request.method != hdrs.METH_HEAD
        if accepts_gzip(request.headers.get(hdrs.ACCEPT_ENCODING)):
            parts = gzip_parts(head, body, GZIP_LEVEL)
            response.headers[hdrs.CONTENT_ENCODING] = "gzip"
            response.content_length = sum(len(p) for p in parts)
            await response.prepare(request)
            if send:
                for part in parts:
                    await response.write(part)
        else:
            response.content_length = len(head) + body.size
            await response.prepare(request)
            if send:
                await response.write(head)
                for piece in inflate(body, PLAIN_PIECE):
                    await response.write(piece)
                    # write() returns without suspending while the socket takes data: yield
                    # anyway, so decompressing 60 MB never holds the loop for more than a piece.
                    await asyncio.sleep(0)
        await response.write_eof()
        return response

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(
        self, tg: asyncio.TaskGroup | None = None, *, inherit: PrometheusExporter | None = None
    ) -> None:
        """Listen; aiohttp runs the server, so ``tg`` (the ``Exporter`` interface) is unused.

        ``inherit`` is a running exporter this one replaces (a config reload): on the same
        address this one serves copies of its listening sockets, so the port never closes and
        nothing can take it in between; the caller stops ``inherit`` afterwards. Elsewhere
        this one binds its own address first, so a failure leaves ``inherit`` serving.
        """
        if self._runner is not None:
            raise RuntimeError("exporter already started")
        runner = web.AppRunner(
            self._app, access_log=None, shutdown_timeout=5.0,
            logger=ServerLog(self._http_metrics, self._limited_log),
            keepalive_timeout=KEEPALIVE_TIMEOUT, lingering_time=LINGER_TIME,
        )
        await runner.setup()
        same = inherit is not None and inherit._listen_key == self._listen_key
        inherited = inherit._sockets() if inherit is not None and same else []
        try:
            handed: list[socket.socket | None] = [*inherited] or [None]
            for sock in handed:
                site = GuardedSite(runner, self._host, self._port, guard=self._guard, sock=sock)
                await site.start()
        except BaseException:
            for sock in inherited:
                sock.close()
            await runner.cleanup()
            raise
        self._runner = runner
        log.info("listening", address=self._listen, port=self.port)

    @property
    def _listen_key(self) -> tuple[str, int]:
        return self._host, self._port

    def _sockets(self) -> list[socket.socket]:
        """Duplicates of the listening sockets (empty when not listening)."""
        if self._runner is None:
            return []
        out: list[socket.socket] = []
        for site in self._runner.sites:
            server = getattr(site, "_server", None)  # aiohttp keeps the asyncio.Server here
            for sock in getattr(server, "sockets", None) or ():
                out.append(sock.dup())
        return out

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    @property
    def port(self) -> int:
        """The bound TCP port (useful with ``127.0.0.1:0``)."""
        if self._runner is None or not self._runner.addresses:
            raise RuntimeError("exporter not started")
        address = self._runner.addresses[0]
        return int(address[1])

    async def __aenter__(self) -> PrometheusExporter:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


def exposition(self_metrics: SelfMetrics, state: FabricState) -> bytes:
    """The ``/metrics`` body for one state without a server (``ibmon scan --format prom``)."""
    views = in_port_order(state.ports.values())
    return self_metrics.render() + PortRenderer().render(views)
