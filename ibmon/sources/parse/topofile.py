"""Plain ``ibnetdiscover`` output, the topology-file format (also what ``ibsim -s`` loads)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ibmon.model import normalize_guid
from ibmon.sources.parse.discovered import DiscoveredPort, link_speed

__all__ = ["looks_like_topology_file", "parse_topology_file"]

_TOPO_HEADER = re.compile(
    r'^(?P<t>Switch|Ca|Hca|Rt)\s+(?P<n>\d+)\s+"(?P<id>[^"]*)"\s*(?P<rest>.*)$'
)
_TOPO_PORT = re.compile(
    r'^\[(?P<p>\d+)\](?:\((?P<pg>[0-9a-fA-F]+)\))?\s*"(?P<rid>[^"]*)"\[(?P<rp>\d+)\]'
    r"(?:\((?P<rpg>[0-9a-fA-F]+)\))?\s*(?P<rest>.*)$"
)
_TOPO_GUIDLINE = re.compile(r"^(switchguid|caguid|rtguid)=(0x[0-9a-fA-F]+)")
_TOPO_IGNORED = re.compile(r"^(vendid|devid|sysimgguid|Non-Chassis|Chassis)")
_LID = re.compile(r"\blid\s+(\d+)")
_SPEC = re.compile(r"\b(\d+)x([A-Za-z0-9?]+)\b")
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
_ID_GUID = re.compile(r"^[SHR]-([0-9a-fA-F]{1,16})$")


@dataclass(frozen=True, slots=True)
class _Node:
    guid: str
    node_type: str
    desc: str
    lid: int | None  # switches only: the base LID of the record


@dataclass(frozen=True, slots=True)
class _PortLine:
    node_id: str
    port: int
    remote_id: str
    remote_port: int
    rest: str


def looks_like_topology_file(line: str) -> bool:
    """Whether a (stripped) line can only come from the topology-file format."""
    return bool(_TOPO_HEADER.match(line) or _TOPO_GUIDLINE.match(line))


def _id_guid(nid: str) -> str | None:
    m = _ID_GUID.match(nid)
    return normalize_guid(m.group(1)) if m else None


def _node(hm: re.Match[str], guid: str) -> _Node:
    t = hm.group("t")
    ntype = "switch" if t == "Switch" else "router" if t == "Rt" else "ca"
    rest = hm.group("rest")
    q = _QUOTED.search(rest)
    lm = _LID.search(rest)
    lid = int(lm.group(1)) if lm and ntype == "switch" else None
    return _Node(guid, ntype, q.group(1) if q else "", lid)


def _records(text: str) -> tuple[dict[str, _Node], list[_PortLine], list[str]]:
    """First pass: node records by id, their port lines, and the lines that fit neither."""
    stray: list[str] = []
    nodes: dict[str, _Node] = {}
    ports: list[_PortLine] = []
    pending_guid: str | None = None
    cur: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or _TOPO_IGNORED.match(line):
            continue
        if gm := _TOPO_GUIDLINE.match(line):
            pending_guid = normalize_guid(gm.group(2))
            continue
        if hm := _TOPO_HEADER.match(line):
            guid = pending_guid or _id_guid(hm.group("id"))
            pending_guid = None
            cur = None
            if guid is None:
                stray.append(raw)
                continue
            cur = hm.group("id")
            nodes[cur] = _node(hm, guid)
            continue
        pm = _TOPO_PORT.match(line)
        if pm and cur is not None:
            ports.append(
                _PortLine(cur, int(pm.group("p")), pm.group("rid"), int(pm.group("rp")),
                          pm.group("rest"))
            )
            continue
        stray.append(raw)
    return nodes, ports, stray


def _resolve(pl: _PortLine, nodes: dict[str, _Node]) -> DiscoveredPort | None:
    """One port line with its peer, or None when the peer's GUID cannot be known."""
    node = nodes[pl.node_id]
    bare = _QUOTED.sub(" ", pl.rest)
    spec = _SPEC.search(bare)
    lids = [int(x) for x in _LID.findall(bare)]
    lid = lids[0] if node.node_type != "switch" and lids else node.lid
    remote = nodes.get(pl.remote_id)
    rguid = remote.guid if remote else _id_guid(pl.remote_id)
    if rguid is None:
        return None
    if remote is not None:
        rtype, rdesc = remote.node_type, remote.desc
    else:
        q = _QUOTED.search(pl.rest)
        rtype = "switch" if pl.remote_id.startswith("S-") else "ca"
        rdesc = q.group(1) if q else ""
    return DiscoveredPort(
        guid=node.guid,
        port=pl.port,
        node_type=node.node_type,
        lid=lid,
        desc=node.desc,
        width=f"{int(spec.group(1))}X" if spec else "",
        speed=link_speed(spec.group(2)) if spec else "",
        remote_guid=rguid,
        remote_port=pl.remote_port,
        remote_type=rtype,
        remote_lid=lids[-1] if lids else None,
        remote_desc=rdesc,
    )


def parse_topology_file(text: str) -> tuple[list[DiscoveredPort], list[str]]:
    """Plain ``ibnetdiscover`` output (the topology file format) -> connected ports.

    Node records give type, id, description, and for switches the base LID; each port line
    gives the peer id and port, the link's width and speed and, on CA records, the local LID.
    Node GUIDs come from ``switchguid=``/``caguid=`` lines or the ``S-``/``H-`` ids.
    """
    nodes, lines, stray = _records(text)
    out = [p for pl in lines if (p := _resolve(pl, nodes)) is not None]
    return out, stray
