"""The listener's limits on real loopback sockets: the cap evicts the longest-waiting idle
client (never one being answered), refuses only when all are busy, closes a client that does
not finish its request in time, and logs each kind once per interval."""

from __future__ import annotations

import asyncio
import configparser
import contextlib
import resource
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog.testing

from exporters.http import (
    FD_RESERVE,
    MAX_CONNECTIONS,
    STALL_EVICT,
    RateLimitedLog,
    ServerLog,
    connection_cap,
    http_metrics,
)
from exporters.prometheus import PrometheusExporter
from exporters.server import Request, Response, Route
from ibmon.runtime.selfmetrics import SelfMetrics

UNIT = Path(__file__).resolve().parents[2] / "deploy" / "systemd" / "ibmon.service"


class Recorder:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **kw: self.lines.append((level, event, kw))


def test_rate_limited_log_says_how_many_it_skipped() -> None:
    now = [0.0]
    rec = Recorder()
    limited = RateLimitedLog(rec, interval=60, clock=lambda: now[0])
    assert limited("warning", "x", a=1)
    for _ in range(5):
        assert not limited("warning", "x", a=2)
    assert limited("warning", "y")  # another key has its own budget
    now[0] = 61
    assert limited("warning", "x", a=3)
    assert rec.lines == [("warning", "x", {"a": 1}), ("warning", "y", {}),
                         ("warning", "x", {"a": 3, "suppressed": 5})]


def test_server_log_turns_malformed_requests_into_one_counted_line() -> None:
    metrics = SelfMetrics()
    hm = http_metrics(metrics.registry)
    assert http_metrics(metrics.registry) is hm  # once per registry (listeners come and go)
    rec = Recorder()
    log = ServerLog(hm, RateLimitedLog(rec))
    bad = "Invalid header token:\n\n  b'Host'\n        ^"
    log.bad_request("192.0.2.1", bad)
    log.bad_request("192.0.2.1", bad)
    log.bad_request("192.0.2.2", "not an HTTP request line", tls=True)
    log.handler_error("192.0.2.3", ConnectionResetError("gone"))
    assert metrics.registry.get_sample_value("ibmon_http_bad_requests_total") == 3
    assert rec.lines == [("warning", "http_bad_request",
                          {"peer": "192.0.2.1", "error": "Invalid header token: b'Host' ^"})]
    log.handler_error(None, RuntimeError("a bug"))
    level, event, fields = rec.lines[-1]
    assert (level, event) == ("error", "http_handler_error")
    assert fields["exc_info"].args == ("a bug",)  # a bug keeps its traceback


def test_every_close_reason_is_a_series_from_the_start() -> None:
    """``increase(ibmon_http_connections_closed_total[5m])`` in an alert needs the series
    before the first close: each reason is exported at 0 from the listener's start."""
    metrics = SelfMetrics()
    PrometheusExporter(listen="127.0.0.1:0", self_metrics=metrics)
    scraped = metrics.render().decode()
    for reason in ("read_timeout", "send_timeout", "evicted", "refused"):
        assert f'ibmon_http_connections_closed_total{{reason="{reason}"}} 0.0' in scraped


