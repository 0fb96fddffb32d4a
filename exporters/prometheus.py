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

``add_routes`` lets the JSON API and health checks share the listener (``exporters.server``),
its TLS and its basic auth.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType

import structlog

from exporters.http import (
    KEEPALIVE_TIMEOUT,
    LINGER_TIME,
    MAX_CONNECTIONS,
    PUBLIC_PATHS,
    READ_TIMEOUT,
    BasicAuth,
    ConnectionGuard,
    Deflated,
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
from exporters.jobs import JobRenderer, render_jobs
from exporters.render import PortRenderer
from exporters.server import HttpApp, HttpConnection, HttpError, Request, Response, Route
from ibmon.infiniband.model import PortView
from ibmon.runtime.gcpause import paused_gc
from ibmon.runtime.selfmetrics import SelfMetrics
from ibmon.runtime.sizes import fabric_sized, run_bulk, submit_bulk
from ibmon.runtime.tuning import release_free_memory
from ibmon.state import FabricState, PortSorter, in_port_order
from ibmon.track.rowview import Span

__all__ = ["CONTENT_TYPE", "PrometheusExporter", "exposition"]

log = structlog.get_logger("ibmon.prometheus")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Level 1 compresses 62 MB of exposition about 11:1 in about a fifth of a second; level 6 gains
#: ~15% in size for 2.5x the CPU, once per state on a 2-core collector host.
GZIP_LEVEL = 1
#: Plain scrapes are decompressed and sent in pieces of this size, yielding to the loop in between.
PLAIN_PIECE = 256 * 1024
#: Free heap pages are handed back after a publish only when the port series (or those they
#: replace) are at least this big (uncompressed). Measured with ``publish_now`` 300 times
#: alternating two states: below ~1 MB (about 300 ports) a publish leaves under 0.5 MB of
#: holes, which the next poll reuses, while ``malloc_trim`` costs a fixed 0.1-0.7 ms (it walks
#: every arena, and the pages it returns fault back in on the next poll): a node-local daemon
#: (16 HCAs, ~30 kB) paid that on every poll for nothing. At 2,000 ports it saves 1.5 MB, at
#: 20,000 about 10 MB.
TRIM_MIN_BODY = 1 << 20
#: On stop, answers in progress get this long to finish before their connections are closed.
SHUTDOWN_TIMEOUT = 5.0

_INDEX = b"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>ibmon</title></head>
<body><h1>ibmon</h1><p><a href="metrics">Metrics</a></p></body></html>
"""


_EMPTY = deflate_chunks((), GZIP_LEVEL)


def _let_go(replaced: list[Deflated]) -> None:
    """Free ``replaced`` (the only reference to a body ``_install`` replaced, unless a
    scrape still sends it) and, when there was one, hand the free pages back.

    Why in a bulk thread after a big publish: freeing megabytes of compressed parts and
    ``malloc_trim`` took the event loop 2-3 ms every poll at 36,720 ports, and a scrape that
    came in meanwhile waited.
    """
    if replaced:
        replaced.clear()
        release_free_memory()


class _Compressor:
    """Renders ports straight into deflate, keeping the ``_info`` families as a reusable segment.

    One per exporter; not re-entrant (``lock``), like the renderer whose label cache it owns.
    """

    def __init__(self) -> None:
        self.renderer = PortRenderer(keep_descriptive=False)
        self.lock = threading.Lock()
        self._descriptive: Deflated | None = None

    def compress(self, views: list[PortView], span: Span | None = None,
                 order: Sequence[int] | None = None, jobs: bytes = b"") -> Deflated:
        renderer = self.renderer
        if renderer.prepare(views) or self._descriptive is None:
            self._descriptive = renderer.descriptive_deflated(GZIP_LEVEL)
        tail = renderer.series_deflated(views, GZIP_LEVEL, span, order)
        if jobs:
            tail = concat(deflate_chunks((jobs,), GZIP_LEVEL, final=False), tail)
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
        fabric: str = "main",
    ) -> None:
        self.name = "prometheus"
        self._jobs = JobRenderer(fabric)  # the job series (``exporters.jobs``)
        self._listen = listen
        self._host, self._port = parse_listen(listen)
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("tls_cert and tls_key must be given together")
        self._ssl = tls_context(tls_cert, tls_key) if tls_cert and tls_key else None
        self._auth = BasicAuth.from_file(basic_auth_file) if basic_auth_file else None
        self._self_metrics = self_metrics
        self._compressor = _Compressor()
        self._sorter = PortSorter()  # /metrics lists ports in port order
        self._exposition = _EMPTY
        self._state: FabricState | None = None
        self._seq = itertools.count(1)
        self._installed_seq = 0
        self._servers: list[asyncio.Server] = []
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
        self._app = HttpApp(ServerLog(self._http_metrics, self._limited_log),
                            keepalive_timeout=KEEPALIVE_TIMEOUT, linger_time=LINGER_TIME,
                            authorize=self._basic_auth if self._auth else None)
        self._app.add(Route("/", self._index))
        self._app.add(Route("/metrics", self._metrics))

    # --- application ----------------------------------------------------------------------------

    def add_routes(self, routes: Iterable[Route]) -> None:
        """Serve more routes (JSON API, health checks) behind the same listener, TLS and auth."""
        for route in routes:
            self._app.add(route)

    # --- publishing -----------------------------------------------------------------------------

    def _render(self, state: FabricState, *, wait: bool) -> Deflated:
        views, order = self._sorter.ordered(state.ports)
        compressor = self._compressor
        # The job families (running jobs only) go between the ports' ``_info`` families and
        # their other families; their rates change every poll, the rest with the jobs.
        jobs = self._jobs.render(state)
        if not compressor.lock.acquire(blocking=wait):
            # A worker thread holds the cached renderer; never block the loop on it.
            body = deflate_chunks(_chunks(PortRenderer(keep_descriptive=False), views, jobs),
                                  GZIP_LEVEL)
        else:
            try:
                body = compressor.compress(views, state.span, order, jobs)
            finally:
                compressor.lock.release()
        return body

    def _install(self, seq: int, state: FabricState, body: Deflated) -> list[Deflated]:
        """Serve ``body`` from the next scrape on. Returns what the caller lets go with
        ``_let_go``: the body it replaced when either is big (``TRIM_MIN_BODY``), else
        nothing (a small one is simply dropped here)."""
        if seq <= self._installed_seq:  # a slower, older render never replaces a newer one
            return []
        self._installed_seq = seq
        self._state = state
        previous, self._exposition = self._exposition, body
        return [previous] if max(body.size, previous.size) >= TRIM_MIN_BODY else []

    def publish_now(self, state: FabricState) -> None:
        """Render ``state``'s ports now, in the calling thread, and serve them from the next
        scrape on (tests, benchmarks, small node-local fabrics)."""
        if state is self._state:
            return
        seq = next(self._seq)
        _let_go(self._install(seq, state, self._render(state, wait=False)))

    async def publish(self, state: FabricState) -> None:
        """Like ``publish_now``, rendering in a worker thread while the loop keeps running;
        a node-sized state (``ibmon.runtime.sizes``) renders inline (``publish_now``): a compute
        node's 16 HCAs take 0.3 ms, less than handing the work to a thread and back (two loop
        wake-ups, 0.3-0.4 ms of CPU on a VM)."""
        if state is self._state:
            return
        if not fabric_sized(len(state.ports)):
            self.publish_now(state)
            return
        seq = next(self._seq)
        body = await run_bulk(self._render_paused, state)
        replaced = self._install(seq, state, body)
        if replaced:
            submit_bulk(_let_go, replaced)

    def _render_paused(self, state: FabricState) -> Deflated:
        """``_render`` of a large state (a worker thread) with the cyclic GC paused: its label
        lists and fingerprints live until the next render (``ibmon.runtime.gcpause``)."""
        with paused_gc():
            return self._render(state, wait=True)

    @property
    def exposition_size(self) -> int:
        """Bytes of port series currently served (without self metrics), uncompressed."""
        return self._exposition.size

    @property
    def exposition_compressed_size(self) -> int:
        """Bytes the port series currently served occupy in memory (deflated)."""
        return self._exposition.compressed_size

    # --- serving --------------------------------------------------------------------------------

    def _basic_auth(self, request: Request) -> Response | None:
        assert self._auth is not None
        if self._auth.check(request.headers.get("authorization")):
            return None
        if request.path in PUBLIC_PATHS:
            request.anonymous = True
            return None
        return HttpError(401, headers=[(
            "www-authenticate", 'Basic realm="ibmon", charset="UTF-8"')]).response()

    async def _index(self, request: Request) -> Response:
        return Response(_INDEX, content_type="text/html; charset=utf-8")

    async def _metrics(self, request: Request) -> Response:
        body = self._exposition  # the one state this whole response is made of
        head = self._self_metrics.render()
        headers = [("vary", "Accept-Encoding")]
        if accepts_gzip(request.headers.get("accept-encoding")):
            parts = gzip_parts(head, body, GZIP_LEVEL)
            headers.append(("content-encoding", "gzip"))
            return Response(parts, content_type=CONTENT_TYPE, headers=headers,
                            length=sum(len(p) for p in parts))
        # Plain: decompressed piece by piece as it is sent, the loop getting a turn in between,
        # so decompressing 60 MB never holds the loop for more than a piece.
        pieces = itertools.chain((head,), inflate(body, PLAIN_PIECE))
        return Response(pieces, content_type=CONTENT_TYPE, headers=headers,
                        length=len(head) + body.size, stream=True)

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(
        self, tg: asyncio.TaskGroup | None = None, *, inherit: PrometheusExporter | None = None
    ) -> None:
        """Listen; connections are served by asyncio's server, so ``tg`` (the ``Exporter``
        interface) is unused.

        ``inherit`` is a running exporter this one replaces (a config reload): on the same
        address this one serves copies of its listening sockets, so the port never closes and
        nothing can take it in between; the caller stops ``inherit`` afterwards. Elsewhere
        this one binds its own address first, so a failure leaves ``inherit`` serving.
        """
        if self._servers:
            raise RuntimeError("exporter already started")
        self._app.frozen = True
        same = inherit is not None and inherit._listen_key == self._listen_key
        inherited = inherit._sockets() if inherit is not None and same else []
        loop = asyncio.get_running_loop()
        app = self._app
        factory = self._guard.factory(lambda conn: HttpConnection(app, conn))
        servers: list[asyncio.Server] = []
        try:
            if inherited:
                for sock in inherited:
                    servers.append(await loop.create_server(factory, sock=sock, backlog=128))
            else:
                servers.append(await loop.create_server(factory, self._host, self._port,
                                                        backlog=128))
        except BaseException:
            for server in servers:
                server.close()
            for sock in inherited:
                sock.close()
            self._app.frozen = False
            raise
        self._servers = servers
        log.info("listening", address=self._listen, port=self.port)

    @property
    def _listen_key(self) -> tuple[str, int]:
        return self._host, self._port

    def _sockets(self) -> list[socket.socket]:
        """Duplicates of the listening sockets (empty when not listening)."""
        return [sock.dup() for server in self._servers for sock in server.sockets]

    async def stop(self) -> None:
        """Stop listening, let answers in progress finish (at most ``SHUTDOWN_TIMEOUT``)."""
        servers, self._servers = self._servers, []
        if not servers:
            return
        # Accept nothing more, then let the connections already accepted become transports
        # before the server closes: asyncio drops one that attaches to a closed server without
        # closing it (its client waits for ever), and on a reload the new listener, on the same
        # socket, takes every connection from here on.
        loop = asyncio.get_running_loop()
        for server in servers:
            for sock in server.sockets:
                loop.remove_reader(sock.fileno())
        for _ in range(2):  # an accept's transport is made one turn of the loop later
            await asyncio.sleep(0)
        for server in servers:
            server.close()
        await self._guard.shutdown(SHUTDOWN_TIMEOUT)
        for server in servers:
            await server.wait_closed()

    @property
    def port(self) -> int:
        """The bound TCP port (useful with ``127.0.0.1:0``)."""
        for server in self._servers:
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        raise RuntimeError("exporter not started")

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


def exposition(self_metrics: SelfMetrics, state: FabricState, *, fabric: str = "main") -> bytes:
    """The ``/metrics`` body for one state without a server (``ibmon scan --format prom``)."""
    views = in_port_order(state.ports.values())
    chunks = _chunks(PortRenderer(), views, render_jobs(state, fabric))
    return self_metrics.render() + b"".join(chunks)


def _chunks(renderer: PortRenderer, views: list[PortView], jobs: bytes) -> Iterator[bytes]:
    """The port families and the job families in the exporter's order: the ports' ``_info``
    families, the job families, the other port families."""
    renderer.prepare(views)
    yield from renderer.descriptive_chunks()
    if jobs:
        yield jobs
    yield from renderer.series_chunks(views)
