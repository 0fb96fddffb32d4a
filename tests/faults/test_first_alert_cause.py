"""Fault: the first ``receive_errors`` alert of a port must already carry its cause.

A real daemon polls a real ibsim + opensm fabric through the ``diags`` source (infiniband-diags)
every second. A host port's PortRcvErrors rise together with
PortRcvErrorDetails.PortLocalPhysicalErrors, and nothing else (no symbol errors that would
point to ``physical`` on their own): the detail counter is the only witness of the cause. The
first ``receive_errors`` event that fires, the one a pager sends, must name ``physical``, not
``unknown`` with a cause that only shows in later updates.

Both ways a port's details reach the daemon: its baseline read before the fault, and no
baseline yet (a source reads at most ``detail_baselines_per_poll`` of them a poll, so on a
fabric of thousands of ports most ports' first detail read is the one made when their
aggregate moves; 0 here stands for such a port).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from ibmon.config import load_settings
from ibmon.runtime.daemon import Daemon
from ibmon.sources.diags import DiagsSource, SubprocessRunner
from mocks.ibsim import IbSim
from tests.ibsim_fixtures import sim_for

NET = """\
Switch 8 "S1"
[1] "H1"[1]
[2] "H2"[1]

Hca 2 "H1"
[1] "S1"[1]

Hca 2 "H2"
[1] "S1"[2]
"""
STEP = 200


@pytest.fixture(scope="module")
def sim() -> Iterator[IbSim]:
    yield from sim_for(NET)


def rates_of(url: str) -> Any:
    """The port's rates from the daemon's API (None before its first poll: 404)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.load(r)["port"].get("rates")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


@pytest.mark.parametrize("baselines", [64, 0], ids=["baseline_read", "baseline_not_yet"])
async def test_first_receive_errors_event_names_the_cause(sim: IbSim, baselines: int) -> None:
    def runner() -> SubprocessRunner:
        return SubprocessRunner(concurrency=4, env=sim.tool_env(), cwd=sim.workdir)

    probe = DiagsSource(runner=runner())
    try:
        topo = await probe.discover()
    finally:
        await probe.close()
    (guid,) = {k[0] for k, p in topo.ports.items() if p.node_desc.startswith("H1")}
    settings = load_settings(None, prometheus={"listen": "127.0.0.1:0"},
                             sources=[{"type": "diags", "name": "fabric", "interval": 1.0}])

    def source(cfg: Any) -> DiagsSource:
        return DiagsSource(name=cfg.label, runner=runner(), interval=1.0, state_interval=60.0,
                           topology_interval=600.0, detail_baselines_per_poll=baselines)

    daemon = Daemon(settings, source_factory=source)
    task = asyncio.create_task(daemon.run())
    stop = threading.Event()
    try:
        await asyncio.wait_for(daemon.ready.wait(), 60)
        assert daemon.exporter is not None
        url = f"http://127.0.0.1:{daemon.exporter.port}/api/v1/ports/{guid}/1"
        deadline = time.monotonic() + 60
        # two clean polls: a baseline and rates
        while not await asyncio.to_thread(rates_of, url):
            assert time.monotonic() < deadline, "the host port was never read twice"
            await asyncio.sleep(0.2)

        def inject() -> None:
            value = 0
            while not stop.wait(0.5):
                value = min(value + STEP, 0xFFFF)
                sim.set_counters("H1", 1, {
                    "PortRcvErrors": value,
                    "PortRcvErrorDetails.PortLocalPhysicalErrors": value})

        thread = threading.Thread(target=inject, name="first-cause-injector", daemon=True)
        thread.start()
        deadline = time.monotonic() + 60
        while True:
            fired = [e for e in daemon.bus.history
                     if e.type == "receive_errors" and e.status == "firing"
                     and e.port is not None and e.port.guid == guid]
            if fired:
                break
            assert time.monotonic() < deadline, "receive_errors never fired"
            await asyncio.sleep(0.1)
        first = fired[0]
        assert first.details["cause"] == "physical", first.details
        assert first.details["breakdown"].get("receive_local_physical_errors", 0) > 0
    finally:
        stop.set()
        daemon.stop()
        await asyncio.wait_for(task, 60)
        sim.reap_clients()


def test_a_burst_whose_details_are_read_with_it_still_fires() -> None:
    """The first firing waits one poll for the details' increase; a one-off burst (the
    aggregate moves once, the rate then falls to 0) must still fire, in that next poll."""
    from ibmon.detect.engine import Engine
    from ibmon.infiniband.model import PortIdentity, PortView

    ident = PortIdentity(guid="0x0002c90a00000007", port="1", device="mlx5_0",
                         node_desc="gpu031 mlx5_0", lid=9)

    def at(t: float, totals: dict[str, int], rate: float | None) -> list[Any]:
        v = PortView(identity=ident, state=4, phys_state=5, rate_bytes_per_second=12.5e9,
                     totals=totals, rates={} if rate is None else {"receive_errors": rate})
        return [e for e in engine.process({v.key: v}, monotonic=t, wall=1e9 + t)
                if e.type == "receive_errors"]

    engine = Engine()
    assert at(0, {"receive_errors": 0}, None) == []
    # the burst, and the port's first detail read (no baseline yet)
    burst = {"receive_errors": 500, "receive_local_physical_errors": 500}
    assert at(1, burst, 500.0) == []
    (ev,) = at(2, burst, 0.0)
    assert ev.status == "firing"
    assert ev.details["count"] == 500
    assert ev.details["cause"] == "unknown"  # honest: nothing tells the burst's cause
