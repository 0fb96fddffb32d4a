"""The pipeline's state, as every output shows it: scan's port series are /metrics byte for byte,
a port that is down has no rates anywhere, a reload keeps firing conditions, every daemon task
is owned and named, and a source that fails to close is reported."""

from __future__ import annotations

import asyncio
import gzip
import time
import urllib.request
from pathlib import Path
from typing import Any

from structlog.testing import capture_logs

from exporters.prometheus import PrometheusExporter
from ibmon.cli.scan import run_scan
from ibmon.config import SourceConfig, load_settings
from ibmon.infiniband.model import PortIdentity, PortSample, Snapshot, Topology
from ibmon.runtime.daemon import Daemon
from ibmon.sources.sysfs import SysfsSourceConfig
from tests.sysfs_tree import write_device, write_port

GUID = "0x0002c90300a1b2c3"
T0 = time.monotonic()


def fetch(url: str, encoding: str) -> tuple[bytes, str]:
    req = urllib.request.Request(url, headers={"Accept-Encoding": encoding})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.read(), resp.headers.get("Content-Encoding", "")


async def test_scan_prom_is_byte_for_byte_what_metrics_serves(tmp_path: Path) -> None:
    write_device(tmp_path, "mlx5_0")
    write_port(tmp_path, "mlx5_0", 1)
    write_port(tmp_path, "mlx5_0", 2, state="1: DOWN\n", phys_state="3: Disabled\n")
    cfg = SysfsSourceConfig(root=tmp_path)
    scan = await run_scan(cfg, load_settings(None), interval=0.0)
    async with PrometheusExporter(listen="127.0.0.1:0", self_metrics=scan.metrics) as exporter:
        body = scan.prom()
        head = scan.metrics.render_one_shot()
        assert body.startswith(head)
        ports = body[len(head):]
        assert b"ibmon_port_symbol_error_ber{" in ports  # the detectors ran
        await exporter.publish(scan.state)
        url = f"http://127.0.0.1:{exporter.port}/metrics"
        plain, enc = await asyncio.to_thread(fetch, url, "identity")
        # /metrics: every self metric (the listener's own included), then the same port series
        assert enc == "" and plain == scan.metrics.render() + ports
        zipped, enc = await asyncio.to_thread(fetch, url, "gzip")
        assert enc == "gzip" and gzip.decompress(zipped) == plain


class Port:
    """A congested port whose state the test flips; its hardware outlives source objects."""

    down = False
    closes = 0

    def __init__(self, name: str, *, close_error: bool = False) -> None:
        self.name = name
        self.close_error = close_error

    async def discover(self) -> Topology:
        return Topology(source=self.name)

    async def sample(self) -> Snapshot:
        now = time.monotonic()
        elapsed = now - T0
        ident = PortIdentity(guid=GUID, port="1", node_desc="leaf01", source=self.name)
        sample = PortSample(
            identity=ident, state=1 if Port.down else 4, phys_state=2 if Port.down else 5,
            rate_bps=100e9,
            # stalled 30 % of the time, in the default unit (8 bytes a count)
            counters={"transmit_wait": int(elapsed * 0.3 * 100e9 / 8 / 8),
                      "transmit_data": int(elapsed * 0.9 * 100e9 / 32)},
            wide=frozenset({"transmit_wait", "transmit_data"}),
        )
        return Snapshot(self.name, monotonic=now, wall=time.time(), ports={ident.key: sample})

    async def close(self) -> None:
        Port.closes += 1
        if self.close_error:
            raise OSError("umad device busy")


def get_json(port: int, path: str) -> Any:
    import json

    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        return json.loads(resp.read())


