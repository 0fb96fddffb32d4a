"""Error and discard details (PortRcvErrorDetails, PortXmitDiscardDetails) from ibsim, through
both fabric sources: the same values from ``mad`` (libibmad MADs) and ``diags`` (perfquery -E /
-D), read only for ports whose PortRcvErrors / PortXmitDiscards moved (counted in MADs and in
perfquery processes), and an attribute that goes unanswered given up until the next discovery.

ibsim answers both attributes on every port and has no way to refuse one with an error status;
that case is in ``tests/unit/test_detail_reads.py``. Its ``Error "node"[port] 100 <attr>``
drops every MAD of one attribute at a port, which is how a PMA that ignores the attribute
looks.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ibmon.infiniband.counters import DETAIL_ATTRIBUTES, DETAILS
from ibmon.sources.diags import CommandResult, DiagsSource, SubprocessRunner
from ibmon.sources.fabric import DETAIL_BASELINES_PER_POLL, DETAIL_MISSES_TO_GIVE_UP
from mocks.ibsim import IbSim
from mocks.ibsim_driver import ibsim_node_id
from mocks.topology import Fabric, fabric_for_ports, to_ibsim_netfile
from tests.ibsim_fixtures import require_ibsim, run_mad, snapshot_json

pytestmark = pytest.mark.system

FAB: Fabric = fabric_for_ports(60)
DETAIL_NAMES = [n for names in DETAILS.values() for n in names]
ALL = 10_000  # baselines per poll: every port at once, for exact comparisons


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


def node_id(guid: str) -> str:
    return ibsim_node_id(FAB, guid)


HOST = next(n for n in FAB.nodes.values() if n.kind == "ca").guid
SWITCH, SWITCH_PORT = FAB.peer(HOST, 1)  # type: ignore[misc]
OTHER_HOST = [n for n in FAB.nodes.values() if n.kind == "ca"][5].guid


class CountingRunner:
    """The real runner, with every argv kept: how many perfquery -E / -D processes ran."""

    def __init__(self, sim: IbSim) -> None:
        self.inner = SubprocessRunner(concurrency=8, env=sim.tool_env(), cwd=sim.workdir)
        self.calls: list[list[str]] = []

    async def run(self, argv: list[str], timeout: float, max_output: int = 1 << 22
                  ) -> CommandResult:
        self.calls.append(argv)
        return await self.inner.run(argv, timeout, max_output)

    def detail_reads(self) -> list[tuple[str, str, str]]:
        """(lid, port, -E|-D) of the detail processes since the last call."""
        out = [(c[-2], c[-1], c[c.index("-e") + 1]) for c in self.calls
               if "-E" in c or "-D" in c]
        self.calls.clear()
        return out


def counters(snap: dict[str, Any], guid: str, port: int) -> dict[str, int]:
    got: dict[str, int] = snap["ports"][f"{guid}/{port}"]["counters"]
    return got


def details_of(snap: dict[str, Any], guid: str, port: int) -> dict[str, int]:
    c = counters(snap, guid, port)
    return {n: c[n] for n in DETAIL_NAMES if n in c}


def script(*actions: Callable[[], None]) -> Callable[[], None]:
    """An ``on_wait`` that runs the next action at each wait of a mad child."""
    todo = iter(actions)

    def step() -> None:
        next(todo)()

    return step


async def test_mad_and_diags_read_the_same_details_exactly(sim: IbSim) -> None:
    rng = random.Random(11)
    expected: dict[str, dict[str, int]] = {}
    for guid, port in FAB.ports():
        vals = {spec.pma: rng.randrange(1 << 16) for specs in DETAIL_ATTRIBUTES.values()
                for spec in specs}
        sim.set_counters(node_id(guid), port, vals)
        expected[f"{guid}/{port}"] = {
            spec.name: vals[spec.pma] for specs in DETAIL_ATTRIBUTES.values() for spec in specs
        }
    try:
        m = run_mad(sim, ["discover", "sample"], detail_baselines_per_poll=ALL)
        runner = CountingRunner(sim)
        src = DiagsSource(runner=runner, detail_baselines_per_poll=ALL)
        try:
            await src.discover()
            d = snapshot_json(await src.sample())
        finally:
            await src.close()
            await runner.inner.aclose()
        ms = m["snapshots"][0]
        assert ms["errors"] == [] and d["errors"] == []
        assert set(ms["ports"]) == set(d["ports"]) and len(ms["ports"]) > 60
        for key, mp in ms["ports"].items():
            got = {n: mp["counters"][n] for n in DETAIL_NAMES}
            assert got == {n: d["ports"][key]["counters"][n] for n in DETAIL_NAMES}, key
            if key in expected:  # a connected port (the others read 0)
                assert got == expected[key], key
            assert not set(DETAIL_NAMES) & set(mp["wide"])  # 16-bit: they saturate
        # the baseline: two detail reads per port, then none
        assert m["detail_mads"] == [2 * len(ms["ports"])]
        assert len(runner.detail_reads()) == 2 * len(d["ports"])

        # with the default cap both sources baseline the same ports first
        m = run_mad(sim, ["discover", "sample"])
        src = DiagsSource(runner=CountingRunner(sim))
        try:
            await src.discover()
            d = snapshot_json(await src.sample())
        finally:
            await src.close()
        with_m = {k for k, p in m["snapshots"][0]["ports"].items()
                  if "receive_local_physical_errors" in p["counters"]}
        with_d = {k for k, p in d["ports"].items()
                  if "receive_local_physical_errors" in p["counters"]}
        assert with_m == with_d and len(with_m) == DETAIL_BASELINES_PER_POLL // 2
        assert m["detail_mads"] == [DETAIL_BASELINES_PER_POLL]
    finally:
        for guid, port in FAB.ports():
            sim.set_counters(node_id(guid), port, {
                spec.pma: 0 for specs in DETAIL_ATTRIBUTES.values() for spec in specs})


def _moves(sim: IbSim, step: int) -> None:
    """Step 1: errors on the host (a bad cable), discards on the switch port towards it (the
    host went away), and a detail value on another host whose aggregate stays put."""
    n = 5 * step
    sim.set_counters(node_id(HOST), 1, {"PortRcvErrors": n, "PortLocalPhysicalErrors": n})
    sim.set_counters(node_id(SWITCH), SWITCH_PORT,
                     {"PortXmitDiscards": 3 * step, "PortInactiveDiscards": 3 * step})
    sim.set_counters(node_id(OTHER_HOST), 1, {"PortLoopingErrors": 9 * step})


def _zero(sim: IbSim) -> None:
    sim.set_counters(node_id(HOST), 1, {"PortRcvErrors": 0, "PortLocalPhysicalErrors": 0})
    sim.set_counters(node_id(SWITCH), SWITCH_PORT,
                     {"PortXmitDiscards": 0, "PortInactiveDiscards": 0})
    sim.set_counters(node_id(OTHER_HOST), 1, {"PortLoopingErrors": 0})


async def test_details_are_read_only_when_the_aggregate_moved(sim: IbSim) -> None:
    try:
        m = run_mad(
            sim, ["discover", "sample", "sample", "wait", "sample", "sample", "wait", "sample"],
            on_wait=script(lambda: _moves(sim, 1), lambda: _moves(sim, 2)),
            detail_baselines_per_poll=ALL,
        )
        plain = run_mad(sim, ["discover", "sample", "sample"], details=False)
        _zero(sim)
        runner = CountingRunner(sim)
        src = DiagsSource(runner=runner, detail_baselines_per_poll=ALL, state_interval=3600)
        d: list[dict[str, Any]] = []
        reads: list[list[tuple[str, str, str]]] = []
        try:
            await src.discover()
            for action in (None, None, lambda: _moves(sim, 1), None, lambda: _moves(sim, 2)):
                if action is not None:
                    action()
                runner.calls.clear()
                d.append(snapshot_json(await src.sample()))
                reads.append(runner.detail_reads())
        finally:
            await src.close()
            await runner.inner.aclose()
    finally:
        _zero(sim)
    n_ports = len(m["snapshots"][0]["ports"])
    # MADs: the baseline, then a healthy poll costs what it costs without details
    assert m["detail_mads"] == [2 * n_ports, 0, 2, 0, 2]
    steady = plain["mads"][1]
    assert m["mads"][1] == m["mads"][3] == steady
    assert m["mads"][2] == m["mads"][4] == steady + 2
    # perfquery processes: the same rule
    lid_of = {k: p["identity"]["lid"] for k, p in d[0]["ports"].items()}
    moved = sorted([
        (str(lid_of[f"{HOST}/1"]), "1", "-E"),
        (str(lid_of[f"{SWITCH}/{SWITCH_PORT}"]), str(SWITCH_PORT), "-D"),
    ])
    assert [len(r) for r in reads] == [2 * n_ports, 0, 2, 0, 2]
    assert sorted(reads[2]) == sorted(reads[4]) == moved
    for snaps in (m["snapshots"], d):
        assert all(s["errors"] == [] for s in snaps)
        for i, step in ((2, 1), (3, 1), (4, 2)):
            host = details_of(snaps[i], HOST, 1)
            assert host["receive_local_physical_errors"] == 5 * step
            assert counters(snaps[i], HOST, 1)["receive_errors"] == 5 * step
            sw = details_of(snaps[i], SWITCH, SWITCH_PORT)
            assert sw["transmit_inactive_discards"] == 3 * step
            # its aggregate never moved: the looping errors set on ibsim were not read
            assert details_of(snaps[i], OTHER_HOST, 1)["receive_looping_errors"] == 0
    assert [details_of(s, HOST, 1) for s in m["snapshots"]] == [
        details_of(s, HOST, 1) for s in d]


def _host_moves(sim: IbSim, step: int) -> None:
    n = 5 * step
    sim.set_counters(node_id(HOST), 1, {"PortRcvErrors": n, "PortLocalPhysicalErrors": n,
                                        "PortXmitDiscards": n, "PortInactiveDiscards": n})


def _host_zero(sim: IbSim) -> None:
    _host_moves(sim, 0)


async def test_an_unanswered_attribute_is_given_up_until_the_next_discovery(sim: IbSim) -> None:
    """ibsim drops every PortXmitDiscardDetails MAD at one host port (attribute 0x16 = 22; not
    0x15, which is also PortInfo's id, and ibsim's filter ignores the class); its counters and
    its PortRcvErrorDetails still answer."""
    hkey = [HOST, "1"]
    misses = DETAIL_MISSES_TO_GIVE_UP
    sim.error(node_id(HOST), 1, 100, 22)
    try:
        m = run_mad(
            sim,
            ["discover", *["sample"] * (misses + 1), "wait", "sample", "discover", "sample",
             "wait", "sample"],
            on_wait=script(lambda: _host_moves(sim, 1), lambda: _host_moves(sim, 2)),
            timeout=0.2, retries=0, detail_baselines_per_poll=ALL,
        )
        _host_zero(sim)
        runner = CountingRunner(sim)
        src = DiagsSource(runner=runner, timeout=0.2, retries=0, command_timeout=30,
                          detail_baselines_per_poll=ALL, state_interval=3600)
        d: list[dict[str, Any]] = []
        reads: list[list[tuple[str, str, str]]] = []
        try:
            await src.discover()
            for step in [*[None] * (misses + 1), 1, "discover", None, 2]:
                if step == "discover":
                    await src.discover()
                    continue
                if step is not None:
                    _host_moves(sim, int(step))
                runner.calls.clear()
                d.append(snapshot_json(await src.sample()))
                reads.append(runner.detail_reads())
        finally:
            await src.close()
            await runner.inner.aclose()
    finally:
        sim.error(node_id(HOST), 1, 0)
        _host_zero(sim)
    n_ports = len(m["snapshots"][0]["ports"])
    # polls 1..misses: the host's read is missed (its first one in the baseline batch), and
    # owed: asked again every poll; then given up: the healthy poll, and a poll where its
    # aggregate moved, send nothing for it (its receive details are read: they answer); after
    # the next discovery (and its first poll: nothing moved) it is asked again on a move
    assert m["detail_mads"] == [2 * n_ports, *[1] * (misses - 1), 0, 1, 0, 2]
    lid = str(m["snapshots"][0]["ports"][f"{HOST}/1"]["identity"]["lid"])
    host_reads = [[r for r in rs if r == (lid, "1", "-D")] for rs in reads]
    assert [len(r) for r in host_reads] == [1] * misses + [0, 0, 0, 1]
    assert [len(r) for r in reads] == [2 * n_ports, *[1] * (misses - 1), 0, 1, 0, 2]
    for snaps in (m["snapshots"], d):
        for i, snap in enumerate(snaps):
            missed = [e for e in snap["errors"] if e[2] == hkey]
            asked = i < misses or i == len(snaps) - 1
            assert bool(missed) == asked, (i, snap["errors"])
            assert all("PortXmitDiscardDetails" in e[1] or "-D" in e[1] for e in missed)
            host = counters(snap, HOST, 1)
            assert "transmit_discards" in host and "receive_local_physical_errors" in host
            assert "transmit_inactive_discards" not in host  # never read: never reported
        assert details_of(snaps[misses + 1], HOST, 1)["receive_local_physical_errors"] == 5
        assert details_of(snaps[-1], HOST, 1)["receive_local_physical_errors"] == 10
