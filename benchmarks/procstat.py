"""What the benchmarks read about a daemon they started: CPU and memory from /proc, a free
loopback port, and one /metrics scrape as Prometheus makes it (gzip)."""

from __future__ import annotations

import gzip
import os
import re
import socket
import urllib.request
from pathlib import Path

__all__ = ["cpu_seconds", "free_port", "memory_mb", "scrape"]

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of ``pid`` (fields 14 and 15 of /proc/<pid>/stat)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def memory_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) in MB."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
    hwm = re.search(r"^VmHWM:\s+(\d+) kB", status, re.M)
    return (int(rss.group(1)) / 1024 if rss else 0.0, int(hwm.group(1)) / 1024 if hwm else 0.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int, timeout: float = 30.0) -> str:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics", headers={"Accept-Encoding": "gzip"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        body: bytes = resp.read()
    if body[:2] == b"\x1f\x8b":
        body = gzip.decompress(body)
    return body.decode("utf-8", "replace")
