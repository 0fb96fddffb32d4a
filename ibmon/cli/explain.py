"""``ibmon explain PORT``: one port and its link, as a short report, from a running daemon.

PORT is what a person has at hand when paged: ``GUID/PORT`` (``0x0002c90300a1b2c3/12``), the
node description and port as ibmon and the infiniband-diags print them
(``"leaf07"[12]``, ``leaf07[12]``), or a host's HCA (``gpu031/mlx5_0``: the CA whose node
description is ``gpu031 mlx5_0``, at its first active port, as the diags tools pick it). Names
are resolved against ``/api/v1/topology``; the report is ``/api/v1/ports/{guid}/{port}``:
both ends, the link, what is firing and why, the detail breakdown, what to check first and
the recent events of both ends, and the jobs on the link and how they touch it. Every string
from the fabric or the scheduler is shown through ``printable``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ibmon.cli.apiclient import ApiClient, ApiError
from ibmon.cli.jobs import job_link_lines
from ibmon.cli.terminal import ber_text, printable, time_text
from ibmon.detect.cause import DETAIL_LABELS, MEANINGS
from ibmon.infiniband.model import PortState, normalize_guid

__all__ = ["find_port", "parse_port_spec", "render_report", "resolve"]

_GUID_PORT = re.compile(r"^(?P<guid>(?:0x)?[0-9a-fA-F:]{1,39})/(?P<port>\d{1,3})$")
_DESC_PORT = re.compile(r'^"?(?P<desc>.+?)"?\s*\[(?P<port>\d{1,3})\]$')
_HOST_DEV = re.compile(r"^(?P<host>[^/\s\[\]]+)/(?P<dev>[^/\s\[\]]+)$")
_NAME = re.compile(r'^"?(?P<name>[^/\[\]"]+?)"?$')
_ACTIVE = int(PortState.ACTIVE)


def parse_port_spec(spec: str) -> tuple[str, str, str]:
    """``("guid", guid, port)``, ``("desc", description, port)``, ``("ca", host, device)`` or
    ``("name", a node's GUID, description or host name, "")``.

    ValueError (a usage mistake) for anything else.
    """
    text = spec.strip()
    m = _GUID_PORT.match(text)
    if m and (guid := _as_guid(m.group("guid"))) is not None:
        return "guid", guid, str(int(m.group("port")))
    m = _DESC_PORT.match(text)
    if m:
        return "desc", m.group("desc"), str(int(m.group("port")))
    m = _HOST_DEV.match(text)
    if m:
        return "ca", m.group("host"), m.group("dev")
    m = _NAME.match(text)
    if m:
        return "name", m.group("name").strip(), ""
    raise ValueError(f"PORT {spec!r} is not GUID/PORT, \"node description\"[port], "
                     "hostname/device or a node's name")


def find_port(kind: str, a: str, b: str,
              nodes: Iterable[Mapping[str, Any]]) -> tuple[str, str]:
    """The ``(guid, port)`` a description, host/device or name names among topology nodes.

    A name is a node's GUID or whole description, else the host name its CAs' descriptions
    start with (``gpu031`` for ``gpu031 mlx5_0``); it picks a CA's first active port, and a
    switch's port or one of a host's several CAs must be named."""
    nodes = list(nodes)
    guid = _as_guid(a) if kind == "name" else None
    hits: list[Mapping[str, Any]] = []
    for node in nodes:
        desc = str(node.get("node_desc", ""))
        if kind in ("desc", "name"):
            match = desc == a or (guid is not None and node.get("guid") == guid)
        else:  # host/device: "host dev" as node descriptions say it, or host + device
            match = desc == f"{a} {b}" or (
                desc.split(" ", 1)[0] == a and str(node.get("device", "")) == b)
        if match:
            hits.append(node)
    if kind == "name" and not hits:  # a host name: its CAs
        hits = [n for n in nodes if n.get("node_type", "ca") == "ca"
                and str(n.get("node_desc", "")).split(" ", 1)[0] == a]
        if len(hits) > 1:
            names = ", ".join(f"{a}/{n.get('device') or n['guid']}" for n in hits[:5])
            raise ApiError(f"{a!r} has {len(hits)} CAs: name one ({names})")
    what = f"{a}/{b}" if kind == "ca" else a
    if not hits:
        raise ApiError(f"no node {what!r} in the daemon's fabric")
    if len(hits) > 1:
        guids = ", ".join(str(n["guid"]) for n in hits[:5])
        raise ApiError(f"{what!r} names {len(hits)} nodes ({guids}): give GUID/PORT")
    node = hits[0]
    if kind == "name" and node.get("node_type", "ca") != "ca":
        raise ApiError(f"{what!r} is a {node.get('node_type')}: name its port "
                       f"(\"{what}\"[N], e.g. from ibmon top)")
    ports: Sequence[Mapping[str, Any]] = node.get("ports", [])
    numbers = [str(p["port"]) for p in ports]
    if kind == "desc":
        if b not in numbers:
            raise ApiError(f"{what!r} has no port {b} (ports {', '.join(numbers) or 'none'})")
        return str(node["guid"]), b
    active = [str(p["port"]) for p in ports if p.get("state") == _ACTIVE]
    if not active and not numbers:
        raise ApiError(f"{what!r} has no ports the daemon knows")
    return str(node["guid"]), (active or numbers)[0]


def _as_guid(text: str) -> str | None:
    try:
        return normalize_guid(text)
    except ValueError:
        return None


def resolve(client: ApiClient, spec: str) -> tuple[str, str]:
    kind, a, b = parse_port_spec(spec)
    if kind == "guid":
        return a, b
    nodes = (n for page in client.pages("/api/v1/topology") for n in page.get("nodes", []))
    return find_port(kind, a, b, nodes)


# --- the report ----------------------------------------------------------------------------------


def _name(end: Mapping[str, Any] | None) -> str:
    if not end:
        return "(no link known)"
    desc = end.get("node_desc") or end.get("device") or end.get("guid")
    return printable(f"{desc} port {end.get('port')}")


def _state(end: Mapping[str, Any]) -> str:
    if end.get("seen") is False:
        return "not seen by this daemon"
    name = end.get("state_name") or "?"
    if end.get("state") != _ACTIVE and end.get("phys_state_name"):
        name += f"/{end['phys_state_name']}"
    return printable(name + (" (stale: did not answer the last poll)" if end.get("stale") else ""))


def _pct(x: Any) -> str:
    return "-" if x is None else f"{float(x) * 100:.1f} %"


def _breakdown_lines(end: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    for aggregate, label in (("receive_errors", "receive errors"),
                             ("transmit_discards", "transmit discards")):
        part = (end.get("breakdown") or {}).get(aggregate) or {}
        total = part.get("total")
        details = {k: v for k, v in (part.get("details") or {}).items() if v}
        if not total and not details:
            continue
        text = f"{label} {total:,}" if isinstance(total, int) else label
        if details:
            text += ": " + ", ".join(f"{DETAIL_LABELS.get(k, k)} {v:,}"
                                     for k, v in sorted(details.items(), key=lambda kv: -kv[1]))
        elif part.get("details") == {}:
            text += " (no detail counters on this port)"
        out.append(text)
    return out


def render_report(detail: Mapping[str, Any]) -> str:
    """The plain-text report of one ``/api/v1/ports/{guid}/{port}`` answer."""
    port = detail["port"]
    peer = detail.get("peer")
    link = detail.get("link")
    lines = [f"{_name(port)} ({port['guid']}/{port['port']}, {printable(port.get('node_type'))}"
             f"{', LID ' + str(port['lid']) if port.get('lid') is not None else ''})"]
    if peer:
        lines.append(f"  linked to {_name(peer)} ({peer['guid']}/{peer['port']})")
    lines.append(f"  state: {_state(port)}" + (f"; far end: {_state(peer)}" if peer else ""))
    if link:
        speed = f"{link.get('active_width')} {link.get('active_speed')}".strip()
        best = f"{link.get('best_width')} {link.get('best_speed')}".strip()
        text = f"  link: {printable(speed or '?')}"
        if best:
            text += f" (best both ends support: {printable(best)})"
        if link.get("degraded"):
            text += " DEGRADED"
        lines.append(text)
    util = port.get("utilization") or {}
    lines.append(f"  now: tx {_pct(util.get('transmit'))}, rx {_pct(util.get('receive'))}, "
                 f"transmit wait {_pct(port.get('transmit_wait_ratio'))}, "
                 f"BER {ber_text(port.get('symbol_error_ber'))}"
                 + (f" (far end {ber_text(peer.get('symbol_error_ber'))})"
                    if peer and peer.get("seen") is not False else ""))
    for end, who in ((port, "here"), (peer, "far end")):
        if end and end.get("seen") is not False:
            for text in _breakdown_lines(end):
                lines.append(f"  {who}: {text}")
    conditions = detail.get("conditions") or []
    if not conditions:
        lines.append("no conditions firing on either end")
    else:
        lines.append("firing:")
        for c in conditions:
            where = "" if c.get("on") == "port" else " (carried by the far end)"
            lines.append(f"  {printable(c.get('type'))} {printable(c.get('severity'))}, "
                         f"firing since {time_text(c.get('since'))}{where}: likely cause "
                         f"{printable(c.get('cause') or 'unknown')}")
            if c.get("message"):
                lines.append(f"    {printable(c['message'])}")
            bd = {k: v for k, v in (c.get("breakdown") or {}).items() if v}
            if bd:
                lines.append("    breakdown: " + ", ".join(
                    f"{DETAIL_LABELS.get(k, k.replace('_', ' '))} {v:,}" for k, v in bd.items()))
            cause = c.get("cause")
            if cause in MEANINGS:
                lines.append(f"    {cause}: {MEANINGS[cause]}")
            if c.get("action"):
                lines.append(f"    first: {printable(c['action'])}")
    lines += job_link_lines(detail.get("jobs"))
    events = detail.get("events") or []
    if events:
        lines.append("recent events (both ends):")
        for e in events[-10:]:
            lines.append(f"  {time_text(e.get('time'))} "
                         f"{printable(e.get('status'))} {printable(e.get('severity'))} "
                         f"{printable(e.get('type'))}: {printable(e.get('message'))}")
    return "\n".join(lines) + "\n"

