"""The fabric as nodes and links: ``GET /api/v1/topology`` and ``ibmon topology``.

The daemon side (``node_rows``, ``link_json``) turns one FabricState into nodes (every port of a
node, with its state and conditions) and links (each cabled pair of ports once, with the active
width and speed against the best both ends support and enable, and the conditions of either
end). The client side (``to_dot``) draws what the API returned as Graphviz DOT: faulty links
red and thick, congested ones orange, links that are down dashed grey, degraded ones labelled
with their width and speed, so ``dot -Tsvg`` gives a map of a whole fabric where the few links
that matter stand out of thousands that do not.

Node descriptions are untrusted text: they are JSON strings in the API and quoted, escaped DOT
strings (``dot_quote``) in the drawing, never DOT syntax.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

from ibmon.infiniband.linkspeed import SPEED_ORDER, WIDTH_LANES
from ibmon.infiniband.model import PortKey, PortState, PortView
from ibmon.state import FabricState

__all__ = [
    "CONGESTED",
    "FAULTS",
    "dot_quote",
    "link_json",
    "node_rows",
    "to_dot",
]

#: Conditions that make a link faulty (red on the map); congestion is drawn on its own.
FAULTS: Final = frozenset({"down", "degraded", "flapping", "high_ber", "link_integrity",
                           "receive_errors", "discards"})
CONGESTED: Final = frozenset({"congestion"})
_ACTIVE: Final = int(PortState.ACTIVE)
_SPEED_RANK: Final = {name: i for i, name in enumerate(SPEED_ORDER)}


def _end_key(view: PortView) -> PortKey | None:
    link = view.link
    if link is None or not link.remote_guid:
        return None
    return (link.remote_guid, link.remote_port)


def _degraded(width: str, speed: str, best_width: str, best_speed: str) -> bool | None:
    lanes, best = WIDTH_LANES.get(width), WIDTH_LANES.get(best_width)
    rank, best_rank = _SPEED_RANK.get(speed), _SPEED_RANK.get(best_speed)
    if lanes is None or best is None or rank is None or best_rank is None:
        return None
    return lanes < best or rank < best_rank


def link_json(view: PortView, peer: PortView | None) -> dict[str, Any]:
    """One link, seen from ``view`` (the lower key of the two ends when both are known)."""
    link = view.link
    assert link is not None
    width = link.active_width or view.active_width
    speed = link.active_speed or view.active_speed
    conditions = sorted(view.conditions | (peer.conditions if peer is not None else set()))
    states = [view.state] + ([peer.state] if peer is not None else [])
    up = all(s == _ACTIVE for s in states if s is not None) and view.state == _ACTIVE
    return {
        "a": {"guid": view.identity.guid, "port": view.identity.port},
        "b": {"guid": link.remote_guid, "port": link.remote_port,
              "node_desc": link.remote_node_desc, "seen": peer is not None},
        "state": "active" if up else "down",
        "active_width": width, "active_speed": speed,
        "best_width": link.max_width, "best_speed": link.max_speed,
        "degraded": _degraded(width, speed, link.max_width, link.max_speed),
        "conditions": conditions,
        "faulty": bool(FAULTS.intersection(conditions)),
        "congested": bool(CONGESTED.intersection(conditions)),
        "utilization": max(view.utilization_tx or 0.0, view.utilization_rx or 0.0,
                           (peer.utilization_tx or 0.0) if peer else 0.0,
                           (peer.utilization_rx or 0.0) if peer else 0.0),
    }


def _port_json(view: PortView) -> dict[str, Any]:
    remote = _end_key(view)
    return {
        "port": view.identity.port, "state": view.state, "phys_state": view.phys_state,
        "active_width": view.active_width, "active_speed": view.active_speed,
        "lid": view.identity.lid, "stale": view.stale,
        "remote": None if remote is None else {"guid": remote[0], "port": remote[1]},
        "conditions": sorted(view.conditions), "causes": dict(sorted(view.causes.items())),
    }


def node_rows(state: FabricState) -> list[tuple[str, dict[str, Any]]]:
    """Every node of the state as ``(guid, json)`` in GUID order, each with its links.

    A link belongs to the node of its lower end (GUID, then port number), so walking all nodes
    lists every link once; a link whose far end the source does not see belongs to the end it
    does see.
    """
    ports = state.ports
    by_node: dict[str, list[PortView]] = {}
    for view in ports.values():
        by_node.setdefault(view.identity.guid, []).append(view)
    rows: list[tuple[str, dict[str, Any]]] = []
    for guid in sorted(by_node):
        views = sorted(by_node[guid], key=lambda v: (len(v.identity.port), v.identity.port))
        first = views[0].identity
        links: list[dict[str, Any]] = []
        for v in views:
            remote = _end_key(v)
            if remote is None:
                continue
            peer = ports.get(remote)
            if peer is not None and _order(remote) < _order(v.key):
                continue  # listed with the other end
            links.append(link_json(v, peer))
        rows.append((guid, {
            "guid": guid, "node_desc": first.node_desc, "node_type": first.node_type,
            "device": first.device,
            "ports": [_port_json(v) for v in views], "links": links,
        }))
    return rows


def _order(key: PortKey) -> tuple[str, int, str]:
    return (key[0], len(key[1]), key[1])


# --- DOT -----------------------------------------------------------------------------------------


def dot_quote(text: str) -> str:
    """A DOT double-quoted string: quotes and backslashes escaped, controls dropped."""
    clean = "".join(ch if ch.isprintable() else " " for ch in str(text))
    return '"' + clean.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _node_label(node: Mapping[str, Any]) -> str:
    return str(node.get("node_desc") or node.get("device") or node.get("guid"))


#: Drawn size of a host (label width) and of a row (height plus rank separation), inches:
#: what ``_hosts_per_row`` balances so the whole map comes out about as wide as high.
_HOST_WIDTH: Final = 1.0
_ROW_HEIGHT: Final = 0.8


def _hosts_per_row(blocks: Mapping[str, Sequence[str]]) -> int:
    """Hosts per row under their switch, so the map is roughly square: L blocks of h hosts in
    rows of r are ``L*r*W`` wide and ``h/r*H`` high, equal at ``r = sqrt(h*H / (L*W))``."""
    if not blocks:
        return 1
    h = max(len(set(v)) for v in blocks.values())
    return max(1, round(math.sqrt(h * _ROW_HEIGHT / (len(blocks) * _HOST_WIDTH))))


def _levels(nodes: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Hop distance of each node from the nearest host (hosts 0, leaves 1, spines 2...), so the
    drawing puts the top of the fabric at the top whatever the GUIDs are."""
    adj: dict[str, set[str]] = {}
    for node in nodes:
        for link in node.get("links", ()):
            a, b = str(link["a"]["guid"]), str(link["b"]["guid"])
            adj.setdefault(a, set()).add(b)
            adj.setdefault(b, set()).add(a)
    level = {str(n["guid"]): 0 for n in nodes if n.get("node_type") != "switch"}
    frontier = list(level)
    while frontier:
        nxt: list[str] = []
        for guid in frontier:
            for other in adj.get(guid, ()):
                if other not in level:
                    level[other] = level[guid] + 1
                    nxt.append(other)
        frontier = nxt
    top = max(level.values(), default=0) + 1
    for guid in adj:
        level.setdefault(guid, top)
    return level


