"""Memory, CPU per poll and scrape latency of a real fabric daemon on a large simulated fabric.

    .venv/bin/python benchmarks/bench_scale.py [--hosts 7000] [--scenario demo]
        [--polls 3] [--scrapes 400] [--phases steady,idle,busy]

Each phase starts its own ``python -m ibmon run`` with one ``mock`` source
exactly as ``ibmon demo --hosts N --scenario S`` configures it (simulated time x10), which is
the simulator and the daemon in one process:

- ``steady`` (``interval`` 10 s, as ``ibmon demo --interval 10``): after the first poll, over
  ``--polls`` polls: VmRSS/VmHWM (``rss_mb`` is read at the end of the window, which
  may fall inside a poll, ``rss_low_mb`` is the lowest reading, between polls, every 0.5 s),
  the daemon's CPU per poll (``utime + stime``, simulator included), its minor page faults
  per poll (fresh memory touched: what makes the same code 10-30 % slower in one run than
  another on a virtual machine) and the mean of each ``ibmon_pipeline_stage_seconds`` stage
  (track + detect + publish is what a poll costs beyond sampling).
- ``idle`` (``interval`` 30 s): after the second poll (the first has no rates, so its body is a
  fifth smaller than a busy daemon's) and before the third, p50/p99 of ``--scrapes`` gzip
  scrapes of ``/metrics``: the baseline.
- ``busy`` (``interval`` 0.05 s: polls back to back): the same scrapes while the pipeline runs,
  the worst case for a scrape. ``ibmon_event_loop_lag_seconds`` (when the daemon
  exports it) gives the worst loop stall seen in the phase.

Scrapes are sequential, one connection each, ``Accept-Encoding: gzip`` as Prometheus asks;
400 of them by default, so a p99 is the fourth-slowest scrape, not the second (with 200, the
idle p99 the ratio is divided by moved 6.6-10.9 ms from run to run of the same code). The
machine's load average is printed with the results: the ratios of one run are what count.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Daemon:
    pid: int
    base: str

    def get(self, path: str, *, gzip: bool = False) -> bytes:
        req = urllib.request.Request(self.base + path,
                                     headers={"Accept-Encoding": "gzip"} if gzip else {})
        with urllib.request.urlopen(req, timeout=600) as resp:
            return bytes(resp.read())

    def metrics(self) -> str:
        """One scrape, gzip (the daemon's cheap path), decompressed here."""
        return gzip.decompress(self.get("/metrics", gzip=True)).decode()

    def cpu(self) -> float:
        """utime + stime of the daemon (all threads) and its live children, seconds."""
        total = 0.0
        for pid in [self.pid, *_children(self.pid)]:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / TICK
        return total

    def faults(self) -> int:
        """Minor page faults of the daemon so far: each a page of memory touched for the first
        time since it was mapped (a poll's fresh arrays and objects), 1.5-13 us each on this
        project's virtual machines."""
        return int(Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[7])

    def status(self, key: str) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
        return 0.0


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def _sample(text: str, name: str, **labels: str) -> float | None:
    sel = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pat = rf"^{re.escape(name)}" + (rf"\{{{re.escape(sel)}\}}" if sel else r"(?:\{\})?") + r" (\S+)"
    m = re.search(pat, text, re.M)
    return float(m.group(1)) if m else None


def _polls(d: Daemon) -> float:
    return _sample(d.metrics(), "ibmon_source_poll_duration_seconds_count", source="mock") or 0.0


@contextmanager
def daemon(hosts: int, scenario: str, interval: float) -> Iterator[Daemon]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    cfg = tmp / "ibmon.toml"
    cfg.write_text('[prometheus]\nlisten = "127.0.0.1:0"\n[[sources]]\ntype = "mock"\n'
                   f'name = "mock"\nscenario = "{scenario}"\nhosts = {hosts}\nspeed = 10.0\n'
                   f'interval = {interval}\n')
    env = {**os.environ, "IBMON_LOG__FORMAT": "json", "IBMON_STATE__PATH": str(tmp / "s.json")}
    log_path = tmp / "daemon.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "ibmon", "run", "--config", str(cfg)],
                                cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=log,
                                start_new_session=True)
    try:
        port = 0
        deadline = time.monotonic() + 600
        while not port:
            if proc.poll() is not None or time.monotonic() > deadline:
                print(log_path.read_text()[-3000:], file=sys.stderr)
                raise SystemExit(2)
            for line in log_path.read_text().splitlines():
                if '"listening"' in line:
                    port = int(json.loads(line)["port"])
            time.sleep(0.2)
        d = Daemon(proc.pid, f"http://127.0.0.1:{port}")
        while _polls(d) < 1 or "ibmon_port_info{" not in d.metrics():  # ports published
            time.sleep(0.5)
        yield d
    finally:
        with contextlib.suppress(ProcessLookupError):  # it exited already (a bad config)
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


STAGES = ("sample", "track", "detect", "publish")

#: The idle phase's interval: its scrapes run after the second poll, so they serve the same
#: series as the busy phase's (a first poll has no rates: a 20 % smaller body), and end long
#: before the third.
IDLE_INTERVAL = 30.0


def _stages(text: str) -> dict[str, tuple[float, float]]:
    out = {}
    for s in STAGES:
        total = _sample(text, "ibmon_pipeline_stage_seconds_sum", source="mock", stage=s) or 0.0
        count = _sample(text, "ibmon_pipeline_stage_seconds_count", source="mock", stage=s) or 0.0
        out[s] = (total, count)
    return out


