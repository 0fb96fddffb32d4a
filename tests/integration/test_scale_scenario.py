"""The ``scale`` scenario (issue 12): radix-64 switches, 100,000+ ports at ``--hosts 20000``, and
an answer key that holds on a bigger tree than its own, as ``ibmon demo --scenario scale --hosts
N`` plays it.

The key names the ports of the scenario's own tree. On a bigger tree the faulted ports resolve
by name; the far end of a faulted leaf uplink is another spine port, so an expected event on a
far end is moved to that fabric's far end of the same faulted port. Everything else in the key
(types, windows, severities, details) is checked unchanged, through the one poll pipeline.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from detect_harness import mismatches, play

from mocks.scenario import Scenario, build_fabric, load_scenario, resolve_port
from mocks.topology import Fabric

HOSTS = 300  # 1,240 ports; leaf01's uplink 40 ends on spine02 here, on spine01 in the key


def _port_name(fabric: Fabric, key: tuple[str, int]) -> str:
    return f"{fabric.nodes[key[0]].desc}[{key[1]}]"


def key_on(sc: Scenario, fabric: Fabric) -> Scenario:
    """The key with every far-end port moved to ``fabric``'s far end of the same faulted port."""
    own = sc.topology.build()
    far: dict[tuple[str, int], str] = {}
    for entry in sc.timeline:
        peer = own.peer(*resolve_port(own, entry.port))
        there = fabric.peer(*resolve_port(fabric, entry.port))
        if peer is not None and there is not None:
            far[peer] = _port_name(fabric, there)
    named = {resolve_port(own, e.port) for e in sc.timeline}
    expect = []
    for exp in sc.expect:
        key = resolve_port(own, exp.port)
        moved = key not in named and key in far
        expect.append(exp.model_copy(update={"port": far[key]}) if moved else exp)
    return sc.model_copy(update={"expect": expect})


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
    key = key_on(sc, fabric)
    assert key.expect != sc.expect  # the far end really moved: the remapping is exercised
    problems = mismatches(key, source, seen)
    assert not problems, "\n".join(problems)
    assert len(seen) == len(sc.expect)
