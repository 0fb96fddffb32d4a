"""Which jobs run over which link: the scheduler's jobs joined with the fabric's ports and routes.

``Attributor.view`` is called once per published state and gives the ``JobsView`` the exporters
read, which answers for any port's link (the API, ``ibmon explain``: ``JobsView.on_link``) from
that view's indexes; ``annotate`` adds the jobs to events at the one place they leave the daemon.

What is indexed when (at 118,400 ports and 10,000 jobs a poll has about a second for
everything, and attribution may take a tenth of it):

- the fabric index (which CA ports belong to which host, each port's peer, each host's leaf)
  is rebuilt only when the number of ports changes or the forwarding tables do, or after
  ``REINDEX_SECONDS`` (a renamed host keeps its old name until then);
- the job index (each job's ports and leaves) only when the running jobs change;
- per poll: each job's rates (a sum over its hosts' HCA ports) and the jobs on the links of
  the ports with a firing condition.

A host link's jobs are the jobs of the host at either end. An inter-switch link's jobs come
from the forwarding tables when every switch's table was read (``RouteIndex``): the jobs with
hosts on a (source leaf, destination leaf) pair routed out of either end; otherwise from leaf
spans: the jobs with hosts under the link's leaf end and under another leaf (a link between two
non-leaf switches then names none, as nothing says whose traffic it carries).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import structlog

from ibmon.infiniband.model import PortKey, PortView
from ibmon.jobs.model import UNKNOWN_JOBS, Job, JobLink, JobsView, JobTable, Routing

if TYPE_CHECKING:
    from ibmon.detect.events import Event
    from ibmon.jobs.routes import RouteIndex
    from ibmon.jobs.slurm import SlurmConfig
    from ibmon.state import FabricState

__all__ = ["REINDEX_SECONDS", "Attributor", "host_name"]

log = structlog.get_logger(__name__)

#: The fabric index is rebuilt at least this often, so a host renamed in place is picked up.
REINDEX_SECONDS = 300.0
#: Jobs named in one event when there is no ``[slurm]`` section (the simulated fabric's jobs).
DEFAULT_EVENT_JOBS = 20
#: A bug in attribution is logged with its traceback at most this often.
BUG_LOG_SECONDS = 300.0
_EMPTY: Mapping[Any, Any] = MappingProxyType({})


def host_name(node_desc: str) -> str:
    """The host a node description names, Linux style (``"gpu031 mlx5_0"`` -> ``gpu031``):
    its first word, lower case, without a domain."""
    first = node_desc.split(None, 1)[0] if node_desc.strip() else ""
    return first.split(".", 1)[0].lower()


@dataclass(slots=True)
class _Fabric:
    """Who is where: built from the port views, independent of the jobs. Only the hosts' HCA
    ports are indexed; a port's far end is read from its view when asked (an index of every
    port's peer cost 15 MB at 118,400 ports)."""

    host_ports: dict[str, list[PortKey]] = field(default_factory=dict)
    host_of: dict[PortKey, str] = field(default_factory=dict)  # either end of a host link
    host_leaves: dict[str, set[str]] = field(default_factory=dict)
    leaves: set[str] = field(default_factory=set)
    routes: RouteIndex | None = None


@dataclass(slots=True)
class _Jobs:
    """The running jobs against the fabric index."""

    table: JobTable = UNKNOWN_JOBS
    by_host: dict[str, tuple[Job, ...]] = field(default_factory=dict)
    ports: dict[str, list[PortKey]] = field(default_factory=dict)
    leaves: dict[str, frozenset[str]] = field(default_factory=dict)
    spanning: list[Job] = field(default_factory=list)  # jobs with hosts under 2+ leaves
    unmatched: frozenset[str] = frozenset()
    shared: frozenset[str] = frozenset()
    host_ports: dict[str, tuple[PortKey, ...]] = field(default_factory=dict)


