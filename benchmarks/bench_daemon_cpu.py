"""CPU and memory of a real ``ibmon run`` polling a simulated >= 2,000-port fabric every 10 s.

    .venv/bin/python benchmarks/bench_daemon_cpu.py [--ports 2200] [--duration 80]

Starts ibsim + opensm on ``fabric_for_ports(--ports)``, writes a config with one ``mad`` source
(interval 10 s, topology_interval 5 m, the config's default concurrency) and runs
``python -m ibmon run --config <tmp>`` as its own process with the simulator's environment
(``LD_PRELOAD`` of libumad2sim, ``IBSIM_SOCKNAME``). A scraper in this process fetches
``/metrics`` with gzip every ``--scrape-interval`` seconds, as Prometheus would.

After the first poll has completed (start-up: imports, discovery, first sweep), the daemon's
``utime + stime`` from ``/proc/<pid>/stat`` (all its threads, plus its live child processes: the
``mad`` source's MAD worker holds the umad port in one) is read at the start and end of a
``--duration`` second window and reported as a percentage of one core, with VmRSS/VmHWM.
Discovery runs on the 5-minute timer, so it is not in the window; its cost per run is reported
from the start-up phase and amortised separately. Exits 1 when the window is over 5 % of a core.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.procstat import cpu_seconds, free_port, memory_mb, scrape
from mocks.ibsim import IbSim
from mocks.topology import fabric_for_ports, to_ibsim_netfile

CPU_LIMIT_PCT = 5.0


def tree_cpu_seconds(pid: int) -> float:
    """``cpu_seconds`` of ``pid`` plus its live children (the MAD worker process)."""
    total = cpu_seconds(pid)
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == pid:
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(text[text.rindex(")") + 2 :].split()[1]) == pid:
            total += cpu_seconds(int(entry))
    return total


def metric(text: str, name: str, source: str = "fabric") -> float | None:
    m = re.search(rf'^{re.escape(name)}\{{[^}}]*source="{source}"[^}}]*\}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else None


#: innermost frames of a thread that is waiting, not working (py-spy samples them anyway)
_IDLE_LEAVES = ("_worker (", "EpollSelector.select (", "Condition.wait (", "Event.wait (")


def print_profile(path: Path, top: int = 20) -> None:
    """Busy samples of a py-spy raw file, by ibmon function (inclusive share of busy time)."""
    busy = 0
    incl: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        if frames[-1].startswith(_IDLE_LEAVES):
            continue
        n = int(count)
        busy += n
        # "func (file.py:123)" -> "func (file.py)": one entry per function, not per line
        names = {re.sub(r":\d+\)$", ")", f) for f in frames}
        for name in names:
            if "ibmon/" in name or "exporters/" in name:
                incl[name] += n
    print(f"py-spy: {busy} busy samples; share of busy time by function (inclusive):")
    for name, n in incl.most_common(top):
        print(f"  {n / max(1, busy) * 100:5.1f} %  {name}")


def config_text(port: int, workdir: Path, interval: str, topology_interval: str) -> str:
    return f"""
