"""Forwarding tables read from ibsim after opensm programmed them, by both fabric sources, and
the routes they give checked against ``ibtracert`` (infiniband-diags), which walks the tables
over the fabric itself and owes nothing to ibmon's model.

The ``mad`` source runs in a child (umad2sim must be preloaded); ``diags`` runs here with a
runner whose children get the simulator's environment.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import pytest

from ibmon.infiniband.model import PortKey, PortView, SourceError, Topology
from ibmon.jobs.routes import RouteIndex
from ibmon.runtime.pipeline import Pipeline
from ibmon.runtime.selfmetrics import SelfMetrics
from ibmon.sources.diags import CommandResult, DiagsSource, DiagsSourceConfig, SubprocessRunner
from mocks.ibsim import IbSim
from mocks.topology import fat_tree, to_ibsim_netfile
from tests.ibsim_fixtures import require_ibsim, run_child
from tests.syspkg import require_binary

pytestmark = pytest.mark.system

FAB = fat_tree(levels=2, leaves=4, hosts_per_leaf=2, radix=8)
SWITCHES = {g for g, n in FAB.nodes.items() if n.kind == "switch"}
LEAVES = {g for g, n in FAB.nodes.items() if n.desc.startswith("leaf")}
SPINES = SWITCHES - LEAVES

_MAD_CHILD = r"""
import asyncio, json, sys, time
from ibmon.sources.mad import MadSource

async def main():
    out = {"forwarding": {}, "times": {"with": [], "without": []}, "errors": []}
    for tables in (False, True):
        src = MadSource(forwarding_tables=tables)
        try:
            await src.discover()  # the MAD port opens: not part of the timing
            t = time.perf_counter()
            topo = await src.discover()
            out["times"]["with" if tables else "without"].append(time.perf_counter() - t)
            if tables:
                out["forwarding"] = {g: t.hex() for g, t in topo.forwarding.items()}
                out["mads"] = src.last_sweep_mads
            else:
                out["mads_without"] = src.last_sweep_mads
                assert not topo.forwarding
        finally:
            await src.close()
    return out

