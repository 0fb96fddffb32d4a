"""Two daemons polling the same fabric (an HA pair): the same events, the same ids, on MQTT.

Each daemon is the real ``Daemon`` with MQTT to a real Mosquitto; their sources read one shared
simulated fabric, and a subscriber sees every event twice, once from each daemon, with one id.
The two sources sample at different moments within each poll interval (wall times 0.1 and 0.7
interval into it), as two daemons started independently do. Each poll is released by the test
(the source waits for the next tick), so both daemons see exactly the same sequence of fabric
states whatever the machine's load: the test asserts what is published, not when.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ibmon.config import Settings, SourceConfig, load_settings
from ibmon.daemon import Daemon
from ibmon.model import PortIdentity, PortKey, PortSample, Snapshot, SourceError, Topology
from tests.mqtt_broker import Collector, Mosquitto
from tests.syspkg import require_binary

pytestmark = pytest.mark.system

INTERVAL = 0.05
EPOCH = 1_800_000_000.0  # a whole number of intervals: tick k's window starts at EPOCH + k*I
GUIDS = ("0x0002c90300a1b2c3", "0x0002c90300a1b2c4")

#: Per tick: which ports are down, and whether the fabric answers at all.
TICKS: list[dict[str, Any]] = [
    {"down": set(), "answers": True},
    {"down": set(), "answers": True},
    {"down": {0}, "answers": True},   # port_down firing (port 0)
    {"down": {0}, "answers": True},
    {"down": set(), "answers": True},  # port_down resolved
    {"down": set(), "answers": False},  # source_failed firing (no port answered)
    {"down": set(), "answers": True},  # source_failed resolved
    {"down": {1}, "answers": True},   # port_down firing (port 1)
    {"down": {1}, "answers": True},
]


class TickedSource:
    """The shared fabric as one daemon's source sees it: each ``sample`` waits for the test to
    release the next tick, then reports that tick's state at this daemon's ``phase``."""

    def __init__(self, name: str, phase: float) -> None:
        self.name = name
        self.phase = phase
        self.ticks: asyncio.Queue[int] = asyncio.Queue()
        self.waiting = 0  # samples started (the daemon is back for more once a poll is done)

    async def discover(self) -> Topology:
        return Topology(source=self.name)

    async def sample(self) -> Snapshot:
        self.waiting += 1
        tick = await self.ticks.get()
        state = TICKS[tick]
        snap = Snapshot(self.name, monotonic=tick * INTERVAL,
                        wall=EPOCH + (tick + self.phase) * INTERVAL)
        for i, guid in enumerate(GUIDS):
            ident = PortIdentity(guid=guid, port="1", device=f"mlx5_{i}", node_desc=f"host{i}")
            key: PortKey = ident.key
            if not state["answers"]:
                snap.ports[key] = PortSample(identity=ident)
                snap.errors.append(SourceError("timeout", f"port {i}", key))
                continue
            down = i in state["down"]
            snap.ports[key] = PortSample(
                identity=ident, state=1 if down else 4, phys_state=2 if down else 5,
                rate_bps=100e9, counters={"transmit_data": 1000 * (tick + 1)},
            )
        return snap

    async def close(self) -> None:
        return None


def settings(tmp_path: Path, name: str, mqtt_port: int) -> Settings:
    src = {"type": "mad", "name": "fabric", "shard": "1/2", "interval": f"{INTERVAL}s"}
    return load_settings(None, prometheus={"listen": "127.0.0.1:0"}, sources=[src],
                         mqtt={"port": mqtt_port, "keepalive": "1s"},
                         state={"path": str(tmp_path / f"{name}.json")})


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    mosq = Mosquitto(require_binary("mosquitto"), tmp_path / "broker")
    mosq.start()
    try:
        yield mosq
    finally:
        mosq.stop()


async def wait(pred: Any, what: str, limit: float = 20.0) -> None:
    deadline = time.monotonic() + limit
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def test_an_ha_pair_publishes_each_event_with_one_id(
    broker: Mosquitto, tmp_path: Path
) -> None:
    sources = {"a": TickedSource("fabric", 0.1), "b": TickedSource("fabric", 0.7)}

    def daemon(name: str) -> Daemon:
        def factory(cfg: SourceConfig) -> TickedSource:
            return sources[name]

        return Daemon(settings(tmp_path, name, broker.port), source_factory=factory)

    daemons = {name: daemon(name) for name in sources}
    async with Collector(broker.port, "ibmon/main/events/#").running() as sub:
        tasks = [asyncio.create_task(d.run()) for d in daemons.values()]
        try:
            for d in daemons.values():
                await asyncio.wait_for(d.ready.wait(), 20)
            for tick in range(len(TICKS)):
                for s in sources.values():
                    s.ticks.put_nowait(tick)
                # a poll is done when the daemon comes back for the next sample
                await wait(lambda t=tick: all(s.waiting >= t + 2 for s in sources.values()),
                           f"tick {tick}")
            published = {n: [e.model_dump() for e in d.bus.history] for n, d in daemons.items()}
            expected = 2 * len(published["a"])
            await wait(lambda: len(sub.messages) >= expected, "both daemons' events on MQTT")
        finally:
            for d in daemons.values():
                d.stop()
            await asyncio.gather(*tasks)

    a, b = published["a"], published["b"]
    kinds = [(e["type"], e["status"], e["port"]["guid"] if e["port"] else None) for e in a]
    assert kinds == [("port_down", "firing", GUIDS[0]), ("port_down", "resolved", GUIDS[0]),
                     ("source_failed", "firing", None), ("source_failed", "resolved", None),
                     ("port_down", "firing", GUIDS[1])]
    # The same events, with the same ids, although each daemon saw them at its own moment.
    assert [e["id"] for e in a] == [e["id"] for e in b]
    assert [e["time"] for e in a] != [e["time"] for e in b]
    assert len({e["id"] for e in a}) == len(a)  # unique within one daemon
    # What a subscriber gets: every event twice (once per daemon), one id for the two copies.
    on_mqtt = [json.loads(payload) for _, payload, _ in sub.messages]
    ids = [m["id"] for m in on_mqtt]
    assert sorted(ids) == sorted(e["id"] for e in a + b)
    assert all(ids.count(i) == 2 for i in ids)


class OnePort:
    """A fabric source stand-in that always answers with one active port."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def discover(self) -> Topology:
        return Topology(source=self.name)

    async def sample(self) -> Snapshot:
        ident = PortIdentity(guid=GUIDS[0], port="1", node_desc="host0")
        return Snapshot(self.name, monotonic=time.monotonic(), wall=time.time(), ports={
            ident.key: PortSample(identity=ident, state=4, phys_state=5, rate_bps=100e9,
                                  counters={"transmit_data": 1})})

    async def close(self) -> None:
        return None


