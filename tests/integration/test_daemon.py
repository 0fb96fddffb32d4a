"""The daemon end to end with an in-test source: polling, scraping, reload, stop, bad sources."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ibmon.config import Settings, SourceConfig, load_settings
from ibmon.detect.events import Event, PortRef
from ibmon.infiniband.model import PortIdentity, PortSample, Snapshot, Topology
from ibmon.runtime.daemon import Daemon
from ibmon.sources import Source
from ibmon.sources.sysfs import SysfsSourceConfig

GUID = "0x0002c90300a1b2c3"


class CountingSource:
    """Data counter grows 1000 words a poll; fails on demand to prove a failure costs one poll.
    With ``resets`` it goes back every other poll instead: a reset, which a poll saves before it
    publishes."""

    def __init__(self, name: str, *, fail: bool = False, resets: bool = False) -> None:
        self.name = name
        self.polls = 0
        self.fail = fail
        self.resets = resets
        self.closed = False

    async def discover(self) -> Topology:
        return Topology(source=self.name)

    async def sample(self) -> Snapshot:
        self.polls += 1
        if self.fail:
            raise RuntimeError("hardware on fire")
        ident = PortIdentity(
            guid=GUID, port="1", device="mlx5_0", node_desc="host1", source=self.name
        )
        sample = PortSample(
            identity=ident,
            state=4,
            phys_state=5,
            rate_bps=100e9,
            counters={"transmit_data": 1000 * (self.polls % 2 + 1 if self.resets else self.polls),
                      "symbol_errors": 0},
        )
        return Snapshot(
            source=self.name,
            monotonic=time.monotonic(),
            wall=time.time(),
            ports={ident.key: sample},
        )

    async def close(self) -> None:
        self.closed = True


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def settings(*sources: SourceConfig) -> Settings:
    return load_settings(
        None, prometheus={"listen": "127.0.0.1:0"}, sources=[s.model_dump() for s in sources]
    )


async def wait_for(pred: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(pred) and pred():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


async def test_polls_scrapes_and_survives_a_failing_source() -> None:
    made: dict[str, CountingSource] = {}

    def factory(cfg: SourceConfig) -> Source:
        if cfg.label == "unbuildable":
            raise OSError("libibumad.so.3: cannot open shared object file")
        src = CountingSource(cfg.label, fail=cfg.label == "broken")
        made[cfg.label] = src
        return src

    cfg_ok = SysfsSourceConfig(name="good", interval=0.05)
    cfg_bad = SysfsSourceConfig(name="broken", interval=0.05)
    cfg_none = SysfsSourceConfig(name="unbuildable", interval=0.05)
    daemon = Daemon(settings(cfg_ok, cfg_bad, cfg_none), source_factory=factory)
    task = asyncio.create_task(daemon.run())
    await daemon.ready.wait()
    await wait_for(lambda: made["good"].polls >= 3 and made["broken"].polls >= 3)
    assert daemon.exporter is not None
    body = await asyncio.to_thread(scrape, daemon.exporter.port)
    assert f'ibmon_port_transmit_data_bytes_total{{guid="{GUID}",port="1"}}' in body
    assert 'ibmon_source_up{source="good"} 1.0' in body
    assert 'ibmon_source_up{source="broken"} 0.0' in body
    assert 'ibmon_source_poll_errors_total{reason="poll_failed",source="broken"}' in body
    # a source that cannot even be built is down, says why, and costs nothing else
    assert 'ibmon_source_up{source="unbuildable"} 0.0' in body
    assert ('ibmon_source_poll_errors_total{reason="init_failed",source="unbuildable"} 1.0'
            in body)
    (failed,) = [e for e in daemon.bus.history
                 if e.type == "source_failed" and "unbuildable" in e.message]
    assert "libibumad.so.3" in failed.message
    started = time.monotonic()
    daemon.stop()
    await asyncio.wait_for(task, 2.0)
    assert time.monotonic() - started < 2.0
    assert made["good"].closed


async def test_totals_survive_reload_and_bad_reload_is_rejected(tmp_path: Path) -> None:
    cfg_file = tmp_path / "ibmon.toml"
    cfg_file.write_text(
        '[prometheus]\nlisten = "127.0.0.1:0"\n'
        '[[sources]]\ntype = "sysfs"\nname = "good"\ninterval = "50ms"\n'
    )
    made: list[CountingSource] = []

    def factory(cfg: SourceConfig) -> Source:
        src = CountingSource(cfg.label)
        src.polls = sum(s.polls for s in made)  # same hardware counter keeps counting
        made.append(src)
        return src

    daemon = Daemon(load_settings(cfg_file), config_path=cfg_file, source_factory=factory)
    task = asyncio.create_task(daemon.run())
    await daemon.ready.wait()
    await wait_for(lambda: sum(s.polls for s in made) >= 3)
    good = cfg_file.read_text()
    cfg_file.write_text("[prometheus\n")  # broken: must be rejected, old config keeps running
    daemon.reload()
    reloads = daemon.metrics.registry.get_sample_value
    await wait_for(lambda: reloads("ibmon_config_reloads_total", {"result": "rejected"}) == 1)
    polls = made[0].polls
    await wait_for(lambda: made[0].polls >= polls + 3)  # the running sources were not touched
    assert len(made) == 1
    assert reloads("ibmon_config_last_reload_successful") == 0
    # valid, but its listener cannot open (the port is taken): it fails whole, and the
    # running config, its source included, stays (the new one renames the source)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg_file.write_text(good.replace("127.0.0.1:0", f"127.0.0.1:{port}")
                            .replace('name = "good"', 'name = "other"'))
        daemon.reload()
        await wait_for(lambda: reloads("ibmon_config_reloads_total", {"result": "failed"}) == 1)
    polls = made[0].polls
    await wait_for(lambda: made[0].polls >= polls + 3)
    assert daemon.settings.sources[0].label == "good" and len(made) == 1
    assert (GUID, "1") in daemon.state.ports
    cfg_file.write_text(good)
    daemon.reload()
    await wait_for(lambda: len(made) == 2)
    assert reloads("ibmon_config_reloads_total", {"result": "applied"}) == 1
    assert reloads("ibmon_config_last_reload_successful") == 1
    before = daemon.state.ports[(GUID, "1")].totals["transmit_data"]
    await wait_for(lambda: made[-1].polls >= made[0].polls + 3)
    after = daemon.state.ports[(GUID, "1")].totals["transmit_data"]
    assert after > before  # the tracker (and its totals) survived the reload
    assert daemon.settings.sources[0].label == "good"
    daemon.stop()
    await asyncio.wait_for(task, 2.0)


async def test_a_source_left_out_of_the_config_keeps_its_totals_for_its_return() -> None:
    """Its saved part stays in the state file while other sources are saved, so when it is
    configured again its totals go on from where they were, never lower, even across a reset
    of its counters meanwhile."""

    async def run(name: str, polls: int, start: int = 0) -> int:
        source = CountingSource(name)
        source.polls = start  # the hardware counter keeps counting meanwhile
        daemon = Daemon(settings(SysfsSourceConfig(name=name, interval=0.05)),
                        source_factory=lambda cfg: source)
        task = asyncio.create_task(daemon.run())
        try:
            await wait_for(lambda: source.polls >= start + polls and daemon.state.ports)
        finally:
            daemon.stop()
            await asyncio.wait_for(task, 2.0)
        return daemon.state.ports[(GUID, "1")].totals["transmit_data"]

    before = await run("a", 5, start=100)
    await run("b", 3)  # "a" is not configured: this daemon saves only "b"'s part of its own
    # back, and its counters were reset meanwhile (a reboot): the totals carry on
    assert await run("a", 2) > before


async def test_a_corrupt_source_part_of_the_state_file_costs_only_that_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A state file that parses but whose saved tracker is wrong (edited by hand, written by
    a buggy version) is reported, and the daemon starts and polls without it."""
    state = tmp_path / "state.json"
    monkeypatch.setenv("IBMON_STATE__PATH", str(state))

    async def run(polls: int) -> Daemon:
        source = CountingSource("a")
        daemon = Daemon(settings(SysfsSourceConfig(name="a", interval=0.05)),
                        source_factory=lambda cfg: source)
        task = asyncio.create_task(daemon.run())
        try:
            await wait_for(lambda: source.polls >= polls)
        finally:
            daemon.stop()
            await asyncio.wait_for(task, 2.0)
        return daemon

    await run(3)
    doc = json.loads(state.read_text())
    doc["sources"]["a"]["tracker"]["ports"][0]["total"]["transmit_data"] = "lots"
    state.write_text(json.dumps(doc))
    daemon = await run(3)
    errors = daemon.metrics.registry.get_sample_value
    assert errors("ibmon_state_file_errors_total", {"reason": "corrupt"}) == 1
    assert (GUID, "1") in daemon.state.ports


