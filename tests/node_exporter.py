"""The real node_exporter for tests: started on a free loopback port, stopped with its group."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.syspkg import require_binary

__all__ = ["http_get", "running_node_exporter", "stop_group"]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        body: bytes = resp.read()
    return body.decode()


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group started with ``start_new_session``, SIGKILL after 5 s."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


@contextmanager
def running_node_exporter(args: list[str], log: Path) -> Iterator[str]:
    """node_exporter with ``args`` (collectors, paths); yields its /metrics URL once it answers."""
    binary = require_binary("prometheus-node-exporter")
    with log.open("wb") as err:
        for _attempt in range(3):  # the free port may be taken between probe and bind
            port = _free_port()
            proc = subprocess.Popen(
                [binary, *args, f"--web.listen-address=127.0.0.1:{port}"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                start_new_session=True,
            )
            try:
                url = f"http://127.0.0.1:{port}/metrics"
                deadline = time.monotonic() + 15
                while proc.poll() is None and time.monotonic() < deadline:
                    try:
                        http_get(url)
                        break
                    except (urllib.error.URLError, ConnectionError):
                        time.sleep(0.05)
                if proc.poll() is None:
                    yield url
                    return
            finally:
                stop_group(proc)
    pytest.fail(f"node_exporter did not start: {log.read_text()[-2000:]}")