class Attributor:
    """Joins the running jobs with the fabric (see the module docstring)."""

    def __init__(self, cfg: SlurmConfig | None = None) -> None:
        self._pattern = None
        self._cap = DEFAULT_EVENT_JOBS
        if cfg is not None:
            import re

            self._pattern = re.compile(cfg.host_pattern) if cfg.host_pattern else None
            self._cap = cfg.max_event_jobs
        self._fabric = _Fabric()
        self._jobs = _Jobs()
        self._fabric_sig: tuple[int, int] | None = None
        self._indexed_at = -REINDEX_SECONDS
        self._roots: dict[PortKey, PortKey] = {}
        self._descs: dict[PortKey, str] = {}
        self._last = JobsView()
        self._ports: Mapping[PortKey, PortView] = _EMPTY
        self._bug_logged = -BUG_LOG_SECONDS

    # -- the view ------------------------------------------------------------------------------

    def view(
        self, state: FabricState, table: JobTable, forwarding: Mapping[str, bytes]
    ) -> JobsView:
        """The jobs as of ``state``; never raises (a bug costs the jobs of this view, logged)."""
        try:
            self._last = self._view(state, table, forwarding)
        except Exception:
            self._bug("jobs_view_failed")
            self._last = JobsView(table=table)
        return self._last

    def _view(
        self, state: FabricState, table: JobTable, forwarding: Mapping[str, bytes]
    ) -> JobsView:
        ports = self._ports = state.ports
        now = time.monotonic()
        sig = (len(ports), id(forwarding))
        if sig != self._fabric_sig or now - self._indexed_at >= REINDEX_SECONDS:
            self._fabric = self._index_fabric(ports, forwarding)
            self._fabric_sig, self._indexed_at = sig, now
            self._jobs = _Jobs()  # the jobs' ports are the fabric's: index them again
        if table is not self._jobs.table:
            last = self._jobs.table
            if table.known and last.known and table.jobs == last.jobs:
                # the same jobs, a newer query: the same jobs mapping goes on, so what is
                # made of the jobs alone (the exporter's info lines) is kept too
                table = self._jobs.table = JobTable(last.jobs, table.fetched, True, None)
            else:
                self._jobs = self._index_jobs(table)
        jobs = self._jobs
        routing: Routing = "tables" if self._fabric.routes is not None else "leaf_span"
        if not table.known:
            return JobsView(table=table, routing=routing)
        firing: dict[PortKey, set[str]] = {}
        congested: list[PortKey] = []
        for cond in state.conditions:
            firing.setdefault(cond.key, set()).add(cond.type)
            if cond.type == "congestion" and cond.identity.node_type == "switch":
                congested.append(cond.key)
        self._descs = {c.key: c.identity.node_desc for c in state.conditions}
        self._roots = {}
        if congested and self._fabric.routes is not None:
            from ibmon.jobs.routes import trace_congestion

            self._roots = trace_congestion(self._fabric.routes, congested)
        port_jobs: dict[PortKey, tuple[JobLink, ...]] = {}
        affected: dict[str, set[str]] = {}
        for key, kinds in firing.items():
            links = self.jobs_on(key)
            if links:
                port_jobs[key] = links
                for link in links:
                    affected.setdefault(link.job.id, set()).update(kinds)
        return JobsView(
            table=table,
            host_ports=MappingProxyType(jobs.host_ports),
            unmatched=jobs.unmatched,
            shared=jobs.shared,
            rates=MappingProxyType(self._rates(ports)),
            port_jobs=MappingProxyType(port_jobs),
            affected=MappingProxyType({j: frozenset(c) for j, c in affected.items()}),
            routing=routing,
            links_of=partial(_links, self._fabric, jobs, ports),
        )

    def _index_fabric(
        self, ports: Mapping[PortKey, PortView], forwarding: Mapping[str, bytes]
    ) -> _Fabric:
        fab = _Fabric()
        pattern = self._pattern
        for key, view in ports.items():
            ident = view.identity
            if ident.node_type != "ca":
                continue
            desc = ident.node_desc
            if pattern is not None:
                m = pattern.search(desc)
                host = m.group("host").lower() if m else ""
            else:
                host = host_name(desc)
            if not host:
                continue
            fab.host_ports.setdefault(host, []).append(key)
            fab.host_of[key] = host
            link = view.link
            if link is not None and link.remote_guid:
                # the switch end too: it carries the link's faults, and keeps its host when a
                # rediscovery no longer shows the link (the cable was pulled)
                fab.host_of[(link.remote_guid, link.remote_port)] = host
                fab.leaves.add(link.remote_guid)
                fab.host_leaves.setdefault(host, set()).add(link.remote_guid)
        if forwarding:
            from ibmon.jobs.routes import RouteIndex

            routes = RouteIndex.build(forwarding, ports)
            fab.routes = routes if routes.usable() else None
        return fab

    def _index_jobs(self, table: JobTable) -> _Jobs:
        """Host names are matched without regard to case; the view keeps the job's spelling."""
        fab = self._fabric
        out = _Jobs(table=table)
        by_host: dict[str, list[Job]] = {}
        spelled: dict[str, set[str]] = {}
        for job in table.jobs.values():
            keys: list[PortKey] = []
            leaves: set[str] = set()
            for host in job.hosts:
                name = host.lower()
                by_host.setdefault(name, []).append(job)
                spelled.setdefault(name, set()).add(host)
                got = fab.host_ports.get(name)
                if got is None:
                    continue
                out.host_ports[host] = tuple(got)
                keys += got
                leaves |= fab.host_leaves.get(name, set())
            out.ports[job.id] = keys
            out.leaves[job.id] = frozenset(leaves)
            if len(leaves) > 1:
                out.spanning.append(job)
        out.by_host = {h: tuple(js) for h, js in by_host.items()}
        out.unmatched = frozenset(
            h for name, hs in spelled.items() if name not in fab.host_ports for h in hs)
        out.shared = frozenset(
            h for name, js in by_host.items() if len(js) > 1 for h in spelled[name])
        return out

    def _rates(self, ports: Mapping[PortKey, PortView]) -> dict[str, tuple[float, float]]:
        """Each job's transmit and receive bytes/s summed over its hosts' HCA ports (a job
        none of whose ports has a rate yet has none)."""
        out: dict[str, tuple[float, float]] = {}
        get = ports.get
        for job_id, keys in self._jobs.ports.items():
            tx = rx = 0.0
            seen = False
            for key in keys:
                view = get(key)
                if view is None or view.stale:
                    continue
                rates = view.rates
                t, r = rates.get("transmit_data"), rates.get("receive_data")
                if t is not None:
                    tx += t
                    seen = True
                if r is not None:
                    rx += r
                    seen = True
            if seen:
                out[job_id] = (tx, rx)
        return out

    # -- one port ------------------------------------------------------------------------------

    def jobs_on(self, key: PortKey) -> tuple[JobLink, ...]:
        """The running jobs on the link of ``key`` (either end), most involved first."""
        return _links(self._fabric, self._jobs, self._ports, key)

    # -- events --------------------------------------------------------------------------------

    def annotate(self, events: Iterable[Event]) -> list[Event]:
        """``events`` with the jobs on each one's link in ``details`` (see README "Which jobs
        a fault hurts"); an event about no port goes as it is. Never raises."""
        out: list[Event] = []
        for event in events:
            if event.port is None:
                out.append(event)
                continue
            try:
                details = self._details((event.port.guid, event.port.port), event.type)
            except Exception:
                self._bug("jobs_annotate_failed")
                out.append(event)
                continue
            out.append(event.model_copy(update={"details": {**event.details, **details}}))
        return out

    def _details(self, key: PortKey, kind: str) -> dict[str, Any]:
        table = self._jobs.table
        routing = "tables" if self._fabric.routes is not None else "leaf_span"
        if not table.known:
            return {"jobs": [], "jobs_total": 0, "jobs_known": False, "jobs_routing": routing}
        links = list(self.jobs_on(key))
        details: dict[str, Any] = {"jobs_known": True, "jobs_routing": routing}
        root = self._roots.get(key) if kind == "congestion" else None
        if root is not None:
            feeding = {link.job.id for link in self.jobs_on(root)}
            links.sort(key=lambda link: link.job.id not in feeding)  # stable: feeders first
            details["congestion_root"] = {"guid": root[0], "port": root[1],
                                          "node_desc": self._descs.get(root, "")}
        details["jobs"] = [{"id": link.job.id, "user": link.job.user, "name": link.job.name,
                            "how": link.how} for link in links[: self._cap]]
        details["jobs_total"] = len(links)
        return details

    def _bug(self, what: str) -> None:
        now = time.monotonic()
        if now - self._bug_logged >= BUG_LOG_SECONDS:
            self._bug_logged = now
            log.exception(what, consequence="this state's or event's jobs are left out")


