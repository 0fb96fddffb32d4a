"""mad and diags sources against real ibsim + opensm + infiniband-diags on a >= 500-port fat tree.

ibsim advances PortXmitData/PortRcvData/PortXmitPkts/PortRcvPkts itself by 72 words and one
packet for every MAD crossing a port (sim_mad.c pc_updated), including the sources' own queries;
those four are compared within that bound, every other counter exactly.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from ibmon.track.tracker import Tracker
from mocks.ibsim import IbSim
from mocks.ibsim_driver import ibsim_node_id
from mocks.topology import Fabric, fabric_for_ports, to_ibsim_netfile
from tests.ibsim_fixtures import require_ibsim, run_diags, run_mad, snapshot_json

pytestmark = pytest.mark.system

TRAFFIC = ("transmit_data", "receive_data", "transmit_packets", "receive_packets")
FAB: Fabric = fabric_for_ports(520)


@pytest.fixture(scope="module")
def sim() -> Iterator[IbSim]:
    require_ibsim()
    with IbSim(to_ibsim_netfile(FAB)) as s:
        yield s


@pytest.fixture(autouse=True)
def _free_client_slots(sim: IbSim) -> Iterator[None]:
    sim.reap_clients()
    yield
    sim.reap_clients()


def _node_id(guid: str) -> str:
    return ibsim_node_id(FAB, guid)


def _strip(ports: dict[str, Any]) -> dict[str, Any]:
    return {k: {**v, "source": ""} for k, v in ports.items()}


def _split(counters: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    return (
        {k: v for k, v in counters.items() if k not in TRAFFIC and k != "qp1_dropped"},
        {k: v for k, v in counters.items() if k in TRAFFIC},
    )


async def test_mad_and_diags_identical_topology_and_counters(sim: IbSim) -> None:
    rng = random.Random(4)
    narrow_bits = {
        "SymbolErrorCounter": 16,
        "LinkErrorRecoveryCounter": 8,
        "LinkDownedCounter": 8,
        "PortRcvErrors": 16,
        "PortXmitDiscards": 16,
        "PortRcvRemotePhysicalErrors": 16,
        "PortRcvSwitchRelayErrors": 16,
        "PortXmitConstraintErrors": 8,
        "PortRcvConstraintErrors": 8,
        "LocalLinkIntegrityErrors": 4,
        "ExcessiveBufferOverrunErrors": 4,
        "VL15Dropped": 16,
        "PortXmitWait": 32,
    }
    wide = [
        "PortCountersExtended.PortXmitData",
        "PortCountersExtended.PortRcvData",
        "PortCountersExtended.PortXmitPkts",
        "PortCountersExtended.PortRcvPkts",
        "PortUnicastXmitPkts",
        "PortUnicastRcvPkts",
        "PortMulticastXmitPkts",
    ]
    expected: dict[str, dict[str, int]] = {}
    for guid, port in FAB.ports():
        vals = {f: rng.randrange(1 << b) for f, b in narrow_bits.items()}
        vals.update({f: rng.randrange(1 << 40, (1 << 64) - (1 << 30)) for f in wide})
        sim.set_counters(_node_id(guid), port, vals)
        expected[f"{guid}/{port}"] = vals

    m = run_mad(sim, ["discover", "sample"])
    # What is compared here is what both read, not how fast: a generous process timeout, so a
    # moment the machine starves ibsim (a CI run: one perfquery of a 36-port switch took longer
    # than the default quarter of the poll timeout) is not a killed tool and 30 missing ports.
    d = await run_diags(sim, ["discover", "sample"], command_timeout=30)
    mt, dt = m["topologies"][0], d["topologies"][0]
    assert len(mt["ports"]) >= 500
    assert _strip(mt["ports"]) == _strip(dt["ports"])
    assert mt["links"] == dt["links"]
    assert len(mt["links"]) == 2 * len(FAB.links)
    assert all(lk["max_width"] == "4X" and lk["max_speed"] == "EDR" for lk in mt["links"].values())

    ms, ds = m["snapshots"][0], d["snapshots"][0]
    assert ms["errors"] == [] and ds["errors"] == []
    assert set(ms["ports"]) == set(ds["ports"]) == set(mt["ports"])
    for key, mp in ms["ports"].items():
        dp = ds["ports"][key]
        m_exact, m_traffic = _split(mp["counters"])
        d_exact, d_traffic = _split(dp["counters"])
        assert m_exact == d_exact, key
        assert mp["wide"] == dp["wide"] and mp["state"] == dp["state"]
        assert mp["link"] == dp["link"] and mp["rate_bps"] == dp["rate_bps"]
        for name in TRAFFIC:
            assert abs(m_traffic[name] - d_traffic[name]) < 72 * 4000, (key, name)
        assert "qp1_dropped" not in dp["counters"]  # perfquery's copy is VL15Dropped (libibmad)
        want = expected.get(key)
        if want is None:
            continue  # unconnected switch port: nothing was set
        assert mp["counters"]["symbol_errors"] == want["SymbolErrorCounter"]
        assert mp["counters"]["link_downed"] == want["LinkDownedCounter"]
        assert mp["counters"]["local_link_integrity_errors"] == want["LocalLinkIntegrityErrors"]
        assert mp["counters"]["transmit_wait"] == want["PortXmitWait"]
        assert mp["counters"]["vl15_dropped"] == want["VL15Dropped"]
        assert mp["counters"]["unicast_transmit_packets"] == want["PortUnicastXmitPkts"]
        assert mp["counters"]["unicast_receive_packets"] == want["PortUnicastRcvPkts"]
        assert mp["counters"]["multicast_transmit_packets"] == want["PortMulticastXmitPkts"]
        for name, fld, per in (
            ("transmit_data", "PortXmitData", 72),
            ("receive_data", "PortRcvData", 72),
            ("transmit_packets", "PortXmitPkts", 1),
            ("receive_packets", "PortRcvPkts", 1),
        ):
            set_to = want[f"PortCountersExtended.{fld}"]
            assert set_to <= mp["counters"][name] <= set_to + per * 4000, (key, name)
        assert "transmit_data" in mp["wide"] and "symbol_errors" not in mp["wide"]


async def test_tracker_multiplies_data_by_four(sim: IbSim) -> None:
    from ibmon.sources.diags import DiagsSource, SubprocessRunner

    guid, port = FAB.ports()[0]
    sim.set_counters(
        _node_id(guid),
        port,
        {"PortCountersExtended.PortXmitData": 2**62, "PortCountersExtended.PortRcvData": 12345},
    )
    src = DiagsSource(runner=SubprocessRunner(env=sim.tool_env(), cwd=sim.workdir), include=[guid])
    try:
        await src.discover()
        snap = await src.sample()
    finally:
        await src.close()
    sample = snap.ports[(guid, str(port))]
    view = Tracker().update(snap)[(guid, str(port))]
    assert 2**62 <= sample.counters["transmit_data"] < 2**62 + 72 * 4000
    assert view.totals["transmit_data"] == 4 * sample.counters["transmit_data"]
    assert view.totals["receive_data"] == 4 * sample.counters["receive_data"]


async def test_unlink_relink_state_and_topology(sim: IbSim) -> None:
    host = next(n for n in FAB.nodes.values() if n.kind == "ca")
    leaf_guid, leaf_port = FAB.peer(host.guid, 1)  # type: ignore[misc]
    hkey, lkey = f"{host.guid}/1", f"{leaf_guid}/{leaf_port}"
    sim.unlink(_node_id(leaf_guid), leaf_port)
    try:
        m = run_mad(sim, ["discover", "sample"], timeout=0.3, retries=0)
        d = await run_diags(sim, ["discover", "sample"], timeout=0.3, retries=0, command_timeout=30)
        for out in (m, d):
            topo, snap = out["topologies"][0], out["snapshots"][0]
            assert hkey not in topo["ports"] and lkey not in topo["links"]
            assert topo["ports"][lkey]["node_desc"] == FAB.nodes[leaf_guid].desc
            assert snap["ports"][lkey]["state"] == 1  # Down
            assert snap["ports"][lkey]["link"] is None
    finally:
        sim.relink(_node_id(leaf_guid), leaf_port)
        sim.resweep()
    m = run_mad(sim, ["discover", "sample"])
    topo, snap = m["topologies"][0], m["snapshots"][0]
    assert topo["links"][lkey]["remote_guid"] == host.guid
    assert snap["ports"][hkey]["state"] == 4 and snap["ports"][lkey]["state"] == 4


async def test_error_command_counts_timeouts_and_polls_the_rest(sim: IbSim) -> None:
    host = [n for n in FAB.nodes.values() if n.kind == "ca"][3]
    hkey = [host.guid, "1"]
    from ibmon.sources.diags import DiagsSource, SubprocessRunner

    def inject() -> None:
        sim.error(_node_id(host.guid), 1, 100)  # drop every MAD arriving at the host port

    # A generous process timeout: ibsim keeps the client slot of a SIGKILLed tool forever
    # (umad2sim never detaches), and after 10 such slots no tool can attach at all.
    dsrc = DiagsSource(
        runner=SubprocessRunner(concurrency=6, env=sim.tool_env(), cwd=sim.workdir),
        timeout=0.2,
        retries=0,
        command_timeout=30,
    )
    try:
        total = len((await dsrc.discover()).ports)
        # the fault comes after the first poll: the poll right after a discovery takes the
        # counters the discovery read (the daemon samples at once), so it would not see it
        m = run_mad(
            sim, ["discover", "sample", "wait", "sample", "sample"], on_wait=inject, timeout=0.2,
            retries=1,
        )
        d = {"snapshots": [snapshot_json(await dsrc.sample())]}
    finally:
        sim.error(_node_id(host.guid), 1, 0)
        await dsrc.close()
    assert not m["snapshots"][0]["errors"] and len(m["snapshots"][0]["ports"]) == total
    for snap in m["snapshots"][1:]:
        assert [e for e in snap["errors"] if e[0] == "timeout" and e[2] == hkey]
        assert all(e[2] == hkey for e in snap["errors"] if e[2] is not None)
        assert f"{host.guid}/1" not in snap["ports"]
        assert len(snap["ports"]) == total - 1
    assert max(m["sample_s"]) < 3.0  # one dead port costs its own retries, not the sweep
    ds = d["snapshots"][0]
    bad = [e for e in ds["errors"] if e[2] == hkey]
    assert bad and bad[0][0] in ("timeout", "mad_timeout")
    assert len(ds["ports"]) == total - 1, sorted({(e[0], e[1][:80]) for e in ds["errors"]})[:5]
