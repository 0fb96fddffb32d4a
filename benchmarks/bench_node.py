"""ibmon beside node_exporter on a compute node: CPU per poll and RSS on a 16-HCA sysfs tree.

    .venv/bin/python benchmarks/bench_node.py [--hcas 16] [--duration 60] [--warmup 15]
    .venv/bin/python benchmarks/bench_node.py --duration 600     # the 10-minute RSS target

A compute node's daemon must cost no more CPU per poll than node_exporter's infiniband
collector per scrape of the same tree, and hold at most 40 MB after 10 minutes. Both programs
run for real, as their own processes, on the same tree for the same wall time:

- the tree: ``--hcas`` devices ``mlx5_<n>`` with one port each, every port with the 21
  ``counters/`` files of a current mlx5 (extended-width table) and 31 ``hw_counters/`` (the
  names of the mlx5 capture in the shared real fixtures plus the RoCE congestion counters). A
  thread in this process advances the data, packet and a few hw counters every second, in place
  (``pwrite`` of a same-length value, as sysfs files keep their inode), so every poll sees new
  values, as on a busy node;
- ``ibmon run --config <tmp>`` (the venv's console script, as the systemd unit starts it) with
  one sysfs source at a 1 s interval and the systemd unit's ``Environment=`` lines (read from
  ``deploy/systemd/ibmon.service``, so the benchmark runs what is shipped);
- ``prometheus-node-exporter --collector.disable-defaults --collector.infiniband
  --path.sysfs=<tree>`` (node_exporter 1.5 reads ``counters/`` and not ``hw_counters/``).

A scraper in this process fetches both ``/metrics`` every second with gzip over a kept-alive
connection, as Prometheus does.
After ``--warmup`` seconds, each process's ``utime + stime`` (``/proc/<pid>/stat``, all threads)
is read at the start and the end of a ``--duration`` window: ibmon's CPU per poll is its CPU
over the polls it completed in the window (``ibmon_source_poll_duration_seconds_count``),
serving its own scrapes included; node_exporter's CPU per scrape is its CPU over the scrapes
it answered. RSS is VmRSS at the end of the window (VmHWM beside it).

Exits 1 when ibmon's CPU per poll is above node_exporter's CPU per scrape or its RSS is above
40 MB (a limit stated for 10 minutes: ``--duration 600``).
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.procstat import cpu_seconds, free_port, memory_mb, scrape
from tests.sysfs_tree import FULL_COUNTERS, class_dir, write_device, write_port

REPO = Path(__file__).resolve().parents[1]

RSS_LIMIT_MB = 40.0

#: hw_counters/ of the mlx5 port in the procfs capture (26 files), plus RoCE congestion counters.
HW_COUNTERS = (
    "duplicate_request", "implied_nak_seq_err", "lifespan", "local_ack_timeout_err",
    "out_of_buffer", "out_of_sequence", "packet_seq_err", "req_cqe_error",
    "req_cqe_flush_error", "req_remote_access_errors", "req_remote_invalid_request",
    "resp_cqe_error", "resp_cqe_flush_error", "resp_local_length_error",
    "resp_remote_access_errors", "rnr_nak_retry_err", "roce_adp_retrans", "roce_adp_retrans_to",
    "roce_slow_restart", "roce_slow_restart_cnps", "roce_slow_restart_trans",
    "rx_atomic_requests", "rx_dct_connect", "rx_read_requests", "rx_write_requests",
    "np_cnp_sent", "np_ecn_marked_roce_packets", "rp_cnp_handled", "rp_cnp_ignored",
    "rx_icrc_encapsulated", "out_of_buffer_discards",
)
#: Files advanced every second (per port), by how much: traffic at roughly 10 GB/s.
MOVING = {
    "counters/port_xmit_data": 2_500_000_000,
    "counters/port_rcv_data": 2_400_000_000,
    "counters/port_xmit_packets": 2_500_000,
    "counters/port_rcv_packets": 2_400_000,
    "counters/unicast_xmit_packets": 2_500_000,
    "counters/unicast_rcv_packets": 2_400_000,
    "counters/port_xmit_wait": 1_000,
    "hw_counters/rx_write_requests": 50_000,
    "hw_counters/rx_read_requests": 20_000,
    "hw_counters/np_ecn_marked_roce_packets": 10,
}
#: Starting value of a moving counter: 13 digits, and 10 minutes of increments keep 13 digits,
#: so each update is one pwrite of the same length (no reader ever sees a short file).
MOVING_START = 1_000_000_000_000
HW_START = 1_000_000_000


def build_tree(root: Path, hcas: int) -> list[Path]:
    """The tree; returns the port directories."""
    ports: list[Path] = []
    for n in range(hcas):
        dev = f"mlx5_{n}"
        write_device(root, dev, node_guid=f"0c42:a103:00{n:02x}:{n:04x}",
                     node_desc=f"node0001 {dev}")
        counters = {**FULL_COUNTERS}
        hw = dict.fromkeys(HW_COUNTERS, 0)
        hw["lifespan"] = 10
        for rel in MOVING:
            kind, name = rel.split("/")
            (counters if kind == "counters" else hw)[name] = (
                MOVING_START if kind == "counters" else HW_START
            )
        ports.append(write_port(root, dev, 1, counters=counters, hw_counters=hw,
                                lid=f"0x{n + 1:x}\n", rate="400 Gb/sec (4X NDR)\n"))
    return ports


class Traffic(threading.Thread):
    """Advances the moving counters every second, in place (same inode, same length)."""

    def __init__(self, ports: list[Path]) -> None:
        super().__init__(daemon=True, name="traffic")
        self.stop = threading.Event()
        self.files: list[tuple[int, int, list[int]]] = []
        for pdir in ports:
            for rel, step in MOVING.items():
                path = pdir / rel
                value = int(path.read_text())
                self.files.append((os.open(path, os.O_WRONLY), step, [value]))

    def run(self) -> None:
        while not self.stop.wait(1.0):
            for fd, step, cell in self.files:
                cell[0] += step
                os.pwrite(fd, f"{cell[0]}\n".encode(), 0)

    def close(self) -> None:
        self.stop.set()
        self.join(timeout=5)
        for fd, _, _ in self.files:
            os.close(fd)


def unit_environment() -> dict[str, str]:
    """The ``Environment=`` assignments of the shipped systemd unit."""
    env: dict[str, str] = {}
    unit = REPO / "deploy" / "systemd" / "ibmon.service"
    for line in unit.read_text().splitlines():
        if line.startswith("Environment="):
            for item in line.removeprefix("Environment=").split():
                key, _, value = item.strip('"').partition("=")
                env[key] = value
    return env


def metric(text: str, name: str) -> float | None:
    m = re.search(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    port: int
    log: Path

    def alive(self) -> None:
        if self.popen.poll() is not None:
            sys.exit(f"{self.name} exited {self.popen.returncode}: "
                     f"{self.log.read_text(errors='replace')[-3000:]}")

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=10)


def start(name: str, argv: list[str], port: int, log: Path, env: dict[str, str]) -> Proc:
    with log.open("wb") as err:
        popen = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    return Proc(name, popen, port, log)


class KeepAlive:
    """One scraper's connection to one target, kept open between scrapes as Prometheus does."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn: http.client.HTTPConnection | None = None

    def get(self) -> str:
        for attempt in (1, 2):  # a connection the server closed meanwhile is opened again
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            try:
                self.conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
                resp = self.conn.getresponse()
                body = resp.read()
            except (OSError, http.client.HTTPException):
                self.conn.close()
                self.conn = None
                if attempt == 2:
                    raise
                continue
            if resp.getheader("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            return body.decode("utf-8", "replace")
        raise AssertionError("unreachable")


class Scraper(threading.Thread):
    """Scrapes every target once a second, with gzip and keep-alive, as Prometheus would."""

    def __init__(self, procs: list[Proc]) -> None:
        super().__init__(daemon=True, name="scraper")
        self.procs = procs
        self.stop = threading.Event()
        self.counts = dict.fromkeys((p.name for p in procs), 0)
        self.last = dict.fromkeys((p.name for p in procs), "")
        self.lock = threading.Lock()
        self.conns = {p.name: KeepAlive(p.port) for p in procs}

    def run(self) -> None:
        next_at = time.monotonic()
        while not self.stop.is_set():
            for p in self.procs:
                try:
                    text = self.conns[p.name].get()
                except (OSError, http.client.HTTPException):
                    continue
                with self.lock:
                    self.counts[p.name] += 1
                    self.last[p.name] = text
            next_at += 1.0
            self.stop.wait(max(0.0, next_at - time.monotonic()))


def ibmon_config(port: int, workdir: Path, tree: Path, keep_open: str = "true") -> str:
    keep = "" if keep_open == "auto" else f"keep_open = {keep_open}\n"
    return f"""
[prometheus]
listen = "127.0.0.1:{port}"
[state]
path = "{workdir / "state.json"}"
[log]
format = "json"
[[sources]]
type = "sysfs"
root = "{tree}"
interval = "1s"
{keep}"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hcas", type=int, default=16)
    ap.add_argument("--duration", type=float, default=60.0, help="measured window, seconds")
    ap.add_argument("--warmup", type=float, default=15.0, help="seconds before the window")
    ap.add_argument(
        "--keep-open", choices=("true", "false", "auto"), default="true",
        help="the sysfs source's keep_open (default true: on a real sysfs mount, which this "
        "tree is not, auto means true; the tree is updated in place, as sysfs is)",
    )
    ap.add_argument("--ibmon", default=str(Path(sys.executable).with_name("ibmon")),
                    help="the ibmon executable (default: the venv's console script)")
    args = ap.parse_args()
    ne_binary = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if ne_binary is None:
        sys.exit("node_exporter not installed (apt package prometheus-node-exporter)")

    with tempfile.TemporaryDirectory(prefix="bench-node-") as tmp:
        workdir = Path(tmp)
        tree = workdir / "sys"
        ports = build_tree(tree, args.hcas)
        nfiles = sum(1 for f in class_dir(tree).rglob("*") if f.is_file())
        traffic = Traffic(ports)
        traffic.start()

        unit_env = unit_environment()
        env = {k: v for k, v in os.environ.items() if not k.startswith("IBMON_")}
        env.update(unit_env)
        iport, nport = free_port(), free_port()
        cfg = workdir / "ibmon.toml"
        cfg.write_text(ibmon_config(iport, workdir, tree, args.keep_open))
        ibmon = start("ibmon", [args.ibmon, "run", "--config", str(cfg)], iport,
                      workdir / "ibmon.log", env)
        ne = start("node_exporter", [
            ne_binary, f"--path.sysfs={tree}", "--collector.disable-defaults",
            "--collector.infiniband", f"--web.listen-address=127.0.0.1:{nport}",
        ], nport, workdir / "node_exporter.log", dict(os.environ))
        scraper: Scraper | None = None
        try:
            deadline = time.monotonic() + 60
            ready: set[str] = set()
            while ready != {"ibmon", "node_exporter"}:
                for p in (ibmon, ne):
                    p.alive()
                    try:
                        text = scrape(p.port, timeout=10)
                    except OSError:
                        continue
                    if p is ne or metric(text, "ibmon_source_up") == 1.0:
                        ready.add(p.name)
                if time.monotonic() > deadline:
                    sys.exit("not ready within 60 s")
                time.sleep(0.2)
            scraper = Scraper([ibmon, ne])
            scraper.start()
            time.sleep(args.warmup)

            def polls() -> float:
                with scraper.lock:
                    text = scraper.last["ibmon"]
                return metric(text, "ibmon_source_poll_duration_seconds_count") or 0.0

            def ne_scrapes() -> int:
                with scraper.lock:
                    return scraper.counts["node_exporter"]

            c0 = {p.name: cpu_seconds(p.popen.pid) for p in (ibmon, ne)}
            p0, s0, t0 = polls(), ne_scrapes(), time.monotonic()
            time.sleep(args.duration)
            time.sleep(1.1)  # one more scrape, so the poll count read is from inside the window
            c1 = {p.name: cpu_seconds(p.popen.pid) for p in (ibmon, ne)}
            p1, s1, t1 = polls(), ne_scrapes(), time.monotonic()
            mem = {p.name: memory_mb(p.popen.pid) for p in (ibmon, ne)}
            with scraper.lock:
                ibmon_text = scraper.last["ibmon"]
            for p in (ibmon, ne):
                p.alive()
        finally:
            if scraper is not None:
                scraper.stop.set()
                scraper.join(timeout=15)
            ibmon.stop()
            ne.stop()
            traffic.close()

    wall = t1 - t0
    n_polls, n_scrapes = p1 - p0, s1 - s0
    if n_polls <= 0 or n_scrapes <= 0:
        sys.exit(f"no polls ({n_polls}) or scrapes ({n_scrapes}) in the window")
    ib_cpu, ne_cpu = c1["ibmon"] - c0["ibmon"], c1["node_exporter"] - c0["node_exporter"]
    per_poll, per_scrape = ib_cpu / n_polls, ne_cpu / n_scrapes
    ratio = per_poll / per_scrape if per_scrape > 0 else float("inf")
    ib_ports = metric(ibmon_text, "ibmon_source_ports") or 0
    env_text = " ".join(f"{k}={v}" for k, v in sorted(unit_env.items())) or "(none)"
    print(f"tree: {args.hcas} HCAs x 1 port, {nfiles} files; ibmon sees {ib_ports:.0f} ports")
    print(f"ibmon environment from the systemd unit: {env_text}")
    print(f"window: {wall:.1f} s after {args.warmup:.0f} s warm-up; both scraped every second")
    print(f"{'':14} {'CPU s':>8} {'count':>7} {'CPU/op ms':>10} {'% core':>7} "
          f"{'RSS MB':>7} {'HWM MB':>7}")
    print(f"{'ibmon poll':14} {ib_cpu:8.2f} {n_polls:7.0f} {per_poll * 1e3:10.2f} "
          f"{ib_cpu / wall * 100:7.2f} {mem['ibmon'][0]:7.1f} {mem['ibmon'][1]:7.1f}")
    print(f"{'node_exp scrape':14} {ne_cpu:8.2f} {n_scrapes:7d} {per_scrape * 1e3:10.2f} "
          f"{ne_cpu / wall * 100:7.2f} {mem['node_exporter'][0]:7.1f} "
          f"{mem['node_exporter'][1]:7.1f}")
    print(f"ratio ibmon CPU per poll / node_exporter CPU per scrape: {ratio:.2f} (target <= 1.0)")
    print(f"ibmon RSS: {mem['ibmon'][0]:.1f} MB (target <= {RSS_LIMIT_MB:.0f} MB after 10 min)")
    failed = []
    if ratio > 1.0:
        failed.append("CPU per poll")
    if mem["ibmon"][0] > RSS_LIMIT_MB:
        failed.append("RSS")
    if failed:
        print("FAILED: " + ", ".join(failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
