"""A real Prometheus scraping a fabric-sized ``/metrics``: the gzip body (435 KB for 2,000
ports) is written by the event loop in coalesced writes while the socket takes a little at a
time, and Prometheus must read every series of it with the values served, scrape after scrape;
over TLS the same body is written by the loop in coalesced writes and must arrive whole as well."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import socket
import ssl
import urllib.request
from pathlib import Path

import pytest
import yaml

import exporters.server
from exporters.prometheus import PrometheusExporter
from ibmon.runtime.selfmetrics import SelfMetrics
from tests.e2e.test_prometheus_alertmanager import Proc, query, wait_until
from tests.integration.test_prometheus_server import _ports_body, _state, _views, self_signed
from tests.mqtt_broker import free_port
from tests.syspkg import require_binary

__all__ = ["self_signed"]  # the fixture, used by the TLS test

PORTS = 2000


def small_send_buffers(monkeypatch: pytest.MonkeyPatch, size: int = 64 * 1024) -> None:
    """The server's connections take at most about ``size`` bytes at once (a scraper at the
    far end of a slower link), so a big body leaves in many writes with pauses between."""
    made = exporters.server.HttpConnection.connection_made

    def limited(self: exporters.server.HttpConnection, transport: asyncio.BaseTransport) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
        made(self, transport)

    monkeypatch.setattr(exporters.server.HttpConnection, "connection_made", limited)


def _port_samples(body: bytes) -> dict[str, str]:
    """``series -> value`` of every sample line of a rendered ports body."""
    samples = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            samples[series] = value
    return samples


async def test_prometheus_reads_every_series_of_a_body_sent_in_pieces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prometheus = require_binary("prometheus")
    small_send_buffers(monkeypatch)  # else a local socket takes the whole body at once
    views = _views(PORTS)
    expected = _port_samples(_ports_body(views))
    port_series = sum(1 for series in expected if series.startswith("ibmon_port_"))
    async with PrometheusExporter(listen="127.0.0.1:0", self_metrics=SelfMetrics()) as exp:
        exp.publish_now(_state(views))
        assert exp.exposition_compressed_size > 256 * 1024  # more than one write's worth
        prom_port = free_port()
        prom = f"http://127.0.0.1:{prom_port}"
        cfg = tmp_path / "prometheus.yml"
        cfg.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [{"job_name": "ibmon", "static_configs": [
                {"targets": [f"127.0.0.1:{exp.port}"]}]}],
        }))
        server = Proc("prometheus", [
            prometheus, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ], tmp_path / "prometheus.log")
        server.start()
        try:
            def three_good_scrapes() -> bool:
                up = query(prom, 'up{job="ibmon"}')
                count = query(prom, 'count({__name__=~"ibmon_port_.+"})')
                done = query(prom, 'count_over_time(up{job="ibmon"}[1m]) >= 3')
                return (bool(up) and up[0]["value"][1] == "1" and bool(count)
                        and count[0]["value"][1] == str(port_series) and bool(done))

            # The exporter answers on this loop: Prometheus is waited for from a thread.
            await asyncio.to_thread(wait_until, "three complete scrapes of the big body",
                                    three_good_scrapes, 60, [server])
            failed = query(prom, 'sum_over_time(up{job="ibmon"}[1m]) != '
                                 'count_over_time(up{job="ibmon"}[1m])')
            assert failed == [], f"a scrape failed: {server.tail()}"
            series = 'ibmon_port_transmit_data_bytes_total{guid="0x000000000000001b",port="20"}'
            got = await asyncio.to_thread(query, prom, series)
            assert got and got[0]["value"][1] == str(float(expected[series])).removesuffix(".0")
        finally:
            await asyncio.to_thread(server.stop)


async def test_a_big_body_over_tls_arrives_whole(self_signed: tuple[Path, Path]) -> None:
    cert, key = self_signed
    views = _views(PORTS)
    metrics = SelfMetrics()
    async with PrometheusExporter(listen="127.0.0.1:0", self_metrics=metrics,
                                  tls_cert=cert, tls_key=key) as exp:
        exp.publish_now(_state(views))
        trusting = ssl.create_default_context(cafile=str(cert))

        def fetch() -> bytes:
            req = urllib.request.Request(f"https://127.0.0.1:{exp.port}/metrics",
                                         headers={"Accept-Encoding": "gzip"})
            with contextlib.closing(urllib.request.urlopen(req, context=trusting,
                                                           timeout=30)) as resp:
                return gzip.decompress(resp.read())

        body = await asyncio.to_thread(fetch)
    assert body.endswith(_ports_body(views))
