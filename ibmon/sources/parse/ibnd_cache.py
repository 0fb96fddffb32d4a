"""libibnetdisc's binary fabric cache (``ibnetdiscover --cache FILE``).

It holds every node's NodeInfo and every port's raw PortInfo, which the ``diags`` source needs
for state and for the max-common link rule (the text output has neither).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from ibmon.sources.parse.smp import (
    NODE_TYPES,
    NodeInfo,
    PortInfo,
    clean_node_desc,
    decode_node_info,
    decode_port_info,
    hex_guid,
)

__all__ = ["CacheFabric", "CacheNode", "parse_ibnd_cache"]

_CACHE_MAGIC = 0x8FE7832B
_CACHE_VERSION = 1
_HEADER = struct.Struct("<IIIIQI")  # magic, version, nodes, ports, from guid, max hops


@dataclass(frozen=True, slots=True)
class CacheNode:
    guid: str
    node_type: str
    num_ports: int
    desc: str
    info: NodeInfo


@dataclass(slots=True)
class CacheFabric:
    """Nodes and raw PortInfo of every port libibnetdisc saw, keyed by (node guid, port)."""

    from_guid: str
    nodes: dict[str, CacheNode] = field(default_factory=dict)
    ports: dict[tuple[str, int], PortInfo] = field(default_factory=dict)
    port_lids: dict[tuple[str, int], int] = field(default_factory=dict)
    remote: dict[tuple[str, int], tuple[str, int]] = field(default_factory=dict)
    #: port GUID -> node GUID (``ibnetdiscover -p`` prints CA *port* GUIDs)
    owner: dict[str, str] = field(default_factory=dict)


def _read_node(data: bytes, off: int) -> tuple[CacheNode, int]:
    """One node record at ``off``; returns it and the offset after it."""
    off += 2 + 1 + 1 + 64  # smalid, smalmc, smaenhsp0, switchinfo
    guid, ntype, nports = struct.unpack_from("<QBB", data, off)
    off += 10
    info = decode_node_info(data[off : off + 64])
    off += 64
    desc = clean_node_desc(data[off : off + 64])
    off += 64
    stored = data[off]
    off += 1 + stored * 9
    node = CacheNode(
        guid=hex_guid(guid),
        node_type=NODE_TYPES.get(ntype, "unknown"),
        num_ports=nports,
        desc=desc,
        info=info,
    )
    return node, off


def _read_ports(
    data: bytes, off: int, n_ports: int, fab: CacheFabric
) -> dict[tuple[int, int], tuple[int, tuple[int, int] | None]]:
    """Every port record into ``fab``; returns (port guid, port) -> (owner, raw remote or None)."""
    seen: dict[tuple[int, int], tuple[int, tuple[int, int] | None]] = {}
    for _ in range(n_ports):
        pguid, pnum, _ext, base_lid, _lmc = struct.unpack_from("<QBBHB", data, off)
        off += 13
        pinfo = decode_port_info(data[off : off + 64])
        off += 64
        owner, flag, rguid, rport = struct.unpack_from("<QBQB", data, off)
        off += 18
        seen[(pguid, pnum)] = (owner, (rguid, rport) if flag else None)
        fab.owner.setdefault(hex_guid(pguid), hex_guid(owner))
        key = (hex_guid(owner), pnum)
        fab.ports[key] = pinfo
        fab.port_lids[key] = base_lid
    return seen


def parse_ibnd_cache(data: bytes) -> CacheFabric:
    """Decode libibnetdisc's cache format (little-endian, version 1; see ibnetdisc_cache.c).

    Raises ValueError on a bad magic, version or truncation.
    """
    if len(data) < _HEADER.size:
        raise ValueError("cache shorter than its header")
    magic, version, n_nodes, n_ports, from_guid, _hops = _HEADER.unpack_from(data, 0)
    if magic != _CACHE_MAGIC:
        raise ValueError("not an ibnetdisc cache (bad magic)")
    if version != _CACHE_VERSION:
        raise ValueError(f"unsupported ibnetdisc cache version {version}")
    off = _HEADER.size
    fab = CacheFabric(from_guid=hex_guid(from_guid))
    try:
        for _ in range(n_nodes):
            node, off = _read_node(data, off)
            fab.nodes[node.guid] = node
        ports = _read_ports(data, off, n_ports, fab)
    except (struct.error, ValueError, IndexError) as exc:
        raise ValueError(f"truncated ibnetdisc cache: {exc}") from exc
    for (_pg, pn), (owner, remote) in ports.items():
        if remote is None:
            continue
        peer = ports.get(remote)
        if peer is not None:
            fab.remote[(hex_guid(owner), pn)] = (hex_guid(peer[0]), remote[1])
    return fab
