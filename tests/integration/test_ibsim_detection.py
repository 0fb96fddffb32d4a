"""Detection through real tools: ibsim + opensm + infiniband-diags, the ``diags`` source.

The faults ibsim can express (counter values set with PerformanceSet, a link taken down with
Unlink) are injected between polls; the tracker and detection engine run on a simulated clock
(one poll per simulated second, the snapshot times replaced) so rates and windows do not depend
on how fast the tools answer. The answer key follows the conventions of mocks/scenario.py.
(The ``mad`` source runs only in a child process under LD_PRELOAD; the mad-versus-diags test
proves the two produce identical snapshots, so detection is exercised through ``diags``.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from ibmon.detect.engine import Engine
from ibmon.detect.events import Event
from ibmon.infiniband.model import Snapshot
from ibmon.infiniband.xmitwait import WaitUnit, counts_for
from ibmon.track.tracker import Tracker
from mocks.ibsim import IbSim
from mocks.topology import Fabric, fat_tree, to_ibsim_netfile
from tests.ibsim_fixtures import require_ibsim

pytestmark = pytest.mark.system

FAB: Fabric = fat_tree(levels=2, radix=8, leaves=2, hosts_per_leaf=4)
TABLES = {"link_integrity": {"hold": 5}, "high_ber": {"window": 10}}
#: leaf02 is a Quantum (NodeInfo.DeviceID 0xd2f0 in the net file): one PortXmitWait count is 8
#: bytes of the port's 4X EDR data rate, whatever its width.
QUANTUM = WaitUnit(8, False, "family", "Quantum")
EDR_4X_BYTES = 100e9 / 8


def stalled(fraction: float, seconds: float) -> int:
    """leaf02's PortXmitWait counts for ``fraction`` of ``seconds`` stalled."""
    bpc = QUANTUM.bytes_per_count("4X")
    assert bpc is not None
    return round(counts_for(fraction, bpc, EDR_4X_BYTES, seconds))


@pytest.fixture(scope="module")
def sim() -> Iterator[IbSim]:
    require_ibsim()
    with IbSim(to_ibsim_netfile(FAB)) as s:
        yield s


def node_id(desc: str) -> str:
    node = FAB.node_by_desc(desc)
    return ("S-" if node.kind == "switch" else "H-") + node.guid[2:]


def key(desc: str, port: int) -> tuple[str, str]:
    return FAB.node_by_desc(desc).guid, str(port)


def peer_of(desc: str, port: int) -> tuple[str, int]:
    guid = FAB.node_by_desc(desc).guid
    link = FAB.link_of(guid, port)
    assert link is not None
    far = link.b if link.a == (guid, port) else link.a
    return FAB.nodes[far[0]].desc, far[1]


