"""Write libibnetdisc's fabric cache (what ``ibnetdiscover --cache FILE`` writes) for tests.

Fake tools in unit tests must answer ``ibnetdiscover --cache`` the way the real one does, with a
cache that describes the same fabric as the text, since the ``diags`` source refuses a discovery
whose text and cache disagree. The layout is ``ibnetdisc_cache.c``'s (little-endian, version 1);
``tests/unit/test_parse.py`` checks that the parser reads back exactly what this writes, and the
real captures come from ibsim in the integration tests.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

from ibmon.infiniband.linkspeed import EXT_SPEED_BITS, SPEED_BITS, WIDTH_BITS
from ibmon.sources.parse import DiscoveredPort

__all__ = ["CacheNodeSpec", "CachePortSpec", "cache_bytes", "cache_from_ports", "port_info_bytes"]

MAGIC, VERSION = 0x8FE7832B, 1
_TYPES = {"ca": 1, "switch": 2, "router": 3}
_WIDTH = {v: k for k, v in WIDTH_BITS.items()}
_SPEED = {v: k for k, v in SPEED_BITS.items()}
_EXT = {v: k for k, v in EXT_SPEED_BITS.items()}


@dataclass
class CachePortSpec:
    guid: int
    num: int
    lid: int
    width: str = "4X"
    speed: str = "EDR"
    state: int = 4  # Active
    phys_state: int = 5  # LinkUp
    remote: tuple[int, int] | None = None  # (port guid, port number)


@dataclass
class CacheNodeSpec:
    guid: int
    node_type: str
    num_ports: int
    desc: str
    ports: list[CachePortSpec] = field(default_factory=list)


def port_info_bytes(p: CachePortSpec) -> bytes:
    """A 64-byte PortInfo with the fields ibmon reads (``ibmon.sources.parse.smp``)."""
    b = bytearray(64)
    struct.pack_into(">HHI", b, 16, p.lid, 1, 0)
    b[28] = p.num
    width = _WIDTH.get(p.width, 0)
    b[29] = b[30] = 0x1F
    b[31] = width
    speed, ext = _SPEED.get(p.speed, 0), _EXT.get(p.speed, 0)
    b[32] = (0x7 << 4) | p.state
    b[33] = p.phys_state << 4
    b[35] = (speed << 4) | 0x7
    struct.pack_into(">H", b, 60, 0x0002 if ext else 0)
    b[62] = (ext << 4) | 0x0F
    b[63] = 0x1F
    return bytes(b)


def _node_info(n: CacheNodeSpec, port_guid: int, local_port: int) -> bytes:
    b = bytearray(64)
    b[0], b[1] = 1, 1
    b[2], b[3] = _TYPES[n.node_type], n.num_ports
    struct.pack_into(">QQQ", b, 4, n.guid, n.guid, port_guid)
    b[36] = local_port
    return bytes(b)


def cache_bytes(nodes: Iterable[CacheNodeSpec], from_guid: int | None = None) -> bytes:
    """The cache file for ``nodes`` (the first node is where discovery started)."""
    nodes = list(nodes)
    start = from_guid if from_guid is not None else nodes[0].guid
    out = bytearray(struct.pack("<IIIIQI", MAGIC, VERSION, len(nodes),
                                sum(len(n.ports) for n in nodes), start, 3))
    for n in nodes:
        first = n.ports[0] if n.ports else CachePortSpec(n.guid, 0, 0)
        out += struct.pack("<HBB", 0, 0, 0) + bytes(64)
        out += struct.pack("<QBB", n.guid, _TYPES[n.node_type], n.num_ports)
        out += _node_info(n, first.guid, first.num)
        out += n.desc.encode("ascii")[:64].ljust(64, b"\0")
        out += struct.pack("<B", len(n.ports))
        for p in n.ports:
            out += struct.pack("<QB", p.guid, p.num)
    for n in nodes:
        for p in n.ports:
            out += struct.pack("<QBBHB", p.guid, p.num, 0, p.lid, 0)
            out += port_info_bytes(p)
            rg, rp = p.remote or (0, 0)
            out += struct.pack("<QBQB", n.guid, 1 if p.remote else 0, rg, rp)
    return bytes(out)


def cache_from_ports(ports: list[DiscoveredPort]) -> bytes:
    """The cache of the fabric an ``ibnetdiscover -p`` text describes: every node, every port
    it prints, a switch's port 0, links both ways; a CA's node GUID is its port GUID."""
    nodes: dict[str, CacheNodeSpec] = {}
    for p in ports:
        n = nodes.setdefault(p.guid, CacheNodeSpec(int(p.guid, 16), p.node_type, 0, p.desc))
        n.num_ports = max(n.num_ports, p.port)
        if p.node_type == "switch" and not n.ports:
            n.ports.append(CachePortSpec(int(p.guid, 16), 0, p.lid or 0))
        remote = None
        if p.remote_guid and p.remote_port:
            remote = (int(p.remote_guid, 16), p.remote_port)
        n.ports.append(CachePortSpec(int(p.guid, 16), p.port, p.lid or 0, p.width or "4X",
                                     p.speed or "EDR", remote=remote))
    return cache_bytes(nodes.values())
