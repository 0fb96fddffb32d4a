"""Routes: which leaf pairs the switches' forwarding tables send over each switch egress port.

InfiniBand unicast routing is by destination LID: every switch looks the destination up in its
LinearForwardingTable (``Topology.forwarding``: switch node GUID -> bytes indexed by LID, each
the egress port, ``0xff`` no route) and sends the packet out of that port. So the path from a
host's leaf switch to a destination LID is fixed by the tables alone, whatever host on the leaf
sent it, and "whose traffic crosses this port" reduces to leaf pairs: a *leaf* is a switch with
at least one channel adapter beside it, and the pair ``(S, D)`` crosses egress port P when the
route from leaf S to the LID of some CA on leaf D goes out of P. A job with a host under S and
one under D may then send over P.

``RouteIndex`` answers that per port, lazily: for port P of switch W it takes only the
destination LIDs W sends out of P, traces every leaf toward each of them through the tables hop
by hop (switch -> egress port -> the switch on the far end of the link) and keeps the pairs whose
trace passes W; at most ``MAX_HOPS`` hops, so a table with a loop cannot hang it. The tracing is
vectorised with numpy over (source leaf, destination) at once, which keeps a spine port of a
20,000-host fat tree in milliseconds; numpy is imported inside the functions only, so importing
this module costs a node daemon nothing.

``trace_congestion`` follows the routes leaving a congested port downstream: the furthest
congested port on them is where the congestion starts (the hotspot: a slow receiver, an
oversubscribed link) and the congested port upstream of it is its victim, backed up by the
credits it waits for.

Limits: destinations are CA port base LIDs (LMC paths beyond the base LID and switch LIDs, which
carry only management traffic, are left out); a switch without a table ends the routes that
reach it, so ``usable`` is true only when every switch has one.

``ForwardingTables`` keeps them across discoveries: a switch whose table one discovery could not
read (an ``ibroute`` that timed out, a lost LinearForwardingTable block) keeps the one it had for
up to ``KEEP_DISCOVERIES`` discoveries, as long as no LID went to another node since (a table is
indexed by LID). On a fabric of a thousand switches one lost read would otherwise put the whole
fabric on ``leaf_span`` until the next discovery. A switch never read, unread for longer, or not
read after a LID moved has no table.
"""

from __future__ import annotations

import contextlib
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ibmon.infiniband.model import PortKey, PortView, Topology

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["KEEP_DISCOVERIES", "MAX_HOPS", "ForwardingTables", "RouteIndex", "trace_congestion"]

#: Hops a route is followed before it is given up as a loop (a fat tree needs at most 5).
MAX_HOPS = 64
#: LFT value for "no route"; any value above the switch's port count is no route too.
NO_ROUTE = 0xFF


class ForwardingTables:
    """The switches' tables the routes use, discovery after discovery (module docstring)."""

    __slots__ = ("_owners", "_unread", "tables")

    def __init__(self) -> None:
        self.tables: Mapping[str, bytes] = {}
        self._owners: array[int] = array("q")  # who had each LID when ``tables`` were read
        self._unread: dict[str, int] = {}  # kept tables: discoveries in a row not read

    def update(self, topo: Topology, *, reading: bool = True) -> list[str]:
        """Take ``topo``'s tables (none when the source no longer ``reading`` them), and keep
        the one of every switch of ``topo`` it lacks from before, for at most
        ``KEEP_DISCOVERIES`` discoveries in a row and while no LID moved to another node; the
        switches so kept, sorted."""
        if not reading:  # tables turned off (a reload): none kept either
            self.tables, self._owners, self._unread = {}, array("q"), {}
            return []
        read = topo.forwarding
        if not read and not self.tables:
            return []
        owners = _lid_owners(topo)
        kept: list[str] = []
        unread: dict[str, int] = {}
        if (missing := self.tables.keys() - read.keys()) and not _moved(self._owners, owners):
            nodes = {guid for guid, _ in topo.ports}
            for guid in sorted(missing):
                misses = self._unread.get(guid, 0) + 1
                if guid in nodes and misses <= KEEP_DISCOVERIES:
                    kept.append(guid)
                    unread[guid] = misses
        if kept:
            read = {**read, **{g: self.tables[g] for g in kept}}
            # A kept table still routes the LIDs of its own discovery: a LID gone since stays
            # its node's, so a node that takes it later counts as a move.
            owners = array("q", map(_or, owners, self._owners))
        self.tables, self._owners, self._unread = read, owners, unread
        return kept


