"""Merging discoveries into the known topology: lost MADs never rewrite it.

``TopologyMemory`` (``ibmon.sources.fabric``) is what both fabric sources run every discovery
through: unreachable nodes stay for N discoveries (counted at most once per gap), known node
descriptions and links survive a lost MAD, and a discovery that reached only the local node is
refused as blind.
"""

from __future__ import annotations

import pytest

from ibmon.sources.fabric import BlindDiscoveryError, FabricPort, FabricView, TopologyMemory
from ibmon.sources.parse import PortInfo

SW, H1, H2 = "0x0000000000000001", "0x00000000000000a1", "0x00000000000000a2"


def info(phys: int = 5) -> PortInfo:
    return PortInfo(lid=1, sm_lid=1, cap_mask=0, local_port=1, width_enabled=3,
                    width_supported=3, width_active=2, speed_supported=1,
                    state=4 if phys == 5 else 1, phys_state=phys, lmc=0, speed_active=1,
                    speed_enabled=1, cap_mask2=0, speed_ext_active=0, speed_ext_supported=0,
                    speed_ext_enabled=0)


def view(*, hosts: tuple[str, ...] = (H1, H2), descs: dict[str, str] | None = None,
         peers: bool = True, phys: int = 5) -> FabricView:
    """A switch with one host per port; ``peers`` False: the sweep lost the hosts' NodeInfo."""
    names = {SW: "leaf01", H1: "host1", H2: "host2", **(descs or {})}
    v = FabricView(source="mad")
    for p, h in enumerate((H1, H2), start=1):
        key, fp = v.add(SW, p, desc=names[SW], node_type="switch", lid=1)
        v.apply_port_info(key, info(phys))
        fp.remote = (h, 1) if peers and h in hosts else None
        if h in hosts:
            hkey, hfp = v.add(h, 1, desc=names[h], node_type="ca", lid=10 + p)
            v.apply_port_info(hkey, info(phys))
            hfp.remote = (SW, p)
    v.finish_links({})
    return v


def test_a_missing_node_is_kept_until_it_missed_n_discoveries() -> None:
    mem = TopologyMemory(misses_to_drop=3)
    known = mem.merge(None, view(), reached=3, now=0.0)
    for n in (1, 2):
        known = mem.merge(known, view(hosts=(H1,)), reached=2, now=float(n))
        assert (H2, "1") in known.ports, n
        assert mem.unreachable == {H2}
        assert known.ports[(H2, "1")].lid == 12  # still asked at its LID
    known = mem.merge(known, view(hosts=(H1,)), reached=2, now=3.0)
    assert (H2, "1") not in known.ports and mem.unreachable == frozenset()


def test_answering_again_resets_the_count() -> None:
    mem = TopologyMemory(misses_to_drop=2)
    known = mem.merge(None, view(), reached=3, now=0.0)
    known = mem.merge(known, view(hosts=(H1,)), reached=2, now=1.0)
    known = mem.merge(known, view(), reached=3, now=2.0)
    known = mem.merge(known, view(hosts=(H1,)), reached=2, now=3.0)
    assert (H2, "1") in known.ports  # one miss since it last answered


def test_misses_count_at_most_once_per_gap() -> None:
    """Extra discoveries after a failed poll must not use up a node's allowance in seconds."""
    mem = TopologyMemory(misses_to_drop=2, min_gap=270.0)
    known = mem.merge(None, view(), reached=3, now=0.0)
    for t in (300.0, 301.0, 302.0, 400.0):
        known = mem.merge(known, view(hosts=(H1,)), reached=2, now=t)
        assert (H2, "1") in known.ports, t
    known = mem.merge(known, view(hosts=(H1,)), reached=2, now=600.0)
    assert (H2, "1") not in known.ports


def test_a_lost_node_description_never_empties_a_known_one() -> None:
    mem = TopologyMemory()
    known = mem.merge(None, view(), reached=3, now=0.0)
    known = mem.merge(known, view(descs={SW: "", H1: ""}), reached=3, now=1.0)
    assert known.ports[(SW, "1")].identity.node_desc == "leaf01"
    assert known.ports[(H1, "1")].identity.node_desc == "host1"
    link = known.ports[(H1, "1")].link
    assert link is not None and link.remote_node_desc == "leaf01"
    renamed = mem.merge(known, view(descs={H1: "host1-new"}), reached=3, now=2.0)
    assert renamed.ports[(H1, "1")].identity.node_desc == "host1-new"  # a real rename wins


def test_a_port_still_up_keeps_its_link_when_the_peer_did_not_answer() -> None:
    mem = TopologyMemory()
    known = mem.merge(None, view(), reached=3, now=0.0)
    kept = mem.merge(known, view(peers=False), reached=3, now=1.0)
    link = kept.ports[(SW, "1")].link
    assert link is not None and link.remote_guid == H1 and link.remote_node_desc == "host1"
    down = mem.merge(kept, view(peers=False, phys=2), reached=3, now=2.0)
    assert down.ports[(SW, "1")].link is None  # down: the missing peer is real news


def test_a_discovery_that_reached_only_the_local_node_is_blind() -> None:
    mem = TopologyMemory()
    known = mem.merge(None, view(), reached=3, now=0.0)
    with pytest.raises(BlindDiscoveryError, match="reached 1 node"):
        mem.merge(known, view(hosts=()), reached=1, now=1.0)
    again = mem.merge(known, view(), reached=3, now=2.0)
    assert len(again.ports) == 4 and mem.unreachable == frozenset()
    first = TopologyMemory().merge(None, view(hosts=()), reached=1, now=0.0)
    assert len(first.ports) == 2  # a fabric of one node is fine when nothing more is known


def test_kept_ports_are_the_known_objects() -> None:
    mem = TopologyMemory()
    known = mem.merge(None, view(), reached=3, now=0.0)
    old: FabricPort = known.ports[(H2, "1")]
    merged = mem.merge(known, view(hosts=(H1,)), reached=2, now=1.0)
    assert merged.ports[(H2, "1")] is old


def test_a_renamed_node_shows_its_new_name_after_a_lost_description() -> None:
    """A node description changed by its administrator is the one a later lost MAD restores."""
    mem = TopologyMemory()
    known = mem.merge(None, view(), reached=3, now=0.0)
    known = mem.merge(known, view(descs={H1: "host1-new"}), reached=3, now=1.0)
    known = mem.merge(known, view(descs={H1: ""}), reached=3, now=2.0)
    assert known.ports[(H1, "1")].identity.node_desc == "host1-new"


def test_a_port_that_left_the_view_leaves_no_miss_count_behind() -> None:
    """Otherwise it would come back with the misses it had and vanish at its next one."""
    mem = TopologyMemory(misses_to_drop=2)
    known = mem.merge(None, view(), reached=3, now=0.0)
    known = mem.merge(known, view(hosts=(H1,)), reached=2, now=1.0)  # one miss of two
    assert (H2, "1") in known.ports
    known = mem.merge(FabricView(source="mad"), view(hosts=(H1,)), reached=2, now=2.0)
    assert (H2, "1") not in known.ports  # no longer known at all: its count goes too
    known = mem.merge(known, view(), reached=3, now=3.0)
    known = mem.merge(known, view(hosts=(H1,)), reached=2, now=4.0)
    assert (H2, "1") in known.ports and mem.unreachable == {H2}  # a fresh count: one of two
