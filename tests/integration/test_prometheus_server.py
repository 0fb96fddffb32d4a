"""The /metrics server for real on loopback: plain, gzip, basic auth, TLS, IPv6, concurrency."""

from __future__ import annotations

import asyncio
import base64
import gc
import gzip
import socket
import ssl
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from exporters.http import hash_password
from exporters.prometheus import CONTENT_TYPE, PrometheusExporter
from exporters.render import render_ports
from exporters.server import Request, Response, Route
from ibmon.infiniband.counters import CATALOGUE
from ibmon.infiniband.model import LinkInfo, PortIdentity, PortView
from ibmon.runtime.selfmetrics import SelfMetrics
from ibmon.state import FabricState
from tests.syspkg import require_binary


def _views(n: int, *, base: int = 0, desc: str = "node") -> list[PortView]:
    return [
        PortView(
            identity=PortIdentity(guid=f"0x{i // 36:016x}", port=str(i % 36 + 1),
                                  node_desc=f'{desc} {i} "q"', lid=i + 1, source="mad"),
            state=4, phys_state=5, rate_bytes_per_second=12.5e9,
            link=LinkInfo(remote_guid=f"0x{i + 1:016x}", remote_port="1"),
            totals={spec.name: base + i * 100 + k for k, spec in enumerate(CATALOGUE)},
            utilization_tx=0.5, utilization_rx=0.25,
        )
        for i in range(n)
    ]


def _state(views: list[PortView], generated: float = 1.0) -> FabricState:
    return FabricState(generated=generated, ports={v.key: v for v in views})


def _ports_body(views: list[PortView]) -> bytes:
    """What the exporter must serve after the self metrics: ports sorted by GUID, port number."""
    ordered = sorted(views, key=lambda v: (v.identity.guid, int(v.identity.port)))
    return render_ports(ordered)


@pytest.fixture
def metrics() -> SelfMetrics:
    m = SelfMetrics()
    m.source_up.labels("mad").set(1)
    return m


@pytest.fixture
async def exporter(metrics: SelfMetrics) -> AsyncIterator[PrometheusExporter]:
    async with PrometheusExporter(listen="127.0.0.1:0", self_metrics=metrics) as exp:
        yield exp


def _url(exp: PrometheusExporter, path: str = "/metrics", scheme: str = "http",
         host: str = "127.0.0.1") -> str:
    return f"{scheme}://{host}:{exp.port}{path}"


async def test_plain_scrape(exporter: PrometheusExporter, metrics: SelfMetrics) -> None:
    views = _views(40)
    exporter.publish_now(_state(views))
    async with aiohttp.ClientSession() as session, session.get(
        _url(exporter), headers={"Accept-Encoding": "identity"}
    ) as resp:
        body = await resp.read()
        assert resp.status == 200
        assert resp.headers["Content-Type"] == CONTENT_TYPE
        assert "Content-Encoding" not in resp.headers
        assert int(resp.headers["Content-Length"]) == len(body)
    assert body == metrics.render() + _ports_body(views)


async def test_gzip_scrape_is_spliced_per_scrape(exporter: PrometheusExporter,
                                                 metrics: SelfMetrics) -> None:
    views = _views(300)
    exporter.publish_now(_state(views))
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        async with session.get(_url(exporter), headers={"Accept-Encoding": "gzip"}) as resp:
            raw = await resp.read()
            assert resp.headers["Content-Encoding"] == "gzip"
            assert resp.headers["Vary"] == "Accept-Encoding"
            assert int(resp.headers["Content-Length"]) == len(raw)
        assert gzip.decompress(raw) == metrics.render() + _ports_body(views)
        assert len(raw) < len(_ports_body(views)) / 4
        # Self metrics change between scrapes; the cached port stream does not.
        metrics.events.labels("port_down", "critical").inc()
        async with session.get(_url(exporter), headers={"Accept-Encoding": "gzip"}) as resp:
            second = gzip.decompress(await resp.read())
    assert b'ibmon_events_total{severity="critical",type="port_down"} 1.0' in second
    assert second == metrics.render() + _ports_body(views)


async def test_only_the_compressed_body_is_held_and_info_segment_is_reused(
    exporter: PrometheusExporter, metrics: SelfMetrics
) -> None:
    views = _views(300)
    exporter.publish_now(_state(views, 1.0))
    assert exporter.exposition_size == len(_ports_body(views))
    assert exporter.exposition_compressed_size < exporter.exposition_size / 4
    first_segment = exporter._exposition.parts[0]
    moved = _views(300, base=10**12)  # same ports (equal identities), new counter values
    exporter.publish_now(_state(moved, 2.0))
    assert exporter._exposition.parts[0] is first_segment
    async with aiohttp.ClientSession() as session:
        for encoding in ("gzip", "identity"):
            async with session.get(_url(exporter), headers={"Accept-Encoding": encoding}) as resp:
                assert await resp.read() == metrics.render() + _ports_body(moved)
        async with session.head(_url(exporter), headers={"Accept-Encoding": "identity"}) as resp:
            assert int(resp.headers["Content-Length"]) == (len(metrics.render())
                                                           + len(_ports_body(moved)))
            assert await resp.read() == b""


