"""Restart without loss: kill -9 mid-scenario, start again, same totals and events.

The daemon (``python -m ibmon run``) reads a simulated sysfs tree that the test itself advances
step by step (MockSource's clock restarts with the process, so it cannot resume a scenario). The
same steps run twice: once with one uninterrupted daemon, once with ``kill -9`` while a port is
down and link integrity errors are firing, and more traffic, a recovery and another error burst
happening while no daemon runs. Both runs must end with identical counter totals (equal to the
hardware values: no reset happened) and the identical list of events.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ibmon.runtime.daemon import EVENT_SAVE_DELAY
from mocks.sysfs import SysfsRenderer
from mocks.topology import fat_tree
from mocks.traffic import FabricModel

REPO = Path(__file__).resolve().parents[2]
POLL = 0.1
TOTAL_RE = re.compile(
    r'^(ibmon_port_[a-z_]+_total)\{guid="(0x[0-9a-f]+)",port="(\d+)"\} (\d+)$', re.M)


class Run:
    """One daemon lifetime-or-two over one simulated sysfs tree."""

    def __init__(self, tmp: Path, save_interval: str = "0.5s") -> None:
        self.tmp = tmp
        self.model = FabricModel(fat_tree(levels=2, radix=8, leaves=2, hosts_per_leaf=4),
                                 seed=11)
        self.renderer = SysfsRenderer(self.model, tmp / "sys")
        self.renderer.render()
        self.events_file = tmp / "events.jsonl"
        self.state_file = tmp / "state.json"
        self.config = tmp / "ibmon.toml"
        self.config.write_text(
            f'[prometheus]\nlisten = "127.0.0.1:0"\n'
            f'[[sources]]\ntype = "sysfs"\nname = "node"\nroot = "{tmp / "sys"}"\n'
            f'interval = "{POLL}s"\n'
            f'[state]\npath = "{self.state_file}"\nsave_interval = "{save_interval}"\n'
            f'[events]\nfile = "{self.events_file}"\n'
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.starts = 0
        self.host_a = self.model.fabric.node_by_desc("host002 mlx5_0").guid
        self.host_b = self.model.fabric.node_by_desc("host005 mlx5_0").guid

    def start(self) -> None:
        env = {**os.environ, "IBMON_LOG__FORMAT": "json"}
        env.pop("IBMON_STATE__PATH", None)  # the config file names this run's state file
        self.starts += 1
        log = self.tmp / f"daemon-{self.starts}.log"
        with log.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ibmon", "run", "--config", str(self.config)],
                cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err,
                start_new_session=True,
            )

        def listening() -> bool:
            assert self.proc is not None
            assert self.proc.poll() is None, log.read_text()
            for line in log.read_text(errors="replace").splitlines():
                if '"listening"' in line:
                    self.port = int(json.loads(line)["port"])
                    return True
            return False

        self.wait("the daemon to listen", listening, timeout=30)
        self.settle()

    @staticmethod
    def settle(polls: int = 6) -> None:
        """Let the daemon poll the current tree several times."""
        time.sleep(polls * POLL)

    def wait(self, what: str, pred: Callable[[], bool], timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.05)

    def events(self) -> list[tuple[str, str, str, str, str]]:
        if not self.events_file.exists():
            return []
        out = []
        for line in self.events_file.read_text().splitlines():
            e = json.loads(line)
            out.append((e["type"], e["port"]["guid"], e["port"]["port"], e["status"],
                        e["severity"]))
        return out

    def saved_active(self) -> set[str]:
        try:
            data = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return set()
        engine = data["sources"].get("node", {}).get("engine", {})
        return {a["type"] for a in engine.get("active", [])}

    def totals(self) -> dict[tuple[str, str, str], int]:
        url = f"http://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = resp.read().decode()
        return {(m[1], m[2], m[3]): int(m[4]) for m in TOTAL_RE.finditer(body)}

    def kill9(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None

    def step(self, dt: float, action: Callable[[FabricModel], None] | None = None) -> None:
        self.model.advance(dt)
        if action is not None:
            action(self.model)
        self.renderer.render()


def scenario(run: Run, *, interrupt: bool) -> tuple[dict[tuple[str, str, str], int],
                                                   list[tuple[str, str, str, str, str]]]:
    a, b = (run.host_a, 1), (run.host_b, 1)
    run.start()
    try:
        run.step(30.0)
        run.settle()
        run.step(5.0, lambda m: (m.link_down(a), m.bump(b, "local_link_integrity_errors", 2)))
        run.wait("the down port and integrity errors to be saved",
                 lambda: {"port_down", "link_integrity"} <= run.saved_active()
                 and len(run.events()) >= 2)
        if interrupt:
            run.kill9()
        # What happens next happens while no daemon runs (in the interrupted run).
        run.step(60.0, lambda m: (m.link_up(a), m.bump(b, "local_link_integrity_errors", 1)))
        run.step(60.0)
        if interrupt:
            run.start()
        run.settle(10)
        run.step(30.0)
        run.settle(10)
        totals = run.totals()
    finally:
        run.stop()
    return totals, run.events()


def test_kill9_restart_gives_the_same_totals_and_events(tmp_path: Path) -> None:
    plain = Run(tmp_path / "plain")
    killed = Run(tmp_path / "killed")
    totals_plain, events_plain = scenario(plain, interrupt=False)
    totals_killed, events_killed = scenario(killed, interrupt=True)

    assert events_killed == events_plain
    a, b = plain.host_a, plain.host_b
    # Both faults fire once (same poll, either order); the recovery resolves once; the second
    # integrity burst (while the first still holds) and the restart announce nothing new.
    assert sorted(events_plain[:2]) == [
        ("link_integrity", b, "1", "firing", "critical"),
        ("port_down", a, "1", "firing", "critical"),
    ]
    assert events_plain[2:] == [("port_down", a, "1", "resolved", "critical")]

    assert totals_killed == totals_plain
    # No reset happened, so every total is the hardware value (x4 for data).
    key = ("ibmon_port_local_link_integrity_errors_total", b, "1")
    assert totals_killed[key] == 3
    tx = ("ibmon_port_transmit_data_bytes_total", a, "1")
    assert totals_killed[tx] == killed.model.value((a, 1), "transmit_data") * 4
    assert len(totals_killed) > 8 * 10  # every host port, every counter


def test_an_event_is_saved_within_seconds_so_a_kill9_does_not_announce_it_again(
        tmp_path: Path) -> None:
    """The periodic save can be an hour away; an event is saved within seconds of it. The last
    save before the event is a clean stop's, so a restart that did not see the event saved
    would find the port down and the integrity errors grown since, and announce both again."""
    run = Run(tmp_path, save_interval="1h")
    a, b = (run.host_a, 1), (run.host_b, 1)
    run.start()
    try:
        run.step(30.0)
        run.settle()
        run.stop()  # saved at the stop: the port is up and the errors at zero
        run.start()
        run.step(5.0, lambda m: (m.link_down(a), m.bump(b, "local_link_integrity_errors", 2)))
        run.wait("both events", lambda: len(run.events()) >= 2)
        time.sleep(EVENT_SAVE_DELAY + 2.0)  # seconds, against an hour of save_interval
        run.kill9()
        run.start()
        run.settle(10)
    finally:
        run.stop()
    assert sorted(run.events()) == [
        ("link_integrity", b[0], "1", "firing", "critical"),
        ("port_down", a[0], "1", "firing", "critical"),
    ]


class _OnePort:
    """A sysfs-typed in-test source: one active port whose data counter grows."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.n = 0

    async def discover(self) -> Any:
        from ibmon.infiniband.model import Topology

        return Topology(source=self.name)

    async def sample(self) -> Any:
        from ibmon.infiniband.model import PortIdentity, PortSample, Snapshot

        self.n += 1
        ident = PortIdentity(guid="0x0002c90300a1b2c3", port="1", source=self.name)
        return Snapshot(self.name, time.monotonic(), time.time(), {ident.key: PortSample(
            ident, state=4, rate_bps=100e9, counters={"transmit_data": 1000 * self.n})})

    async def close(self) -> None:
        return None


