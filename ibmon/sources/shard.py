"""``shard = "K/N"``: split one fabric between N daemons so that together they poll it once.

Each switch goes to shard ``sha1(guid) mod N``; every HCA (or router) goes with the switch it is
cabled to (the lowest-GUID switch when it has several), so a host's counters and its leaf
switch's counters come from the same daemon. A CA with no switch neighbour hashes its own GUID.
The hash depends only on GUIDs: every daemon computes the same assignment from its own
discovery, with no coordination, and a node keeps its shard across restarts. Shards are
numbered from 0 (``0/3``, ``1/3``, ``2/3``), like Prometheus ``hashmod``.
"""

from __future__ import annotations

import hashlib
import re

from ibmon.infiniband.model import Topology

__all__ = ["assign_nodes", "filter_topology", "guid_shard", "parse_shard"]

_SHARD_RE = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


def parse_shard(text: str) -> tuple[int, int]:
    """``"K/N"`` -> (K, N) with 0 <= K < N; ValueError otherwise."""
    m = _SHARD_RE.match(text)
    if not m:
        raise ValueError(f"shard must look like K/N, got {text!r}")
    k, n = int(m.group(1)), int(m.group(2))
    if n < 1 or not 0 <= k < n:
        raise ValueError(f"shard {text!r}: need N >= 1 and 0 <= K < N")
    return k, n


def guid_shard(guid: str, n: int) -> int:
    """Stable shard of one GUID (sha1 of the key-form GUID text)."""
    digest = hashlib.sha1(guid.encode("ascii"), usedforsecurity=False).digest()
    return int.from_bytes(digest[:8], "big") % n


def assign_nodes(topo: Topology, n: int) -> dict[str, int]:
    """Node GUID -> shard for every node in the topology."""
    kinds: dict[str, str] = {}
    for ident in topo.ports.values():
        kinds.setdefault(ident.guid, ident.node_type)
    switch_peers: dict[str, set[str]] = {}
    for (guid, _port), link in topo.links.items():
        if kinds.get(link.remote_guid) == "switch":
            switch_peers.setdefault(guid, set()).add(link.remote_guid)
    out: dict[str, int] = {}
    for guid, kind in kinds.items():
        if kind == "switch":
            out[guid] = guid_shard(guid, n)
        else:
            peers = switch_peers.get(guid)
            out[guid] = guid_shard(min(peers) if peers else guid, n)
    return out


def filter_topology(topo: Topology, k: int, n: int) -> Topology:
    """The part of ``topo`` that shard K of N polls."""
    mine = {g for g, s in assign_nodes(topo, n).items() if s == k}
    out = Topology(source=topo.source)
    out.ports = {key: ident for key, ident in topo.ports.items() if key[0] in mine}
    out.links = {key: link for key, link in topo.links.items() if key[0] in mine}
    return out