print(json.dumps(asyncio.run(main())))
"""

#: ibtracert's lines: "From ca {guid} ...", then per hop "[egress] -> switch port {guid}[in]".
_FROM = re.compile(r"^From (\S+) \{(0x[0-9a-f]+)\}")
_HOP = re.compile(r"^\[(\d+)\] -> (\S+) port \{(0x[0-9a-f]+)\}\[(\d+)\]")


@pytest.fixture(scope="module")
def sim() -> Iterator[IbSim]:
    require_ibsim()
    require_binary("ibroute")
    require_binary("ibtracert")
    with IbSim(to_ibsim_netfile(FAB)) as s:
        yield s


@pytest.fixture(autouse=True)
def _free_client_slots(sim: IbSim) -> Iterator[None]:
    sim.reap_clients()
    yield
    sim.reap_clients()


@pytest.fixture(scope="module")
def mad(sim: IbSim) -> dict[str, Any]:
    out: dict[str, Any] = run_child(sim, _MAD_CHILD, timeout=300)
    return out


class _Breaking:
    """A runner that hands one switch's ibroute output back cut short, as a SubnGet that
    failed mid-table leaves it (exit status 0, no 'lids dumped' line); or, with ``moved_to``,
    as the table of the switch of that GUID, which holds the LID now (LIDs moved since the
    discovery)."""

    def __init__(self, inner: SubprocessRunner, lid: int | None, moved_to: str | None = None
                 ) -> None:
        self.inner, self.lid, self.moved_to = inner, lid, moved_to
        self.broken = 0

    async def run(self, argv: list[str], timeout: float, max_output: int) -> CommandResult:
        res = await self.inner.run(argv, timeout, max_output)
        if argv[0] == "ibroute" and argv[-1] == str(self.lid) and res.stdout:
            self.broken += 1
            if self.moved_to is not None:
                return replace(res, stdout=re.sub(r"guid 0x[0-9a-f]+", f"guid {self.moved_to}",
                                                  res.stdout, count=1))
            return replace(res, stdout=res.stdout.rsplit("0x0005", 1)[0])
        return res


async def _diags(sim: IbSim, *, tables: bool = True, break_lid: int | None = None,
                 moved_to: str | None = None) -> tuple[Topology, list[SourceError], float]:
    inner = SubprocessRunner(concurrency=8, env=sim.tool_env(), cwd=sim.workdir)
    runner: Any = inner if break_lid is None else _Breaking(inner, break_lid, moved_to)
    src = DiagsSource(runner=runner, forwarding_tables=tables, interval=30.0)
    try:
        t = time.perf_counter()
        topo = await src.discover()
        took = time.perf_counter() - t
        snap = await src.sample()
    finally:
        await src.close()
        await inner.aclose()
    return topo, snap.errors, took


def _views(topo: Topology) -> dict[PortKey, PortView]:
    return {k: PortView(identity=ident, link=topo.links.get(k)) for k, ident in topo.ports.items()}


def _tool(sim: IbSim, *argv: str) -> str:
    out = subprocess.run(list(argv), env=sim.tool_env(), cwd=sim.workdir, capture_output=True,
                         text=True, timeout=60, check=True)
    return out.stdout


def _egresses(sim: IbSim, slid: int, dlid: int) -> set[PortKey]:
    """The switch egress ports ``ibtracert slid dlid`` says the packets leave by."""
    out: set[PortKey] = set()
    node, kind = "", ""
    lines = _tool(sim, "ibtracert", str(slid), str(dlid)).splitlines()
    for line in lines:
        if m := _FROM.match(line):
            kind, node = m.group(1), f"0x{int(m.group(2), 16):016x}"
        elif m := _HOP.match(line):
            if kind == "switch":
                out.add((node, m.group(1)))
            kind, node = m.group(2), f"0x{int(m.group(3), 16):016x}"
    assert out or slid == dlid, lines
    return out


async def test_mad_and_ibroute_read_the_same_tables(sim: IbSim, mad: dict[str, Any]) -> None:
    topo, errors, _took = await _diags(sim)
    via_mad = {g: bytes.fromhex(t) for g, t in mad["forwarding"].items()}
    assert set(via_mad) == set(topo.forwarding) == SWITCHES
    assert via_mad == dict(topo.forwarding)
    assert not [e for e in errors if "ibroute" in e.detail or "Forwarding" in e.detail]
    # what opensm programmed: every host's LID leaves its leaf by the host's port, and a
    # switch's own LID is port 0
    for host in FAB.hosts():
        leaf, port = FAB.peer(host.guid, 1)  # type: ignore[misc]
        assert via_mad[leaf][host.lid] == port
    for g in SWITCHES:
        assert via_mad[g][FAB.nodes[g].lid] == 0
    # one SwitchInfo and one block (LIDs 0..63) a switch, nothing else
    assert all(len(t) <= 64 for t in via_mad.values())
    assert mad["mads"] - mad["mads_without"] == 2 * len(SWITCHES)


async def test_a_switch_whose_table_is_junk_is_left_out(sim: IbSim) -> None:
    leaf = next(g for g in sorted(LEAVES))
    topo, errors, _took = await _diags(sim, break_lid=FAB.nodes[leaf].lid)
    assert set(topo.forwarding) == SWITCHES - {leaf}
    assert [e.reason for e in errors if "ibroute" in e.detail] == ["parse_error"]
    assert topo.ports  # the discovery itself stands


async def test_a_table_that_another_switch_answers_is_left_out(sim: IbSim) -> None:
    """The LID a discovery found a switch at answers for another switch now: its table is
    not booked on the switch the discovery named."""
    leaf, other = sorted(LEAVES)[:2]
    topo, errors, _took = await _diags(sim, break_lid=FAB.nodes[leaf].lid, moved_to=other)
    assert set(topo.forwarding) == SWITCHES - {leaf}
    found = [e.detail for e in errors if "ibroute" in e.detail]
    assert len(found) == 1 and f"printed the table of {other}" in found[0], found


async def test_a_table_a_discovery_lost_is_kept_and_routing_stays_on_tables(sim: IbSim) -> None:
    # Through the pipeline, as the daemon polls: the first discovery reads every table, the
    # next loses one leaf's; the routes still come from the tables, that leaf's the one before.
    leaf = sorted(LEAVES)[0]
    inner = SubprocessRunner(concurrency=8, env=sim.tool_env(), cwd=sim.workdir)
    runner = _Breaking(inner, None)
    cfg = DiagsSourceConfig(forwarding_tables=True, topology_interval=0.001, interval=30.0)
    src = DiagsSource(runner=runner, forwarding_tables=True, interval=30.0)
    pipeline = Pipeline(cfg, metrics=SelfMetrics())
    try:
        await pipeline.poll(src)
        first = dict(pipeline.forwarding)
        assert set(first) == SWITCHES
        runner.lid = FAB.nodes[leaf].lid
        await pipeline.poll(src)  # the topology interval has passed: a new discovery
    finally:
        await src.close()
        await inner.aclose()
    assert runner.broken == 1
    assert pipeline.error is None
    assert dict(pipeline.forwarding) == first
    index = RouteIndex.build(pipeline.forwarding, pipeline.views)
    assert index.usable()
    assert index.leaves() == LEAVES


async def test_routes_from_the_tables_match_ibtracert(sim: IbSim, mad: dict[str, Any]) -> None:
    topo, _errors, _took = await _diags(sim)
    index = RouteIndex.build(topo.forwarding, _views(topo))
    assert index.usable()
    assert index.leaves() == LEAVES
    for host in FAB.hosts():
        assert index.leaf_of(host.guid) == FAB.peer(host.guid, 1)[0]  # type: ignore[index]
    # a spine's port down to leaf L carries (S, L) for other leaves S, never (L, L)
    carried = 0
    for spine in SPINES:
        for p in range(1, FAB.nodes[spine].nports + 1):
            far = FAB.peer(spine, p)
            assert far is not None and far[0] in LEAVES
            down = index.leaf_pairs((spine, str(p)))
            assert all(d == far[0] and s != far[0] for s, d in down), down
            carried += len(down)
    assert carried > 0
    # ibtracert: for leaf pair (S, D), the ports traffic from the hosts on S to the other hosts
    # on D leaves by are exactly the ports whose leaf pairs hold (S, D)
    hosts_on: dict[str, list[int]] = {}
    for host in FAB.hosts():
        hosts_on.setdefault(FAB.peer(host.guid, 1)[0], []).append(host.lid)  # type: ignore[index]
    pairs = [(s, d) for s in sorted(LEAVES) for d in sorted(LEAVES)]
    with ThreadPoolExecutor(4) as pool:
        traced = list(pool.map(
            lambda sd: set().union(*(_egresses(sim, slid, dlid) for slid in hosts_on[sd[0]]
                                     for dlid in hosts_on[sd[1]] if slid != dlid)), pairs))
    switch_ports = [k for k, ident in topo.ports.items() if ident.node_type == "switch"]
    for (s, d), want in zip(pairs, traced, strict=True):
        got = {k for k in switch_ports if (s, d) in index.leaf_pairs(k)}
        assert got == want, (FAB.nodes[s].desc, FAB.nodes[d].desc)
