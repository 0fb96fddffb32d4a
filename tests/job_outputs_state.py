"""A small fabric with jobs, built by hand, for the tests of what users see of jobs (metrics,
API, CLI, dashboards, alerts): one leaf, three hosts, an uplink to a spine.

- job 101 (alice, a name with quotes, a newline and non-ASCII) runs on host01 and host02;
- job 102 (bob) runs on host02 too: host02 is shared, so neither job's rates are exact;
- job 103 (carol) runs on host03 and host99; host99 matches no port;
- the cable leaf01 port 1 / host01 is down (carried by the leaf end): job 101's host link;
- the uplink leaf01 port 10 is congested: jobs 101 and 103 are routed over it.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

from ibmon.detect.base import Finding
from ibmon.detect.engine import ActiveCondition
from ibmon.detect.events import EventType
from ibmon.infiniband.model import LinkInfo, PortIdentity, PortKey, PortView
from ibmon.jobs.model import Job, JobLink, JobsView, JobTable
from ibmon.state import FabricState

LEAF = "0x0002c90300000101"
SPINE = "0x0002c90300000201"
HOSTS = {"host01": "0x0002c90300000001", "host02": "0x0002c90300000002",
         "host03": "0x0002c90300000003"}
TRICKY_NAME = 'train "llm"\nrun \u00e9t\u00e9 \u2713 \\ done'
DOWN_PORT: PortKey = (LEAF, "1")
CONGESTED_PORT: PortKey = (LEAF, "10")

JOBS = (
    Job("101", user="alice", name=TRICKY_NAME, partition="gpu", start=1_700_000_000.0,
        hosts=("host01", "host02")),
    Job("102", user="bob", name="eval", partition="gpu", start=1_700_000_100.0,
        hosts=("host02",)),
    Job("103", user="carol", name="sim", partition="cpu", start=1_700_000_200.0,
        hosts=("host03", "host99")),
)


def _port(guid: str, port: str, desc: str, node_type: str, peer: tuple[str, str, str], *,
          state: int = 4, conditions: frozenset[str] = frozenset(),
          causes: dict[str, str] | None = None, tx: float = 1e8, rx: float = 2e8) -> PortView:
    ident = PortIdentity(guid=guid, port=port, device="mlx5_0" if node_type == "ca" else "",
                         node_desc=desc, node_type=node_type, lid=int(guid[-3:], 16),
                         source="test")
    return PortView(
        identity=ident, state=state, phys_state=5 if state == 4 else 2,
        rate_bytes_per_second=12.5e9, active_width="4X", active_speed="EDR",
        link=LinkInfo(remote_guid=peer[0], remote_port=peer[1], remote_node_desc=peer[2],
                      active_width="4X", active_speed="EDR", max_width="4X", max_speed="EDR"),
        rates={"transmit_data": tx, "receive_data": rx},
        utilization_tx=tx / 12.5e9, utilization_rx=rx / 12.5e9,
        conditions=conditions, causes=causes or {},
    )


def ports() -> dict[PortKey, PortView]:
    views = []
    for i, (host, guid) in enumerate(HOSTS.items(), start=1):
        down = i == 1
        views.append(_port(guid, "1", f"{host} mlx5_0", "ca", (LEAF, str(i), "leaf01"),
                           state=1 if down else 4))
        views.append(_port(LEAF, str(i), "leaf01", "switch", (guid, "1", f"{host} mlx5_0"),
                           state=1 if down else 4,
                           conditions=frozenset({"down"}) if down else frozenset(),
                           causes={"down": "link_down"} if down else None))
    views.append(_port(LEAF, "10", "leaf01", "switch", (SPINE, "1", "spine01"),
                       conditions=frozenset({"congestion"}),
                       causes={"congestion": "unknown"}))
    views.append(_port(SPINE, "1", "spine01", "switch", (LEAF, "10", "leaf01")))
    return {v.key: v for v in views}


def jobs_view(jobs: tuple[Job, ...] = JOBS, *, known: bool = True,
              error: str | None = None) -> JobsView:
    """The view job attribution (``ibmon.jobs.attribute``) would make of ``ports()`` with
    ``jobs`` running."""
    if not known:
        return JobsView(table=JobTable(known=False, error=error or "timeout"))
    table = JobTable.of(jobs, fetched=1_700_000_300.0)
    running = table.jobs
    host_ports = {h: ((g, "1"),) for h, g in HOSTS.items()}
    by_host = table.by_host()
    port_jobs: dict[PortKey, tuple[JobLink, ...]] = {}
    if "101" in running:
        port_jobs[DOWN_PORT] = (JobLink(running["101"], "host"),)
    routed = [JobLink(running[i], "route") for i in ("101", "103") if i in running]
    if routed:
        port_jobs[CONGESTED_PORT] = tuple(routed)
    affected: dict[str, frozenset[str]] = {}
    for key, links in port_jobs.items():
        conds = ports()[key].conditions
        for link in links:
            affected[link.job.id] = affected.get(link.job.id, frozenset()) | conds
    rates = {j.id: (1e9 * int(j.id[-1]), 2e9 * int(j.id[-1])) for j in jobs}
    return JobsView(
        table=table,
        host_ports=MappingProxyType({h: p for h, p in host_ports.items() if h in by_host}),
        unmatched=frozenset(h for h in by_host if h not in host_ports),
        shared=frozenset(h for h, ids in by_host.items() if len(ids) > 1),
        rates=MappingProxyType(rates),
        port_jobs=MappingProxyType(port_jobs),
        # the attribution's answer for any port: here, the ports above with jobs
        links_of=lambda key: port_jobs.get(key, ()),
        affected=MappingProxyType(affected),
        routing="tables",
    )


#: The event type of each condition the fabric above has.
_TYPES: dict[str, EventType] = {"down": "port_down", "congestion": "congestion"}


def active(state: FabricState) -> tuple[ActiveCondition, ...]:
    return tuple(
        ActiveCondition(type=_TYPES[c], key=v.key, since=1_700_000_000.0, identity=v.identity,
                        peer=None, finding=Finding(severity="critical" if c == "down"
                                                   else "warning", value=1.0, message=c))
        for v in state.ports.values() for c in sorted(v.conditions))


def state(view: JobsView | None = None, generated: float = 1_700_000_400.0) -> FabricState:
    """The fabric with ``view`` (default: the three jobs running, known)."""
    base = FabricState(generated=generated, ports=MappingProxyType(ports()),
                       jobs=jobs_view() if view is None else view)
    return dataclasses.replace(base, conditions=active(base))
