"""In-process MockSource versus the sysfs renderer read by the unmodified SysfsSource.

For every scenario, the counter trajectories the tracker computes from both paths (totals,
saturated counters, reset counts, state and link rate names per poll) must be identical on every
HCA port the tree shows: the simulated sysfs tree is only a different rendering of the same
fabric, so any difference is a renderer or parser bug. One difference is the hardware's: the
mock's PortXmitWait is the PMA's 64-bit copy, sysfs's ``port_xmit_wait`` the 32-bit PortCounters
field. Counted in bytes (8 a count on a ConnectX-6), a congested HCA passes 2**32 within
seconds; from that poll on, sysfs must show it saturated and the two totals part.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from ibmon.infiniband.counters import CATALOGUE
from ibmon.infiniband.model import PortView
from ibmon.sources.mock import MockSource
from ibmon.sources.sysfs import SysfsSource
from ibmon.track.tracker import Tracker
from mocks.scenario import ManualClock, Scenario, list_scenarios, load_scenario, resolve_port
from mocks.sysfs import SysfsRenderer
from mocks.topology import fat_tree
from mocks.traffic import SM_LID, FabricModel

#: Counters a PMA has but sysfs has no file for (QP1Dropped, the error and discard details).
NOT_IN_SYSFS = {c.name for c in CATALOGUE if c.sysfs is None}
MAX32 = (1 << 32) - 1


@pytest.fixture
def tree_root(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs directory when there is one (rendering rewrites hundreds of files per poll)."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        with tempfile.TemporaryDirectory(dir=shm, prefix="ibmon-diff-") as d:
            yield Path(d)
    else:
        yield tmp_path


def _poll_times(sc: Scenario) -> list[float]:
    """Polls around every fault edge (so each fault is crossed) plus an even grid."""
    times: set[float] = {0.0, sc.duration}
    times.update(round(sc.duration * k / 30, 3) for k in range(31))
    for e in sc.timeline:
        edges = [e.at]
        if e.duration is not None:
            edges.append(e.at + e.duration)
        for attr in ("count",):
            count = getattr(e, attr, None)
            every = getattr(e, "every", None)
            if count and every:
                edges += [e.at + k * every for k in range(count)]
                down_for = getattr(e, "down_for", None)
                if down_for:
                    edges += [e.at + k * every + down_for for k in range(count)]
        for t in edges:
            times.update(x for x in (t - 1, t, t + 1, t + 2, t + 3) if 0 <= x <= sc.duration)
    for x in sc.expect:
        times.update(x.window)
    return sorted(times)


def _host_guids(sc: Scenario, src: MockSource) -> set[str]:
    """HCAs a scenario touches (directly or as the far end of a faulted port) plus a few more."""
    fabric = src.model.fabric
    guids = {n.guid for n in fabric.hosts()[:3]}
    for ref in [e.port for e in sc.timeline] + [x.port for x in sc.expect]:
        key = resolve_port(fabric, ref)
        peer = fabric.peer(*key)
        for g, _ in (key, peer) if peer else (key,):
            if fabric.nodes[g].kind == "ca":
                guids.add(g)
    return guids


ERRORS = ("symbol_errors", "receive_errors", "link_downed", "local_link_integrity_errors",
          "transmit_discards")


def _fault_visible(view: PortView, first: dict[str, int]) -> bool:
    return bool(
        view.state != 4
        or view.resets
        or view.saturated
        or (view.active_width, view.active_speed) != ("4X", "EDR")
        or any(view.totals[c] != first[c] for c in ERRORS)
        or (view.xmit_wait_ratio or 0.0) > 0.05
    )


@pytest.mark.parametrize("name", list_scenarios())
async def test_trajectories_identical(name: str, tree_root: Path) -> None:
    sc = load_scenario(name)
    clock = ManualClock()
    src = MockSource.from_scenario(name, clock=clock)
    hosts = _host_guids(sc, src)
    renderer = SysfsRenderer(src.model, tree_root, hosts=hosts)
    sysfs = SysfsSource(root=tree_root)
    via_mock, via_sysfs = Tracker(), Tracker()
    fault_seen = False
    first: dict[tuple[str, str], dict[str, int]] = {}
    parted: set[tuple[str, str]] = set()  # ports whose 64-bit PortXmitWait passed 2**32-1
    for t in _poll_times(sc):
        clock.t = t
        snap_m = await src.sample()
        renderer.render()
        snap_s = await sysfs.sample()
        assert snap_s.errors == [], snap_s.errors[:3]
        views_m = via_mock.update(snap_m)
        views_s = via_sysfs.update(snap_s)
        assert {k[0] for k in views_s} == hosts
        for key, vs in views_s.items():
            vm = views_m[key]
            assert vm.totals.keys() - vs.totals.keys() == NOT_IN_SYSFS
            common = {c: vm.totals[c] for c in vs.totals}
            wide = "transmit_wait" in snap_m.ports[key].wide  # not a narrow_wait port
            if wide and snap_m.ports[key].counters["transmit_wait"] >= MAX32:
                parted.add(key)
            if key in parted:
                raw = snap_s.ports[key].counters["transmit_wait"]
                assert raw <= MAX32, (name, t, key)  # the kernel's field, never wider
                # pinned in sysfs while the 64-bit count is above it
                pinned = snap_m.ports[key].counters["transmit_wait"] >= MAX32
                assert ("transmit_wait" in vs.saturated) == pinned, (name, t, key)
                assert "transmit_wait" not in vm.saturated, (name, t, key)
                del common["transmit_wait"]
                assert common == {c: v for c, v in vs.totals.items() if c != "transmit_wait"}
                assert vm.saturated == vs.saturated - {"transmit_wait"}, (name, t, key)
            else:
                assert common == vs.totals, (name, t, key)
                assert vm.saturated == vs.saturated, (name, t, key)
            assert vm.resets == vs.resets, (name, t, key)
            assert (vm.state, vm.phys_state) == (vs.state, vs.phys_state), (name, t, key)
            assert (vm.active_width, vm.active_speed) == (vs.active_width, vs.active_speed)
            # the same data rate: sysfs prints the signalling rate, the source converts it
            assert snap_m.ports[key].rate_bps == snap_s.ports[key].rate_bps, (name, t, key)
            assert vm.identity.node_desc == vs.identity.node_desc
            assert vm.identity.device == vs.identity.device
            assert vm.identity.lid == vs.identity.lid
            # what one PortXmitWait count is: the mock's family, and sysfs's from hca_type
            assert vm.identity.hca_type == vs.identity.hca_type == "MT4123"
            assert vm.identity.xmit_wait == vs.identity.xmit_wait
            assert vs.identity.xmit_wait.family == "ConnectX-6"
            base = first.setdefault(key, dict(vs.totals))
            # rates only from the mock view: the sysfs source stamps real time, not simulated
            fault_seen = fault_seen or _fault_visible(vm, base)
    # not vacuous: every scenario but healthy shows a fault on some HCA in the tree
    assert fault_seen == (name != "healthy")
    # host010's 80 % backpressure fills 32 bits within seconds in both scenarios that have it
    # (and hours of a healthy HCA's baseline stall fill it too)
    host010 = resolve_port(src.model.fabric, "host010 mlx5_0[1]")
    if name in {"congestion", "demo"}:
        assert (host010[0], str(host010[1])) in parted, (name, parted)


async def test_tree_matches_kernel_format(tree_root: Path) -> None:
    """Spot-check the bytes of a rendered device against what the kernel prints."""
    clock = ManualClock(30.0)
    src = MockSource.from_scenario("degraded", clock=clock)
    fabric = src.model.fabric
    host = fabric.node_by_desc("host050 mlx5_0")
    renderer = SysfsRenderer(src.model, tree_root, hosts={host.guid})
    clock.t = 250.0
    await src.sample()
    renderer.render()
    dev = tree_root / "class" / "infiniband" / "mlx5_49"
    assert (dev / "node_desc").read_text() == "host050 mlx5_0\n"
    g = host.guid[2:]
    assert (dev / "node_guid").read_text() == f"{g[0:4]}:{g[4:8]}:{g[8:12]}:{g[12:16]}\n"
    assert (dev / "node_type").read_text() == "1: CA\n"
    port = dev / "ports" / "1"
    assert (port / "state").read_text() == "4: ACTIVE\n"
    assert (port / "phys_state").read_text() == "5: LinkUp\n"
    assert (port / "rate").read_text() == "56 Gb/sec (4X FDR)\n"  # degraded to FDR at 200 s
    assert (port / "lid").read_text() == f"0x{host.lid:x}\n"
    data = (port / "counters" / "port_xmit_data").read_text()
    assert data.endswith("\n")
    assert data.strip().isdigit()
    assert int(data) == src.model.value((host.guid, 1), "transmit_data")
    assert not any(p.name.startswith(".") for p in dev.rglob("*"))


def test_tree_prints_what_the_kernel_prints(tree_root: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The rest of each file, as ``drivers/infiniband/core/sysfs.c`` prints it: ``sm_lid``
    ``0x%x``, ``cap_mask`` ``0x%08x``, ``rate`` with ``.5`` for a half (``2.5 Gb/sec (1X
    SDR)``), ``phys_state`` 7 as ``Phy Test``; ``node_desc`` at most the 64 bytes of an IB
    NodeDescription; ``sys_image_guid`` the node's. A tree chosen by node description, and
    written without a temporary name ever inside it."""
    fabric = fat_tree(radix=8, leaves=2, hosts_per_leaf=4)
    first = fabric.hosts()[0]
    host = fabric.nodes[first.guid] = replace(first, desc="h" * 70)
    model = FabricModel(fabric, seed=1)
    renderer = SysfsRenderer(model, tree_root, hosts={host.desc})
    (dev,) = renderer.devices
    i = model.port_index((host.guid, 1))
    model.degrade((host.guid, 1), width="1X", speed="SDR")
    model.phys[i] = 7
    written: list[str] = []  # where each file was written before it was moved into place
    replace_file = os.replace

    def spy(src: str, dst: str) -> None:
        written.append(os.fspath(src))
        replace_file(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    for _ in range(3):
        renderer.render()
    ddir = tree_root / "class" / "infiniband" / dev
    port = ddir / "ports" / "1"
    assert (port / "sm_lid").read_text() == f"0x{SM_LID:x}\n"
    assert re.fullmatch(r"0x[0-9a-f]{8}\n", (port / "cap_mask").read_text())
    assert (port / "rate").read_text() == "2.5 Gb/sec (1X SDR)\n"
    assert (port / "phys_state").read_text() == "7: Phy Test\n"
    assert (ddir / "node_desc").read_text() == "h" * 64 + "\n"
    assert (ddir / "sys_image_guid").read_text() == (ddir / "node_guid").read_text()
    assert (port / "link_layer").read_text() == "InfiniBand\n"
    tree = os.fspath(tree_root / "class")
    assert written and not any(p.startswith(tree) for p in written)
    assert not any(p.name.startswith(".") or "tmp" in p.name
                   for p in (tree_root / "class").rglob("*"))
