"""MockSource: the Source protocol over the simulated fabric, on simulated time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from ibmon.sources import Source
from ibmon.sources.mock import MockSource
from ibmon.sources.sysfs import SysfsSource
from ibmon.track.tracker import Tracker
from mocks.scenario import ManualClock, ScenarioError, SimClock, resolve_port
from mocks.sysfs import run_sysfs


async def test_snapshots_carry_simulated_time_and_every_port() -> None:
    clock = ManualClock()
    src = MockSource.from_scenario("congestion", clock=clock, name="sim")
    assert isinstance(src, Source)
    first = await src.sample()
    assert first.monotonic == 0.0
    assert len(first.ports) == len(src.model.keys) == 288
    clock.t = 125.0
    snap = await src.sample()
    assert snap.monotonic == 125.0
    assert snap.wall - first.wall == pytest.approx(125.0)
    assert src.model.now == 125.0
    sample = next(iter(snap.ports.values()))
    assert sample.identity.source == "sim"


async def test_rates_are_per_simulated_second() -> None:
    clock = ManualClock()
    src = MockSource.from_scenario("congestion", clock=clock)
    tracker = Tracker()
    key = resolve_port(src.model.fabric, "leaf03[20]")
    pkey = (key[0], str(key[1]))
    for t in (120.0, 130.0):
        clock.t = t
        views = tracker.update(await src.sample())
    view = views[pkey]
    assert view.xmit_wait_ratio == pytest.approx(0.35, rel=1e-3)
    assert view.utilization_tx == pytest.approx(0.6, rel=1e-3)


async def test_discover_keeps_down_links_and_reports_degradation() -> None:
    clock = ManualClock()
    src = MockSource.from_scenario("degraded", clock=clock)
    clock.t = 130.0
    await src.sample()
    topo = await src.discover()
    assert len(topo.ports) == len(topo.links) == 288
    g, p = resolve_port(src.model.fabric, "leaf02[30]")
    link = topo.links[(g, str(p))]
    assert (link.active_width, link.max_width) == ("1X", "4X")
    assert link.remote_node_desc == "spine02"
    flap = MockSource.from_scenario("flap", clock=ManualClock(121.0))
    await flap.sample()
    g, p = resolve_port(flap.model.fabric, "leaf02[3]")
    assert (await flap.discover()).links[(g, str(p))].remote_node_desc == "host021 mlx5_0"
    assert (await flap.sample()).ports[(g, str(p))].state == 1


async def test_hosts_scales_the_fabric() -> None:
    src = MockSource.from_scenario("demo", hosts=7000, clock=ManualClock())
    assert len(src.model.keys) >= 20_000
    with pytest.raises(ScenarioError, match="unknown scenario"):
        MockSource.from_scenario("no-such-scenario")


def test_sim_clock_runs_faster_than_real_time() -> None:
    clock = SimClock(1000.0, start=5.0)
    assert 5.0 <= clock() < 5.0 + 1000.0 * 60
    with pytest.raises(ValueError, match="speed"):
        SimClock(0)


async def _until(cond: Callable[[], bool]) -> None:
    async with asyncio.timeout(20):
        while not cond():  # noqa: ASYNC110 - polling files another task writes
            await asyncio.sleep(0.02)


async def test_run_sysfs_renders_until_stopped(tmp_path: Path) -> None:
    stop = asyncio.Event()
    clock = ManualClock(0.0)
    task = asyncio.create_task(run_sysfs(tmp_path, "flap", interval=0.01, clock=clock, stop=stop))
    state = tmp_path / "class" / "infiniband" / "mlx5_20" / "ports" / "1" / "state"  # host021
    await _until(state.exists)
    assert state.read_text() == "4: ACTIVE\n"
    clock.t = 121.0  # the flap began at 120 s
    await _until(lambda: state.read_text() == "1: DOWN\n")
    stop.set()
    renderer = await asyncio.wait_for(task, 20)
    assert len(renderer.devices) == 72
    snap = await SysfsSource(root=tmp_path).sample()
    assert len(snap.ports) == 72
    host021 = resolve_port(renderer.model.fabric, "host021 mlx5_0[1]")
    assert snap.ports[(host021[0], "1")].state == 1
