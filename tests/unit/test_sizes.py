"""One size threshold (``ibmon.runtime.sizes.OFFLOAD_PORTS``) decides how every stage does a poll.

What an operator relies on: a node's daemon (a few HCAs) never loads numpy (its 40 MB RSS
budget), a fabric's daemon accounts in columns and works off the event loop, and both give the
same views. What a maintainer relies on: moving that one number moves every stage, so the test
suite (``tests/conftest.py`` sets it to 1) runs a fabric's paths on a few simulated ports.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ibmon.infiniband.model import PortIdentity, PortSample, Snapshot
from ibmon.runtime import looplag, sizes
from ibmon.runtime.pipeline import Pipeline
from ibmon.runtime.selfmetrics import SelfMetrics
from ibmon.sources.mock import MockSource, MockSourceConfig
from ibmon.track.rowview import RowView
from ibmon.track.totals import packed_counters
from ibmon.track.tracker import Tracker
from mocks.scenario import ManualClock

REPO = Path(__file__).resolve().parents[2]


def _snapshot(ports: int, t: float) -> Snapshot:
    samples = {}
    for p in range(1, ports + 1):
        ident = PortIdentity(guid=f"0x{p:016x}", port="1")
        counters = packed_counters({"transmit_data": int(t) * 1000 * p, "symbol_errors": 0})
        samples[ident.key] = PortSample(identity=ident, state=4, phys_state=5, rate_bps=100e9,
                                        counters=counters)
    return Snapshot(source="t", monotonic=t, wall=1.7e9 + t, ports=samples)


def _two_polls(tracker: Tracker, ports: int) -> list[object]:
    tracker.update(_snapshot(ports, 1.0))
    return list(tracker.update(_snapshot(ports, 11.0)).values())


def test_tests_run_the_fabric_path_on_a_few_ports() -> None:
    """The suite's default: two ports are accounted in the column store."""
    assert sizes.OFFLOAD_PORTS == 1
    views = _two_polls(Tracker(), 2)
    assert all(type(v) is RowView for v in views)


@pytest.mark.node_sized
def test_a_node_sized_test_keeps_the_daemons_threshold() -> None:
    assert sizes.OFFLOAD_PORTS == 200
    views = _two_polls(Tracker(), 2)
    assert not any(type(v) is RowView for v in views)


@pytest.mark.node_sized
def test_both_sides_of_the_threshold_give_the_same_views() -> None:
    """199 ports port by port, 200 in columns: the same values either way."""
    small = _two_polls(Tracker(), sizes.OFFLOAD_PORTS - 1)
    large = _two_polls(Tracker(), sizes.OFFLOAD_PORTS)
    assert not any(type(v) is RowView for v in small)
    assert all(type(v) is RowView for v in large)
    assert large[: len(small)] == small


def test_one_setting_moves_every_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    """A poll of one port, with the threshold at 1: sampled and ingested in bulk threads,
    tracked in columns, and the loop-lag probe at its fabric period."""
    monkeypatch.setattr(sizes, "OFFLOAD_PORTS", 1)
    clock = ManualClock()
    source = MockSource.from_scenario("healthy", clock=clock)
    pipeline = Pipeline(MockSourceConfig(name="mock", interval=10.0), metrics=SelfMetrics())
    threads: list[str] = []
    ingest, sample = pipeline._ingest_and_free, source._sample_sync

    def ingest_recorded(*args: object) -> object:
        threads.append(threading.current_thread().name)
        return ingest(*args)  # type: ignore[arg-type]

    def sample_recorded() -> Snapshot:
        threads.append(threading.current_thread().name)
        return sample()

    monkeypatch.setattr(pipeline, "_ingest_and_free", ingest_recorded)
    monkeypatch.setattr(source, "_sample_sync", sample_recorded)
    for t in (0.0, 10.0):
        clock.t = t
        asyncio.run(pipeline.poll(source))
    assert threads and all(name.startswith("ibmon-bulk") for name in threads)
    assert all(type(v) is RowView for v in pipeline.views.values())
    assert looplag.period_for(1) == looplag.PERIOD
    monkeypatch.setattr(sizes, "OFFLOAD_PORTS", 1 << 62)
    assert looplag.period_for(100_000) == looplag.IDLE_PERIOD


_NODE_POLL = """
import sys
from ibmon.runtime import sizes
from tests.unit.test_sizes import _two_polls
from ibmon.track.tracker import Tracker
views = _two_polls(Tracker(), int(sys.argv[1]))
print(len(views), "numpy" in sys.modules)
"""


@pytest.mark.node_sized
@pytest.mark.parametrize(("ports", "numpy"), [(4, False), (200, True)])
def test_only_a_fabric_sized_poll_loads_numpy(ports: int, numpy: bool) -> None:
    """In a fresh interpreter, as a node's daemon runs: a poll of a node's few ports tracks
    without numpy (15 MB of the node daemon's 40 MB); a fabric's loads it for the store."""
    out = subprocess.run([sys.executable, "-c", _NODE_POLL, str(ports)], cwd=REPO,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.split() == [str(ports), str(numpy)]
