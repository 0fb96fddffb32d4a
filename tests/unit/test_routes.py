"""RouteIndex and congestion tracing over synthetic fat trees with fat-tree (d-mod-k) tables.

The oracle is a plain per-packet walk of the tables (``_walk``), written apart from the
vectorised index: both must name the same leaf pairs on every switch port.
"""

from __future__ import annotations

import dataclasses

import pytest

from ibmon.infiniband.model import PortKey, Topology
from ibmon.jobs.routes import (
    KEEP_DISCOVERIES,
    MAX_HOPS,
    ForwardingTables,
    RouteIndex,
    trace_congestion,
)
from mocks.topology import Fabric, fat_tree
from tests.route_tables import dmodk_tables, port_views

pytest.importorskip("numpy")


def _by_desc(fab: Fabric, desc: str) -> str:
    return fab.node_by_desc(desc).guid


def _walk(fab: Fabric, tables: dict[str, bytes], leaf: str, lid: int) -> list[PortKey]:
    """The egress ports a packet from ``leaf`` to ``lid`` leaves through, one hop at a time."""
    out: list[PortKey] = []
    node = leaf
    for _ in range(MAX_HOPS):
        port = tables[node][lid]
        out.append((node, str(port)))
        far = fab.peer(node, port)
        assert far is not None
        if fab.nodes[far[0]].kind != "switch":
            assert fab.nodes[far[0]].lid == lid
            return out
        node = far[0]
    raise AssertionError("loop")


def _oracle(fab: Fabric, tables: dict[str, bytes]) -> dict[PortKey, set[tuple[str, str]]]:
    leaf_of = {fab.peer(h.guid, 1)[0]: None for h in fab.hosts()}  # type: ignore[index]
    pairs: dict[PortKey, set[tuple[str, str]]] = {}
    for h in fab.hosts():
        far = fab.peer(h.guid, 1)
        assert far is not None
        for src in leaf_of:
            for key in _walk(fab, tables, src, h.lid):
                pairs.setdefault(key, set()).add((src, far[0]))
    return pairs


@pytest.mark.parametrize("levels", [2, 3])
def test_leaf_pairs_match_a_walk_of_the_tables(levels: int) -> None:
    fab = (fat_tree(levels=2, leaves=4, hosts_per_leaf=2, radix=8) if levels == 2
           else fat_tree(levels=3, leaves=8, hosts_per_leaf=2, radix=8))
    tables = dmodk_tables(fab)
    index = RouteIndex.build(tables, port_views(fab))
    assert index.usable()
    want = _oracle(fab, tables)
    for guid, port in fab.ports():
        if fab.nodes[guid].kind != "switch":
            assert index.leaf_pairs((guid, str(port))) == frozenset()
            continue
        assert index.leaf_pairs((guid, str(port))) == frozenset(want.get((guid, str(port)), ())), (
            fab.nodes[guid].desc, port)
    assert sum(1 for k in want if index.leaf_pairs(k)) == len(want) > 0


def test_a_spine_port_down_to_a_leaf_carries_the_other_leaves_toward_it() -> None:
    fab = fat_tree(levels=2, leaves=4, hosts_per_leaf=2, radix=8)
    index = RouteIndex.build(dmodk_tables(fab), port_views(fab))
    leaves = {_by_desc(fab, f"leaf0{i}") for i in range(1, 5)}
    assert index.leaves() == leaves
    for h in fab.hosts():
        assert index.leaf_of(h.guid) == fab.peer(h.guid, 1)[0]  # type: ignore[index]
    assert index.leaf_of("0x0000000000000bad") is None
    seen_down = 0
    for spine in (_by_desc(fab, f"spine0{i}") for i in range(1, 4)):
        for p in range(1, 9):
            far = fab.peer(spine, p)
            assert far is not None
            pairs = index.leaf_pairs((spine, str(p)))
            assert all(d == far[0] and s != far[0] for s, d in pairs)
            seen_down += bool(pairs)
    assert seen_down > 0
    # a leaf's host port carries every leaf toward that host's leaf, its own leaf included
    host = fab.hosts()[0]
    leaf, lport = fab.peer(host.guid, 1)  # type: ignore[misc]
    assert index.leaf_pairs((leaf, str(lport))) == frozenset((s, leaf) for s in leaves)


def test_usable_only_with_every_switch_table() -> None:
    fab = fat_tree(levels=2, leaves=4, hosts_per_leaf=2, radix=8)
    tables = dmodk_tables(fab)
    views = port_views(fab)
    assert not RouteIndex.build({}, views).usable()
    tables.pop(_by_desc(fab, "spine02"))
    assert not RouteIndex.build(tables, views).usable()


