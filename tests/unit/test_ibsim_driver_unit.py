"""What the ibsim driver sends to the console, checked without ibsim (a recording fake)."""

from __future__ import annotations

import json
import re
from typing import Any, cast

from ibmon.infiniband.model import Snapshot, SourceError
from mocks.ibsim import MAX_CONSOLE_LINE, IbSim
from mocks.ibsim_driver import IbSimDriver, snapshot_from_json, snapshot_to_json
from mocks.topology import fat_tree
from mocks.traffic import FabricModel

_LINE = re.compile(r'^PerformanceSet "([SH]-[0-9a-f]+)"\[(\d+)\] (\w+)\.(\w+)=(\d+)$')


class FakeSim:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.calls: list[tuple[str, str, int]] = []

    def console(self, cmd: Any, timeout: float = 30.0) -> str:
        lines = [cmd] if isinstance(cmd, str) else list(cmd)
        self.lines += lines
        return "\n".join(f"{ln.split(' ', 2)[2]} has been set to x" for ln in lines)

    def unlink(self, node: str, port: int | None = None) -> str:
        self.calls.append(("unlink", node, port or 0))
        return ""

    def relink(self, node: str, port: int | None = None) -> str:
        self.calls.append(("relink", node, port or 0))
        return ""

    def resweep(self, timeout: float = 60.0) -> None:
        self.calls.append(("resweep", "", 0))


def make() -> tuple[FakeSim, IbSimDriver]:
    fab = fat_tree(levels=2, radix=8, leaves=2, hosts_per_leaf=4)
    sim = FakeSim()
    return sim, IbSimDriver(cast(IbSim, sim), FabricModel(fab, seed=1))


def parsed(lines: list[str]) -> dict[tuple[str, int, str], int]:
    out: dict[tuple[str, int, str], int] = {}
    for ln in lines:
        m = _LINE.match(ln)
        assert m, ln
        assert len(ln.encode()) <= MAX_CONSOLE_LINE
        out[(m.group(1), int(m.group(2)), f"{m.group(3)}.{m.group(4)}")] = int(m.group(5))
    return out


def test_first_push_sets_everything_then_only_changes() -> None:
    sim, drv = make()
    drv.push()
    first = parsed(sim.lines)
    n_ports = len(drv.model.keys)
    # 4 data/packet counters x 2 copies, 4 unicast/multicast, 13 narrow (no qp1_dropped field),
    # 6 receive error and 4 transmit discard details
    assert len(first) == len(sim.lines) == n_ports * (8 + 4 + 13 + 10)
    sim.lines.clear()
    drv.push()
    assert sim.lines == []  # nothing changed
    key = drv.model.keys[0]
    drv.model.bump(key, "symbol_errors", 3)
    drv.push()
    assert len(sim.lines) == 1 and "PortCounters.SymbolErrorCounter=3" in sim.lines[0]


def test_an_error_reaches_ibsim_with_its_cause() -> None:
    """A receive error or discard moves the aggregate and one detail field by the same amount."""
    sim, drv = make()
    drv.push()
    sim.lines.clear()
    key = drv.model.keys[1]
    drv.model.bump(key, "receive_errors", 5)
    drv.model.bump(key, "transmit_discards", 2, detail="transmit_neighbor_mtu_discards")
    drv.push()
    assert {ln.split(" ", 2)[2] for ln in sim.lines} == {
        "PortCounters.PortRcvErrors=5",
        "PortRcvErrorDetails.PortLocalPhysicalErrors=5",
        "PortCounters.PortXmitDiscards=2",
        "PortXmitDiscardDetails.PortNeighborMTUDiscards=2",
    }


def test_wide_values_go_to_both_copies_and_the_narrow_one_saturates() -> None:
    sim, drv = make()
    key = drv.model.keys[2]
    drv.model.set_value(key, "transmit_data", 5 * 2**32)
    drv.model.set_value(key, "transmit_packets", 1000)
    drv.push()
    vals = parsed(sim.lines)
    nid = ("S-" if drv.model.fabric.nodes[key[0]].kind == "switch" else "H-") + key[0][2:]
    assert vals[(nid, key[1], "PortCountersExtended.PortXmitData")] == 5 * 2**32
    assert vals[(nid, key[1], "PortCounters.PortXmitData")] == 2**32 - 1
    assert vals[(nid, key[1], "PortCountersExtended.PortXmitPkts")] == 1000
    assert vals[(nid, key[1], "PortCounters.PortXmitPkts")] == 1000
    sim.lines.clear()
    drv.model.set_value(key, "transmit_data", 6 * 2**32)
    drv.push()
    # the 32-bit copy stayed saturated: only the 64-bit copy is sent again
    assert sim.lines == [f'PerformanceSet "{nid}"[{key[1]}] '
                         f"PortCountersExtended.PortXmitData={6 * 2**32}"]