def steady(d: Daemon, polls: int, interval: float) -> dict[str, float]:
    """Over ``polls`` intervals: two scrapes only (their CPU is not counted), so the CPU per
    poll is the poll's (sample, track, detect, publish, state saves)."""
    start = _polls(d)
    while _polls(d) < start + 1:  # align the window just after a poll's end
        time.sleep(0.5)
    text0 = d.metrics()
    cpu0 = d.cpu()
    faults0 = d.faults()
    peak = low = d.status("VmRSS")
    end = time.monotonic() + polls * interval
    while time.monotonic() < end:
        rss = d.status("VmRSS")
        peak, low = max(peak, rss), min(low, rss)
        time.sleep(0.5)
    cpu1 = d.cpu()
    faults1 = d.faults()
    text1 = d.metrics()
    n0 = _sample(text0, "ibmon_source_poll_duration_seconds_count", source="mock") or 0.0
    n1 = _sample(text1, "ibmon_source_poll_duration_seconds_count", source="mock") or 0.0
    s0, s1 = _stages(text0), _stages(text1)
    res = {"polls": n1 - n0, "cpu_per_poll": (cpu1 - cpu0) / max(1.0, n1 - n0),
           "faults_per_poll": (faults1 - faults0) / max(1.0, n1 - n0),
           "rss_mb": d.status("VmRSS"), "rss_low_mb": low, "rss_peak_mb": peak,
           "hwm_mb": d.status("VmHWM"),
           "ports": _sample(text1, "ibmon_source_ports", source="mock") or 0.0}
    for s in STAGES:
        dt, dn = s1[s][0] - s0[s][0], s1[s][1] - s0[s][1]
        res[f"{s}_s"] = dt / dn if dn else float("nan")
    res["track_detect_publish_s"] = res["track_s"] + res["detect_s"] + res["publish_s"]
    return res


def _lag(text: str) -> tuple[float, float, float]:
    """(samples, samples over 50 ms, sum) of ibmon_event_loop_lag_seconds, zeros if absent."""
    count = _sample(text, "ibmon_event_loop_lag_seconds_count") or 0.0
    under = _sample(text, "ibmon_event_loop_lag_seconds_bucket", le="0.05") or 0.0
    total = _sample(text, "ibmon_event_loop_lag_seconds_sum") or 0.0
    return count, count - under, total


def _largest_bucket(text: str) -> float:
    """The upper bound of the largest occupied lag bucket (the worst stall, to a bucket)."""
    worst, prev = 0.0, 0.0
    for m in re.finditer(r'^ibmon_event_loop_lag_seconds_bucket\{le="([^"]+)"\} (\S+)', text,
                         re.M):
        le, n = m.group(1), float(m.group(2))
        if n > prev:
            worst = float("inf") if le == "+Inf" else float(le)
        prev = n
    return worst


def scrapes(d: Daemon, n: int) -> dict[str, float]:
    lag0 = _lag(d.metrics())
    times: list[float] = []
    size = 0
    for _ in range(n):
        t0 = time.perf_counter()
        body = d.get("/metrics", gzip=True)
        times.append(time.perf_counter() - t0)
        size = len(body)
        time.sleep(0.05)
    text = d.metrics()
    lag1 = _lag(text)
    times.sort()
    return {"p50_ms": statistics.median(times) * 1e3,
            "p99_ms": times[min(len(times) - 1, round(0.99 * (len(times) - 1)))] * 1e3,
            "max_ms": times[-1] * 1e3, "gzip_bytes": size,
            "lag_samples": lag1[0] - lag0[0], "lag_over_50ms": lag1[1] - lag0[1],
            "lag_worst_bucket_s": _largest_bucket(text)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=7000)
    ap.add_argument("--scenario", default="demo")
    ap.add_argument("--polls", type=int, default=3)
    ap.add_argument("--scrapes", type=int, default=400)
    ap.add_argument("--phases", default="steady,idle,busy")
    args = ap.parse_args()
    phases = args.phases.split(",")
    results: dict[str, dict[str, float]] = {}
    print(f"hosts={args.hosts} scenario={args.scenario} load={os.getloadavg()}", flush=True)
    if "steady" in phases:
        with daemon(args.hosts, args.scenario, 10.0) as d:
            results["steady"] = steady(d, args.polls, 10.0)
        print("steady", json.dumps(results["steady"]), flush=True)
    if "idle" in phases:
        with daemon(args.hosts, args.scenario, IDLE_INTERVAL) as d:
            while _polls(d) < 2:  # the rate series exist from the second poll on
                time.sleep(0.5)
            time.sleep(2)  # its publish done; the next poll is IDLE_INTERVAL away
            before = _polls(d)
            results["idle"] = scrapes(d, args.scrapes)
            if _polls(d) != before:
                print(f"warning: a poll ran during the idle scrapes (more than "
                      f"{IDLE_INTERVAL:.0f} s of scrapes): the baseline is not idle", flush=True)
        print("idle", json.dumps(results["idle"]), flush=True)
    if "busy" in phases:
        with daemon(args.hosts, args.scenario, 0.05) as d:
            results["busy"] = scrapes(d, args.scrapes)
        print("busy", json.dumps(results["busy"]), flush=True)
    if "idle" in results and "busy" in results:
        ratio = results["busy"]["p99_ms"] / results["idle"]["p99_ms"]
        print(f"gzip scrape p99 busy/idle: {ratio:.1f}x (target <= 2x)")
    print(f"load={os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
