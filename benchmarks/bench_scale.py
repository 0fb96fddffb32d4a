"""What a fabric daemon costs, and what its scrapers see, on a large simulated fabric.

    .venv/bin/python benchmarks/bench_scale.py [--hosts 7000] [--scenario demo] [--interval 10]
        [--polls 6] [--scrape-every 0.5] [--phases steady,scrape] [--max-rss-mb 450]

It starts one ``python -m ibmon run`` with one ``mock`` source exactly as ``ibmon demo --hosts N
--scenario S --interval I`` configures it (simulated time x10): the simulator and the daemon in
one process, so the simulator's CPU and memory are counted. Once the daemon is in steady state
(two polls done: the first has no rates, so its body is a fifth smaller), each phase is a window
of ``--polls`` intervals that starts just after a poll ends:

- ``steady``: no client but the two reads at the window's ends, so the CPU per poll
  (``utime + stime``, simulator included) and the minor page faults per poll (fresh memory
  touched) are the poll's alone.
- ``scrape``: gzip scrapes of ``/metrics`` every ``--scrape-every`` seconds on a fixed schedule,
  each on its own connection and thread, as a few Prometheus servers scrape (none waits for
  another, a slow answer does not delay the next): p50, p99 and max of their latency. The CPU
  per poll here includes serving them.

Both windows give, from the daemon's own metrics at the window's start and end: the mean wall time
of each ``ibmon_pipeline_stage_seconds`` stage (track + detect + publish is what a poll costs
beyond reading the source) and the p99 of ``ibmon_event_loop_lag_seconds`` over the window, from
the bucket deltas, so it is a bucket's upper bound ("p99 <= 0.05 s"). VmRSS is read at every tick
(0.5 s, or each scrape): ``rss_mb`` is the median reading, which is between polls while a poll
takes under half the interval; the lowest, the last and VmHWM are printed too.

Targets (one line each, exit 1 when one is missed): event-loop lag p99 <= 50 ms, gzip scrape p99
<= 1 s, track + detect + publish <= 1.0 s per poll, RSS between polls <= ``--max-rss-mb``. The
benchmark reads only the head of ``/metrics`` (the daemon's self metrics, before the port series)
so its own decompression does not compete with the daemon for the CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import zlib
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")
STAGES = ("sample", "track", "detect", "publish")
#: The first port series: everything before it in ``/metrics`` is the daemon's self metrics.
PORT_SERIES = re.compile(r"^(?:# [A-Z]+ )?ibmon_(?:port|link)_", re.M)
LAG_BUCKET = re.compile(r'^ibmon_event_loop_lag_seconds_bucket\{le="([^"]+)"\} (\S+)', re.M)
#: Seconds between two VmRSS readings when nothing is scraped.
RSS_EVERY = 0.5


@dataclass
class Daemon:
    pid: int
    base: str

    def get(self, path: str, *, gzip: bool = False) -> bytes:
        req = urllib.request.Request(self.base + path,
                                     headers={"Accept-Encoding": "gzip"} if gzip else {})
        with urllib.request.urlopen(req, timeout=600) as resp:
            return bytes(resp.read())

    def head(self) -> str:
        """The self metrics: one gzip scrape, decompressed only up to the first port series."""
        body = self.get("/metrics", gzip=True)
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        text = ""
        for at in range(0, len(body), 1 << 16):
            text += inflater.decompress(body[at:at + (1 << 16)]).decode(errors="replace")
            if m := PORT_SERIES.search(text):
                return text[:m.start()]
        return text

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
        time since it was mapped (a poll's fresh arrays and objects)."""
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


def _polls(text: str) -> float:
    return _sample(text, "ibmon_source_poll_duration_seconds_count", source="mock") or 0.0