async def test_ibsim_faults_yield_exactly_the_expected_events(sim: IbSim) -> None:
    from ibmon.sources.diags import DiagsSource, SubprocessRunner

    sim.reap_clients()
    uplink = ("leaf01", 5)
    spine_end = peer_of(*uplink)
    steps: dict[int, Callable[[], None]] = {
        3: lambda: (sim.set_counters(node_id("host003 mlx5_0"), 1, {"PortRcvErrors": 100}),
                    sim.set_counters(node_id("leaf02"), 2, {"LocalLinkIntegrityErrors": 1})),
        4: lambda: sim.set_counters(node_id(spine_end[0]), spine_end[1],
                                    {"SymbolErrorCounter": 1000}),
        # 64 % of each second stalled: 1e9 counts a second, 3e9 by 7 s (under 2**32)
        5: lambda: sim.set_counters(node_id("leaf02"), 3, {"PortXmitWait": stalled(0.64, 1)}),
        6: lambda: sim.set_counters(node_id("leaf02"), 3, {"PortXmitWait": stalled(0.64, 2)}),
        7: lambda: sim.set_counters(node_id("leaf02"), 3, {"PortXmitWait": stalled(0.64, 3)}),
        8: lambda: (sim.unlink(node_id(uplink[0]), uplink[1]),
                    sim.set_counters(node_id(uplink[0]), uplink[1], {"LinkDownedCounter": 1}),
                    sim.set_counters(node_id(spine_end[0]), spine_end[1],
                                     {"LinkDownedCounter": 1})),
        10: lambda: (sim.relink(node_id(uplink[0]), uplink[1]), sim.resweep()),
        12: lambda: sim.set_counters(node_id("host003 mlx5_0"), 1, {"PortRcvErrors": 0}),
        13: lambda: sim.set_counters(node_id("host004 mlx5_0"), 1,
                                     {"SymbolErrorCounter": 65535}),
        16: lambda: sim.set_counters(node_id("host004 mlx5_0"), 1, {"SymbolErrorCounter": 0}),
    }
    rediscover = {8, 10}
    carrier = min(key(*uplink), key(*spine_end))
    expected = {
        ("receive_errors", key("host003 mlx5_0", 1), "firing", 3),
        ("receive_errors", key("host003 mlx5_0", 1), "resolved", 6),
        ("link_integrity", key("leaf02", 2), "firing", 3),
        ("link_integrity", key("leaf02", 2), "resolved", 8),
        ("high_ber", key(*spine_end), "firing", 4),  # 1000 errors / (10 s x 100 Gb/s): critical
        ("high_ber", key(*spine_end), "resolved", 14),
        ("congestion", key("leaf02", 3), "firing", 7),  # 0.64 of each second x 3 polls
        ("congestion", key("leaf02", 3), "resolved", 10),
        # once per link, on its carrying end (the lower GUID between two switches), although
        # the rediscovery at 8 shows neither end a neighbour
        ("port_down", carrier, "firing", 8),
        ("port_down", carrier, "resolved", 10),
        ("counter_reset", key("host003 mlx5_0", 1), "firing", 12),
        ("counter_saturated", key("host004 mlx5_0", 1), "firing", 13),
        # 65535 errors in one second: a lower bound already far above 1e-10, so it fires even
        # though the counter is pinned; it resolves when they leave the 10 s window.
        ("high_ber", key("host004 mlx5_0", 1), "firing", 13),
        ("high_ber", key("host004 mlx5_0", 1), "resolved", 23),
        ("counter_saturated", key("host004 mlx5_0", 1), "resolved", 16),
        ("counter_reset", key("host004 mlx5_0", 1), "firing", 16),
    }
    src = DiagsSource(runner=SubprocessRunner(concurrency=4, env=sim.tool_env(),
                                              cwd=sim.workdir))
    tracker, engine = Tracker(), Engine(TABLES, source="diags")
    seen: list[tuple[int, Event]] = []
    wait: dict[int, float | None] = {}
    try:
        await src.discover()
        for t in range(25):
            if t in steps:
                steps[t]()
            if t in rediscover:
                await src.discover()  # port state comes with discovery (PortInfo)
            real = await src.sample()
            snap = Snapshot(real.source, float(t), 1e9 + t, real.ports, real.errors)
            views = tracker.update(snap)
            wait[t] = views[key("leaf02", 3)].xmit_wait_ratio
            seen += [(t, e) for e in engine.process(views, monotonic=t, wall=1e9 + t)]
    finally:
        await src.close()
        sim.reap_clients()
    got = {(e.type, (e.port.guid, e.port.port) if e.port else None, e.status, t)
           for t, e in seen}
    assert got == expected, (
        f"missing {sorted(expected - got)}\nunexpected {sorted(got - expected)}")
    assert len(seen) == len(expected)
    # the stall fraction itself, from counts in the Quantum's unit (not a fixed tick time)
    for t in (5, 6, 7):
        assert wait[t] == pytest.approx(0.64, rel=1e-6), (t, wait[t])
    (down,) = [e for _, e in seen if e.type == "port_down" and e.status == "firing"]
    far = key(*spine_end) if carrier == key(*uplink) else key(*uplink)
    assert down.peer is not None
    assert (down.peer.guid, down.peer.port) == far  # the other end named
    sev = {(e.type, e.status): e.severity for _, e in seen}
    assert {e.severity for _, e in seen if e.type == "high_ber"} == {"critical"}
    assert sev[("congestion", "firing")] == "critical"
    assert sev[("counter_reset", "firing")] == "info"
    kinds = {e.details.get("kind") for _, e in seen if e.type == "congestion"}
    assert kinds == {"backpressure"}  # ibsim moves data only with MADs: nothing utilized
