"""A node another shard now polls is handed off at once, not kept as unreachable.

``TopologyMemory.merge`` sees a sharded discovery: a known node missing from it because the
assignment gave it to another shard (``FabricView.handed_off``, filled by ``keep_shard``) is
dropped with all its ports at once and named in ``handed_off``; a node missing because it did
not answer is still kept as unreachable. tests/faults/test_shard_handoff.py runs the same on
ibsim through both fabric sources and real daemons.
"""

from __future__ import annotations

from ibmon.sources.fabric import FabricView, TopologyMemory
from ibmon.sources.shard import assign_nodes

#: sw-b and sw-c of tests/shard_fabric.py: sha1 shards 0 and 1 of 2 there
SW_A, SW_B = "0x0002c90000000d00", "0x0002c90000000f00"
HOST = "0x0002c90000001000"


def discovery(host_on: str | None) -> FabricView:
    """Two switches linked by their port 1; the host on port 2 of ``host_on`` (None: it did
    not answer)."""
    v = FabricView(source="mad")
    for sw, other in ((SW_A, SW_B), (SW_B, SW_A)):
        _, fp = v.add(sw, 1, desc=sw, node_type="switch", lid=1)
        fp.remote = (other, 1)
        _, fp = v.add(sw, 2, desc=sw, node_type="switch", lid=1)
        fp.remote = (HOST, 1) if sw == host_on else None
    if host_on is not None:
        _, fp = v.add(HOST, 1, desc="host", node_type="ca", lid=9)
        fp.remote = (host_on, 2)
    v.finish_links({})
    return v


def shard_of(sw: str) -> int:
    return assign_nodes(discovery(sw).topology(), 2)[sw]


def test_a_host_moved_to_another_shards_switch_is_handed_off_at_once() -> None:
    assert (shard_of(SW_A), shard_of(SW_B)) == (0, 1)
    mine = shard_of(SW_A)
    mem = TopologyMemory(misses_to_drop=3)
    first = discovery(SW_A)
    first.keep_shard((mine, 2))
    known = mem.merge(None, first, reached=3, now=0.0)
    assert (HOST, "1") in known.ports and first.handed_off == {SW_B}

    moved = discovery(SW_B)  # re-cabled: it is behind the other shard's switch now
    moved.keep_shard((mine, 2))
    assert HOST in moved.handed_off
    known = mem.merge(known, moved, reached=3, now=1.0)
    assert (HOST, "1") not in known.ports
    assert mem.unreachable == frozenset() and mem.handed_off == {HOST}

    gone = discovery(None)  # the next discovery: nothing more to hand off
    gone.keep_shard((mine, 2))
    mem.merge(known, gone, reached=2, now=2.0)
    assert mem.handed_off == frozenset()


def test_a_host_that_did_not_answer_is_still_unreachable_not_handed_off() -> None:
    mine = shard_of(SW_A)
    mem = TopologyMemory(misses_to_drop=3)
    first = discovery(SW_A)
    first.keep_shard((mine, 2))
    known = mem.merge(None, first, reached=3, now=0.0)
    silent = discovery(None)
    silent.keep_shard((mine, 2))
    known = mem.merge(known, silent, reached=2, now=1.0)
    assert (HOST, "1") in known.ports
    assert mem.unreachable == {HOST} and mem.handed_off == frozenset()