@contextmanager
def daemon(hosts: int, scenario: str, interval: float, jobs: int = 0) -> Iterator[Daemon]:
    """``jobs``: synthetic running jobs besides the scenario's (the mock source's ``jobs``)."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    cfg = tmp / "ibmon.toml"
    cfg.write_text('[prometheus]\nlisten = "127.0.0.1:0"\n[[sources]]\ntype = "mock"\n'
                   f'name = "mock"\nscenario = "{scenario}"\nhosts = {hosts}\nspeed = 10.0\n'
                   f'interval = {interval}\njobs = {jobs}\n')
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
        yield Daemon(proc.pid, f"http://127.0.0.1:{port}")
    finally:
        with contextlib.suppress(ProcessLookupError):  # it exited already (a bad config)
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _after_poll(d: Daemon) -> None:
    """Return just after a poll ends, the second or a later one (steady state)."""
    start = _polls(d.head())
    while _polls(d.head()) < max(2.0, start + 1):
        time.sleep(RSS_EVERY)


def _stages(text: str) -> dict[str, tuple[float, float]]:
    out = {}
    for s in STAGES:
        total = _sample(text, "ibmon_pipeline_stage_seconds_sum", source="mock", stage=s) or 0.0
        count = _sample(text, "ibmon_pipeline_stage_seconds_count", source="mock", stage=s) or 0.0
        out[s] = (total, count)
    return out


def lag_p99(text0: str, text1: str) -> tuple[float, float, float]:
    """(samples, samples over 50 ms, p99) of ``ibmon_event_loop_lag_seconds`` between two
    scrapes. The p99 is the upper bound of the first bucket holding 99 % of the window's
    samples (the true p99 is at most that); NaN when the window has no sample."""
    b0 = {float(le): float(n) for le, n in LAG_BUCKET.findall(text0)}
    b1 = {float(le): float(n) for le, n in LAG_BUCKET.findall(text1)}
    deltas = [(le, n - b0.get(le, 0.0)) for le, n in sorted(b1.items())]
    total = deltas[-1][1] if deltas else 0.0
    if total <= 0:
        return 0.0, 0.0, math.nan
    over = total - dict(deltas).get(0.05, 0.0)
    return total, over, next(le for le, n in deltas if n >= 0.99 * total)


def _timed_scrape(d: Daemon) -> tuple[float, int]:
    t0 = time.perf_counter()
    size = len(d.get("/metrics", gzip=True))
    return time.perf_counter() - t0, size


def window(d: Daemon, polls: int, interval: float, scrape_every: float | None) -> dict[str, float]:
    """Over ``polls`` intervals from just after a poll: what the module docstring lists, with
    gzip scrapes every ``scrape_every`` seconds when it is given."""
    _after_poll(d)
    text0 = d.head()
    cpu0, faults0 = d.cpu(), d.faults()
    step = scrape_every or RSS_EVERY
    rss: list[float] = []
    futures: list[Future[tuple[float, int]]] = []
    with ThreadPoolExecutor(max_workers=8) as pool:
        start = time.monotonic()
        end, tick = start + polls * interval, 0
        while time.monotonic() < end:
            if scrape_every:
                futures.append(pool.submit(_timed_scrape, d))
            rss.append(d.status("VmRSS"))
            tick += 1
            time.sleep(max(0.0, start + tick * step - time.monotonic()))
        scraped = sorted(f.result() for f in futures)
    cpu1, faults1 = d.cpu(), d.faults()
    text1 = d.head()
    n = _polls(text1) - _polls(text0)
    s0, s1 = _stages(text0), _stages(text1)
    samples, over, p99 = lag_p99(text0, text1)
    res = {"polls": n, "cpu_per_poll": (cpu1 - cpu0) / max(1.0, n),
           "faults_per_poll": (faults1 - faults0) / max(1.0, n),
           "rss_mb": statistics.median(rss), "rss_low_mb": min(rss), "rss_end_mb": rss[-1],
           "hwm_mb": d.status("VmHWM"),
           "ports": _sample(text1, "ibmon_source_ports", source="mock") or 0.0,
           "lag_samples": samples, "lag_over_50ms": over, "lag_p99_s": p99}
    for s in STAGES:
        dt, dn = s1[s][0] - s0[s][0], s1[s][1] - s0[s][1]
        res[f"{s}_s"] = dt / dn if dn else math.nan
    res["track_detect_publish_s"] = res["track_s"] + res["detect_s"] + res["publish_s"]
    if scraped:
        times = [t for t, _ in scraped]
        res.update(scrapes=len(times), scrape_p50_s=statistics.median(times),
                   scrape_p99_s=times[min(len(times) - 1, round(0.99 * (len(times) - 1)))],
                   scrape_max_s=times[-1], gzip_bytes=scraped[-1][1])
    return res


def check(phase: str, res: dict[str, float], max_rss_mb: float) -> bool:
    """Print one line per figure with its target; False when one is missed (or not measured)."""
    targets = [("event-loop lag p99", "lag_p99_s", 0.05, "s"),
               ("gzip scrape p99", "scrape_p99_s", 1.0, "s"),
               ("track + detect + publish per poll", "track_detect_publish_s", 1.0, "s"),
               ("RSS between polls (median)", "rss_mb", max_rss_mb, "MB")]
    ok = True
    for label, key, target, unit in targets:
        if key not in res:
            continue
        value = res[key]
        met = value <= target  # NaN (nothing measured) is a miss
        ok &= met
        shown = f"<= {value:g}" if key == "lag_p99_s" else f"{value:.3f}" if unit == "s" \
            else f"{value:.0f}"
        print(f"{phase} {label}: {shown} {unit} (target <= {target:g} {unit})"
              f"{'' if met else '  MISSED'}", flush=True)
    return ok


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=7000)
    ap.add_argument("--scenario", default="demo")
    ap.add_argument("--interval", type=float, default=10.0, help="the daemon's poll interval")
    ap.add_argument("--polls", type=int, default=6, help="intervals in each phase's window")
    ap.add_argument("--scrape-every", type=float, default=0.5)
    ap.add_argument("--phases", default="steady,scrape")
    ap.add_argument("--max-rss-mb", type=float, default=450.0)
    args = ap.parse_args()
    phases = [p for p in args.phases.split(",") if p]
    if not phases or set(phases) - {"steady", "scrape"}:
        ap.error("--phases: steady, scrape or both")
    print(f"hosts={args.hosts} scenario={args.scenario} interval={args.interval:g} "
          f"load={os.getloadavg()}", flush=True)
    ok = True
    with daemon(args.hosts, args.scenario, args.interval) as d:
        for phase in phases:
            every = args.scrape_every if phase == "scrape" else None
            res = window(d, args.polls, args.interval, every)
            print(phase, json.dumps(res), flush=True)
            ok &= check(phase, res, args.max_rss_mb)
    print(f"load={os.getloadavg()}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