async def test_a_bug_in_reading_the_config_at_reload_is_a_rejected_reload() -> None:
    """A reload never stops the daemon, whatever reading the config raises."""

    def broken() -> Settings:
        raise RuntimeError("bug while reading the config")

    source = CountingSource("good")
    daemon = Daemon(settings(SysfsSourceConfig(name="good", interval=0.05)),
                    reload_settings=broken, source_factory=lambda cfg: source)
    task = asyncio.create_task(daemon.run())
    try:
        await daemon.ready.wait()
        daemon.reload()
        reloads = daemon.metrics.registry.get_sample_value
        await wait_for(lambda: reloads("ibmon_config_reloads_total", {"result": "rejected"}) == 1)
        polls = source.polls
        await wait_for(lambda: source.polls >= polls + 3)  # still polling
        assert not task.done()
    finally:
        daemon.stop()
        await asyncio.wait_for(task, 2.0)


async def test_the_periodic_save_keeps_the_part_of_a_source_left_out_of_the_config(
        tmp_path: Path) -> None:
    """A kill -9 leaves the last periodic save behind: it must still hold the part of a source
    this run does not poll, or that source's totals would start over when it returns."""
    path = tmp_path / "state.json"

    def parts() -> dict[str, Any]:
        try:
            return dict(json.loads(path.read_text())["sources"])
        except (OSError, ValueError):
            return {}

    async def run(name: str, until: Callable[[], bool]) -> None:
        source = CountingSource(name)
        daemon = Daemon(load_settings(
            None, prometheus={"listen": "127.0.0.1:0"},
            state={"path": str(path), "save_interval": 0.1},
            sources=[SysfsSourceConfig(name=name, interval=0.05).model_dump()],
        ), source_factory=lambda cfg: source)
        task = asyncio.create_task(daemon.run())
        try:
            await wait_for(until)
        finally:
            daemon.stop()
            await asyncio.wait_for(task, 2.0)

    await run("a", lambda: "a" in parts())
    kept = parts()["a"]
    seen: dict[str, Any] = {}

    def saved_b() -> bool:  # read while "b" runs: what a kill -9 now would leave
        seen.clear()
        seen.update(parts())
        return "b" in seen

    await run("b", saved_b)
    assert seen["a"] == kept