def test_a_cap_lowered_to_fit_the_descriptor_limit_says_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An operator who set ``max_connections`` learns that LimitNOFILE overrode it."""
    monkeypatch.setattr(resource, "getrlimit", lambda which: (FD_RESERVE + 40, 4096))
    with structlog.testing.capture_logs() as logs:
        PrometheusExporter(listen="127.0.0.1:0", self_metrics=SelfMetrics(), max_connections=100)
    (lowered,) = [e for e in logs if e["event"] == "connection_cap_lowered"]
    assert (lowered["wanted"], lowered["cap"]) == (100, 40)
    assert "LimitNOFILE" in lowered["reason"]


def test_cap_fits_the_descriptor_limit_and_the_unit_leaves_room() -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert connection_cap(10**9) == (10**9 if soft == resource.RLIM_INFINITY
                                     else soft - FD_RESERVE)
    assert connection_cap(5) == 5
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string(UNIT.read_text(encoding="utf-8"))
    assert int(unit["Service"]["LimitNOFILE"]) >= MAX_CONNECTIONS + FD_RESERVE


@pytest.fixture
async def guarded() -> AsyncIterator[tuple[PrometheusExporter, SelfMetrics, asyncio.Event]]:
    metrics = SelfMetrics()
    release = asyncio.Event()

    async def hold(request: Request) -> Response:
        await release.wait()
        return Response(b"released")

    exporter = PrometheusExporter(listen="127.0.0.1:0", self_metrics=metrics,
                                  max_connections=4, read_timeout=0.5)
    exporter.add_routes([Route("/hold", hold)])
    async with exporter:
        yield exporter, metrics, release
    release.set()


async def _closed(reader: asyncio.StreamReader, within: float = 5.0) -> bool:
    """Whether the server closed the connection within ``within`` seconds."""
    try:
        return await asyncio.wait_for(reader.read(1), within) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


async def test_a_trickled_second_request_on_a_kept_alive_connection_has_the_read_deadline(
    guarded: tuple[PrometheusExporter, SelfMetrics, asyncio.Event],
) -> None:
    """A client that got one answer and then sends the next request a byte at a time (each
    byte restarting the idle timer) is closed at the read deadline like a first request."""
    exporter, metrics, _ = guarded
    reader, writer = await asyncio.open_connection("127.0.0.1", exporter.port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    await reader.readuntil(b"</html>")
    started = asyncio.get_running_loop().time()
    closed = False
    for byte in b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100:
        try:
            writer.write(bytes([byte]))
            await writer.drain()
        except ConnectionError:
            closed = True
            break
        if reader.at_eof() or await _closed(reader, within=0.001):
            closed = True
            break
        await asyncio.sleep(0.05)
    assert closed
    assert asyncio.get_running_loop().time() - started < 3  # 0.5 s deadline, not the byte stream
    assert metrics.registry.get_sample_value("ibmon_http_connections_closed_total",
                                             {"reason": "read_timeout"}) == 1
    writer.close()


async def test_at_the_cap_the_longest_waiting_idle_client_makes_room(
    guarded: tuple[PrometheusExporter, SelfMetrics, asyncio.Event],
) -> None:
    exporter, metrics, _ = guarded
    idle = [await asyncio.open_connection("127.0.0.1", exporter.port) for _ in range(4)]
    for _, writer in idle:
        writer.write(b"GET /metrics HTTP/1.1\r\n")  # never finished
        await writer.drain()
    await asyncio.sleep(0.05)
    async with aiohttp.ClientSession() as session, session.get(
        f"http://127.0.0.1:{exporter.port}/metrics"
    ) as resp:
        assert resp.status == 200
    # the oldest made room (here at once; the read deadline would close it only later)
    open_ports = {conn.transport.get_extra_info("peername")[1]
                  for conn in exporter._guard._open if conn.transport is not None}
    assert idle[0][1].get_extra_info("sockname")[1] not in open_ports
    assert await _closed(idle[0][0])
    evicted = metrics.registry.get_sample_value("ibmon_http_connections_closed_total",
                                                {"reason": "evicted"})
    assert evicted == 1
    # The others are closed at the read deadline (0.5 s here), counted, not answered.
    for reader, _ in idle[1:]:
        assert await _closed(reader)
    timed_out = metrics.registry.get_sample_value("ibmon_http_connections_closed_total",
                                                  {"reason": "read_timeout"})
    assert timed_out == 3
    for _, writer in idle:
        writer.close()


async def test_a_client_being_answered_is_never_evicted_and_a_full_house_refuses(
    guarded: tuple[PrometheusExporter, SelfMetrics, asyncio.Event],
) -> None:
    exporter, metrics, release = guarded
    url = f"http://127.0.0.1:{exporter.port}"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def held() -> str:
            async with session.get(f"{url}/hold") as resp:
                return await resp.text()

        busy = [asyncio.create_task(held()) for _ in range(4)]
        await asyncio.sleep(0.3)
        # Past the cap, a place kept for health checks: anything else there is refused (503).
        reader, writer = await asyncio.open_connection("127.0.0.1", exporter.port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 5)  # to the end: the server closed
        assert answer.startswith(b"HTTP/1.1 503 ")
        writer.close()
        refused = metrics.registry.get_sample_value("ibmon_http_connections_closed_total",
                                                    {"reason": "refused"})
        assert refused == 1
        await asyncio.sleep(0.6)  # past the read deadline: busy connections are not touched
        release.set()
        assert await asyncio.gather(*busy) == ["released"] * 4
    with contextlib.suppress(Exception):
        await writer.wait_closed()


async def test_at_the_cap_only_a_client_stalled_past_stall_evict_makes_room() -> None:
    """A scraper that stopped reading its answer holds a place; at the cap it makes room
    once its writes have waited ``STALL_EVICT`` (a slow reader that only paused keeps its
    place: until then a newcomer gets a health-check place, and /metrics there a 503)."""
    metrics = SelfMetrics()
    big = b"x" * (32 << 20)  # more than loopback's socket buffers hold: writing pauses

    async def huge(request: Request) -> Response:
        return Response(big)

    exporter = PrometheusExporter(listen="127.0.0.1:0", self_metrics=metrics,
                                  max_connections=4, read_timeout=0.5)
    exporter.add_routes([Route("/huge", huge)])

    def closed(reason: str) -> float:
        return metrics.registry.get_sample_value(
            "ibmon_http_connections_closed_total", {"reason": reason}) or 0.0

    async def metrics_status() -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", exporter.port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        line = await asyncio.wait_for(reader.readline(), 5)
        writer.close()
        return line

    async with exporter:
        stuck = []
        for _ in range(4):
            reader, writer = await asyncio.open_connection("127.0.0.1", exporter.port)
            writer.write(b"GET /huge HTTP/1.1\r\nHost: x\r\n\r\n")  # and never read
            stuck.append((reader, writer))
        stalled_at = asyncio.get_running_loop().time()
        await asyncio.sleep(0.2)
        assert (await metrics_status()).startswith(b"HTTP/1.1 503 ")
        assert asyncio.get_running_loop().time() - stalled_at < STALL_EVICT
        assert closed("evicted") == 0
        await asyncio.sleep(STALL_EVICT)
        assert (await metrics_status()).startswith(b"HTTP/1.1 200 ")
        assert closed("evicted") == 1
        for _, writer in stuck:
            writer.close()


async def test_tls_clients_that_never_finish_the_handshake_count_against_the_cap(
    tmp_path: Path,
) -> None:
    """The guard admits the TCP connection before the handshake, so silent TLS clients hold
    counted, evictable places (not uncounted descriptors) and meet the same deadline."""
    from tests.mqtt_broker import make_tls

    tls = make_tls(tmp_path / "tls")
    metrics = SelfMetrics()
    exporter = PrometheusExporter(listen="127.0.0.1:0", self_metrics=metrics,
                                  tls_cert=tls.server_cert, tls_key=tls.server_key,
                                  max_connections=3, read_timeout=0.5)
    async with exporter:
        silent = [await asyncio.open_connection("127.0.0.1", exporter.port) for _ in range(3)]
        await asyncio.sleep(0.05)
        ctx = ssl.create_default_context(cafile=str(tls.ca))
        async with aiohttp.ClientSession() as session, session.get(
            f"https://127.0.0.1:{exporter.port}/metrics", ssl=ctx
        ) as resp:
            assert resp.status == 200
        assert await _closed(silent[0][0])  # evicted for the scraper
        for reader, _ in silent[1:]:
            assert await _closed(reader)  # the read deadline covers the handshake
        for _, writer in silent:
            writer.close()

    def closed(reason: str) -> float | None:
        return metrics.registry.get_sample_value("ibmon_http_connections_closed_total",
                                                 {"reason": reason})

    assert (closed("evicted"), closed("read_timeout")) == (1, 2)