fabric = "bench"
[prometheus]
listen = "127.0.0.1:{port}"
[state]
path = "{workdir / "state.json"}"
[log]
level = "warning"
format = "json"
[[sources]]
type = "mad"
name = "fabric"
interval = "{interval}"
topology_interval = "{topology_interval}"
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ports", type=int, default=2200)
    ap.add_argument("--duration", type=float, default=80.0)
    ap.add_argument("--interval", default="10s")
    ap.add_argument("--topology-interval", default="5m")
    ap.add_argument("--scrape-interval", type=float, default=15.0, help="0: no scrapes")
    ap.add_argument(
        "--profile",
        metavar="FILE",
        help="also record the window with py-spy (pip install py-spy) into FILE (raw stacks) "
        "and print where the daemon's CPU goes",
    )
    args = ap.parse_args()
    fab = fabric_for_ports(args.ports)
    repo = Path(__file__).resolve().parents[1]
    with IbSim(to_ibsim_netfile(fab)) as sim, tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        port = free_port()
        cfg = workdir / "ibmon.toml"
        cfg.write_text(config_text(port, workdir, args.interval, args.topology_interval))
        env = sim.tool_env()
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo), env.get("PYTHONPATH")) if p)
        log = open(workdir / "daemon.log", "w+b")  # noqa: SIM115 - closed below
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "ibmon", "run", "--config", str(cfg)],
            env=env,
            cwd=sim.workdir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            text = ""
            while True:  # start-up: until the first poll has completed
                if proc.poll() is not None:
                    log.seek(0)
                    sys.exit(f"ibmon exited {proc.returncode}: {log.read().decode()[-3000:]}")
                if time.monotonic() - t0 > 120:
                    sys.exit("ibmon did not complete a poll within 120 s")
                try:
                    text = scrape(port)
                except OSError:
                    text = ""
                if metric(text, "ibmon_source_up") == 1.0:
                    break
                time.sleep(0.2)
            startup_wall = time.monotonic() - t0
            startup_cpu = cpu_seconds(proc.pid)
            ports = metric(text, "ibmon_source_ports") or 0
            first_poll = metric(text, "ibmon_source_poll_duration_seconds_sum") or 0.0
            spy = None
            if args.profile:
                spy = subprocess.Popen(
                    [
                        str(Path(sys.executable).with_name("py-spy")),
                        "record",
                        "--nonblocking",
                        "-r",
                        "100",
                        "-d",
                        str(int(args.duration)),
                        "-f",
                        "raw",
                        "-o",
                        args.profile,
                        "-p",
                        str(proc.pid),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            cpu0, w0 = tree_cpu_seconds(proc.pid), time.monotonic()
            next_scrape = w0 + args.scrape_interval
            scrapes = 0
            while time.monotonic() - w0 < args.duration:
                if proc.poll() is not None:
                    sys.exit(f"ibmon exited {proc.returncode} during the window")
                if args.scrape_interval > 0 and time.monotonic() >= next_scrape:
                    text = scrape(port)
                    scrapes += 1
                    next_scrape += args.scrape_interval
                time.sleep(0.1)
            cpu1, w1 = tree_cpu_seconds(proc.pid), time.monotonic()
            rss, hwm = memory_mb(proc.pid)
            if spy is not None:
                spy.wait(timeout=60)
            text = scrape(port)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 15)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, 9)
                    proc.wait(timeout=5)
            log.close()
        polls = metric(text, "ibmon_source_poll_duration_seconds_count") or 0.0
        poll_sum = metric(text, "ibmon_source_poll_duration_seconds_sum") or 0.0
        errors = re.findall(r"^ibmon_source_poll_errors_total\{[^}]*\} (\S+)$", text, re.M)
    pct = (cpu1 - cpu0) / (w1 - w0) * 100
    polls_in_window = max(1.0, polls - 1)
    print(f"fabric: {len(fab.nodes)} nodes, {ports:.0f} ports polled by the daemon (mad source)")
    print(
        f"start-up (imports + discovery + first poll): {startup_wall:.1f} s wall, "
        f"{startup_cpu:.2f} s CPU; first poll {first_poll:.3f} s"
    )
    print(
        f"window: {w1 - w0:.1f} s, {polls_in_window:.0f} polls every {args.interval}, "
        f"{scrapes} gzip scrapes every {args.scrape_interval:g} s"
    )
    print(
        f"daemon CPU: {cpu1 - cpu0:.2f} s = {pct:.2f} % of one core "
        f"(limit {CPU_LIMIT_PCT:g} %); {(cpu1 - cpu0) / polls_in_window:.3f} s CPU per poll"
    )
    print(
        f"mean poll wall time {(poll_sum - first_poll) / polls_in_window:.3f} s "
        f"(ibmon_source_poll_duration_seconds)"
    )
    print(f"memory: VmRSS {rss:.0f} MB, VmHWM {hwm:.0f} MB")
    print(f"poll errors: {sum(float(e) for e in errors):.0f}")
    if args.profile:
        print_profile(Path(args.profile))
    sys.exit(0 if pct <= CPU_LIMIT_PCT else 1)


if __name__ == "__main__":
    main()
