"""``ibnetdiscover -p`` (the ports format the ``diags`` source reads), and format detection.

The plain topology-file format is in ``topofile``; ``parse_ibnetdiscover`` picks either by
content. Both read strictly (``ibmon.sources.parse.errors``): the whole output or nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ibmon.infiniband.model import normalize_guid
from ibmon.sources.parse.discovered import TEXT_TYPES, DiscoveredPort, link_speed
from ibmon.sources.parse.errors import ParseError, require_whole_lines
from ibmon.sources.parse.topofile import looks_like_topology_file, parse_topology_file

__all__ = ["LINK_WIDTHS", "MAX_LID", "MAX_PORT", "parse_ibnetdiscover", "parse_ibnetdiscover_ports"]

_ADDR = r"(?P<t>CA|SW|RT)\s+(?P<lid>\d{1,5})\s+(?P<port>\d{1,3})\s+(?P<guid>0x[0-9a-fA-F]{1,16})"
_PORTS_LINE = re.compile(rf"^{_ADDR}\s+(?P<w>\d{{1,2}})x\s+(?P<s>[A-Za-z0-9?]+)(?P<rest>.*)$")
_PORTS_REMOTE = re.compile(
    rf"^\s*-\s+{_ADDR}\s+\(\s*'(?P<descs>.*)'\s*\)\s*$"
)
#: Widths a port can train to (LinkWidthActive), as ibnetdiscover prints them.
LINK_WIDTHS = frozenset({1, 2, 4, 8, 12})
MAX_LID = 0xFFFF
#: Port numbers ibnetdiscover prints: 1..254 (switch port 0 has no link; 255 is reserved).
MAX_PORT = 254

#: One port line: the local match, the remote match (None: not connected), the candidate
#: (local, remote) description splits of a link line, and the description of an unlinked port.
_Line = tuple[re.Match[str], re.Match[str] | None, list[tuple[str, str]], str]


class _Votes:
    """How often each description was seen for a GUID, to settle ambiguous splits."""

    def __init__(self) -> None:
        self._by_guid: dict[str, dict[str, int]] = {}

    def add(self, guid: str, desc: str, weight: int = 1) -> None:
        d = self._by_guid.setdefault(guid.lower(), {})
        d[desc] = d.get(desc, 0) + weight

    def best(self, lg: str, rg: str, cands: Iterable[tuple[str, str]]) -> tuple[str, str]:
        lv, rv = self._by_guid.get(lg.lower(), {}), self._by_guid.get(rg.lower(), {})
        return max(cands, key=lambda c: lv.get(c[0], 0) + rv.get(c[1], 0))


def _check_addr(m: re.Match[str], lineno: int, raw: str) -> None:
    """LID and port number within what the protocol allows."""
    if int(m.group("lid")) > MAX_LID:
        raise ParseError(f"LID {m.group('lid')} out of range", line=lineno, text=raw)
    if not 1 <= int(m.group("port")) <= MAX_PORT:
        raise ParseError(f"port {m.group('port')} out of range", line=lineno, text=raw)


def _scan(text: str) -> tuple[list[_Line], _Votes]:
    """First pass: match every line, collect description candidates and their votes."""
    require_whole_lines(text)
    lines: list[_Line] = []
    votes = _Votes()
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        m = _PORTS_LINE.match(line)
        if not m:
            raise ParseError("not an ibnetdiscover -p port line", line=lineno, text=raw)
        _check_addr(m, lineno, raw)
        if int(m.group("w")) not in LINK_WIDTHS:
            raise ParseError(f"link width {m.group('w')}x does not exist", line=lineno, text=raw)
        rest = m.group("rest")
        if rest.strip().startswith("-"):
            rm = _PORTS_REMOTE.match(rest)
            if rm is None:
                raise ParseError("unreadable far end of a link", line=lineno, text=raw)
            _check_addr(rm, lineno, raw)
            descs = rm.group("descs")
            cands = [(descs[: s.start()], descs[s.end() :]) for s in re.finditer(r"' - '", descs)]
            if not cands:
                raise ParseError("link line without both descriptions", line=lineno, text=raw)
            if len(cands) == 1:
                votes.add(m.group("guid"), cands[0][0], 2)
                votes.add(rm.group("guid"), cands[0][1], 2)
            lines.append((m, rm, cands, ""))
        else:
            solo = rest.strip()
            if solo.startswith("'"):
                if len(solo) < 2 or not solo.endswith("'"):
                    raise ParseError("unbalanced quotes around a description", line=lineno,
                                     text=raw)
                solo = solo[1:-1]
            votes.add(m.group("guid"), solo, 2)
            lines.append((m, None, [], solo))
    return lines, votes


def _check_consistent(ports: list[DiscoveredPort]) -> None:
    """Refuse output whose lines contradict each other (one node, two types; a switch with two
    LIDs; a port on two lines; two ports claiming one peer; a link whose ends disagree)."""
    types: dict[str, str] = {}
    switch_lids: dict[str, int | None] = {}
    by_key: dict[tuple[str, int], DiscoveredPort] = {}
    peers: dict[tuple[str, int], tuple[str, int]] = {}

    def node(guid: str, ntype: str, lid: int | None, where: str) -> None:
        if types.setdefault(guid, ntype) != ntype:
            raise ParseError(f"{guid} is both {types[guid]} and {ntype} ({where})")
        if ntype == "switch" and switch_lids.setdefault(guid, lid) != lid:
            raise ParseError(f"switch {guid} has LIDs {switch_lids[guid]} and {lid} ({where})")

    for p in ports:
        key = (p.guid, p.port)
        where = f"{p.guid} port {p.port}"
        if key in by_key:
            raise ParseError(f"{where} printed twice")
        by_key[key] = p
        node(p.guid, p.node_type, p.lid, where)
        if p.remote_guid is None or p.remote_port is None or p.remote_type is None:
            continue
        node(p.remote_guid, p.remote_type, p.remote_lid, f"far end of {where}")
        far = (p.remote_guid, p.remote_port)
        if peers.setdefault(far, key) != key:
            raise ParseError(f"{far[0]} port {far[1]} is the far end of two ports")
    for key, p in by_key.items():
        if p.remote_guid is None or p.remote_port is None:
            continue
        back = by_key.get((p.remote_guid, p.remote_port))
        if back is None:
            continue  # an excerpt: the far end's own line is not part of this output
        if (back.remote_guid, back.remote_port) != key or back.lid != p.remote_lid:
            raise ParseError(
                f"{key[0]} port {key[1]} and {p.remote_guid} port {p.remote_port} "
                "disagree about their link"
            )


def parse_ibnetdiscover_ports(text: str) -> list[DiscoveredPort]:
    """``ibnetdiscover -p`` output -> ports (each physical link appears once per end).

    Descriptions are quoted with single quotes and may themselves contain quotes and `` - ``;
    when the split between the two descriptions of a link line is ambiguous, the split that
    agrees with how the same node is described on its other lines wins. Raises ParseError for
    the whole output on any line that is not a port line, a value out of range, or lines that
    contradict each other (see ``_check_consistent``).
    """
    lines, votes = _scan(text)
    out: list[DiscoveredPort] = []
    for m, rm, cands, solo in lines:
        guid = normalize_guid(m.group("guid"))
        port = int(m.group("port"))
        ntype = TEXT_TYPES[m.group("t")]
        lid = int(m.group("lid"))
        width = f"{int(m.group('w'))}X"
        speed = link_speed(m.group("s"))
        if rm is None:
            out.append(DiscoveredPort(guid, port, ntype, lid, solo, width, speed))
            continue
        desc, rdesc = votes.best(m.group("guid"), rm.group("guid"), cands)
        out.append(
            DiscoveredPort(
                guid,
                port,
                ntype,
                lid,
                desc,
                width,
                speed,
                remote_guid=normalize_guid(rm.group("guid")),
                remote_port=int(rm.group("port")),
                remote_type=TEXT_TYPES[rm.group("t")],
                remote_lid=int(rm.group("lid")),
                remote_desc=rdesc,
            )
        )
    _check_consistent(out)
    return out


def parse_ibnetdiscover(text: str) -> list[DiscoveredPort]:
    """Either ibnetdiscover format: ports (``-p``) or the topology file; detected by content.

    Text that is neither (including empty text) raises ParseError.
    """
    for line in text.splitlines():
        s = line.strip()
        if _PORTS_LINE.match(s):
            return parse_ibnetdiscover_ports(text)
        if looks_like_topology_file(s):
            return parse_topology_file(text)
    raise ParseError("neither ibnetdiscover format (no port line, no node record)")
