"""Which jobs a fault hurts, with every part real: ibsim + opensm, Slurm, and ``ibmon run``.

opensm programs the switches' forwarding tables; the daemon reads them (``mad``: SMP Gets,
``diags``: ``ibroute``) and asks a real slurmctld for its running jobs (``squeue --json``).
The fabric is a two-level tree of four leaves with two hosts each and two spines, one link from
every leaf to every spine. Which jobs an inter-switch link carries is checked against an oracle
that is not ibmon's: ``ibtracert`` (infiniband-diags) traces every pair of a job's hosts through
the same tables, and the link carries the job when a trace leaves through either of its ends.

- a link fault on a host names exactly the job running there;
- a fault on a leaf-spine link names the jobs routed over it (``how`` = ``route``, routing
  ``tables``) and not the others, as the port's API answer did while the link was quiet;
- a job that ends is gone from ``/api/v1/jobs`` and ``/metrics``, and a later fault on its
  host's link names no job.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from collections.abc import Iterator
from itertools import permutations
from pathlib import Path
from typing import Any

import pytest

from mocks.ibsim import IbSim
from mocks.topology import fat_tree, to_ibsim_netfile
from tests.faults.ha_daemons import SimDaemon, wait_for
from tests.ibsim_fixtures import require_ibsim
from tests.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.system

FABRIC = fat_tree(levels=2, radix=4, leaves=4, hosts_per_leaf=2)
HOSTS = [f"host{i:03d}" for i in range(1, 9)]
#: ibtracert's hop lines: "[egress] -> switch port {guid}[in] ..." (the first from the CA).
HOP = re.compile(r"^\[(\d+)\] -> \S+ port \{(0x[0-9a-f]+)\}\[(\d+)\]")
FROM = re.compile(r"^From \S+ \{(0x[0-9a-f]+)\}")


@pytest.fixture
def sim() -> Iterator[IbSim]:
    require_ibsim()
    with IbSim(to_ibsim_netfile(FABRIC)) as s:
        yield s


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    with SlurmCluster(HOSTS, tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


def _tool(sim: IbSim, *argv: str) -> str:
    out = subprocess.run(list(argv), env=sim.tool_env(), cwd=sim.workdir, capture_output=True,
                         text=True, timeout=60, check=True)
    return out.stdout


def _host_lids(sim: IbSim) -> dict[str, int]:
    """Host name -> LID, from ibnetdiscover's port list."""
    lids: dict[str, int] = {}
    for line in _tool(sim, "ibnetdiscover", "-p").splitlines():
        m = re.match(r"^CA\s+(\d+)\s.*\( '(host\d+) ", line)
        if m:
            lids[m.group(2)] = int(m.group(1))
    assert len(lids) == len(HOSTS), lids
    return lids


def _egresses(sim: IbSim, src: int, dst: int) -> set[tuple[str, str]]:
    """The (switch GUID, egress port) pairs ``ibtracert`` says traffic src -> dst leaves by."""
    out: set[tuple[str, str]] = set()
    node = ""  # the switch the next hop line leaves from ("" while at a CA)
    for line in _tool(sim, "ibtracert", str(src), str(dst)).splitlines():
        if FROM.match(line):
            node = ""
        elif m := HOP.match(line):
            if node:
                out.add((f"0x{int(node, 16):016x}", m.group(1)))
            node = m.group(2) if " switch port " in line else ""
    return out


def _ends(sim: IbSim, host_a: str, host_b: str, lids: dict[str, int]) -> tuple[str, str]:
    """The first inter-switch hop of host_a -> host_b: (leaf GUID, uplink port)."""
    switch_hops = sorted(_egresses(sim, lids[host_a], lids[host_b]))
    peer = FABRIC.peer(_host(host_a).guid, 1)
    assert peer is not None
    for guid, port in switch_hops:
        if guid == peer[0]:
            return guid, port
    raise AssertionError(f"no hop from {host_a}'s leaf: {switch_hops}")


def _host(name: str) -> Any:
    return FABRIC.node_by_desc(f"{name} mlx5_0")


