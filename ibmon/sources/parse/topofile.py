"""Plain ``ibnetdiscover`` output, the topology-file format (also what ``ibsim -s`` loads).

Read strictly (``ibmon.sources.parse.errors``): a line that is not a comment, an attribute
line, a node header or a port line of the current node, a node or port given twice, or a peer
whose GUID cannot be known rejects the whole file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ibmon.infiniband.model import normalize_guid
from ibmon.sources.parse.discovered import DiscoveredPort, link_speed
from ibmon.sources.parse.errors import ParseError, require_whole_lines

__all__ = ["looks_like_topology_file", "parse_topology_file"]

_TOPO_HEADER = re.compile(
    r'^(?P<t>Switch|Ca|Hca|Rt)\s+(?P<n>\d{1,3})\s+"(?P<id>[^"]*)"\s*(?P<rest>.*)$'
)
_TOPO_PORT = re.compile(
    r'^\[(?P<p>\d{1,3})\](?:\((?P<pg>[0-9a-fA-F]{1,16})\))?\s*"(?P<rid>[^"]*)"\[(?P<rp>\d{1,3})\]'
    r"(?:\((?P<rpg>[0-9a-fA-F]{1,16})\))?\s*(?P<rest>.*)$"
)
_TOPO_GUIDLINE = re.compile(
    r"^(switchguid|caguid|rtguid)=(0x[0-9a-fA-F]{1,16})(?:\([0-9a-fA-F]{1,16}\))?$"
)
_TOPO_IGNORED = re.compile(
    r"^(?:(?:vendid|devid|sysimgguid)=0x[0-9a-fA-F]{1,16}|Non-Chassis Nodes|Chassis\b.*)$"
)
_LID = re.compile(r"\blid\s+(\d{1,6})\b")
_SPEC = re.compile(r"\b(\d{1,2})x([A-Za-z0-9?]+)\b")
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
_ID_GUID = re.compile(r"^[SHR]-([0-9a-fA-F]{1,16})$")
_MAX_PORT = 254
_MAX_LID = 0xFFFF


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
    line: int


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
    if lid is not None and lid > _MAX_LID:
        raise ParseError(f"LID {lid} out of range", text=hm.group(0))
    return _Node(guid, ntype, q.group(1) if q else "", lid)


def _records(text: str) -> tuple[dict[str, _Node], list[_PortLine]]:
    """First pass: node records by id and their port lines; anything else is refused."""
    require_whole_lines(text)
    nodes: dict[str, _Node] = {}
    ports: list[_PortLine] = []
    seen_ports: set[tuple[str, int]] = set()
    pending_guid: str | None = None
    cur: str | None = None
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#") or _TOPO_IGNORED.match(line):
            continue
        if gm := _TOPO_GUIDLINE.match(line):
            pending_guid = normalize_guid(gm.group(2))
            continue
        if hm := _TOPO_HEADER.match(line):
            guid = pending_guid or _id_guid(hm.group("id"))
            pending_guid = None
            if guid is None:
                raise ParseError("a node record without a GUID", line=lineno, text=raw)
            if not _is_comment(hm.group("rest")):
                raise ParseError("unreadable text after a node header", line=lineno, text=raw)
            cur = hm.group("id")
            if cur in nodes:
                raise ParseError(f"node {cur!r} recorded twice", line=lineno, text=raw)
            nodes[cur] = _node(hm, guid)
            continue
        pm = _TOPO_PORT.match(line)
        if pm is None:
            raise ParseError("not a topology-file line", line=lineno, text=raw)
        if cur is None:
            raise ParseError("a port line outside a node record", line=lineno, text=raw)
        port, rport = int(pm.group("p")), int(pm.group("rp"))
        if not (1 <= port <= _MAX_PORT and 1 <= rport <= _MAX_PORT):
            raise ParseError("port number out of range", line=lineno, text=raw)
        if not _is_comment(pm.group("rest")):
            raise ParseError("unreadable text after a port", line=lineno, text=raw)
        if (cur, port) in seen_ports:
            raise ParseError(f"port {port} of {cur!r} given twice", line=lineno, text=raw)
        seen_ports.add((cur, port))
        ports.append(_PortLine(cur, port, pm.group("rid"), rport, pm.group("rest"), lineno))
    return nodes, ports


def _is_comment(rest: str) -> bool:
    """What may follow a header or a port: nothing, or a ``#`` comment."""
    rest = rest.strip()
    return not rest or rest.startswith("#")


def _resolve(pl: _PortLine, nodes: dict[str, _Node]) -> DiscoveredPort:
    """One port line with its peer; ParseError when the peer's GUID cannot be known."""
    node = nodes[pl.node_id]
    bare = _QUOTED.sub(" ", pl.rest)
    spec = _SPEC.search(bare)
    lids = [int(x) for x in _LID.findall(bare)]
    if any(x > _MAX_LID for x in lids):
        raise ParseError("LID out of range", line=pl.line, text=pl.rest)
    lid = lids[0] if node.node_type != "switch" and lids else node.lid
    if spec and int(spec.group(1)) not in (1, 2, 4, 8, 12):
        raise ParseError(f"link width {spec.group(1)}x does not exist", line=pl.line)
    remote = nodes.get(pl.remote_id)
    rguid = remote.guid if remote else _id_guid(pl.remote_id)
    if rguid is None:
        raise ParseError(f"peer {pl.remote_id!r} is neither a record nor a GUID id",
                         line=pl.line)
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


def parse_topology_file(text: str) -> list[DiscoveredPort]:
    """Plain ``ibnetdiscover`` output (the topology file format) -> connected ports.

    Node records give type, id, description, and for switches the base LID; each port line
    gives the peer id and port, the link's width and speed and, on CA records, the local LID.
    Node GUIDs come from ``switchguid=``/``caguid=`` lines or the ``S-``/``H-`` ids. Strict:
    ParseError for the whole file (see the module docstring).
    """
    nodes, lines = _records(text)
    return [_resolve(pl, nodes) for pl in lines]
