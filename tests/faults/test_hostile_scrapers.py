"""Scrapers that ask for ``/metrics`` and never read, against a real ``ibmon demo`` process.

Each holds a connection whose answer cannot leave (a 4 KB receive buffer, nothing read). The
daemon must still answer its liveness probe and a real scraper at once, keep its memory
bounded, and close the stuck connections at their send deadline instead of holding them (and
their buffers) for ever. The connection cap is made small by starting the daemon under a low
``RLIMIT_NOFILE`` (the cap leaves ``FD_RESERVE`` descriptors under it), so a few dozen sockets
fill it, as 260 fill the default 256 on a 62 MB body.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporters.http import FD_RESERVE
from exporters.server import SEND_FLOOR
from tests.faults.daemonproc import REPO, wait_until
from tests.mqtt_broker import free_port

#: The listener's connection cap in this test (see the module docstring).
CAP = 24
#: Never-reading clients: more than the cap, so new ones find it full of stuck answers.
STUCK = 40
#: Linux ``tcpi_state`` values of a socket the other side has closed (RST, or FIN).
_CLOSED_STATES = {7, 8}  # TCP_CLOSE, TCP_CLOSE_WAIT


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _tcp_state(sock: socket.socket) -> int:
    """The kernel's TCP state of ``sock`` (read without touching its receive queue)."""
    return int(struct.unpack("B", sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1))[0])


def _get(url: str, timeout: float) -> tuple[int, bytes, float]:
    start = time.monotonic()
    with contextlib.closing(urllib.request.urlopen(url, timeout=timeout)) as resp:
        body = resp.read()
        return resp.status, body, time.monotonic() - start


#: Lowers the descriptor limit, then becomes the daemon (a limit set before exec, no threads).
_UNDER_LIMIT = (
    "import os, resource, sys; n = int(sys.argv[1]);"
    " resource.setrlimit(resource.RLIMIT_NOFILE, (n, n));"
    " os.execv(sys.executable, [sys.executable, '-m', 'ibmon', *sys.argv[2:]])"
)


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = free_port()
    log = (tmp_path / "demo.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-c", _UNDER_LIMIT, str(CAP + FD_RESERVE), "demo", "--hosts", "300",
         "--listen", f"127.0.0.1:{port}", "--log-level", "warning"],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    url = f"http://127.0.0.1:{port}"

    def serving() -> bool:
        try:
            return _get(f"{url}/metrics", 5)[0] == 200
        except OSError:
            return False

    try:
        wait_until("the demo daemon serving /metrics", serving, 30)
        yield proc, url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        proc.wait(10)
        log.close()


def test_clients_that_never_read_lock_nobody_out(
    demo: tuple[subprocess.Popen[bytes], str], tmp_path: Path,
) -> None:
    proc, url = demo
    port = int(url.rsplit(":", 1)[1])
    rss_before = _rss_kb(proc.pid)
    stuck: list[socket.socket] = []
    started = time.monotonic()
    try:
        for _ in range(STUCK):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", port))
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: ibmon\r\n\r\n")  # plain: 4.7 MB
            stuck.append(sock)
            time.sleep(0.02)
        time.sleep(1.5)  # every answer the cap let in is stuck at the socket buffers now

        # The liveness probe and a real scraper are answered while the cap is full.
        status, body, took = _get(f"{url}/healthz", 5)
        assert status == 200 and b"ok" in body, body
        assert took < 2.0, f"/healthz took {took:.2f}s"
        status, body, took = _get(f"{url}/metrics", 10)
        assert status == 200 and b"ibmon_port_" in body
        assert took < 5.0, f"a fresh /metrics scrape took {took:.2f}s"
        rss_peak = _rss_kb(proc.pid)

        # No stuck answer outlives its send deadline (the floor: the body is under 10 MB).
        def all_closed() -> bool:
            return all(_tcp_state(s) in _CLOSED_STATES for s in stuck)

        wait_until("every never-reading client closed by the send deadline", all_closed,
                   SEND_FLOOR + 5 - (time.monotonic() - started))
        closed_after = time.monotonic() - started
        status, _, _ = _get(f"{url}/healthz", 5)
        assert status == 200
        metrics = _get(f"{url}/metrics", 10)[1].decode()
    finally:
        for sock in stuck:
            sock.close()
    rss_after = _rss_kb(proc.pid)
    grown = (max(rss_peak, rss_after) - rss_before) / 1024
    print(f"RSS {rss_before / 1024:.0f} -> peak {rss_peak / 1024:.0f} -> "
          f"{rss_after / 1024:.0f} MB; stuck clients all closed after {closed_after:.1f}s")
    assert grown < 100, f"RSS grew {grown:.0f} MB for {STUCK} stuck clients"
    timed_out = [line for line in metrics.splitlines()
                 if line.startswith('ibmon_http_connections_closed_total{reason="send_timeout"}')]
    assert timed_out and float(timed_out[0].rsplit(" ", 1)[1]) > 0, timed_out
    log = (tmp_path / "demo.log").read_text(errors="replace")
    assert "Traceback" not in log and "exception was never retrieved" not in log, log[-3000:]