def _api(d: SimDaemon, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{d.port}{path}", timeout=10) as r:
        return json.load(r)


def _running(d: SimDaemon) -> set[str]:
    body = _api(d, "/api/v1/jobs")
    return {j["id"] for j in body["jobs"]} if body.get("known") else set()


def _fired(d: SimDaemon, guids: set[str], since: int) -> list[dict[str, Any]]:
    return [e for e in d.events()[since:] if e["type"] == "port_down"
            and e["status"] == "firing" and e["port"]["guid"] in guids]


def _source(kind: str) -> str:
    return (f'type = "{kind}"\nname = "fabric"\ninterval = "1s"\ntopology_interval = "3s"\n'
            + ("concurrency = 2\n" if kind == "diags" else ""))


@pytest.mark.parametrize("kind", ["mad", "diags"])
def test_faults_name_the_jobs_on_their_links(
    sim: IbSim, slurm: SlurmCluster, tmp_path: Path, kind: str
) -> None:
    lids = _host_lids(sim)
    alone = slurm.submit(["host001"], "alone")
    across = slurm.submit(["host002", "host003"], "across-01-02")
    far = slurm.submit(["host005", "host007"], "far-03-04")
    for job in (alone, across, far):
        slurm.wait_running(job, timeout=60)
    extra = (f'[slurm]\ninterval = "1s"\ntimeout = "10s"\n'
             f'slurm_conf = "{slurm.conf}"\n')
    d = SimDaemon(tmp_path, sim, f"jobs-{kind}", _source(kind), extra=extra)
    try:
        d.start()
        wait_for("the daemon to list the three jobs",
                 lambda: _running(d) >= {alone, across, far}, timeout=90)
        # the jobs can be listed before a discovery has read every switch's table (diags: one
        # ``ibroute`` a switch), so the first answers may honestly say ``leaf_span``; they must
        # reach ``tables``
        wait_for("the daemon to read the forwarding tables",
                 lambda: _api(d, "/api/v1/jobs")["routing"] == "tables", timeout=60)

        # the oracle for a leaf-spine link: the jobs whose host pairs ibtracert routes over it
        leaf, port = _ends(sim, "host002", "host003", lids)
        link = FABRIC.peer(leaf, int(port))
        assert link is not None
        ends = {(leaf, port), (link[0], str(link[1]))}
        jobs = {alone: ["host001"], across: ["host002", "host003"], far: ["host005", "host007"]}
        routed = {job for job, hosts in jobs.items()
                  if any(_egresses(sim, lids[a], lids[b]) & ends
                         for a, b in permutations(hosts, 2))}
        assert across in routed and far not in routed and alone not in routed
        # before any fault: the API's answer for the quiet link names the same jobs (once a
        # state built on every switch's table is served: diags reads them one ibroute a switch)
        want = dict.fromkeys(routed, "route")
        wait_for("the quiet link's answer to name the routed jobs",
                 lambda: {j["id"]: j["how"] for j in _api(
                     d, f"/api/v1/ports/{leaf}/{port}")["jobs"]["list"]} == want, timeout=60)
        assert _api(d, f"/api/v1/ports/{leaf}/{port}")["jobs"]["routing"] == "tables"

        # 1. a host's link: exactly the job on that host
        host001 = _host("host001")
        seen = len(d.events())
        sim.unlink(f"H-{host001.guid[2:]}", 1)
        leaf01 = FABRIC.peer(host001.guid, 1)
        assert leaf01 is not None
        wait_for("port_down on host001's link",
                 lambda: bool(_fired(d, {host001.guid, leaf01[0]}, seen)), timeout=60)
        (event,) = _fired(d, {host001.guid, leaf01[0]}, seen)[:1]
        assert [j["id"] for j in event["details"]["jobs"]] == [alone], event
        assert event["details"]["jobs"][0]["how"] == "host"
        assert event["details"]["jobs"][0]["name"] == "alone"

        # 2. a leaf-spine link: the jobs routed over it, and no other
        seen = len(d.events())
        sim.unlink(f"S-{leaf[2:]}", int(port))
        wait_for("port_down on the leaf-spine link",
                 lambda: bool(_fired(d, {leaf, link[0]}, seen)), timeout=60)
        (event,) = _fired(d, {leaf, link[0]}, seen)[:1]
        named = {j["id"]: j["how"] for j in event["details"]["jobs"]}
        assert set(named) == routed, (event, routed)
        assert set(named.values()) == {"route"}
        assert event["details"]["jobs_routing"] == "tables"

        # 3. a job that ends leaves the API, the metrics and later events
        slurm.cancel(across)
        slurm.wait_gone(across, timeout=60)
        wait_for("the ended job to leave the API", lambda: across not in _running(d),
                 timeout=60)
        scrape = d.scrape()
        assert scrape.value("ibmon_job_info", job_id=across) is None
        assert scrape.value("ibmon_job_info", job_id=far) == 1
        host002 = _host("host002")
        leaf_of_2 = FABRIC.peer(host002.guid, 1)
        assert leaf_of_2 is not None
        seen = len(d.events())
        sim.unlink(f"H-{host002.guid[2:]}", 1)
        wait_for("port_down on host002's link",
                 lambda: bool(_fired(d, {host002.guid, leaf_of_2[0]}, seen)), timeout=60)
        (event,) = _fired(d, {host002.guid, leaf_of_2[0]}, seen)[:1]
        assert event["details"]["jobs"] == [], event
        assert event["details"]["jobs_total"] == 0
        d.stop()
    finally:
        d.kill()
        for job in (alone, across, far):
            slurm.cancel(job)
