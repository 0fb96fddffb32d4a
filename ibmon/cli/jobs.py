"""``ibmon jobs [ID]``: the running jobs, or one job's hosts, ports and conditions, from a
running daemon (``/api/v1/jobs``, ``/api/v1/jobs/{id}``).

Job names, users and partitions are whatever the scheduler's users typed, and host names and
node descriptions come from the fabric: everything is printed through ``printable``, so an
escape sequence in a job name shows as ``\\x1b`` and does nothing to the terminal. A job's rates
are marked ``~`` when it shares a host with another job: they then include that job's traffic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ibmon.cli.terminal import printable, rate_text, time_text

__all__ = ["job_link_lines", "render_job", "render_jobs", "unknown_line"]

#: Longest name printed in the table (the detail prints it whole).
NAME_WIDTH = 24


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "\u2026"


def unknown_line(doc: Mapping[str, Any]) -> str:
    """What a jobs answer with ``known`` false means, in one line."""
    if not doc.get("source"):
        return "jobs unknown: this daemon has no job source (add a [slurm] section)\n"
    reason = printable(doc.get("error") or "not asked yet")
    return f"jobs unknown: the scheduler could not be asked ({reason})\n"


def render_jobs(doc: Mapping[str, Any]) -> str:
    """The table of one ``/api/v1/jobs`` answer."""
    if not doc.get("known"):
        return unknown_line(doc)
    jobs: Sequence[Mapping[str, Any]] = doc.get("jobs") or []
    head = (f"{doc.get('count', len(jobs))} running jobs (scheduler asked "
            f"{time_text(doc.get('fetched'))}; inter-switch links by "
            f"{'forwarding tables' if doc.get('routing') == 'tables' else 'leaf span'})")
    if doc.get("hosts_unmatched"):
        head += f"; {doc['hosts_unmatched']} job hosts match no port"
    rows = [("JOBID", "USER", "NAME", "PARTITION", "HOSTS", "TX", "RX", "CONDITIONS")]
    shared = False
    for j in jobs:
        mark = "" if j.get("rates_exact", True) else "~"
        shared = shared or bool(mark)
        rows.append((
            printable(j.get("id")), printable(j.get("user", "")),
            _cut(printable(j.get("name", "")), NAME_WIDTH), printable(j.get("partition", "")),
            str(j.get("hosts", "")),
            mark + rate_text(j.get("transmit_bytes_per_second")),
            mark + rate_text(j.get("receive_bytes_per_second")),
            printable(",".join(j.get("conditions") or []) or "-"),
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [head]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
              for r in rows]
    if shared:
        lines.append("~ the job shares a host with another job: its rates include that job's "
                     "traffic (exact only on hosts a job has to itself)")
    return "\n".join(lines) + "\n"


def render_job(doc: Mapping[str, Any]) -> str:
    """The report of one ``/api/v1/jobs/{id}`` answer."""
    job = doc.get("job") or {}
    lines = [f"job {printable(job.get('id'))}: {printable(job.get('name', ''))}",
             f"  user {printable(job.get('user', ''))}, partition "
             f"{printable(job.get('partition', ''))}, {printable(job.get('state', ''))} since "
             f"{time_text(job.get('start'))}"]
    exact = doc.get("rates_exact", True)
    rates = (f"  traffic: tx {rate_text(doc.get('transmit_bytes_per_second'))}, "
             f"rx {rate_text(doc.get('receive_bytes_per_second'))}")
    if not exact:
        rates += (f" (approximate: {doc.get('shared_hosts')} of its hosts run other jobs too, "
                  "whose traffic is included)")
    lines.append(rates)
    conditions = doc.get("conditions") or []
    lines.append("  conditions on its links: " + (printable(", ".join(conditions))
                                                  if conditions else "none"))
    hosts: Sequence[Mapping[str, Any]] = doc.get("hosts") or []
    lines.append(f"hosts ({len(hosts)}):")
    for h in hosts:
        notes = []
        if h.get("shared"):
            notes.append("shared with another job")
        if not h.get("matched", True):
            notes.append("no port of the fabric matches it")
        lines.append(f"  {printable(h.get('host'))}" + (f" ({'; '.join(notes)})" if notes else ""))
        for p in h.get("ports") or []:
            conds = ",".join(p.get("conditions") or []) or "ok"
            lines.append(f"    {printable(p.get('node_desc') or '')} {printable(p.get('guid'))}/"
                         f"{printable(p.get('port'))}: {printable(conds)}, tx "
                         f"{rate_text(p.get('transmit_bytes_per_second'))}, rx "
                         f"{rate_text(p.get('receive_bytes_per_second'))}")
    links: Sequence[Mapping[str, Any]] = doc.get("links") or []
    if links:
        lines.append("links with a condition it uses:")
        for link in links:
            lines.append(f"  {printable(link.get('node_desc') or '')} "
                         f"{printable(link.get('guid'))}/{printable(link.get('port'))} "
                         f"({_how(link.get('how'))}): "
                         f"{printable(','.join(link.get('conditions') or []) or '-')}")
    return "\n".join(lines) + "\n"


def _how(how: Any) -> str:
    return {"host": "its host's link", "route": "its traffic is routed over it",
            "leaf_span": "it spans this leaf and another (no forwarding tables)"}.get(
        str(how), printable(how))


def job_link_lines(jobs: Mapping[str, Any] | None) -> list[str]:
    """The lines ``ibmon explain`` prints for the ``jobs`` part of a port's answer."""
    if not jobs or not jobs.get("source"):
        return []
    if not jobs.get("known"):
        return ["jobs on this link: unknown (the scheduler could not be asked)"]
    listed: Sequence[Mapping[str, Any]] = jobs.get("list") or []
    total = int(jobs.get("total") or 0)
    if not total:
        return ["jobs on this link: none running"]
    lines = [f"jobs on this link ({total}):"]
    for j in listed:
        lines.append(f"  {printable(j.get('id'))} {printable(j.get('user', ''))} "
                     f"{printable(j.get('name', ''))}: {_how(j.get('how'))}")
    if total > len(listed):
        lines.append(f"  ... and {total - len(listed)} more (ibmon jobs)")
    return lines