async def until(pred: Any, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while not await asyncio.to_thread(pred):
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


CONFIG = ('[prometheus]\nlisten = "127.0.0.1:0"\n'
          '[[sources]]\ntype = "sysfs"\nname = "fabric"\ninterval = "0.05s"\n')


async def test_reloads_keep_firing_conditions_and_announce_nothing(tmp_path: Path) -> None:
    Port.down = False
    cfg_file = tmp_path / "ibmon.toml"
    cfg_file.write_text(CONFIG)
    daemon = Daemon(load_settings(cfg_file), config_path=cfg_file,
                    source_factory=lambda c: Port(c.label))
    task = asyncio.create_task(daemon.run())
    try:
        await until(lambda: [a.type for a in daemon.conditions()] == ["congestion"])
        Port.down = True
        await until(lambda: sorted(a.type for a in daemon.conditions())
                    == ["congestion", "port_down"])
        # the engine holds a condition within a poll; its event is published at the poll's end
        await until(lambda: any(e.type == "port_down" for e in daemon.bus.history))
        announced = [e.summary() for e in daemon.bus.history]
        for body in (CONFIG, CONFIG + "[detect.port_down]\nseverity = \"warning\"\n"):
            cfg_file.write_text(body)  # the same config again, then a changed detector table
            daemon.reload()
            await until(lambda: daemon.settings.detect.tables() == load_settings(
                cfg_file).detect.tables())
            polls = daemon.metrics.registry.get_sample_value(
                "ibmon_source_poll_duration_seconds_count", {"source": "fabric"}) or 0
            await until(lambda p=polls: (daemon.metrics.registry.get_sample_value(
                "ibmon_source_poll_duration_seconds_count", {"source": "fabric"}) or 0) > p + 5)
            assert sorted(a.type for a in daemon.conditions()) == ["congestion", "port_down"]
            assert [e.summary() for e in daemon.bus.history] == announced
        # The down port shows no rates anywhere, though its totals and series stay.
        assert daemon.exporter is not None
        (port,) = (await asyncio.to_thread(get_json, daemon.exporter.port, "/api/v1/ports"))[
            "ports"]
        assert (port["state_name"], port["phys_state_name"]) == ("DOWN", "Polling")
        assert port["utilization"] == {"transmit": None, "receive": None}
        assert port["transmit_wait_ratio"] is None and port["rates"] == {}
        assert port["totals"]["transmit_data"] > 0
        metrics, _ = await asyncio.to_thread(
            fetch, f"http://127.0.0.1:{daemon.exporter.port}/metrics", "identity")
        text = metrics.decode()
        assert f'ibmon_port_state{{guid="{GUID}",port="1"}} 1' in text
        assert "ibmon_port_utilization_ratio{" not in text
        assert "ibmon_port_transmit_wait_ratio{" not in text
        assert "ibmon_port_rate_bytes_per_second{" not in text
    finally:
        daemon.stop()
        await task


async def test_every_task_is_owned_and_named_and_close_errors_are_logged(
    tmp_path: Path,
) -> None:
    Port.down = False
    Port.closes = 0
    events = tmp_path / "events.jsonl"
    settings = load_settings(None, prometheus={"listen": "127.0.0.1:0"},
                             events={"file": str(events)},
                             sources=[SysfsSourceConfig(name="fabric", interval=0.05).model_dump()])

    def factory(cfg: SourceConfig) -> Port:
        return Port(cfg.label, close_error=True)

    daemon = Daemon(settings, source_factory=factory)
    task = asyncio.create_task(daemon.run(), name="test-daemon")
    await daemon.ready.wait()
    await until(lambda: daemon.bus.history)
    ours = {asyncio.current_task(), task}
    names = sorted(t.get_name() for t in asyncio.all_tasks() if t not in ours)
    assert names == ["events:file", "events:log", "loop-lag", "poll:fabric", "state-saver"], names
    with capture_logs() as logs:
        daemon.stop()
        await task
    assert Port.closes == 1
    (failed,) = [e for e in logs if e["event"] == "source_close_failed"]
    assert failed["source"] == "fabric" and "umad device busy" in failed["error"]
    assert events.read_text().count('"congestion"') == 1  # the file consumer took the event