async def test_gzip_is_readable_by_a_decompressing_client(exporter: PrometheusExporter,
                                                           metrics: SelfMetrics) -> None:
    views = _views(100)
    exporter.publish_now(_state(views))
    async with aiohttp.ClientSession() as session, session.get(_url(exporter)) as resp:
        assert resp.headers["Content-Encoding"] == "gzip"  # aiohttp asks for gzip by default
        assert await resp.read() == metrics.render() + _ports_body(views)


async def test_before_first_publish_serves_self_metrics(exporter: PrometheusExporter,
                                                        metrics: SelfMetrics) -> None:
    async with aiohttp.ClientSession() as session, session.get(_url(exporter)) as resp:
        assert resp.status == 200
        assert await resp.read() == metrics.render()


async def test_publish_replaces_series(exporter: PrometheusExporter) -> None:
    exporter.publish_now(_state(_views(10)))
    newer = _views(5, base=10**9, desc="renamed")
    await exporter.publish(_state(newer, 2.0))
    async with aiohttp.ClientSession() as session, session.get(_url(exporter)) as resp:
        text = await resp.text()
    assert _ports_body(newer).decode() in text
    assert 'node_desc="node ' not in text
    assert text.count("ibmon_port_info{") == 5


async def test_an_older_render_never_replaces_a_newer_one(exporter: PrometheusExporter) -> None:
    older = asyncio.create_task(exporter.publish(_state(_views(3000), 1.0)))
    await asyncio.sleep(0)  # the worker thread is rendering the big, older state
    newer = _views(2, desc="newest")
    exporter.publish_now(_state(newer, 2.0))
    await older
    async with aiohttp.ClientSession() as session, session.get(_url(exporter)) as resp:
        text = await resp.text()
    assert text.count("ibmon_port_info{") == 2
    assert 'node_desc="newest 0' in text


async def test_a_large_state_renders_in_a_thread_without_collections(
        exporter: PrometheusExporter, metrics: SelfMetrics) -> None:
    views = _views(3000)
    in_worker: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and threading.current_thread() is not threading.main_thread():
            in_worker.append(info["generation"])

    gc.enable()
    gc.callbacks.append(seen)
    try:
        await exporter.publish(_state(views))  # labels and lines by the ten thousand
    finally:
        gc.callbacks.remove(seen)
    assert in_worker == []  # the GC paused while the worker rendered (``ibmon.runtime.gcpause``)
    assert gc.isenabled()
    async with aiohttp.ClientSession() as session, session.get(_url(exporter)) as resp:
        assert await resp.read() == metrics.render() + _ports_body(views)


async def test_index_head_and_extra_routes(metrics: SelfMetrics) -> None:
    exp = PrometheusExporter(listen="127.0.0.1:0", self_metrics=metrics)

    async def healthz(request: Request) -> Response:
        return Response(b"ok")

    exp.add_routes([Route("/healthz", healthz)])
    async with exp, aiohttp.ClientSession() as session:
        with pytest.raises(RuntimeError, match="before start"):
            exp.add_routes([Route("/late", healthz)])
        async with session.get(_url(exp, "/")) as resp:
            assert resp.status == 200
            assert 'href="metrics"' in await resp.text()
        async with session.get(_url(exp, "/healthz")) as resp:
            assert await resp.text() == "ok"
        async with session.head(_url(exp)) as resp:
            assert resp.status == 200
            assert await resp.read() == b""
        async with session.get(_url(exp, "/nope")) as resp:
            assert resp.status == 404


def _basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


async def test_basic_auth(tmp_path: Path, metrics: SelfMetrics) -> None:
    users = tmp_path / "users"
    users.write_text(f"prom:{hash_password('right')}\n", encoding="utf-8")
    async with (
        PrometheusExporter(listen="127.0.0.1:0", self_metrics=metrics,
                           basic_auth_file=users) as exp,
        aiohttp.ClientSession() as session,
    ):
        for path in ("/metrics", "/"):
            async with session.get(_url(exp, path)) as resp:
                assert resp.status == 401
                assert resp.headers["WWW-Authenticate"].startswith("Basic realm=")
        async with session.get(_url(exp), headers=_basic("prom", "wrong")) as resp:
            assert resp.status == 401
        async with session.get(_url(exp), headers=_basic("other", "right")) as resp:
            assert resp.status == 401
        async with session.get(_url(exp), headers=_basic("prom", "right")) as resp:
            assert resp.status == 200
            assert await resp.read() == metrics.render()


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    openssl = require_binary("openssl")
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60, start_new_session=True,
    )
    return cert, key