async def test_a_stop_right_after_a_burst_of_events_logs_and_writes_every_one(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A switch that reboots takes its ports down in one poll; a stop (SIGTERM) that comes right
    after must still leave each of those events in the log and in the events file."""
    events_file = tmp_path / "events.jsonl"
    daemon = Daemon(load_settings(
        None, prometheus={"listen": "127.0.0.1:0"}, events={"file": str(events_file)},
        sources=[SysfsSourceConfig(name="a", interval=60).model_dump()],
    ), source_factory=lambda cfg: CountingSource("a"))
    task = asyncio.create_task(daemon.run())
    await wait_for(lambda: daemon.state.ports)  # the first poll is done: the next is a minute off
    burst = [Event(time=Event.at(1e9), fabric="", type="port_down", status="firing",
                   severity="critical", port=PortRef(guid=f"0x{n:016x}", port="1"))
             for n in range(300)]
    daemon.bus.publish_many(burst)
    daemon.stop()
    await asyncio.wait_for(task, 5.0)
    written = [json.loads(line)["id"] for line in events_file.read_text().splitlines()]
    assert written == [e.id for e in burst]
    out = capfd.readouterr()
    logged = [m.group(0) for line in (out.out + out.err).splitlines()
              if "event_firing" in line and (m := re.search(r"0x[0-9a-f]{16}", line))]
    assert sorted(logged) == sorted(e.port.guid for e in burst if e.port)


async def test_a_slow_poll_is_followed_by_one_interval_not_a_burst_of_polls() -> None:
    """A poll that takes several intervals (a fabric that answers slowly) is not made up with
    back-to-back polls: each would load the fabric again and give rates over a few ms."""
    interval, pause = 0.1, 0.45

    class SlowOnce(CountingSource):
        def __init__(self) -> None:
            super().__init__("a")
            self.starts: list[float] = []

        async def sample(self) -> Snapshot:
            self.starts.append(time.monotonic())
            if len(self.starts) == 3:
                await asyncio.sleep(pause)
            return await super().sample()

    source = SlowOnce()
    daemon = Daemon(settings(SysfsSourceConfig(name="a", interval=interval)),
                    source_factory=lambda cfg: source)
    task = asyncio.create_task(daemon.run())
    try:
        await wait_for(lambda: len(source.starts) >= 8)
    finally:
        daemon.stop()
        await asyncio.wait_for(task, 2.0)
    # The slow poll ends 3.5 intervals late; the next three polls keep to the interval (a burst
    # would start them all at once). Measured over the three, so a late wake-up cannot fail it.
    after = source.starts[3:7]
    assert after[-1] - after[0] >= 1.5 * interval, after


async def test_a_reload_applies_a_source_s_new_interval(tmp_path: Path) -> None:
    cfg_file = tmp_path / "ibmon.toml"
    slow = ('[prometheus]\nlisten = "127.0.0.1:0"\n'
            '[[sources]]\ntype = "sysfs"\nname = "good"\ninterval = "1h"\n')
    cfg_file.write_text(slow)
    source = CountingSource("good")
    daemon = Daemon(load_settings(cfg_file), config_path=cfg_file,
                    source_factory=lambda cfg: source)
    task = asyncio.create_task(daemon.run())
    try:
        await daemon.ready.wait()
        await wait_for(lambda: source.polls == 1)
        cfg_file.write_text(slow.replace('"1h"', '"50ms"'))
        daemon.reload()
        await wait_for(lambda: source.polls >= 6)  # every 50 ms now, not once an hour
    finally:
        daemon.stop()
        await asyncio.wait_for(task, 2.0)


async def test_a_reload_that_rebuilds_the_listener_never_refuses_a_scrape(tmp_path: Path) -> None:
    """A reload that changes the listener (here its connection cap) takes over the listening
    socket: the address stays bound throughout, every scrape meanwhile is answered."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cfg_file = tmp_path / "ibmon.toml"
    config = (f'[prometheus]\nlisten = "127.0.0.1:{port}"\nmax_connections = 64\n'
              '[[sources]]\ntype = "sysfs"\nname = "good"\ninterval = "50ms"\n')
    cfg_file.write_text(config)
    daemon = Daemon(load_settings(cfg_file), config_path=cfg_file,
                    source_factory=lambda cfg: CountingSource(cfg.label))
    task = asyncio.create_task(daemon.run())
    scraped: list[int] = []
    stop = False

    def scraper() -> None:
        while not stop:
            scraped.append(len(scrape(port)))  # raises on a refused connection

    try:
        await daemon.ready.wait()
        scraping = asyncio.create_task(asyncio.to_thread(scraper))
        await wait_for(lambda: len(scraped) >= 3)
        before = daemon.exporter
        cfg_file.write_text(config.replace("= 64", "= 32"))
        daemon.reload()
        await wait_for(lambda: daemon.exporter is not before)
        count = len(scraped)
        await wait_for(lambda: len(scraped) >= count + 3)
        stop = True
        await scraping
        assert 'ibmon_config_reloads_total{result="applied"} 1.0' in await asyncio.to_thread(
            scrape, port)
    finally:
        stop = True
        daemon.stop()
        await asyncio.wait_for(task, 5.0)


async def test_a_reload_that_moves_the_state_file_saves_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("IBMON_STATE__PATH")  # the config file says where
    cfg_file = tmp_path / "ibmon.toml"
    base = ('[prometheus]\nlisten = "127.0.0.1:0"\n'
            '[[sources]]\ntype = "sysfs"\nname = "good"\ninterval = "50ms"\n')
    first, moved = tmp_path / "a" / "state.json", tmp_path / "b" / "state.json"
    cfg_file.write_text(base + f'[state]\npath = "{first}"\nsave_interval = "1s"\n')
    daemon = Daemon(load_settings(cfg_file), config_path=cfg_file,
                    source_factory=lambda cfg: CountingSource(cfg.label))
    task = asyncio.create_task(daemon.run())
    await wait_for(first.exists)
    cfg_file.write_text(base + f'[state]\npath = "{moved}"\nsave_interval = "1s"\n')
    daemon.reload()
    await wait_for(moved.exists)
    assert json.loads(moved.read_text())["sources"]["good"]
    daemon.stop()
    await asyncio.wait_for(task, 2.0)


def _stop_after_save(daemon: Daemon, loop: asyncio.AbstractEventLoop) -> Callable[..., None]:
    """The daemon's state save, which from the third save on (past the first polls, the
    saves of resets) asks for the stop from the saving thread once the file is written."""
    save, saves = daemon._statefile.save, itertools.count(1)

    def save_then_stop(*args: Any, **kwargs: Any) -> None:
        save(*args, **kwargs)
        if next(saves) >= 3:
            loop.call_soon_threadsafe(daemon.stop)

    return save_then_stop


async def test_a_stop_as_a_poll_save_completes_still_ends_the_daemon(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stop that lands in the loop turn in which a poll's own save completes ends the daemon.

    Python 3.11's ``asyncio.wait_for`` returned a finished inner result instead of raising the
    cancellation that arrived with it; the poll loop that waited on its save that way lived on,
    and ``run()`` never returned. Each save here asks for the stop from the save's own thread,
    which puts the cancellation in exactly that turn.
    """
    loop = asyncio.get_running_loop()
    for _ in range(8):
        daemon = Daemon(settings(SysfsSourceConfig(name="good", interval=0.02)),
                        source_factory=lambda cfg: CountingSource(cfg.label, resets=True))
        monkeypatch.setattr(daemon._statefile, "save", _stop_after_save(daemon, loop))
        task = asyncio.create_task(daemon.run())
        done, _ = await asyncio.wait({task}, timeout=3.0)
        if not done:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert done, "the daemon did not stop"
        assert daemon._pipelines["good"].tracker.resets_seen >= 1


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_process_within_two_seconds(tmp_path: Path, sig: signal.Signals) -> None:
    """A real `ibmon run` process on a generated sysfs tree stops cleanly on SIGTERM/SIGINT."""
    root = tmp_path / "sys"
    port_dir = root / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    (port_dir / "counters").mkdir(parents=True)
    (root / "class" / "infiniband" / "mlx5_0" / "node_guid").write_text("0002:c903:00a1:b2c3\n")
    (port_dir / "state").write_text("4: ACTIVE\n")
    (port_dir / "rate").write_text("100 Gb/sec (4X EDR)\n")
    (port_dir / "counters" / "port_xmit_data").write_text("123\n")
    cfg = tmp_path / "ibmon.toml"
    cfg.write_text(
        f'[prometheus]\nlisten = "127.0.0.1:0"\n[[sources]]\ntype = "sysfs"\nroot = "{root}"\n'
        'interval = "100ms"\n'
    )
    with subprocess.Popen(
        [sys.executable, "-m", "ibmon", "run", "--config", str(cfg)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        _stop_and_check(proc, sig)


def _stop_and_check(proc: subprocess.Popen[str], sig: signal.Signals) -> None:
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 20
        seen = ""
        while time.monotonic() < deadline and '"listening"' not in seen:
            seen += proc.stderr.readline()
        assert '"listening"' in seen, seen
        time.sleep(0.3)
        started = time.monotonic()
        os.kill(proc.pid, sig)
        rc = proc.wait(timeout=5)
        assert time.monotonic() - started < 2.0
        assert rc == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


class WideSource(CountingSource):
    """``ports`` ports, each moving like CountingSource's one."""

    def __init__(self, name: str, ports: int) -> None:
        super().__init__(name)
        self.ports = ports

    async def sample(self) -> Snapshot:
        snap = await super().sample()
        (one,) = snap.ports.values()
        for n in range(2, self.ports + 1):
            ident = PortIdentity(guid=GUID, port=str(n), device="sw", source=self.name)
            snap.ports[ident.key] = PortSample(identity=ident, state=4, phys_state=5,
                                               rate_bps=100e9, counters=dict(one.counters))
        return snap


@pytest.mark.node_sized  # the daemon's own threshold: 16 ports are a node's, 250 a fabric's
@pytest.mark.parametrize("ports", [16, 250])
async def test_loop_lag_probe_wakes_as_often_as_the_port_count_needs(ports: int) -> None:
    """Each wake-up of the loop costs CPU, so a compute node's daemon
    (a few HCAs) probes its loop once a second; one that tracks enough ports to stall it
    probes every 0.1 s. The probe keeps measuring either way."""
    from ibmon.runtime.looplag import IDLE_PERIOD, PERIOD

    daemon = Daemon(settings(SysfsSourceConfig(name="w", interval=0.05)),
                    source_factory=lambda cfg: WideSource(cfg.label, ports))
    task = asyncio.create_task(daemon.run())
    await daemon.ready.wait()
    await wait_for(lambda: daemon.state is not None and len(daemon.state.ports) == ports)
    assert daemon.loop_lag.period == (PERIOD if ports >= 200 else IDLE_PERIOD)
    count = daemon.metrics.registry.get_sample_value
    await wait_for(lambda: (count("ibmon_event_loop_lag_seconds_count") or 0) >= 2, 5.0)
    daemon.stop()
    await asyncio.wait_for(task, 5.0)


async def test_a_daemon_cancelled_while_it_stops_still_closes_everything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cancellation that lands mid-shutdown (an embedding program's deadline, a second Ctrl-C
    where signals cannot be handled) ends ``run`` with CancelledError, but only once every
    shutdown step ran: its sources are closed and its listener no longer accepts."""
    made: list[CountingSource] = []

    def factory(cfg: SourceConfig) -> Source:
        made.append(CountingSource(cfg.label))
        return made[-1]

    daemon = Daemon(settings(SysfsSourceConfig(name="good", interval=0.05)),
                    source_factory=factory)
    entered = asyncio.Event()
    stop_polls = daemon._stop_polls

    async def slow_stop_polls() -> None:
        entered.set()
        await asyncio.sleep(0.2)  # where the cancellation lands
        await stop_polls()

    monkeypatch.setattr(daemon, "_stop_polls", slow_stop_polls)
    task = asyncio.create_task(daemon.run())
    await daemon.ready.wait()
    assert daemon.exporter is not None
    port = daemon.exporter.port
    daemon.stop()
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert made and all(s.closed for s in made)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
