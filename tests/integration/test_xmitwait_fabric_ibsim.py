"""Both fabric sources decide each port's PortXmitWait unit at discovery, on real ibsim + opensm.

ibsim's NodeInfo reports the device ID its net file gives a node (a ``devid=`` line before the
record, kept for the following records until the next one), and ibsim has no PortSamplesControl
handler: it answers the Get with status 110 at once. So a node of a documented family gets its
family's unit ("family"), and any other node asks its Tick in vain and keeps the default unit
("default"), without an error and without slowing the discovery down: the second test measures
a 520-port fat tree whose every node asks its Tick against the same tree whose nodes are all of
documented families (no Tick read at all).
"""

from __future__ import annotations

import asyncio
import re
import statistics
import time
from collections.abc import Iterator
from typing import Any

import pytest

from ibmon.sources.diags import CommandResult, DiagsSource, SubprocessRunner
from mocks.ibsim import IbSim
from mocks.topology import Fabric, fabric_for_ports, to_ibsim_netfile
from tests.ibsim_fixtures import require_ibsim, run_diags, run_mad

pytestmark = pytest.mark.system

#: A Quantum switch (the SM's node), a Switch-IB 2 switch, a ConnectX-6, a ConnectX-5 (no
#: documented unit) and an HCA with no device ID. Every devid line is explicit: ibsim keeps
#: the last one for the records that follow. The SM's node is never asked its Tick whatever
#: its device (the next-but-one test).
NET = """\
devid=0xd2f0
Switch 8 "S1"
[1] "H1"[1]
[2] "H2"[1]
[3] "S2"[3]

devid=0xcf08
Switch 8 "S2"
[1] "H3"[1]
[3] "S1"[3]

devid=0x101b
Hca 1 "H1"
[1] "S1"[1]

devid=0x1017
Hca 1 "H2"
[1] "S1"[2]

devid=0x0
Hca 1 "H3"
[1] "S2"[1]
"""
QUANTUM = {"bytes": 8, "per_lane": False, "source": "family", "family": "Quantum"}
SWITCH_IB_2 = {"bytes": 32, "per_lane": True, "source": "family", "family": "Switch-IB 2"}
CONNECTX_6 = {"bytes": 8, "per_lane": False, "source": "family", "family": "ConnectX-6"}
DEFAULT = {"bytes": 8, "per_lane": False, "source": "default", "family": ""}
WANT = {"S1": QUANTUM, "S2": SWITCH_IB_2, "H1": CONNECTX_6, "H2": DEFAULT, "H3": DEFAULT}


@pytest.fixture(scope="module")
def sim() -> Iterator[IbSim]:
    require_ibsim()
    with IbSim(NET) as s:
        yield s


@pytest.fixture(autouse=True)
def _free_client_slots(sim: IbSim) -> Iterator[None]:
    sim.reap_clients()
    yield
    sim.reap_clients()


