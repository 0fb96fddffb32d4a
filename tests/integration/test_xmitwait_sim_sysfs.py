"""A congested HCA seen through the simulated sysfs tree: the stall fraction ibmon reports is the
one the simulator was told, because the tree says what the device is.

The real path: ``FabricModel`` counts PortXmitWait in each HCA's family unit, ``SysfsRenderer``
writes ``hca_type`` as mlx5 does (``MT`` + the PCI device ID in decimal), ibmon's ``sysfs``
source maps it back to the family's unit and the ``Tracker`` turns counts into a fraction. Three
HCAs: a ConnectX-6 at 4X HDR and a ConnectX-7 at 4X NDR (both 8 bytes a count, by family) and a
ConnectX-5 (``MT4119``, no documented unit: the default, 8 bytes, said so). The snapshots are
stamped with simulated time, so the rates do not depend on how fast the files are read. The
stalls stay within what the kernel's 32-bit ``port_xmit_wait`` holds over the test's two
seconds (30 % at 4X NDR is 1.9e9 counts a second; 80 % would pin it within the first).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ibmon.infiniband.model import Snapshot
from ibmon.infiniband.xmitwait import WaitUnit, counts_for
from ibmon.sources.sysfs import SysfsSource
from ibmon.track.tracker import Tracker
from mocks.sysfs import SysfsRenderer
from mocks.topology import Fabric, Link, Node
from mocks.traffic import FabricModel

pytestmark = pytest.mark.node_sized  # a node's HCAs: the per-port path a node daemon runs

LEAF = "0x0002c90100000010"
#: (HCA GUID, device ID, hca_type, link speed, the unit ibmon must decide, stall fraction)
HCAS = [
    ("0x0002c90a00000010", 0x101B, "MT4123", "HDR",
     WaitUnit(8, False, "family", "ConnectX-6"), 0.35),
    ("0x0002c90a00000020", 0x1021, "MT4129", "NDR",
     WaitUnit(8, False, "family", "ConnectX-7"), 0.3),
    ("0x0002c90a00000030", 0x1017, "MT4119", "EDR",
     WaitUnit(8, False, "default"), 0.2),
]
LANE_GBPS = {"EDR": 25.0, "HDR": 50.0, "NDR": 100.0}


@pytest.fixture
def tree_root(tmp_path: Path) -> Iterator[Path]:
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        with tempfile.TemporaryDirectory(dir=shm, prefix="ibmon-xw-") as d:
            yield Path(d)
    else:
        yield tmp_path


def fabric() -> Fabric:
    leaf = Node(guid=LEAF, kind="switch", desc="leaf01", nports=4, lid=1, device_id=0xD2F0)
    nodes = {leaf.guid: leaf}
    links = []
    for n, (guid, dev, _, speed, _, _) in enumerate(HCAS, start=1):
        nodes[guid] = Node(guid=guid, kind="ca", desc=f"host{n:03d} mlx5_0", nports=1,
                           lid=n + 1, device_id=dev)
        links.append(Link(a=(LEAF, n), b=(guid, 1), width="4X", speed=speed))
    return Fabric(nodes=nodes, links=links)


async def test_each_hca_reports_the_stall_fraction_it_was_given(tree_root: Path) -> None:
    model = FabricModel(fabric(), seed=3, load=0.0)
    for guid, *_, fraction in HCAS:
        model.congest((guid, 1), wait_ratio=fraction, utilization=0.0)
    renderer = SysfsRenderer(model, tree_root)
    source = SysfsSource(root=tree_root)
    tracker = Tracker()
    views = {}
    prev: dict[str, int] = {}
    try:
        for t in (0.0, 1.0, 2.0):
            model.advance_to(t)
            renderer.render()
            real = await source.sample()
            assert real.errors == []
            snap = Snapshot(real.source, t, 1.7e9 + t, real.ports, real.errors)
            views = tracker.update(snap)
            for guid, dev, hca_type, speed, unit, fraction in HCAS:
                v = views[(guid, "1")]
                assert v.identity.hca_type == hca_type
                assert v.identity.xmit_wait == unit
                counts = v.totals["transmit_wait"]
                if t > 0:
                    rate_bytes = 4 * LANE_GBPS[speed] * 1e9 / 8
                    want = counts_for(fraction, 8.0, rate_bytes, 1.0)
                    assert abs(counts - prev[guid] - want) <= 1.0, (dev, t)
                    assert v.xmit_wait_ratio == pytest.approx(fraction, abs=1e-6), (dev, t)
                prev[guid] = counts
    finally:
        await source.close()
    assert (tree_root / "class/infiniband/mlx5_0/hca_type").read_text() == "MT4123\n"