async def test_corrupt_state_file_is_reported_replaced_and_not_fatal(tmp_path: Path) -> None:
    import asyncio

    from ibmon.config import load_settings
    from ibmon.runtime.daemon import Daemon
    from ibmon.sources.sysfs import SysfsSourceConfig

    state = tmp_path / "state.json"
    state.write_text('{"version": 1, "sources": {"node": {"tracker": {"version": 1, "ports": [')
    settings = load_settings(
        None, prometheus={"listen": "127.0.0.1:0"}, state={"path": str(state)},
        sources=[SysfsSourceConfig(name="node", interval=0.05).model_dump()])
    daemon = Daemon(settings, source_factory=lambda c: _OnePort(c.label))
    task = asyncio.create_task(daemon.run())
    await daemon.ready.wait()
    for _ in range(100):
        if daemon.state.ports:
            break
        await asyncio.sleep(0.02)
    metrics = daemon.metrics.render().decode()
    daemon.stop()
    await task
    assert 'ibmon_state_file_errors_total{reason="corrupt"} 1.0' in metrics
    assert (tmp_path / "state.json.corrupt").read_text().startswith('{"version": 1')
    saved = json.loads(state.read_text())  # replaced by a good file at stop
    assert saved["sources"]["node"]["tracker"]["ports"][0]["guid"] == "0x0002c90300a1b2c3"


