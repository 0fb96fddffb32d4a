"""The JSON API on the metrics listener: worst ports first, events, health and readiness."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from typing import Any

from rich.console import Console

from ibmon.cli.top import ApiReader, render
from ibmon.config import Settings, SourceConfig, load_settings
from ibmon.infiniband.model import LinkInfo, PortIdentity, PortSample, Snapshot, Topology
from ibmon.runtime.daemon import Daemon
from ibmon.sources.sysfs import SysfsSourceConfig

GUID = "0x0002c90300a1b2c3"
T0 = time.monotonic()


class StalledSource:
    """Port 1 waits 30 % of the time at 90 % utilization (a hotspot); port 2 is idle."""

    def __init__(self, name: str, *, broken: bool = False) -> None:
        self.name = name
        self.broken = broken
        self.t0 = T0  # hardware counters outlive a source object (reload re-creates sources)

    async def discover(self) -> Topology:
        return Topology(source=self.name)

    async def sample(self) -> Snapshot:
        if self.broken:
            raise RuntimeError("no PMA")
        now = time.monotonic()
        elapsed = now - self.t0
        snap = Snapshot(source=self.name, monotonic=now, wall=time.time())
        for port, wait, util in (("1", 0.3, 0.9), ("2", 0.0, 0.01)):
            ident = PortIdentity(guid=GUID, port=port, device="mlx5_0",
                                 node_desc="leaf07 ü", source=self.name)  # non-ASCII on purpose
            snap.ports[ident.key] = PortSample(
                identity=ident, state=4, phys_state=5, rate_bps=100e9,
                link=LinkInfo(remote_guid="0x0002c90300000001", remote_port="3",
                              remote_node_desc="spine02"),
                # stalled ``wait`` of the time, in the default unit (8 bytes a count)
                counters={"transmit_wait": int(elapsed * wait * 100e9 / 8 / 8),
                          "transmit_data": int(elapsed * util * 100e9 / 32)},
                wide=frozenset({"transmit_data"}),
            )
        return snap

    async def close(self) -> None:
        return None


def get(port: int, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def settings(*sources: SourceConfig) -> Settings:
    return load_settings(None, prometheus={"listen": "127.0.0.1:0"},
                         sources=[s.model_dump() for s in sources])


async def until(pred: Any, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while not await asyncio.to_thread(pred):
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


def _sources(*names: str) -> str:
    return '[prometheus]\nlisten = "127.0.0.1:0"\n' + "".join(
        f'[[sources]]\ntype = "sysfs"\nname = "{n}"\ninterval = "0.05s"\n' for n in names)


async def test_ports_events_health_and_metrics() -> None:
    cfg = SysfsSourceConfig(name="fabric", interval=0.05)
    daemon = Daemon(settings(cfg), source_factory=lambda c: StalledSource(c.label))
    task = asyncio.create_task(daemon.run())
    try:
        await daemon.ready.wait()
        assert daemon.exporter is not None
        port = daemon.exporter.port
        assert await asyncio.to_thread(get, port, "/healthz") == (200, {"ok": True})
        await until(lambda: get(port, "/api/v1/events")[1]["events"])
        status, body = await asyncio.to_thread(get, port, "/api/v1/events")
        (event,) = body["events"]
        assert (event["type"], event["status"], event["severity"]) == (
            "congestion", "firing", "warning")
        assert event["details"]["kind"] == "hotspot"
        assert event["port"]["node_desc"] == "leaf07 ü"
        assert event["peer"]["node_desc"] == "spine02"

        status, ports = await asyncio.to_thread(get, port, "/api/v1/ports")
        assert status == 200
        assert ports["count"] == 2
        worst = ports["ports"][0]
        assert (worst["port"], worst["conditions"]) == ("1", ["congestion"])
        assert worst["active"][0]["type"] == "congestion"
        assert 0.2 < worst["transmit_wait_ratio"] < 0.4
        assert ports["ports"][1]["conditions"] == []
        _, only = await asyncio.to_thread(get, port, "/api/v1/ports?condition=congestion&limit=5")
        assert [p["port"] for p in only["ports"]] == ["1"]
        assert (await asyncio.to_thread(get, port, "/api/v1/ports?limit=x"))[0] == 400
        _, since = await asyncio.to_thread(get, port, f"/api/v1/events?since={event['id']}")
        assert since["events"] == []

        status, ready = await asyncio.to_thread(get, port, "/readyz")
        assert status == 200
        assert ready["sources_up"] == ["fabric"]
        # `ibmon top` reads the same API and shows the congested port first, escaped.
        console = Console(record=True, width=160, color_system=None)
        frame = await ApiReader(f"http://127.0.0.1:{port}").frame()
        console.print(render(*frame))
        screen = console.export_text()
        assert screen.index("leaf07 ü [1]") < screen.index("leaf07 ü [2]")
        assert "congestion" in screen and "hotspot" in screen

        metrics = await asyncio.to_thread(
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode())
        assert 'ibmon_events_total{severity="warning",type="congestion"} 1.0' in metrics
        assert (f'ibmon_port_condition{{guid="{GUID}",port="1",condition="congestion"}} 1'
                in metrics)
    finally:
        daemon.stop()
        await task


async def test_readyz_is_503_while_no_source_works_and_source_failed_is_an_event() -> None:
    cfg = SysfsSourceConfig(name="broken", interval=0.05)
    daemon = Daemon(settings(cfg), source_factory=lambda c: StalledSource(c.label, broken=True))
    task = asyncio.create_task(daemon.run())
    try:
        await daemon.ready.wait()
        assert daemon.exporter is not None
        port = daemon.exporter.port
        await until(lambda: get(port, "/api/v1/events")[1]["events"])
        status, ready = await asyncio.to_thread(get, port, "/readyz")
        assert status == 503
        assert ready["ready"] is False
        assert "no PMA" in ready["sources_down"]["broken"]
        _, body = await asyncio.to_thread(get, port, "/api/v1/events")
        assert [(e["type"], e["status"], e["port"]) for e in body["events"]] == [
            ("source_failed", "firing", None)]  # once, not once per failed poll
    finally:
        daemon.stop()
        await task


async def test_reload_with_new_thresholds_keeps_active_conditions(tmp_path: Any) -> None:
    cfg_file = tmp_path / "ibmon.toml"
    base = ('[prometheus]\nlisten = "127.0.0.1:0"\n'
            '[[sources]]\ntype = "sysfs"\nname = "fabric"\ninterval = "0.05s"\n')
    cfg_file.write_text(base)
    daemon = Daemon(load_settings(cfg_file), config_path=cfg_file,
                    source_factory=lambda c: StalledSource(c.label))
    task = asyncio.create_task(daemon.run())
    try:
        # the engine holds the condition before the poll's end publishes its event
        await until(lambda: [(e.type, e.status) for e in daemon.bus.history]
                    == [("congestion", "firing")])
        assert [a.type for a in daemon.conditions()] == ["congestion"]
        cfg_file.write_text(base + "[detect.congestion]\nwarning = 0.2\nsustain = 5\n")
        daemon.reload()
        published = len(daemon.bus.history)
        await asyncio.sleep(0.6)  # a dozen polls under the new rules
        assert [a.type for a in daemon.conditions()] == ["congestion"]
        assert len(daemon.bus.history) == published  # not re-announced, not resolved
        assert daemon.settings.detect.tables() == {"congestion": {"warning": 0.2, "sustain": 5}}
        # the engine runs the new rules: the port's 30 % is below a clear level of 40 %
        cfg_file.write_text(base + "[detect.congestion]\nclear = 0.4\nwarning = 0.5\n"
                            "critical = 0.6\nclear_polls = 2\n")
        daemon.reload()
        # the engine drops the condition within a poll; its event is published at the poll's end
        await until(lambda: [(e.type, e.status) for e in list(daemon.bus.history)[published:]]
                    == [("congestion", "resolved")])
        assert daemon.conditions() == []
    finally:
        daemon.stop()
        await task


async def test_an_outage_across_a_reload_is_announced_once_and_resolved(tmp_path: Any) -> None:
    """A source fails; the operator edits the config and reloads (new detector rules rebuild
    the engine) while it still fails, then it recovers: one ``firing``, one ``resolved``."""
    cfg_file = tmp_path / "ibmon.toml"
    base = _sources("fabric")
    cfg_file.write_text(base)
    made: list[StalledSource] = []

    def factory(c: Any) -> StalledSource:
        made.append(StalledSource(c.label, broken=not made or made[-1].broken))
        return made[-1]

    daemon = Daemon(load_settings(cfg_file), config_path=cfg_file, source_factory=factory)
    task = asyncio.create_task(daemon.run())

    def outages() -> list[tuple[str, str]]:
        return [(e.type, e.status) for e in daemon.bus.history if e.type == "source_failed"]

    try:
        await until(lambda: outages() == [("source_failed", "firing")])
        cfg_file.write_text(base + "[detect.congestion]\nwarning = 0.2\n")
        daemon.reload()
        await until(lambda: daemon.settings.detect.tables() == {"congestion": {"warning": 0.2}})
        await asyncio.sleep(0.3)  # failed polls under the new rules: nothing new to say
        assert outages() == [("source_failed", "firing")]
        for source in made:
            source.broken = False
        await until(lambda: len(outages()) == 2)
        await asyncio.sleep(0.2)
        assert outages() == [("source_failed", "firing"), ("source_failed", "resolved")]
    finally:
        daemon.stop()
        await task


async def test_reload_that_disables_a_detector_resolves_its_conditions(tmp_path: Any) -> None:
    """An operator switches a noisy detector off: its open conditions end with one
    ``resolved`` event each, so whatever consumes events does not hold them open for ever."""
    cfg_file = tmp_path / "ibmon.toml"
    base = _sources("fabric")
    cfg_file.write_text(base)
    daemon = Daemon(load_settings(cfg_file), config_path=cfg_file,
                    source_factory=lambda c: StalledSource(c.label))
    task = asyncio.create_task(daemon.run())
    try:
        await until(lambda: [(e.type, e.status) for e in daemon.bus.history]
                    == [("congestion", "firing")])
        cfg_file.write_text(base + "[detect.congestion]\nenabled = false\n")
        daemon.reload()
        await until(lambda: len(daemon.bus.history) == 2)
        assert daemon.conditions() == []
        await asyncio.sleep(0.3)  # more polls: nothing more to say
        firing, done = daemon.bus.history
        assert (done.type, done.status, done.severity) == ("congestion", "resolved", "warning")
        assert done.details["resolution"] == "detector_disabled"
        assert done.message.startswith("congestion no longer watched after ")
        assert done.id != firing.id
        assert done.port == firing.port
    finally:
        daemon.stop()
        await task


def _from(source: str, daemon: Daemon) -> list[tuple[str, str, str | None]]:
    return [(e.type, e.status, e.details.get("resolution")) for e in daemon.bus.history
            if e.details.get("source") == source]


async def test_a_source_removed_from_the_config_ends_what_it_held(tmp_path: Any) -> None:
    """Conditions and an outage of a source the operator removes end with one ``resolved``
    each (``source_removed``); put back, it raises what still holds again."""
    cfg_file = tmp_path / "ibmon.toml"
    cfg_file.write_text(_sources("fabric", "broken"))
    daemon = Daemon(load_settings(cfg_file), config_path=cfg_file,
                    source_factory=lambda c: StalledSource(c.label, broken=c.label == "broken"))
    task = asyncio.create_task(daemon.run())
    try:
        await until(lambda: _from("fabric", daemon) == [("congestion", "firing", None)]
                    and _from("broken", daemon) == [("source_failed", "firing", None)])
        cfg_file.write_text(_sources("broken"))
        daemon.reload()
        await until(lambda: len(_from("fabric", daemon)) == 2)
        assert _from("fabric", daemon)[1] == ("congestion", "resolved", "source_removed")
        assert daemon.conditions() == []
        cfg_file.write_text(_sources("fabric", "broken"))
        daemon.reload()
        await until(lambda: len(_from("fabric", daemon)) == 3)
        assert _from("fabric", daemon)[2] == ("congestion", "firing", None)
        cfg_file.write_text(_sources("fabric"))
        daemon.reload()
        await until(lambda: len(_from("broken", daemon)) == 2)
        await asyncio.sleep(0.2)
        assert _from("broken", daemon) == [("source_failed", "firing", None),
                                          ("source_failed", "resolved", "source_removed")]
        assert len(_from("fabric", daemon)) == 3
    finally:
        daemon.stop()
        await task


async def test_a_source_removed_while_ibmon_was_stopped_ends_what_it_held(
        tmp_path: Any) -> None:
    cfg_file = tmp_path / "ibmon.toml"
    cfg_file.write_text(_sources("fabric", "spare"))

    def factory(c: Any) -> StalledSource:
        return StalledSource(c.label, broken=c.label == "spare")

    first = Daemon(load_settings(cfg_file), config_path=cfg_file, source_factory=factory)
    task = asyncio.create_task(first.run())
    await until(lambda: _from("fabric", first) == [("congestion", "firing", None)])
    first.stop()
    await task
    cfg_file.write_text(_sources("spare"))
    for expected in ([("congestion", "resolved", "source_removed")], []):  # once, not at each start
        daemon = Daemon(load_settings(cfg_file), config_path=cfg_file, source_factory=factory)
        task = asyncio.create_task(daemon.run())
        try:
            await daemon.ready.wait()
            await asyncio.sleep(0.3)  # polls of the source that stayed
            assert _from("fabric", daemon) == expected
            # the outage of the source that stayed was saved: neither announced again nor lost
            assert _from("spare", daemon) == []
            assert daemon.state.sources["spare"].up is False
        finally:
            daemon.stop()
            await task