def _discovery(fab: Fabric, tables: dict[str, bytes], **lids: int) -> Topology:
    """What a discovery of ``fab`` reports with ``tables`` read, ``lids`` (node description ->
    LID) changed from the fabric's."""
    ports = {}
    for key, view in port_views(fab).items():
        desc = fab.nodes[key[0]].desc
        ident = view.identity
        ports[key] = dataclasses.replace(ident, lid=lids.get(desc, ident.lid))
    return Topology("diags", ports=ports, forwarding=tables)


def test_a_table_one_discovery_could_not_read_is_the_one_before() -> None:
    fab = fat_tree(levels=2, leaves=4, hosts_per_leaf=2, radix=8)
    tables = dmodk_tables(fab)
    spine = _by_desc(fab, "spine02")
    kept = ForwardingTables()
    assert kept.update(_discovery(fab, tables)) == []
    lost = {g: t for g, t in tables.items() if g != spine}
    assert kept.update(_discovery(fab, lost)) == [spine]
    assert kept.tables == tables
    assert RouteIndex.build(kept.tables, port_views(fab)).usable()
    # and again, while the switch stays unreadable and nothing moves
    assert kept.update(_discovery(fab, lost)) == [spine]
    assert kept.tables == tables
    # a read that works again replaces it
    fresh = {**tables, spine: bytes(len(tables[spine]))}
    assert kept.update(_discovery(fab, fresh)) == []
    assert kept.tables == fresh


def test_a_moved_lid_drops_the_tables_not_read_under_it() -> None:
    fab = fat_tree(levels=2, leaves=4, hosts_per_leaf=2, radix=8)
    tables = dmodk_tables(fab)
    spine = _by_desc(fab, "spine02")
    lost = {g: t for g, t in tables.items() if g != spine}
    host1, host2 = [h.desc for h in fab.hosts()][:2]
    swapped = {host1: fab.node_by_desc(host2).lid, host2: fab.node_by_desc(host1).lid}
    kept = ForwardingTables()
    kept.update(_discovery(fab, tables))
    assert kept.update(_discovery(fab, lost, **swapped)) == []
    assert kept.tables == lost
    assert not RouteIndex.build(kept.tables, port_views(fab)).usable()
    # a LID that went (a host that left) moved nothing
    kept.update(_discovery(fab, tables))
    left = _discovery(fab, lost)
    left.ports = {k: v for k, v in left.ports.items() if fab.nodes[k[0]].desc != host1}
    assert kept.update(left) == [spine]


def test_a_table_is_kept_a_few_discoveries_and_not_once_tables_are_off() -> None:
    fab = fat_tree(levels=2, leaves=4, hosts_per_leaf=2, radix=8)
    tables = dmodk_tables(fab)
    spine = _by_desc(fab, "spine02")
    lost = {g: t for g, t in tables.items() if g != spine}
    kept = ForwardingTables()
    kept.update(_discovery(fab, tables))
    for _ in range(KEEP_DISCOVERIES):
        assert kept.update(_discovery(fab, lost)) == [spine]
    assert kept.update(_discovery(fab, lost)) == []  # unread too long: the SM may have rerouted
    assert kept.tables == lost
    kept.update(_discovery(fab, tables))
    assert kept.update(_discovery(fab, {}), reading=False) == []  # a reload turned them off
    assert kept.tables == {}


def test_a_lid_that_went_and_came_back_on_another_node_is_a_move() -> None:
    fab = fat_tree(levels=2, leaves=4, hosts_per_leaf=2, radix=8)
    tables = dmodk_tables(fab)
    spine = _by_desc(fab, "spine02")
    lost = {g: t for g, t in tables.items() if g != spine}
    host1, host2 = [h.desc for h in fab.hosts()][:2]
    kept = ForwardingTables()
    kept.update(_discovery(fab, tables))
    left = _discovery(fab, lost)
    left.ports = {k: v for k, v in left.ports.items() if fab.nodes[k[0]].desc != host1}
    assert kept.update(left) == [spine]  # host1's LID went: nothing moved
    taken = _discovery(fab, lost, **{host2: fab.node_by_desc(host1).lid})
    taken.ports = {k: v for k, v in taken.ports.items() if fab.nodes[k[0]].desc != host1}
    assert kept.update(taken) == []  # host2 took host1's old LID: the kept table is wrong
    assert spine not in kept.tables


