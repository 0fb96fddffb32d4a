"""The jobs a fabric runs, as Prometheus series and as JSON: what ``FabricState.jobs`` says.

Every output about jobs reads one ``JobsView`` (made with each ``FabricState``) and never asks
the scheduler or the routes itself. Job names, users and partitions are whatever a user or an
administrator typed: they are only ever label values (escaped by ``escape_label_value``) or
JSON strings, never a metric name, a label name or an MQTT topic.

Cardinality is bounded by what is running: ``ibmon_job_*`` series exist for running jobs only
and vanish with the next state once a job ends; ``ibmon_port_jobs_info`` exists only for ports
with a firing condition, its ``jobs`` value capped at ``MAX_LABEL_JOBS`` ids (then ``,+N``).
When the scheduler could not be asked (``JobTable.known`` False) only ``ibmon_jobs_known 0`` is
rendered: the jobs are unknown, which is not "no jobs", and stale ones must not linger.

A daemon without a job source leaves ``FabricState.jobs`` at its default (its table is
``UNKNOWN_JOBS`` itself): it renders no job series at all, so hundreds of node-local daemons
without ``[slurm]`` do not each claim ``ibmon_jobs_known 0``.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import isfinite
from typing import Any

from exporters.render import escape_help, escape_label_value, format_float
from ibmon.infiniband.model import PortKey
from ibmon.jobs.model import UNKNOWN_JOBS, Job, JobLink, JobsView
from ibmon.state import FabricState

__all__ = [
    "JOB_FAMILIES",
    "MAX_LABEL_JOBS",
    "JobRenderer",
    "job_detail_json",
    "job_order",
    "jobs_json",
    "jobs_label",
    "link_jobs_json",
    "render_jobs",
    "source_attached",
]

#: Job ids in one ``ibmon_port_jobs_info`` ``jobs`` value; the rest are counted (``,+N``).
MAX_LABEL_JOBS = 20

_EXACT = ("Exact only for a job that has its hosts to itself (ibmon_job_shared_hosts 0): a host "
          "shared with another job adds that job's traffic too. In a sharded fabric each "
          "shard's daemon sums the ports it polls.")


def _header(name: str, help_: str) -> str:
    return f"# HELP {name} {escape_help(help_)}\n# TYPE {name} gauge\n"


#: (name, HELP) of every family this module renders, in exposition order.
JOB_FAMILIES: tuple[tuple[str, str], ...] = (
    ("ibmon_jobs_known", "1 while the job scheduler answered its latest query, 0 while jobs are "
     "unknown (scheduler missing, failing, hanging or printing junk): then no ibmon_job_* "
     "series exist, which does not mean no jobs run."),
    ("ibmon_job_hosts_unmatched", "Hosts of running jobs that matched no HCA port of the fabric "
     "(by node description, node-name map or host pattern): their traffic and faults are not "
     "attributed."),
    ("ibmon_job_info", "A running job as the scheduler lists it; always 1. Join on (fabric, "
     "job_id)."),
    ("ibmon_job_transmit_bytes_per_second", "Data the job's hosts' HCA ports send, bytes per "
     "second, summed over those ports. " + _EXACT),
    ("ibmon_job_receive_bytes_per_second", "Data the job's hosts' HCA ports receive, bytes per "
     "second, summed over those ports. " + _EXACT),
    ("ibmon_job_shared_hosts", "Hosts of the job that also run another job: the job's rates are "
     "exact only while this is 0."),
    ("ibmon_job_affected", "1 while a condition fires on a link the job uses (a link of one of "
     "its hosts, or an inter-switch link its traffic is routed over)."),
    ("ibmon_port_jobs_info", "The jobs on the link of a port with a firing condition, most "
     "involved first (jobs: comma-separated job ids, at most 20, then +N more); always 1. What "
     "alert annotations query by (guid, port)."),
)
_HEADERS = {name: _header(name, help_) for name, help_ in JOB_FAMILIES}


def source_attached(view: JobsView) -> bool:
    """Whether a job source made ``view`` (the default view's table is ``UNKNOWN_JOBS``)."""
    return view.table is not UNKNOWN_JOBS


def job_order(job_id: str) -> tuple[int, str]:
    """Job ids in numeric order where they are numbers ("9" before "10"), compared by length
    then text (as port numbers are), so an id is never parsed."""
    return (len(job_id), job_id)


def _running(view: JobsView) -> list[Job]:
    return sorted(view.table.jobs.values(), key=lambda j: job_order(j.id))


def jobs_label(links: Sequence[JobLink], limit: int = MAX_LABEL_JOBS) -> str:
    """The ``jobs`` label value: ids in the given order (most involved first), one each,
    ``limit`` at most, then ``+N`` for the others."""
    ids = list(dict.fromkeys(link.job.id for link in links))
    shown = ids[:limit]
    if len(ids) > limit:
        shown.append(f"+{len(ids) - limit}")
    return ",".join(shown)


def _firing(state: FabricState, key: PortKey) -> bool:
    view = state.ports.get(key)
    return view is None or bool(view.conditions)


class JobRenderer:
    """Renders the job families of each state; the lines that change only with the running
    jobs (``ibmon_job_info``, ``ibmon_job_shared_hosts``) are kept while the jobs are the same
    (the attribution hands on the same jobs mapping until they change), so a poll of 10,000
    jobs spells only their rates again."""

    def __init__(self, fabric: str) -> None:
        self._fab = f'fabric="{escape_label_value(fabric)}"'
        self._key: tuple[int, int] | None = None
        self._jobs: list[Job] = []
        self._labels: dict[str, str] = {}
        self._info = ""
        self._shared = ""

    def _static(self, view: JobsView) -> None:
        key = (id(view.table.jobs), id(view.shared))
        if key == self._key:
            return
        e = escape_label_value
        jobs = self._jobs = _running(view)
        labels = self._labels = {j.id: f'{self._fab},job_id="{e(j.id)}"' for j in jobs}
        self._info = "".join(
            [_HEADERS["ibmon_job_info"]]
            + [f'ibmon_job_info{{{labels[j.id]},user="{e(j.user)}",name="{e(j.name)}",'
               f'partition="{e(j.partition)}"}} 1\n' for j in jobs]) if jobs else ""
        shared = view.shared
        self._shared = "".join(
            [_HEADERS["ibmon_job_shared_hosts"]]
            + [f"ibmon_job_shared_hosts{{{labels[j.id]}}} "
               f"{sum(1 for h in set(j.hosts) if h in shared)}\n" for j in jobs]) if jobs else ""
        self._key = key

    def render(self, state: FabricState) -> bytes:
        """The job families of ``state`` as exposition text (b"" without a job source)."""
        view = state.jobs
        if not source_attached(view):
            return b""
        e = escape_label_value
        fab = self._fab
        out: list[str] = [_HEADERS["ibmon_jobs_known"],
                          f"ibmon_jobs_known{{{fab}}} {1 if view.table.known else 0}\n"]
        if not view.table.known:
            return "".join(out).encode("utf-8")
        out += [_HEADERS["ibmon_job_hosts_unmatched"],
                f"ibmon_job_hosts_unmatched{{{fab}}} {len(view.unmatched)}\n"]
        self._static(view)
        jobs, labels = self._jobs, self._labels
        out.append(self._info)
        rated = [(j.id, view.rates[j.id]) for j in jobs if j.id in view.rates]
        for at, name in enumerate(("ibmon_job_transmit_bytes_per_second",
                                   "ibmon_job_receive_bytes_per_second")):
            if rated:
                out.append(_HEADERS[name])
                out += [f"{name}{{{labels[i]}}} {format_float(pair[at])}\n" for i, pair in rated]
        out.append(self._shared)
        affected = [(j.id, c) for j in jobs for c in sorted(view.affected.get(j.id, ()))]
        if affected:
            out.append(_HEADERS["ibmon_job_affected"])
            out += [f'ibmon_job_affected{{{labels[i]},condition="{e(c)}"}} 1\n'
                    for i, c in affected]
        running = view.table.jobs
        ports = []
        for key in sorted(view.port_jobs, key=lambda k: (k[0], len(k[1]), k[1])):
            links = [link for link in view.port_jobs[key] if link.job.id in running]
            if links and _firing(state, key):
                ports.append(f'ibmon_port_jobs_info{{{fab},guid="{e(key[0])}",'
                             f'port="{e(key[1])}",jobs="{e(jobs_label(links))}"}} 1\n')
        if ports:
            out.append(_HEADERS["ibmon_port_jobs_info"])
            out += ports
        return "".join(out).encode("utf-8")


def render_jobs(state: FabricState, fabric: str) -> bytes:
    """The job families of ``state`` as exposition text, once (``ibmon scan``, tests); the
    exporter keeps a ``JobRenderer``."""
    return JobRenderer(fabric).render(state)


# --- JSON ----------------------------------------------------------------------------------------


def _finite(x: float | None) -> float | None:
    """JSON has no NaN or infinity: a value that is not finite is unknown (null)."""
    return x if x is not None and isfinite(x) else None


def _job_json(job: Job) -> dict[str, Any]:
    return {"id": job.id, "user": job.user, "name": job.name, "partition": job.partition,
            "state": job.state, "start": job.start}


def _head(state: FabricState) -> dict[str, Any]:
    view = state.jobs
    table = view.table
    return {"generated": state.generated, "source": source_attached(view),
            "known": table.known, "error": table.error,
            "fetched": table.fetched if table.known else None, "routing": view.routing}


def _rates(view: JobsView, job: Job) -> dict[str, Any]:
    tx, rx = view.rates.get(job.id, (None, None))
    shared = sorted(h for h in set(job.hosts) if h in view.shared)
    return {"transmit_bytes_per_second": _finite(tx), "receive_bytes_per_second": _finite(rx),
            "shared_hosts": len(shared), "rates_exact": not shared}


def jobs_json(state: FabricState) -> dict[str, Any]:
    """``/api/v1/jobs``: every running job (none while jobs are unknown), in job-id order, with
    its host count, rates and the conditions on its links."""
    view = state.jobs
    out = _head(state)
    jobs = _running(view) if view.table.known else []
    out["count"] = len(jobs)
    out["hosts_unmatched"] = len(view.unmatched) if view.table.known else None
    out["jobs"] = [{**_job_json(j), "hosts": len(j.hosts), **_rates(view, j),
                    "conditions": sorted(view.affected.get(j.id, ()))} for j in jobs]
    return out


def job_detail_json(state: FabricState, job_id: str) -> dict[str, Any] | None:
    """``/api/v1/jobs/{id}``: the job, each of its hosts with the HCA ports it matched (their
    state, conditions and data rates), the links with a firing condition it uses and how, and
    its rates. None for a job that is not running (or while jobs are unknown)."""
    view = state.jobs
    job = view.table.jobs.get(job_id) if view.table.known else None
    if job is None:
        return None
    hosts = []
    for host in job.hosts:
        ports = []
        for key in view.host_ports.get(host, ()):
            port = state.ports.get(key)
            entry: dict[str, Any] = {"guid": key[0], "port": key[1]}
            if port is not None:
                entry.update({
                    "node_desc": port.identity.node_desc, "state": port.state,
                    "conditions": sorted(port.conditions),
                    "transmit_bytes_per_second": _finite(port.rates.get("transmit_data")),
                    "receive_bytes_per_second": _finite(port.rates.get("receive_data")),
                })
            ports.append(entry)
        hosts.append({"host": host, "shared": host in view.shared,
                      "matched": host not in view.unmatched and bool(ports), "ports": ports})
    links = []
    for key in sorted(view.port_jobs, key=lambda k: (k[0], len(k[1]), k[1])):
        for link in view.port_jobs[key]:
            if link.job.id == job_id:
                port = state.ports.get(key)
                links.append({"guid": key[0], "port": key[1], "how": link.how,
                              "node_desc": port.identity.node_desc if port else None,
                              "conditions": sorted(port.conditions) if port else []})
                break
    return {**_head(state), "job": {**_job_json(job), "hosts": list(job.hosts)},
            **_rates(view, job), "conditions": sorted(view.affected.get(job_id, ())),
            "hosts": hosts, "links": links}


def link_jobs_json(state: FabricState, links: Sequence[JobLink],
                   limit: int = 100) -> dict[str, Any]:
    """The ``jobs`` part of a port's answer: known, routing, the first ``limit`` jobs and
    how they touch the link, and how many there are."""
    view = state.jobs
    return {"source": source_attached(view), "known": view.table.known,
            "routing": view.routing, "total": len(links),
            "list": [{**_job_json(link.job), "how": link.how} for link in links[:limit]]}
