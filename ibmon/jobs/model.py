"""Plain data of job attribution: jobs as the scheduler lists them and how one touches a link.

Job fields other than the id are untrusted text (a user names a job what they like): they are
only ever label values, JSON strings or terminal text passed through ``printable``; never an
MQTT topic level, a file name or a shell word.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from ibmon.infiniband.model import PortKey

__all__ = ["UNKNOWN_JOBS", "Job", "JobLink", "JobTable", "JobsView", "Routing", "Touch"]

Touch = Literal["host", "route", "leaf_span"]
"""How a job touches a link: ``host``, it runs on a host at one end of the link; ``route``, the
switches' forwarding tables send traffic between two of its hosts over the link; ``leaf_span``,
no tables were read and the job has hosts under this link's leaf and under another leaf."""

Routing = Literal["tables", "leaf_span"]
"""What inter-switch attribution used: forwarding tables, or the leaf-span fallback."""


@dataclass(frozen=True, slots=True)
class Job:
    """One running job. ``hosts`` are expanded host names (never a Slurm hostlist), sorted."""

    id: str
    user: str = ""
    name: str = ""
    partition: str = ""
    state: str = "RUNNING"
    start: float | None = None  # wall-clock seconds
    hosts: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class JobTable:
    """The running jobs as of one successful scheduler query (or none: ``known`` False).

    ``known`` False means the scheduler could not be asked (missing, failing, hanging, junk):
    jobs are unknown, which is not the same as no jobs, and every output says so.
    """

    jobs: Mapping[str, Job] = field(default_factory=lambda: MappingProxyType({}))
    fetched: float = 0.0  # wall-clock seconds of the query that produced ``jobs``
    known: bool = False
    error: str | None = None  # why the latest query failed, for the log and the API

    @classmethod
    def of(cls, jobs: Iterable[Job], *, fetched: float) -> JobTable:
        return cls(MappingProxyType({j.id: j for j in jobs}), fetched, True, None)

    def by_host(self) -> dict[str, tuple[str, ...]]:
        """Host name -> ids of the jobs running on it, in job-id order."""
        out: dict[str, list[str]] = {}
        for job in self.jobs.values():
            for host in job.hosts:
                out.setdefault(host, []).append(job.id)
        return {h: tuple(ids) for h, ids in out.items()}


UNKNOWN_JOBS = JobTable()


@dataclass(frozen=True, slots=True)
class JobLink:
    """One job on one port's link, and how it touches it."""

    job: Job
    how: Touch


@dataclass(frozen=True, slots=True)
class JobsView:
    """What the exporters read about jobs, made with each ``FabricState``.

    ``host_ports``: each job host that matched HCA ports, to those ports; ``unmatched``: job hosts
    that matched none. ``shared``: hosts running more than one job (a job's rates summed over its
    hosts' ports are exact only on hosts it has to itself). ``rates``: job id -> (transmit,
    receive) bytes per second summed over its hosts' ports (absent while no port has a rate).
    ``port_jobs``: for each port with a firing condition, the jobs on its link, most involved
    first. ``affected``: job id -> the conditions its links carry. ``routing``: what the
    inter-switch attribution used. ``links_of``: the jobs on any port's link, most involved
    first, from the attribution's indexes as of this view (``on_link`` reads it); None while
    the jobs are unknown.
    """

    table: JobTable = UNKNOWN_JOBS
    host_ports: Mapping[str, tuple[PortKey, ...]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    unmatched: frozenset[str] = frozenset()
    shared: frozenset[str] = frozenset()
    rates: Mapping[str, tuple[float, float]] = field(default_factory=lambda: MappingProxyType({}))
    port_jobs: Mapping[PortKey, tuple[JobLink, ...]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    affected: Mapping[str, frozenset[str]] = field(default_factory=lambda: MappingProxyType({}))
    routing: Routing = "leaf_span"
    links_of: Callable[[PortKey], tuple[JobLink, ...]] | None = None

    def on_link(self, ends: Iterable[PortKey]) -> list[JobLink]:
        """The jobs on the link of ``ends`` (a port and its peer), one entry per job, first
        mention first."""
        links_of = self.links_of
        if links_of is None:
            return []
        found: dict[str, JobLink] = {}
        for key in ends:
            for link in links_of(key):
                found.setdefault(link.job.id, link)
        return list(found.values())
