"""The ``mad`` source's directed-route sweep on ibsim: every node and link found (a three-level
fat tree with parallel cables; a dual-port HCA cabled to two switches), no errors, and each MAD
asked once: the far end of each cable once (not again from its other end, nor back through the
port a node was entered by), each node's description once and each port's PortInfo once. A
sweep that asks more costs every discovery round trips on a large fabric; one that asks fewer
misses nodes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from mocks.ibsim import IbSim
from mocks.topology import Fabric, Link, Node, fat_tree, to_ibsim_netfile
from tests.ibsim_fixtures import run_child, sim_for

pytestmark = pytest.mark.system

#: Three levels (paths of up to six hops from a host to a host in another pod), parallel
#: uplinks between a leaf and a spine, several hosts a leaf.
TREE: Fabric = fat_tree(levels=3, radix=4, leaves=4, hosts_per_leaf=2)


def _two_rails() -> Fabric:
    """Two switches joined by two cables, a host on each, and a dual-port HCA with a port on
    each switch: the sweep reaches that HCA twice, by different ports, and must describe both."""
    sw = [Node(f"0x0002c90200000{i}00", "switch", f"rail{i}", 4, i) for i in (1, 2)]
    ca = [Node(f"0x0002c90a00000{i}00", "ca", f"host{i}", n, 2 + i)
          for i, n in ((1, 1), (2, 1), (3, 2))]
    links = [Link((sw[0].guid, 3), (sw[1].guid, 3), "4X", "EDR"),
             Link((sw[0].guid, 4), (sw[1].guid, 4), "4X", "EDR"),
             Link((ca[0].guid, 1), (sw[0].guid, 1), "4X", "EDR"),
             Link((ca[1].guid, 1), (sw[1].guid, 1), "4X", "EDR"),
             Link((ca[2].guid, 1), (sw[0].guid, 2), "4X", "EDR"),
             Link((ca[2].guid, 2), (sw[1].guid, 2), "4X", "EDR")]
    return Fabric({n.guid: n for n in sw + ca}, links)

_CHILD = r"""
import asyncio, json
from ibmon.sources.mad import MadSource

async def main():
    src = MadSource()
    try:
        await src.discover()  # opens the port
        sweep = await asyncio.get_running_loop().run_in_executor(None, src.sweep_sync)
    finally:
        await src.close()
    print(json.dumps({"mads": sweep.mads, "errors": [e.detail for e in sweep.errors],
                      "nodes": sorted(sweep.nodes),
                      "links": sorted(f"{a[0]}/{a[1]}-{b[0]}/{b[1]}"
                                      for a, b in sweep.links.items())}))

asyncio.run(main())
"""


@pytest.fixture(scope="module", params=["tree", "two_rails"])
def fab_sim(request: pytest.FixtureRequest) -> Iterator[tuple[Fabric, IbSim]]:
    fab = TREE if request.param == "tree" else _two_rails()
    for sim in sim_for(to_ibsim_netfile(fab)):
        yield fab, sim


def test_a_sweep_finds_the_whole_fabric_asking_each_thing_once(
    fab_sim: tuple[Fabric, IbSim],
) -> None:
    FAB, sim = fab_sim  # noqa: N806 - the fabric, as in the other ibsim tests
    got: dict[str, Any] = run_child(sim, _CHILD)
    assert got["errors"] == []
    assert got["nodes"] == sorted(FAB.nodes)
    ends = [(lk.a, lk.b) for lk in FAB.links] + [(lk.b, lk.a) for lk in FAB.links]
    assert got["links"] == sorted(f"{a[0]}/{a[1]}-{b[0]}/{b[1]}" for a, b in ends)
    switches = [n for n in FAB.nodes.values() if n.kind == "switch"]
    ca_ports = [k for k in FAB.ports() if FAB.nodes[k[0]].kind == "ca"]
    assert got["mads"] == (
        1  # the local NodeInfo
        + len(FAB.links)  # NodeInfo of each cable's far end, once
        + len(FAB.nodes)  # NodeDescription
        + sum(n.nports + 1 for n in switches)  # PortInfo of every switch port, port 0 too
        + len(ca_ports)  # PortInfo of each CA port a cable enters
    )