def test_a_discovery_that_read_no_table_keeps_them_all_and_a_new_lid_moves_nothing() -> None:
    fab = fat_tree(levels=2, leaves=4, hosts_per_leaf=2, radix=8)
    tables = dmodk_tables(fab)
    host1, host2 = [h.desc for h in fab.hosts()][:2]
    kept = ForwardingTables()
    # host1 is not there yet: its LID is nobody's
    first = _discovery(fab, tables)
    first.ports = {k: v for k, v in first.ports.items() if fab.nodes[k[0]].desc != host1}
    kept.update(first)
    # every table unread (every ibroute failed, or a refused discovery kept without tables),
    # and host1 arrived with a LID nobody had: nothing moved, every table is kept
    for _ in range(KEEP_DISCOVERIES):
        assert kept.update(_discovery(fab, {})) == sorted(tables)
        assert kept.tables == tables
    assert kept.update(_discovery(fab, {})) == []
    assert kept.tables == {}
    # the highest unicast LID counts like any other
    top = 0xBFFF
    kept.update(_discovery(fab, tables, **{host1: top}))
    moved = _discovery(fab, {}, **{host1: top - 1, host2: top})  # only LID top changed hands
    assert kept.update(moved) == []


def test_a_switch_that_left_is_not_kept_nor_a_source_without_tables() -> None:
    fab = fat_tree(levels=2, leaves=4, hosts_per_leaf=2, radix=8)
    tables = dmodk_tables(fab)
    spine = _by_desc(fab, "spine02")
    kept = ForwardingTables()
    kept.update(_discovery(fab, tables))
    gone = _discovery(fab, {g: t for g, t in tables.items() if g != spine})
    gone.ports = {k: v for k, v in gone.ports.items() if k[0] != spine}
    assert kept.update(gone) == []
    assert spine not in kept.tables
    none = ForwardingTables()
    assert none.update(_discovery(fab, {})) == []
    assert none.tables == {}


def test_a_looping_table_ends() -> None:
    fab = fat_tree(levels=2, leaves=4, hosts_per_leaf=2, radix=8)
    tables = dmodk_tables(fab)
    host = fab.hosts()[-1]
    # leaf01 and spine01 send this host's LID to each other forever
    leaf1, spine1 = _by_desc(fab, "leaf01"), _by_desc(fab, "spine01")
    up = next(p for p in range(1, 9) if (fab.peer(leaf1, p) or ("",))[0] == spine1)
    down = fab.peer(leaf1, up)[1]  # type: ignore[index]
    for g, port in ((leaf1, up), (spine1, down)):
        t = bytearray(tables[g])
        t[host.lid] = port
        tables[g] = bytes(t)
    index = RouteIndex.build(tables, port_views(fab))
    leaf4, hport = fab.peer(host.guid, 1)  # type: ignore[misc]
    # the packets go round the loop (both ports carry them) and never reach the host
    assert (leaf1, leaf4) in index.leaf_pairs((spine1, str(down)))
    assert (leaf1, leaf4) in index.leaf_pairs((leaf1, str(up)))
    assert (leaf1, leaf4) not in index.leaf_pairs((leaf4, str(hport)))
    assert (_by_desc(fab, "leaf02"), leaf4) in index.leaf_pairs((leaf4, str(hport)))
    assert trace_congestion(index, [(leaf1, str(up)), (spine1, str(down))]) is not None


def _hotspot() -> tuple[Fabric, RouteIndex, PortKey, PortKey, PortKey]:
    """A 2-level tree; a host on leaf04 is the hotspot; the spine port feeding leaf04 on one of
    the hotspot's routes, and leaf01's uplink on it, are congested too."""
    fab = fat_tree(levels=2, leaves=4, hosts_per_leaf=2, radix=8)
    tables = dmodk_tables(fab)
    index = RouteIndex.build(tables, port_views(fab))
    host = fab.hosts()[-1]
    leaf4, hport = fab.peer(host.guid, 1)  # type: ignore[misc]
    path = _walk(fab, tables, _by_desc(fab, "leaf01"), host.lid)
    assert len(path) == 3 and path[-1] == (leaf4, str(hport))
    return fab, index, path[-1], path[1], path[0]


def test_a_congested_spine_port_points_at_the_hotspot_downstream() -> None:
    _fab, index, host_port, spine_port, _up = _hotspot()
    assert trace_congestion(index, [host_port, spine_port]) == {spine_port: host_port}
    # nothing congested downstream: a root, not in the result
    assert trace_congestion(index, [spine_port]) == {}
    assert trace_congestion(index, [host_port]) == {}


def test_the_furthest_congested_port_is_the_root() -> None:
    _fab, index, host_port, spine_port, uplink = _hotspot()
    got = trace_congestion(index, [uplink, spine_port, host_port])
    assert got == {uplink: host_port, spine_port: host_port}


def test_congestion_off_the_routes_is_not_a_root() -> None:
    fab, index, host_port, spine_port, _up = _hotspot()
    other = fab.hosts()[0]
    leaf1, p1 = fab.peer(other.guid, 1)  # type: ignore[misc]
    assert trace_congestion(index, [spine_port, (leaf1, str(p1))]) == {}
    assert trace_congestion(index, [("0x00000000000000ff", "1"), host_port]) == {}