def _fetch(url: str, context: ssl.SSLContext | None = None) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=10, context=context) as resp:
        return int(resp.status), bytes(resp.read())


async def test_tls(self_signed: tuple[Path, Path], metrics: SelfMetrics) -> None:
    cert, key = self_signed
    views = _views(20)
    async with PrometheusExporter(listen="127.0.0.1:0", self_metrics=metrics,
                                  tls_cert=cert, tls_key=key) as exp:
        exp.publish_now(_state(views))
        trusting = ssl.create_default_context(cafile=str(cert))
        status, body = await asyncio.to_thread(_fetch, _url(exp, scheme="https"), trusting)
        assert status == 200
        assert body == metrics.render() + _ports_body(views)
        # A client that does not trust the certificate is refused; plain HTTP gets nothing.
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            await asyncio.to_thread(_fetch, _url(exp, scheme="https"),
                                    ssl.create_default_context())
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            await asyncio.to_thread(_fetch, _url(exp))


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback (::1) on this machine")
async def test_ipv6_listen(metrics: SelfMetrics) -> None:
    views = _views(3)
    async with PrometheusExporter(listen="[::1]:0", self_metrics=metrics) as exp:
        exp.publish_now(_state(views))
        status, body = await asyncio.to_thread(_fetch, _url(exp, host="[::1]"))
    assert status == 200
    assert body == metrics.render() + _ports_body(views)


async def _read_response(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    return head, await reader.readexactly(length)


async def test_scrape_in_flight_keeps_its_state(exporter: PrometheusExporter,
                                                metrics: SelfMetrics) -> None:
    """A publish while a slow scraper is mid-body must not mix two states in that body."""
    first = _views(3000)  # ~10 MB, far beyond socket buffers
    exporter.publish_now(_state(first, 1.0))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", exporter.port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=4096)
    try:
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept-Encoding: identity\r\n"
                     b"Connection: close\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        assert b" 200 " in head.split(b"\r\n")[0]
        start = await reader.readexactly(64 * 1024)
        exporter.publish_now(_state(_views(3000, base=10**12, desc="second"), 2.0))
        await asyncio.sleep(0.05)  # let the server run with the new state in place
        length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        assert length > 5_000_000  # so the publish above happened mid-body
        body = start + await reader.readexactly(length - len(start))
    finally:
        writer.close()
        await writer.wait_closed()
    assert body == metrics.render() + _ports_body(first)
    async with aiohttp.ClientSession() as session, session.get(_url(exporter)) as resp:
        assert b'node_desc="second 0 ' in await resp.read()


def test_free_memory_is_released_only_after_a_big_publish(
    metrics: SelfMetrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    """malloc_trim costs a node-local daemon CPU on every poll for nothing; a big fabric (or
    one that just shrank from big) gets its free pages back."""
    import exporters.prometheus

    trims: list[int] = []
    monkeypatch.setattr(exporters.prometheus, "release_free_memory", lambda: trims.append(1))
    exp = PrometheusExporter(listen="127.0.0.1:0", self_metrics=metrics)
    small, big = _views(16), _views(600)
    assert len(_ports_body(small)) < exporters.prometheus.TRIM_MIN_BODY <= len(_ports_body(big))
    exp.publish_now(_state(small, 1.0))
    exp.publish_now(_state(small, 2.0))
    assert trims == []
    exp.publish_now(_state(big, 3.0))
    assert trims == [1]
    exp.publish_now(_state(small, 4.0))  # what the big one leaves behind is returned too
    assert trims == [1, 1]
    exp.publish_now(_state(small, 5.0))
    assert trims == [1, 1]


async def test_a_big_publish_lets_go_of_the_body_it_replaced_in_a_bulk_thread(
        exporter: PrometheusExporter, metrics: SelfMetrics,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Freeing a fabric's last body and ``malloc_trim`` held the event loop 2-3 ms every poll
    at 36,720 ports, and a scrape arriving then waited: a publish serves
    the new body and leaves both to a bulk thread."""
    import exporters.prometheus

    trimmed: list[str] = []
    done = threading.Event()

    def trim() -> None:
        trimmed.append(threading.current_thread().name)
        done.set()

    monkeypatch.setattr(exporters.prometheus, "release_free_memory", trim)
    for n, views in enumerate([_views(3000), _views(3000, base=7, desc="later")]):
        done.clear()
        await exporter.publish(_state(views, float(n + 1)))
        assert await asyncio.to_thread(done.wait, 10)
        async with aiohttp.ClientSession() as session, session.get(_url(exporter)) as resp:
            assert await resp.read() == metrics.render() + _ports_body(views)
    assert len(trimmed) == 2
    assert all(name.startswith("ibmon-bulk") for name in trimmed), trimmed
