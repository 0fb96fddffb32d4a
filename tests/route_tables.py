"""Forwarding tables for a mocks fat tree, computed the way a fat-tree routing engine would
(minimum hops; among the ``k`` equal-cost egress ports of a switch ``level`` hops above the
leaves, number ``(lid // k**level) % k``, as d-mod-k does), and the port views
``RouteIndex.build`` reads; for route tests and timings.
"""

from __future__ import annotations

from ibmon.infiniband.model import LinkInfo, PortIdentity, PortKey, PortView
from mocks.topology import Fabric

__all__ = ["dmodk_tables", "port_views"]


def port_views(fabric: Fabric) -> dict[PortKey, PortView]:
    """A view per connected port: identity (type, LID) and the link's far end."""
    out: dict[PortKey, PortView] = {}
    for guid, port in fabric.ports():
        node = fabric.nodes[guid]
        far = fabric.peer(guid, port)
        assert far is not None
        ident = PortIdentity(guid=guid, port=str(port), node_type=node.kind, lid=node.lid)
        out[(guid, str(port))] = PortView(identity=ident,
                                          link=LinkInfo(far[0], str(far[1])))
    return out


def dmodk_tables(fabric: Fabric) -> dict[str, bytes]:
    """switch GUID -> LFT bytes (index: LID, value: egress port, 0xff none) for ``fabric``."""
    import numpy as np

    sw = [g for g, n in fabric.nodes.items() if n.kind == "switch"]
    idx = {g: i for i, g in enumerate(sw)}
    n = len(sw)
    radix = max(fabric.nodes[g].nports for g in sw)
    nbr = np.full((n, radix + 1), -1, dtype=np.int64)  # neighbour switch by port
    ca_at: dict[int, list[tuple[int, int]]] = {}  # switch -> [(ca lid, port)]
    for g in sw:
        for p in range(1, fabric.nodes[g].nports + 1):
            far = fabric.peer(g, p)
            if far is None:
                continue
            other = fabric.nodes[far[0]]
            if other.kind == "switch":
                nbr[idx[g], p] = idx[far[0]]
            else:
                ca_at.setdefault(idx[g], []).append((other.lid, p))
    leaves = sorted(ca_at)
    adj = np.zeros((n, n), dtype=np.float32)
    rows, cols = np.nonzero(nbr >= 0)
    adj[rows, nbr[rows, cols]] = 1.0
    # hop distance from every leaf to every switch (BFS, all leaves at once)
    dist = np.full((len(leaves), n), -1, dtype=np.int64)
    frontier = np.zeros((len(leaves), n), dtype=np.float32)
    frontier[np.arange(len(leaves)), leaves] = 1.0
    step = 0
    while frontier.any():
        dist[(frontier > 0) & (dist < 0)] = step
        reach = (frontier @ adj) > 0
        frontier = (reach & (dist < 0)).astype(np.float32)
        step += 1
    level = dist.min(axis=0)  # hops from the nearest leaf
    max_lid = max(node.lid for node in fabric.nodes.values())
    dest_lids = np.array([lid for lf in leaves for lid, _p in ca_at[lf]], dtype=np.int64)
    dest_leaf = np.array([k for k, lf in enumerate(leaves) for _ in ca_at[lf]], dtype=np.int64)
    out: dict[str, bytes] = {}
    ports = np.arange(radix + 1)
    for g in sw:
        w = idx[g]
        lft = np.full(max_lid + 1, 0xFF, dtype=np.uint8)
        lft[fabric.nodes[g].lid] = 0
        u = nbr[w]  # [port]
        valid = u >= 0
        du = np.where(valid[None, :], dist[:, np.where(valid, u, 0)], -9)  # [leaf, port]
        cand = (du == (dist[:, w][:, None] - 1)) & valid[None, :]
        k = cand.sum(axis=1)  # [leaf]
        kd = k[dest_leaf]
        has = kd > 0
        kk = np.maximum(kd, 1)
        pick = np.where(has, (dest_lids // kk ** int(level[w])) % kk, 0)
        csum = np.cumsum(cand, axis=1)[dest_leaf]  # [dest, port]
        choose = (csum == (pick + 1)[:, None]) & cand[dest_leaf]
        port = np.where(has, ports[np.argmax(choose, axis=1)], 0xFF)
        lft[dest_lids] = port.astype(np.uint8)
        for lid, p in ca_at.get(w, []):
            lft[lid] = p
        out[g] = lft.tobytes()
    return out
