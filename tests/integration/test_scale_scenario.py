"""The ``scale`` scenario: radix-64 switches, 100,000+ ports at ``--hosts 20000``, and
an answer key that holds on a bigger tree than its own, as ``ibmon demo --scenario scale --hosts
N`` plays it.

The key names only faulted ports (a link fault is raised once, on its carrying end: the switch
end of a host link, the leaf end of an uplink), and they resolve by name on any tree size, so
the same key is checked unchanged on a bigger tree (where leaf01's uplink 40 ends on another
spine), through the one poll pipeline.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from detect_harness import mismatches, play

from mocks.scenario import build_fabric, load_scenario, resolve_port

HOSTS = 300  # 1,240 ports; leaf01's uplink 40 ends on spine02 here, on spine01 in its own tree


def test_scale_reaches_100k_ports_with_radix_64() -> None:
    sc = load_scenario("scale")
    assert sc.topology.radix == 64
    fabric = build_fabric(sc, hosts=20_000)
    assert len(fabric.ports()) >= 100_000
    assert {n.nports for n in fabric.nodes.values() if n.kind == "switch"} == {64}
    for entry in sc.timeline:  # every fault lands on a port of the big tree
        resolve_port(fabric, entry.port)


def test_scale_answer_key_holds_on_a_bigger_tree() -> None:
    sc, source, seen = play("scale", hosts=HOSTS)
    fabric = source.model.fabric
    assert len(fabric.ports()) > len(sc.topology.build().ports())
    named = {resolve_port(sc.topology.build(), e.port) for e in sc.timeline}
    assert {resolve_port(sc.topology.build(), e.port) for e in sc.expect} <= named
    problems = mismatches(sc, source, seen)
    assert not problems, "\n".join(problems)
    assert len(seen) == len(sc.expect)