def _links(fab: _Fabric, jobs: _Jobs, ports: Mapping[PortKey, PortView], key: PortKey
           ) -> tuple[JobLink, ...]:
    """The running jobs on the link of ``key`` (either end), most involved first, as
    ``fab`` and ``jobs`` index ``ports``."""
    if not jobs.table.known:
        return ()
    view = ports.get(key)
    link = view.link if view is not None else None
    peer = (link.remote_guid, link.remote_port) if link is not None else None
    host = fab.host_of.get(key)
    if host is not None:
        return tuple(JobLink(job, "host") for job in jobs.by_host.get(host, ()))
    if peer is None or view is None or view.identity.node_type != "switch":
        return ()
    if fab.routes is not None:
        pairs = fab.routes.leaf_pairs(key) | fab.routes.leaf_pairs(peer)
        if not pairs:
            return ()
        scored = []
        for job in jobs.spanning:
            leaves = jobs.leaves[job.id]
            n = sum((s, d) in pairs for s in leaves for d in leaves if s != d)
            if n:
                scored.append((-n, _id_order(job.id), job))
        return tuple(JobLink(job, "route") for *_, job in sorted(scored))
    leaf = key[0] if key[0] in fab.leaves else peer[0] if peer[0] in fab.leaves else None
    if leaf is None:
        return ()
    scored = []
    for job in jobs.spanning:
        if leaf in jobs.leaves[job.id]:
            under = sum(leaf in fab.host_leaves.get(h.lower(), ()) for h in job.hosts)
            scored.append((-under, _id_order(job.id), job))
    return tuple(JobLink(job, "leaf_span") for *_, job in sorted(scored))


def _id_order(job_id: str) -> tuple[int, str]:
    """Job ids as Slurm numbers them: by length, then text ("9" before "10")."""
    return (len(job_id), job_id)