def to_dot(nodes: Sequence[Mapping[str, Any]], *, name: str = "ibmon") -> str:
    """Graphviz DOT for the nodes (and their links) of ``/api/v1/topology``.

    Switches are boxes, hosts small ellipses in blocks under their switch; a link is grey when
    healthy, red and thick when either end has a fault condition, orange when congested, dashed
    when down, and labelled with its width and speed against the best when degraded. The top
    of the fabric (farthest from the hosts) is drawn at the top.
    """
    known = {str(n["guid"]) for n in nodes}
    level = _levels(nodes)
    out = [
        f"graph {dot_quote(name)} {{",
        '  graph [rankdir=TB, splines=false, outputorder=edgesfirst, nodesep=0.08, '
        'ranksep=0.6, fontname="Helvetica"];',
        '  node [fontname="Helvetica", fontsize=8, height=0.2, margin="0.02,0.01"];',
        '  edge [color="#b0b0b0", penwidth=0.5];',
    ]
    stubs: dict[str, str] = {}
    under: dict[str, list[str]] = {}
    for node in nodes:
        guid = str(node["guid"])
        faulty = any(set(p.get("conditions", ())) & FAULTS for p in node.get("ports", ()))
        if node.get("node_type") == "switch":
            shape = "shape=box"
        else:
            shape = "shape=ellipse, fontsize=6, height=0.1"
        colour = ", color=red, fontcolor=red" if faulty else ""
        out.append(f"  {dot_quote(guid)} [label={dot_quote(_node_label(node))}, "
                   f"{shape}{colour}];")
    for node in nodes:
        for link in node.get("links", ()):
            a, b = link["a"], link["b"]
            ga, gb = str(a["guid"]), str(b["guid"])
            if gb not in known and gb not in stubs:
                stubs[gb] = str(b.get("node_desc") or gb)
            if level.get(ga, 0) < level.get(gb, 0):  # the upper end first: it ranks above
                a, b, ga, gb = b, a, gb, ga
            if level.get(gb, 1) == 0:
                under.setdefault(ga, []).append(gb)
            attrs = []
            if link.get("faulty"):
                attrs += ["color=red", "penwidth=3"]
            elif link.get("congested"):
                attrs += ['color="#ff8c00"', "penwidth=2"]
            if link.get("state") != "active":
                attrs += ["style=dashed"]
                if not link.get("faulty"):
                    attrs += ['color="#808080"']
            if link.get("degraded"):
                attrs.append("label=" + dot_quote(
                    f"{link.get('active_width')} {link.get('active_speed')} "
                    f"(could be {link.get('best_width')} {link.get('best_speed')})"))
                attrs.append("fontsize=7")
            if link.get("conditions"):
                attrs.append("tooltip=" + dot_quote(", ".join(link["conditions"])))
            ends = f"{dot_quote(ga)} -- {dot_quote(gb)}"
            ports = (f"taillabel={dot_quote(str(a['port']))}, "
                     f"headlabel={dot_quote(str(b['port']))}, labelfontsize=6")
            out.append(f"  {ends} [{ports}{', ' + ', '.join(attrs) if attrs else ''}];")
    for guid, label in sorted(stubs.items()):
        out.append(f"  {dot_quote(guid)} [label={dot_quote(label)}, style=dashed];")
    # A switch's hosts in rows: invisible edges stack each row under the one before, so a leaf
    # with 40 hosts is a block several rows deep instead of 40 nodes wide, and the map of a
    # big fabric is about as high as wide. Each block is a cluster: blocks do not interleave.
    per_row = _hosts_per_row(under)
    for n, members in enumerate(v for _, v in sorted(under.items())):
        hosts = sorted(set(members))
        out.append(f"  subgraph cluster_{n} {{ graph [style=invis]; "
                   + " ".join(dot_quote(h) + ";" for h in hosts))
        for i in range(len(hosts) - per_row):
            out.append(f"    {dot_quote(hosts[i])} -- {dot_quote(hosts[i + per_row])} "
                       "[style=invis];")
        out.append("  }")
    out.append("}")
    return "\n".join(out) + "\n"