#: Discoveries in a row a switch's table may go unread and still be used: the subnet manager
#: may reroute meanwhile (a link goes down), and a table read before that is wrong after it.
KEEP_DISCOVERIES = 3
#: Unicast LIDs are 1..0xBFFF; the rest are multicast, never a port's.
_LIDS = 0xC000


def _lid_owners(topo: Topology) -> array[int]:
    """Per LID, a nonzero number for the node that has it (0: nobody), 384 KB."""
    owners = array("q", bytes(8 * _LIDS))
    for (guid, _), ident in topo.ports.items():
        if (lid := ident.lid) and lid < _LIDS:
            owners[lid] = hash(guid) | 1
    return owners


def _or(now: int, before: int) -> int:
    return now or before


def _moved(before: array[int], now: array[int]) -> bool:
    """Whether a LID both know is another node's now (a LID that came or went moved nothing:
    a table's route to a LID nobody has is never asked, and a new LID has none)."""
    return any(a and b and a != b for a, b in zip(before, now, strict=False))


@dataclass(slots=True)
class _Arrays:
    """The numpy form of the tables and links (built on the first question, then kept)."""

    lft: Any  # uint8 [switch, lid]: egress port, 0xff none
    nbr: Any  # int32 [switch, port]: the switch on the far end, -1 none (a CA, no link)
    dest_lids: Any  # int64 [n]: CA base LIDs present in the fabric
    dest_leaf: Any  # int32 [n]: the leaf index of each one's CA
    leaf_sw: Any  # int32 [leaf]: the switch index of each leaf


