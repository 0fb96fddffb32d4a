"""Real ``ibmon run`` processes on one ibsim fabric, for the fault, HA-pair and shard tests.

Each daemon is its own process group with a ``mad`` (or ``diags``) source on the simulator, its
own state file and an events file (the JSON lines every channel publishes), and every scrape
goes through its ``TotalsWatch`` (no port total ever goes down). ``poll_phase`` tells where in
its interval a daemon polls, so a test can start two of them at different phases on purpose.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mocks.ibsim import IbSim
from tests.faults.promise import Scrape, TotalsWatch
from tests.ibsim_fixtures import REPO

__all__ = ["SimDaemon", "circular_gap", "start_apart", "wait_for"]


def wait_for(what: str, pred: Callable[[], bool], timeout: float = 60.0) -> None:
    """Poll ``pred`` until true; fail naming ``what`` after ``timeout`` (a safety net)."""
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def circular_gap(a: float, b: float, interval: float) -> float:
    """How far apart two phases within ``interval`` are, the short way round."""
    d = (a - b) % interval
    return min(d, interval - d)


class SimDaemon:
    """One ``ibmon run`` on the simulator. ``source`` is the TOML body of its one source
    (after ``[[sources]]``); ``extra`` is appended to the config (an ``[mqtt]`` table)."""

    def __init__(self, tmp: Path, sim: IbSim, name: str, source: str, *,
                 fabric: str = "main", extra: str = "", save_interval: str = "2s") -> None:
        self.dir = tmp / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.sim = sim
        self.name = name
        self.watch = TotalsWatch()
        self.events_file = self.dir / "events.jsonl"
        self.config = self.dir / "ibmon.toml"
        self.config.write_text(
            f'fabric = "{fabric}"\n[prometheus]\nlisten = "127.0.0.1:0"\n'
            f"[[sources]]\n{source}\n"
            f'[state]\npath = "{self.dir / "state.json"}"\nsave_interval = "{save_interval}"\n'
            f'[events]\nfile = "{self.events_file}"\n{extra}\n'
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.runs = 0

    @property
    def log(self) -> Path:
        return self.dir / f"daemon-{self.runs}.log"

    def spawn(self) -> None:
        """Start the process (returns at once; ``wait_listening`` waits for its port)."""
        env = self.sim.tool_env()
        env.update({"IBMON_LOG__FORMAT": "json", "PYTHONPATH": str(REPO)})
        env.pop("IBMON_STATE__PATH", None)
        self.runs += 1
        with self.log.open("wb") as err:
            # cwd: umad2sim writes its sys-<pid> tree into the working directory
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ibmon", "run", "--config", str(self.config)],
                cwd=self.dir, env=env, stdout=subprocess.DEVNULL, stderr=err,
                start_new_session=True,
            )

    def wait_listening(self) -> None:
        def listening() -> bool:
            assert self.proc is not None
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            for line in self.log.read_text(errors="replace").splitlines():
                if '"listening"' in line:
                    self.port = int(json.loads(line)["port"])
                    return True
            return False

        wait_for(f"{self.name} to listen", listening)

    def start(self) -> None:
        self.spawn()
        self.wait_listening()

    def scrape(self) -> Scrape:
        assert self.proc is not None and self.proc.poll() is None, self.log.read_text()[-3000:]
        return self.watch.scrape(f"http://127.0.0.1:{self.port}/metrics")

    def until(self, what: str, pred: Callable[[Scrape], bool], timeout: float = 60.0) -> Scrape:
        """Scrape (every scrape checked by the watch) until ``pred`` holds."""
        got: list[Scrape] = []

        def ok() -> bool:
            got[:] = [self.scrape()]
            return pred(got[0])

        wait_for(f"{self.name}: {what}", ok, timeout)
        return got[0]

    def polls(self, s: Scrape | None = None) -> int:
        """Polls made so far, from ``s`` or a fresh scrape."""
        s = self.scrape() if s is None else s
        return int(sum(v for (n, _), v in s.samples.items()
                       if n == "ibmon_source_poll_duration_seconds_count"))

    def poll_phase(self, interval: float) -> float:
        """Where in each ``interval`` (of wall time) this daemon's polls land: the phase of its
        last successful poll, once it has made two (the first one, a discovery's, ends later
        than the scheduled ones do)."""
        s = self.until("two polls, the last successful", lambda s: self.polls(s) >= 2 and any(
            n == "ibmon_source_last_success_timestamp_seconds" and v > 0
            for (n, _), v in s.samples.items()))
        (stamp,) = [v for (n, _), v in s.samples.items()
                    if n == "ibmon_source_last_success_timestamp_seconds"]
        return stamp % interval

    def events(self) -> list[dict[str, Any]]:
        if not self.events_file.exists():
            return []
        return [json.loads(line) for line in self.events_file.read_text().splitlines()
                if line.strip()]

    def stop(self) -> None:
        """SIGTERM to the whole group; exit 0 and no traceback in its log."""
        if self.proc is None:
            return
        pid = self.proc.pid
        os.killpg(pid, signal.SIGTERM)
        rc = self.proc.wait(timeout=30)
        self.proc = None
        text = self.log.read_text(errors="replace")
        assert rc == 0, text[-3000:]
        assert "Traceback" not in text, text[-3000:]

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None


def start_apart(a: SimDaemon, b: SimDaemon, interval: float) -> float:
    """Start ``a``, then ``b`` so that their polls are 0.2 to 0.8 of an interval apart, as two
    daemons started independently may be (a start lands wherever the machine's load puts it:
    try again until it is so). Returns the gap."""
    a.start()
    for _ in range(20):
        b.start()
        b.until("a first successful poll", lambda s: s.value("ibmon_source_up") == 1)
        pb = b.poll_phase(interval)
        pa = a.poll_phase(interval)  # again: on a loaded machine a late poll moves the phase
        gap = circular_gap(pb, pa, interval)
        if 0.2 * interval <= gap <= 0.8 * interval:
            return gap
        b.stop()
        # a start takes about as long each time: starting later by as much as the phase is
        # off moves the next one's polls half an interval away from the first daemon's
        time.sleep((pa + 0.5 * interval - pb) % interval)
    pytest.fail("could not start the second daemon at another phase than the first")