async def test_the_daemon_exports_its_shard_and_a_reload_replaces_it(tmp_path: Path) -> None:
    config = tmp_path / "ibmon.toml"
    body = ('fabric = "east"\n[prometheus]\nlisten = "127.0.0.1:0"\n'
            '[[sources]]\ntype = "mad"\nname = "fabric"\ninterval = "0.05s"\nshard = "{}"\n')
    config.write_text(body.format("0/2"))
    daemon = Daemon(load_settings(config), config_path=config,
                    reload_settings=lambda: load_settings(config),
                    source_factory=lambda cfg: OnePort(cfg.label))
    task = asyncio.create_task(daemon.run())

    def shards() -> set[str]:
        return {
            f"{s.name}{json.dumps(s.labels, sort_keys=True)} {s.value}"
            for s in daemon.metrics.registry.samples()
            if s.name in ("ibmon_shard_info", "ibmon_source_shards")
        }

    try:
        await asyncio.wait_for(daemon.ready.wait(), 20)
        assert shards() == {
            'ibmon_shard_info{"fabric": "east", "shard": "0", "shards": "2", "source": "fabric"}'
            " 1.0",
            'ibmon_source_shards{"fabric": "east", "source": "fabric"} 2.0',
        }
        config.write_text(body.format("2/3"))
        daemon.reload()
        await wait(lambda: any('"shards": "3"' in s for s in shards()), "the reloaded shard")
        assert shards() == {
            'ibmon_shard_info{"fabric": "east", "shard": "2", "shards": "3", "source": "fabric"}'
            " 1.0",
            'ibmon_source_shards{"fabric": "east", "source": "fabric"} 3.0',
        }
    finally:
        daemon.stop()
        await task