@dataclass(slots=True)
class RouteIndex:
    """Leaf pairs per switch egress port, from the forwarding tables (module docstring).

    Build with ``RouteIndex.build``; the questions are answered lazily and cached.
    """

    switches: tuple[str, ...] = ()
    #: switch GUID -> index into ``switches``
    switch_index: dict[str, int] = field(default_factory=dict)
    #: leaf switch GUIDs, in index order (a leaf's index is its position here)
    leaf_list: tuple[str, ...] = ()
    #: CA node GUID -> its leaf switch GUID
    ca_leaf: dict[str, str] = field(default_factory=dict)
    #: CA port base LID -> leaf switch GUID
    lid_leaf: dict[int, str] = field(default_factory=dict)
    #: (switch GUID, port) -> (far GUID, far port) for switch ports with a link
    links: dict[tuple[str, int], tuple[str, int]] = field(default_factory=dict)
    forwarding: Mapping[str, bytes] = field(default_factory=dict)
    _arrays: _Arrays | None = None
    _pairs: dict[PortKey, frozenset[tuple[str, str]]] = field(default_factory=dict)

    @classmethod
    def build(
        cls, forwarding: Mapping[str, bytes], ports: Mapping[PortKey, PortView]
    ) -> RouteIndex:
        """The index of ``forwarding`` over the fabric the port views describe (node types,
        CA LIDs, links). Cheap: the arrays are made on the first question."""
        switches: set[str] = set()
        node_type: dict[str, str] = {}
        links: dict[tuple[str, int], tuple[str, int]] = {}
        ca_ports: list[tuple[str, int, int | None]] = []  # (ca guid, port, lid)
        for (guid, port), view in ports.items():
            ident = view.identity
            node_type[guid] = ident.node_type
            if ident.node_type == "switch":
                switches.add(guid)
            try:
                pnum = int(port)
            except ValueError:
                continue
            link = view.link
            if link is not None:
                with contextlib.suppress(ValueError):
                    links[(guid, pnum)] = (link.remote_guid, int(link.remote_port))
            if ident.node_type == "ca":
                ca_ports.append((guid, pnum, ident.lid))
        # a link seen from one end only (the other end filtered out) counts both ways
        for end, other in list(links.items()):
            links.setdefault(other, end)
        ca_leaf: dict[str, str] = {}
        lid_leaf: dict[int, str] = {}
        for guid, pnum, lid in sorted(ca_ports, key=lambda t: (t[0], t[1])):
            peer = links.get((guid, pnum))
            if peer is None or peer[0] not in switches:
                continue
            ca_leaf.setdefault(guid, peer[0])
            if lid:
                lid_leaf[lid] = peer[0]
        # CAs seen only from the switch side (their own ports filtered out)
        for (guid, _pnum), (far_guid, _fp) in links.items():
            if guid in switches and node_type.get(far_guid) not in (None, "switch"):
                ca_leaf.setdefault(far_guid, guid)
        ordered = tuple(sorted(switches))
        leaves = tuple(sorted(set(ca_leaf.values())))
        return cls(
            switches=ordered,
            switch_index={g: i for i, g in enumerate(ordered)},
            leaf_list=leaves,
            ca_leaf=ca_leaf,
            lid_leaf=lid_leaf,
            links={k: v for k, v in links.items() if k[0] in switches},
            forwarding=dict(forwarding),
        )

    # ------------------------------------------------------------------ questions

    def usable(self) -> bool:
        """Whether the tables can answer: leaves exist and every switch has a table."""
        return bool(self.leaf_list) and all(
            len(self.forwarding.get(g, b"")) > 0 for g in self.switches
        )

    def leaf_of(self, ca_guid: str) -> str | None:
        """The leaf switch GUID a CA (node GUID) is cabled to, None when unknown."""
        return self.ca_leaf.get(ca_guid)

    def leaves(self) -> frozenset[str]:
        """The switches with at least one CA beside them."""
        return frozenset(self.leaf_list)

    def leaf_pairs(self, egress_key: PortKey) -> frozenset[tuple[str, str]]:
        """(source leaf, destination leaf) GUID pairs whose routes leave through ``egress_key``
        (a switch port); empty for a port no route uses, a CA port or an unknown switch."""
        got = self._pairs.get(egress_key)
        if got is not None:
            return got
        pairs: frozenset[tuple[str, str]] = frozenset()
        hit = self._through(egress_key)
        if hit is not None:
            import numpy as np

            src, dst_leaf = hit
            n = max(1, len(self.leaf_list))
            codes = np.unique(src.astype(np.int64) * n + dst_leaf)
            names = self.leaf_list
            pairs = frozenset((names[int(c) // n], names[int(c) % n]) for c in codes)
        self._pairs[egress_key] = pairs
        return pairs

    # ------------------------------------------------------------------ tracing

    def _ensure_arrays(self) -> _Arrays:
        if self._arrays is not None:
            return self._arrays
        import numpy as np

        n_sw = len(self.switches)
        width = max((len(self.forwarding.get(g, b"")) for g in self.switches), default=0)
        lft = np.full((max(1, n_sw), max(1, width)), NO_ROUTE, dtype=np.uint8)
        for i, g in enumerate(self.switches):
            table = self.forwarding.get(g, b"")
            if table:
                lft[i, : len(table)] = np.frombuffer(table, dtype=np.uint8)
        nbr = np.full((max(1, n_sw), 256), -1, dtype=np.int32)
        for (guid, pnum), (far, _fp) in self.links.items():
            at = self.switch_index.get(guid)
            to = self.switch_index.get(far)
            if at is not None and to is not None and 0 <= pnum < 256:
                nbr[at, pnum] = to
        leaf_pos = {g: k for k, g in enumerate(self.leaf_list)}
        lids = sorted(lid for lid in self.lid_leaf if lid < width)
        dest_lids = np.asarray(lids, dtype=np.int64)
        dest_leaf = np.asarray([leaf_pos[self.lid_leaf[lid]] for lid in lids], dtype=np.int32)
        leaf_sw = np.asarray([self.switch_index[g] for g in self.leaf_list], dtype=np.int32)
        self._arrays = _Arrays(lft, nbr, dest_lids, dest_leaf, leaf_sw)
        return self._arrays

    def _egress(self, egress_key: PortKey) -> tuple[int, int] | None:
        sw = self.switch_index.get(egress_key[0])
        try:
            port = int(egress_key[1])
        except ValueError:
            return None
        if sw is None or not 0 < port < NO_ROUTE:
            return None
        return sw, port

    def _through(
        self, egress_key: PortKey
    ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]] | None:
        """(source leaf index, destination leaf index) of every (leaf, destination LID) route
        through the port, one entry per route; None when none can."""
        routes = self._routes(egress_key)
        if routes is None:
            return None
        src, d = routes
        a = self._ensure_arrays()
        return src, a.dest_leaf[d]

    def _routes(
        self, egress_key: PortKey
    ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int64]] | None:
        """(source leaf index, destination index into ``dest_lids``) of the routes that leave
        through the port."""
        target = self._egress(egress_key)
        if target is None or not self.leaf_list:
            return None
        import numpy as np

        a = self._ensure_arrays()
        sw, port = target
        # only destinations the switch sends out of this port can cross it
        d_idx = np.flatnonzero(a.lft[sw, a.dest_lids] == port)
        if d_idx.size == 0:
            return None
        n_leaf = a.leaf_sw.size
        src = np.repeat(np.arange(n_leaf, dtype=np.int32), d_idx.size)
        d = np.tile(d_idx, n_leaf)
        cur = a.leaf_sw[src].copy()
        lids = a.dest_lids[d]
        hit = np.zeros(src.size, dtype=bool)
        alive = np.ones(src.size, dtype=bool)
        for _ in range(MAX_HOPS):
            idx = np.flatnonzero(alive)
            if idx.size == 0:
                break
            c = cur[idx]
            at = c == sw
            hit[idx[at]] = True
            alive[idx[at]] = False  # it leaves through the port: counted, no need to go on
            idx, c = idx[~at], c[~at]
            out = a.lft[c, lids[idx]]
            nxt = a.nbr[c, out.astype(np.int64)]
            cur[idx] = nxt
            alive[idx[nxt < 0]] = False  # reached a CA, or no route / no link
        if not hit.any():
            return None
        return src[hit], d[hit]

    def downstream(self, egress_key: PortKey) -> dict[PortKey, tuple[int, int]]:
        """The switch egress ports the routes through ``egress_key`` take after it: port ->
        (furthest hop after it, routes through both). The port itself is not included."""
        routes = self._routes(egress_key)
        target = self._egress(egress_key)
        if routes is None or target is None:
            return {}
        import numpy as np

        a = self._ensure_arrays()
        _src, d = routes
        lids = a.dest_lids[d]
        cur = np.full(d.size, a.nbr[target[0], target[1]], dtype=np.int32)
        seen: dict[int, tuple[int, int]] = {}
        for hop in range(1, MAX_HOPS + 1):
            ok = cur >= 0
            if not ok.any():
                break
            cur, lids = cur[ok], lids[ok]
            out = a.lft[cur, lids].astype(np.int64)
            codes, counts = np.unique(cur.astype(np.int64) * 256 + out, return_counts=True)
            for code, count in zip(codes.tolist(), counts.tolist(), strict=True):
                if code % 256 == NO_ROUTE:
                    continue
                was = seen.get(code)
                seen[code] = (hop, count + (was[1] if was else 0))
            cur = a.nbr[cur, out]
        return {(self.switches[code // 256], str(code % 256)): v for code, v in seen.items()}


def trace_congestion(index: RouteIndex, congested: Iterable[PortKey]) -> dict[PortKey, PortKey]:
    """Victim port -> root port for the congested switch egress ports.

    For each congested port P, the routes that leave through P are followed downstream; the
    congested port furthest along them (ties: the one more of P's routes cross, then by key)
    is P's root and P is its victim. A port with nothing congested downstream is a root and is
    not in the result, nor is a port the tables say nothing about.
    """
    hot = set(congested)
    out: dict[PortKey, PortKey] = {}
    for key in sorted(hot):
        after = index.downstream(key)
        found = [(hop, n, k) for k, (hop, n) in after.items() if k in hot and k != key]
        if not found:
            continue
        found.sort(key=lambda t: (-t[0], -t[1], t[2]))
        out[key] = found[0][2]
    return out
