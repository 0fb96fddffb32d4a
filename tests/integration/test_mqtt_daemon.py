"""The daemon with ``[mqtt]``: a broker that is not there never stops polling or /metrics.

No broker binary is needed: "down" is a loopback port nobody listens on. The tests with a real
Mosquitto are in test_mqtt.py.
"""

from __future__ import annotations

import asyncio
import socket
import time
import urllib.request

from ibmon.config import Settings, SourceConfig, load_settings
from ibmon.infiniband.model import PortIdentity, PortSample, Snapshot, Topology
from ibmon.runtime.daemon import Daemon
from ibmon.sources import Source
from ibmon.sources.sysfs import SysfsSourceConfig

GUID = "0x0002c90300a1b2c3"


class TickingSource:
    """One port whose transmit counter grows every poll."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.polls = 0

    async def discover(self) -> Topology:
        return Topology(source=self.name)

    async def sample(self) -> Snapshot:
        self.polls += 1
        ident = PortIdentity(guid=GUID, port="1", device="mlx5_0", node_desc="host1")
        sample = PortSample(identity=ident, state=4, phys_state=5, rate_bps=100e9,
                            counters={"transmit_data": 1000 * self.polls})
        return Snapshot(source=self.name, monotonic=time.monotonic(), wall=time.time(),
                        ports={ident.key: sample})

    async def close(self) -> None:
        return None


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def settings(mqtt: dict[str, object] | None) -> Settings:
    src = SysfsSourceConfig(name="local", interval=0.05)
    return load_settings(None, prometheus={"listen": "127.0.0.1:0"},
                         sources=[src.model_dump()], mqtt=mqtt)


async def run_until_polls(daemon: Daemon, source: TickingSource, polls: int) -> str:
    task = asyncio.create_task(daemon.run())
    try:
        await daemon.ready.wait()
        deadline = time.monotonic() + 10
        while source.polls < polls:
            assert time.monotonic() < deadline, "polling stalled"
            await asyncio.sleep(0.02)
        assert daemon.exporter is not None
        return await asyncio.to_thread(scrape, daemon.exporter.port)
    finally:
        started = time.monotonic()
        daemon.stop()
        await asyncio.wait_for(task, 10)
        assert time.monotonic() - started < 3, "stop waited on the absent broker"


async def test_broker_down_at_start_never_stops_polling_or_metrics() -> None:
    source = TickingSource("local")

    def factory(cfg: SourceConfig) -> Source:
        return source

    daemon = Daemon(settings({"port": closed_port(), "keepalive": "1s"}),
                    source_factory=factory)
    body = await run_until_polls(daemon, source, 20)
    assert "ibmon_mqtt_connected 0.0" in body
    assert "ibmon_mqtt_dropped_total 0.0" in body
    assert f'ibmon_port_transmit_data_bytes_total{{guid="{GUID}",port="1"}}' in body


async def test_without_mqtt_no_mqtt_series_are_exported() -> None:
    source = TickingSource("local")

    def factory(cfg: SourceConfig) -> Source:
        return source

    body = await run_until_polls(Daemon(settings(None), source_factory=factory), source, 3)
    assert "ibmon_mqtt_" not in body
