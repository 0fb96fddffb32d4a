"""``ibnetdiscover -p`` (the ports format the ``diags`` source reads), and format detection.

The plain topology-file format is in ``topofile``; ``parse_ibnetdiscover`` picks either by
content.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ibmon.model import normalize_guid
from ibmon.sources.parse.discovered import TEXT_TYPES, DiscoveredPort, link_speed
from ibmon.sources.parse.topofile import looks_like_topology_file, parse_topology_file

__all__ = ["parse_ibnetdiscover", "parse_ibnetdiscover_ports"]

_PORTS_LINE = re.compile(
    r"^(?P<t>CA|SW|RT)\s+(?P<lid>\d+)\s+(?P<port>\d+)\s+(?P<guid>0x[0-9a-fA-F]+)\s+"
    r"(?P<w>\d+)x\s+(?P<s>\S+)(?P<rest>.*)$"
)
_PORTS_REMOTE = re.compile(
    r"^\s*-\s+(?P<t>CA|SW|RT)\s+(?P<lid>\d+)\s+(?P<port>\d+)\s+(?P<guid>0x[0-9a-fA-F]+)\s+"
    r"\(\s*'(?P<descs>.*)'\s*\)\s*$"
)

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


def _scan(text: str) -> tuple[list[_Line], list[str], _Votes]:
    """First pass: match every line, collect description candidates and their votes."""
    stray: list[str] = []
    lines: list[_Line] = []
    votes = _Votes()
    for raw in text.splitlines():
        line = raw.rstrip("\r\n")
        if not line.strip():
            continue
        m = _PORTS_LINE.match(line.strip())
        if not m:
            stray.append(raw)
            continue
        rm = _PORTS_REMOTE.match(m.group("rest"))
        if rm:
            descs = rm.group("descs")
            cands = [(descs[: s.start()], descs[s.end() :]) for s in re.finditer(r"' - '", descs)]
            if not cands:
                stray.append(raw)
                continue
            if len(cands) == 1:
                votes.add(m.group("guid"), cands[0][0], 2)
                votes.add(rm.group("guid"), cands[0][1], 2)
            lines.append((m, rm, cands, ""))
        else:
            solo = m.group("rest").strip()
            if len(solo) >= 2 and solo[0] == "'" and solo[-1] == "'":
                solo = solo[1:-1]
            votes.add(m.group("guid"), solo, 2)
            lines.append((m, None, [], solo))
    return lines, stray, votes


def parse_ibnetdiscover_ports(text: str) -> tuple[list[DiscoveredPort], list[str]]:
    """``ibnetdiscover -p`` output -> ports (each physical link appears once per end).

    Descriptions are quoted with single quotes and may themselves contain quotes and `` - ``;
    when the split between the two descriptions of a link line is ambiguous, the split that
    agrees with how the same node is described on its other lines wins. Lines that are not port
    lines (stderr noise) are returned separately.
    """
    lines, stray, votes = _scan(text)
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
    return out, stray


def parse_ibnetdiscover(text: str) -> tuple[list[DiscoveredPort], list[str]]:
    """Either ibnetdiscover format: ports (``-p``) or the topology file; detected by content."""
    for line in text.splitlines():
        s = line.strip()
        if _PORTS_LINE.match(s):
            return parse_ibnetdiscover_ports(text)
        if looks_like_topology_file(s):
            return parse_topology_file(text)
    return [], [ln for ln in text.splitlines() if ln.strip()]
