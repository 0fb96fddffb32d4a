"""Plain HTTP sent to a TLS listener (``http://`` where ``https://`` was meant): the listener
must count it as a bad request and log it with a hint, as it does TLS sent to a plain port,
instead of dropping it without a trace. A real TLS listener with a throwaway certificate."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
import urllib.request
from pathlib import Path

import structlog

from exporters.prometheus import PrometheusExporter
from ibmon.runtime.selfmetrics import SelfMetrics
from tests.integration.test_prometheus_server import self_signed

__all__ = ["self_signed"]  # the fixture


async def test_plain_http_to_the_tls_port_is_counted_and_logged(
    self_signed: tuple[Path, Path],
) -> None:
    cert, key = self_signed
    metrics = SelfMetrics()
    async with PrometheusExporter(listen="127.0.0.1:0", self_metrics=metrics,
                                  tls_cert=cert, tls_key=key) as exp:
        with structlog.testing.capture_logs() as logs:
            reader, writer = await asyncio.open_connection("127.0.0.1", exp.port)
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: ibmon\r\n\r\n")
            with contextlib.suppress(ConnectionError):
                await asyncio.wait_for(reader.read(), 10)  # the listener closes it
            writer.close()
            for _ in range(100):
                if metrics.registry.get_sample_value("ibmon_http_bad_requests_total"):
                    break
                await asyncio.sleep(0.02)
        assert metrics.registry.get_sample_value("ibmon_http_bad_requests_total") == 1
        bad = [line for line in logs if line["event"] == "http_bad_request"]
        assert len(bad) == 1, logs
        assert bad[0]["peer"] == "127.0.0.1"
        assert "http:// vs https://" in bad[0]["hint"]

        # A TLS client is still served, and is no bad request.
        trusting = ssl.create_default_context(cafile=str(cert))

        def fetch() -> int:
            with urllib.request.urlopen(f"https://127.0.0.1:{exp.port}/metrics",
                                        context=trusting, timeout=10) as resp:
                return int(resp.status)

        assert await asyncio.to_thread(fetch) == 200
        assert metrics.registry.get_sample_value("ibmon_http_bad_requests_total") == 1


async def test_tls_to_the_plain_port_is_counted_and_logged_with_a_hint() -> None:
    """The reverse mistake (``https://`` to a plain listener): a real TLS client's hello."""
    metrics = SelfMetrics()
    async with PrometheusExporter(listen="127.0.0.1:0", self_metrics=metrics) as exp:
        with structlog.testing.capture_logs() as logs:
            client = ssl.create_default_context()
            client.check_hostname = False
            client.verify_mode = ssl.CERT_NONE

            def fetch() -> None:
                with urllib.request.urlopen(f"https://127.0.0.1:{exp.port}/metrics",
                                            context=client, timeout=10):
                    pass

            with contextlib.suppress(OSError):  # the handshake fails: a 400 is no ServerHello
                await asyncio.to_thread(fetch)
        assert metrics.registry.get_sample_value("ibmon_http_bad_requests_total") == 1
        (bad,) = [line for line in logs if line["event"] == "http_bad_request"]
        assert "https:// vs http://" in bad["hint"]


async def test_a_client_that_drops_during_the_handshake_is_no_bad_request(
    self_signed: tuple[Path, Path],
) -> None:
    """A port scan or a load balancer's TCP check connects and resets: nothing malformed was
    received, so nothing is counted or logged as a bad request."""
    cert, key = self_signed
    metrics = SelfMetrics()
    async with PrometheusExporter(listen="127.0.0.1:0", self_metrics=metrics,
                                  tls_cert=cert, tls_key=key) as exp:
        with structlog.testing.capture_logs() as logs:
            for _ in range(3):
                sock = socket.create_connection(("127.0.0.1", exp.port))
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()  # RST
            for _ in range(100):  # until the listener has let go of them
                if exp._guard.open == 0:
                    break
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.2)  # and its handshake task has ended
        assert exp._guard.open == 0
        assert not metrics.registry.get_sample_value("ibmon_http_bad_requests_total")
        assert not [line for line in logs if line["event"] == "http_bad_request"]