async def test_a_first_start_without_a_state_file_is_counted_as_missing(tmp_path: Path) -> None:
    """``ibmon_state_file_errors_total{reason="missing"}`` tells a first start (or a state file
    someone deleted) from a restart that resumed: totals begin at the hardware values."""
    import asyncio

    from ibmon.config import load_settings
    from ibmon.runtime.daemon import Daemon
    from ibmon.sources.sysfs import SysfsSourceConfig

    settings = load_settings(
        None, prometheus={"listen": "127.0.0.1:0"}, state={"path": str(tmp_path / "s.json")},
        sources=[SysfsSourceConfig(name="node", interval=0.05).model_dump()])

    async def start() -> str:
        daemon = Daemon(settings, source_factory=lambda c: _OnePort(c.label))
        task = asyncio.create_task(daemon.run())
        await daemon.ready.wait()
        metrics = daemon.metrics.render().decode()
        daemon.stop()
        await task
        return metrics

    assert 'ibmon_state_file_errors_total{reason="missing"} 1.0' in await start()
    assert 'reason="missing"' not in await start()  # resumed from the file the first one saved


def test_counters_reset_while_no_daemon_runs_never_lower_a_total(tmp_path: Path) -> None:
    """A host rebooted (or someone ran ``perfquery -R``) while ibmon was stopped: its counters
    started again from zero and climbed a little before the next start. The restart finds them
    below the saved values, which is a reset: no total goes down, and what the port counted
    since the reset is added once."""
    run = Run(tmp_path, save_interval="1h")
    a = (run.host_a, 1)
    run.start()
    try:
        run.step(30.0)
        run.settle()
        before = run.totals()
        saved = run.model.value(a, "transmit_data")
        run.stop()
        run.step(0.0, lambda m: m.reset_counters(a))
        run.step(5.0)
        since = run.model.value(a, "transmit_data")
        assert 0 < since < saved  # the reset shows as a drop
        run.start()
        run.settle(10)
        after = run.totals()
        with urllib.request.urlopen(f"http://127.0.0.1:{run.port}/metrics", timeout=10) as resp:
            body = resp.read()
    finally:
        run.stop()
    assert {k for k, v in before.items() if after[k] < v} == set()
    tx = ("ibmon_port_transmit_data_bytes_total", a[0], "1")
    assert after[tx] == before[tx] + since * 4
    b = ("ibmon_port_transmit_data_bytes_total", run.host_b, "1")
    assert after[b] == run.model.value((run.host_b, 1), "transmit_data") * 4  # no reset there
    resets = re.search(rf'^ibmon_port_resets_total\{{guid="{a[0]}",port="1",'
                       rf'counter="transmit_data"\}} (\d+)', body.decode(), re.M)
    assert resets is not None and int(resets[1]) == 1
    assert [e for e in run.events() if e[0] == "counter_reset"] == [
        ("counter_reset", a[0], "1", "firing", "info")]