def test_link_changes_unlink_relink_on_the_switch_end_and_resweep() -> None:
    sim, drv = make()
    drv.push()
    host = drv.model.fabric.node_by_desc("host001 mlx5_0")
    leaf_guid, leaf_port = drv.model.fabric.peer(host.guid, 1)  # type: ignore[misc]
    drv.model.link_down((host.guid, 1))
    sim.lines.clear()
    stats = drv.push()
    assert (stats.unlinks, stats.relinks) == (1, 0)
    assert sim.calls == [("unlink", "S-" + leaf_guid[2:], leaf_port), ("resweep", "", 0)]
    # the model's LinkDowned increment reaches ibsim on both ends (ibsim's Unlink does not count)
    vals = parsed(sim.lines)
    assert vals[("H-" + host.guid[2:], 1, "PortCounters.LinkDownedCounter")] == 1
    assert vals[("S-" + leaf_guid[2:], leaf_port, "PortCounters.LinkDownedCounter")] == 1
    sim.calls.clear()
    drv.model.link_up((host.guid, 1))
    assert drv.push().relinks == 1
    assert sim.calls == [("relink", "S-" + leaf_guid[2:], leaf_port), ("resweep", "", 0)]


def test_ports_limits_counter_pushes_not_link_changes() -> None:
    fab = fat_tree(levels=2, radix=8, leaves=2, hosts_per_leaf=4)
    model = FabricModel(fab, seed=1)
    sim = FakeSim()
    drv = IbSimDriver(cast(IbSim, sim), model, ports=model.keys[:2])
    drv.push()
    assert {(k[0], k[1]) for k in parsed(sim.lines)} == {
        (("S-" if fab.nodes[g].kind == "switch" else "H-") + g[2:], p) for g, p in model.keys[:2]
    }


def test_xmit_wait_reaches_ibsim_in_the_family_unit_saturated_at_32_bits() -> None:
    """ibsim has only the 32-bit PortXmitWait: the model's counts (in the port's family unit)
    go there as they are, and pin at 2**32-1 once the model's 64-bit count passes it."""
    sim, drv = make()
    model = drv.model
    spine = model.fabric.node_by_desc("spine01")
    key = (spine.guid, 1)
    nid = f"S-{spine.guid[2:]}"
    model.congest(key, wait_ratio=0.5, utilization=0.1)
    drv.push()
    w0 = parsed(sim.lines)[(nid, 1, "PortCounters.PortXmitWait")]
    sim.lines.clear()
    drv.step_to(2.0)
    w1 = parsed(sim.lines)[(nid, 1, "PortCounters.PortXmitWait")]
    # a Switch-IB 2 count is 32 bytes a lane: 128 on 4X EDR
    assert abs((w1 - w0) - 0.5 * 100e9 / 8 * 2.0 / 128) <= 1
    model.set_value(key, "transmit_wait", 2**32 + 10)
    sim.lines.clear()
    drv.push()
    assert parsed(sim.lines)[(nid, 1, "PortCounters.PortXmitWait")] == 2**32 - 1
    sim.lines.clear()
    drv.step_to(3.0)
    # the 32-bit field stays pinned: nothing more is sent for it
    assert not [ln for ln in sim.lines if ln.startswith(f'PerformanceSet "{nid}"[1] PortCounters.'
                                                         "PortXmitWait")]


def test_snapshots_cross_the_child_pipe_whole() -> None:
    """``MadSourceProcess`` hands the child's snapshots over as JSON: every port's identity,
    link, counters and which of them are 64-bit, and every source error, arrive as sent."""
    model = FabricModel(fat_tree(levels=1, radix=4, leaves=1, hosts_per_leaf=2))
    model.narrow_wait(model.keys[0])  # this port has the 32-bit PortXmitWait only
    snap = Snapshot(source="mad", monotonic=1.5, wall=2.5)
    keys = model.port_keys("mad")
    snap.ports.update(zip(keys, model.samples("mad"), strict=True))
    snap.errors += [SourceError("timeout", f"{keys[1][0]} port 1: PMA", keys[1]),
                    SourceError("stray_process", "left 1", None)]
    back = snapshot_from_json(json.loads(json.dumps(snapshot_to_json(snap))))
    assert (back.source, back.monotonic, back.wall, back.errors) == ("mad", 1.5, 2.5, snap.errors)
    assert back.ports.keys() == snap.ports.keys()
    for key, sent in snap.ports.items():
        got = back.ports[key]
        assert (got.identity, got.link, got.state, got.rate_bps) == (
            sent.identity, sent.link, sent.state, sent.rate_bps)
        assert dict(got.counters.items()) == dict(sent.counters.items())
        assert got.wide == sent.wide
    assert "transmit_wait" not in back.ports[keys[0]].wide
    assert "transmit_wait" in back.ports[keys[1]].wide
