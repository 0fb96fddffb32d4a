"""libibnetdisc's binary fabric cache (``ibnetdiscover --cache FILE``).

It holds every node's NodeInfo and every port's raw PortInfo, which the ``diags`` source needs
for state and for the max-common link rule (the text output has neither). Read strictly: a
cache that is not exactly what ``ibnd_cache_fabric`` writes is refused whole.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from ibmon.sources.parse.errors import ParseError
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


def _read_node(data: bytes, off: int) -> tuple[CacheNode, set[tuple[int, int]], int]:
    """One node record at ``off``: the node, the port keys it lists, the offset after it."""
    off += 2 + 1 + 1 + 64  # smalid, smalmc, smaenhsp0, switchinfo
    guid, ntype, nports = struct.unpack_from("<QBB", data, off)
    if ntype not in NODE_TYPES:
        raise ParseError(f"node {hex_guid(guid)} has node type {ntype}")
    off += 10
    info = decode_node_info(data[off : off + 64])
    off += 64
    desc = clean_node_desc(data[off : off + 64])
    off += 64
    stored = data[off]
    off += 1
    keys: set[tuple[int, int]] = set()
    for _ in range(stored):
        keys.add(struct.unpack_from("<QB", data, off))
        off += 9
    if len(keys) != stored:
        raise ParseError(f"node {hex_guid(guid)} lists a port twice")
    node = CacheNode(
        guid=hex_guid(guid),
        node_type=NODE_TYPES[ntype],
        num_ports=nports,
        desc=desc,
        info=info,
    )
    return node, keys, off


def _read_ports(
    data: bytes, off: int, n_ports: int, fab: CacheFabric
) -> tuple[dict[tuple[int, int], tuple[int, tuple[int, int] | None]], int]:
    """Every port record into ``fab``; returns (port guid, port) -> (owner, raw remote or
    None), and the offset after the last record."""
    seen: dict[tuple[int, int], tuple[int, tuple[int, int] | None]] = {}
    for _ in range(n_ports):
        pguid, pnum, _ext, base_lid, _lmc = struct.unpack_from("<QBBHB", data, off)
        off += 13
        pinfo = decode_port_info(data[off : off + 64])
        off += 64
        owner, flag, rguid, rport = struct.unpack_from("<QBQB", data, off)
        off += 18
        if (pguid, pnum) in seen:
            raise ParseError(f"port {hex_guid(pguid)}/{pnum} recorded twice")
        node = fab.nodes.get(hex_guid(owner))
        if node is None:
            raise ParseError(f"port {hex_guid(pguid)}/{pnum} belongs to no recorded node")
        if pnum > node.num_ports:
            raise ParseError(f"port {pnum} of {node.guid}, which has {node.num_ports} ports")
        seen[(pguid, pnum)] = (owner, (rguid, rport) if flag else None)
        fab.owner.setdefault(hex_guid(pguid), hex_guid(owner))
        key = (hex_guid(owner), pnum)
        fab.ports[key] = pinfo
        fab.port_lids[key] = base_lid
    return seen, off


def parse_ibnd_cache(data: bytes) -> CacheFabric:
    """Decode libibnetdisc's cache format (little-endian, version 1; see ibnetdisc_cache.c).

    Strict, like ``ibnd_load_fabric`` and more: ParseError (a ValueError) on a bad magic or
    version, a truncated record, bytes after the last record (a cache whose counts were never
    written: the tool was killed while saving it), a node or port recorded twice, a port
    without its node or beyond its node's port count, a node's port list that disagrees with
    the port records, or a "from" node that is not recorded.
    """
    if len(data) < _HEADER.size:
        raise ParseError("cache shorter than its header")
    magic, version, n_nodes, n_ports, from_guid, _hops = _HEADER.unpack_from(data, 0)
    if magic != _CACHE_MAGIC:
        raise ParseError("not an ibnetdisc cache (bad magic)")
    if version != _CACHE_VERSION:
        raise ParseError(f"unsupported ibnetdisc cache version {version}")
    off = _HEADER.size
    fab = CacheFabric(from_guid=hex_guid(from_guid))
    listed: dict[int, set[tuple[int, int]]] = {}
    try:
        for _ in range(n_nodes):
            node, keys, off = _read_node(data, off)
            if node.guid in fab.nodes:
                raise ParseError(f"node {node.guid} recorded twice")
            fab.nodes[node.guid] = node
            listed[int(node.guid, 16)] = keys
        ports, off = _read_ports(data, off, n_ports, fab)
    except ParseError:
        raise
    except (struct.error, IndexError, ValueError) as exc:
        raise ParseError(f"truncated ibnetdisc cache: {exc}") from exc
    if off != len(data):
        raise ParseError(f"{len(data) - off} bytes after the last record "
                         f"({n_nodes} nodes, {n_ports} ports in the header)")
    if fab.from_guid not in fab.nodes:
        raise ParseError(f"the node discovery started from ({fab.from_guid}) is not recorded")
    owned: dict[int, set[tuple[int, int]]] = {g: set() for g in listed}
    for key, (owner, _remote) in ports.items():
        owned[owner].add(key)
    if owned != listed:
        bad = next(g for g in listed if owned[g] != listed[g])
        raise ParseError(f"node {hex_guid(bad)} lists other ports than the port records")
    for (_pg, pn), (owner, remote) in ports.items():
        if remote is None:
            continue
        peer = ports.get(remote)
        if peer is not None:
            fab.remote[(hex_guid(owner), pn)] = (hex_guid(peer[0]), remote[1])
    return fab