def units(topo: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {key: port["xmit_wait"] for key, port in topo["ports"].items()}


async def test_family_from_the_device_id_else_the_default_in_both_sources(sim: IbSim) -> None:
    m = run_mad(sim, ["discover", "sample"])
    d = await run_diags(sim, ["discover", "sample"])
    mad_units, diags_units = units(m["topologies"][0]), units(d["topologies"][0])
    assert mad_units == diags_units  # one rule, one answer
    descs = {k: p["node_desc"] for k, p in m["topologies"][0]["ports"].items()}
    assert len(descs) == 8 + 8 + 3
    for key, unit in mad_units.items():
        assert unit == WANT[descs[key]], (key, descs[key], unit)
    # a PMA without PortSamplesControl costs neither source an error, nor any port a sample
    assert m["snapshots"][0]["errors"] == [] and d["snapshots"][0]["errors"] == []
    assert len(m["snapshots"][0]["ports"]) == len(d["snapshots"][0]["ports"]) == 19
    for snap in (m["snapshots"][0], d["snapshots"][0]):
        for key, port in snap["ports"].items():
            assert port["identity"]["xmit_wait"] == WANT[descs[key]]


async def test_a_shard_decides_the_units_of_its_own_ports(sim: IbSim) -> None:
    """With a shard the Ticks go out in a batch of their own, after the view: read to its end,
    so the worker is kept for the poll."""
    both = [run_mad(sim, ["discover", "sample", "sample"], shard=f"{k}/2") for k in (0, 1)]
    seen: dict[str, dict[str, Any]] = {}
    for m in both:
        descs = {k: p["node_desc"] for k, p in m["topologies"][0]["ports"].items()}
        for key, unit in units(m["topologies"][0]).items():
            assert unit == WANT[descs[key]], (key, unit)
            seen[key] = unit
        assert all(s["errors"] == [] for s in m["snapshots"])
        assert len(m["snapshots"][1]["ports"]) == len(descs)
    assert len(seen) == 19


#: ibsim's own example shape: no device ID anywhere, so every node asks its Tick, the SM's
#: node (S1, where opensm and every tool attach) included.
PLAIN_NET = "\n".join(line for line in NET.splitlines() if not line.startswith("devid="))


def test_the_subnet_managers_node_is_never_asked_its_tick() -> None:
    """ibsim hands a PortSamplesControl Get at the port opensm is attached to over to opensm,
    which exits on it (then no resweep, no relinked port ever comes up again): neither source
    asks at the master SM's LID, and opensm lives through their discoveries."""
    require_ibsim()
    with IbSim(PLAIN_NET) as plain:
        m = run_mad(plain, ["discover", "discover", "sample"])
        d = asyncio.run(run_diags(plain, ["discover", "discover", "sample"]))
        assert {u["source"] for u in units(m["topologies"][1]).values()} == {"default"}
        assert units(m["topologies"][1]) == units(d["topologies"][1])
        assert m["snapshots"][0]["errors"] == [] and d["snapshots"][0]["errors"] == []
        plain.resweep(timeout=30)  # raises when opensm has exited


# ------------------------------------------------------------------ the cost of asking

FAB: Fabric = fabric_for_ports(520)
DISCOVERIES = 3
#: Device IDs of no documented family: a ConnectX-5 HCA and a switch ID outside the table.
CX5, ODD_SWITCH = 0x1017, 0xBD34


def _unknown(netfile: str) -> str:
    """The same fabric with HCAs and switches of no documented family: every port asks its
    Tick in ``mad``, and ``diags`` asks two nodes of each of the two models."""
    hcas = {f"0x{i:x}" for i in (0x101B,)}
    return re.sub(r"(?m)^devid=(0x[0-9a-fA-F]+)$",
                  lambda m: f"devid=0x{CX5 if m.group(1) in hcas else ODD_SWITCH:x}", netfile)


class CountingRunner(SubprocessRunner):
    """The real runner, counting the ``perfquery -c`` processes it ran."""

    ticks = 0

    async def run(self, argv: list[str], timeout: float, max_output: int = 1 << 22
                  ) -> CommandResult:
        if "-c" in argv:
            self.ticks += 1
        return await super().run(argv, timeout, max_output)


async def _diags_discoveries(sim: IbSim, n: int) -> tuple[list[float], dict[str, Any]]:
    runner = CountingRunner(concurrency=8, env=sim.tool_env(), cwd=sim.workdir)
    src = DiagsSource(runner=runner)
    times: list[float] = []
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            topo = await src.discover()
            times.append(time.perf_counter() - t0)
        sources = {p.xmit_wait.source for p in topo.ports.values()}
        return times, {"sources": sources, "processes": runner.ticks // n,
                       "errors": len(src._discover_errors)}
    finally:
        await src.close()


def _measure(netfile: str) -> dict[str, Any]:
    with IbSim(netfile) as sim:
        m = run_mad(sim, ["discover"] * DISCOVERIES)
        diags_times, diags = asyncio.run(_diags_discoveries(sim, DISCOVERIES))
    ports = m["topologies"][-1]["ports"]
    return {
        "ports": len(ports),
        "mad_s": statistics.median(m["discover_s"]),
        "mad_mads": m["discover_mads"][-1],
        "mad_sources": {p["xmit_wait"]["source"] for p in ports.values()},
        "diags_s": statistics.median(diags_times),
        **{f"diags_{k}": v for k, v in diags.items()},
    }


def test_a_fabric_that_asks_its_ticks_in_vain_pays_round_trips_not_timeouts() -> None:
    require_ibsim()
    netfile = to_ibsim_netfile(FAB)
    assert "devid=0xd2f0" in netfile and "devid=0x101b" in netfile  # documented families
    known = _measure(netfile)
    unknown = _measure(_unknown(netfile))
    print(f"\n{known['ports']}-port fat tree, median of {DISCOVERIES} discoveries: "
          f"mad {known['mad_s']:.3f}s ({known['mad_mads']} MADs) with no Tick read, "
          f"{unknown['mad_s']:.3f}s ({unknown['mad_mads']} MADs) with every port's; "
          f"diags {known['diags_s']:.3f}s with none, {unknown['diags_s']:.3f}s with "
          f"{unknown['diags_processes']} perfquery -c")
    assert known["mad_sources"] == known["diags_sources"] == {"family"}
    assert unknown["mad_sources"] == unknown["diags_sources"] == {"default"}
    assert unknown["diags_errors"] == known["diags_errors"] == 0
    # mad: one Get per port but the SM's switch's (the first record of the net file), answered
    # at once with status 110 and retried twice: round trips, not timeouts (1 s each, 3 times)
    sm_switch = sorted(FAB.nodes.values(), key=lambda n: n.kind != "switch")[0]
    assert unknown["mad_mads"] - known["mad_mads"] == known["ports"] - sm_switch.nports
    # diags: two nodes of each model, not one process per node (156 nodes)
    assert known["diags_processes"] == 0 and unknown["diags_processes"] == 4
    # (the times are printed, not asserted: a loaded machine's, not the design's)
