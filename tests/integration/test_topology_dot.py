"""``ibmon topology --format dot`` on a 2,000-port fabric, rendered by the real Graphviz ``dot``.

The fabric is the simulated fat tree of the sweep benchmarks (``fabric_for_ports(2200)``: 2,310
cabled ports, 644 nodes), tracked like the daemon
tracks it; three links get faults: one down, one degraded, one congested. The map must render,
show those three links and only those in colour, and keep hostile node descriptions as labels.
"""

from __future__ import annotations

import re
import subprocess
import time
from types import MappingProxyType

import pytest

from ibmon.infiniband.model import PortKey, PortView, Snapshot
from ibmon.state import FabricState
from ibmon.state.topology import dot_quote, node_rows, to_dot
from ibmon.track.tracker import Tracker
from mocks.topology import fabric_for_ports
from mocks.traffic import FabricModel
from tests.syspkg import require_binary

pytestmark = pytest.mark.system


def fabric_state(ports: int) -> tuple[FabricState, FabricModel]:
    model = FabricModel(fabric_for_ports(ports), seed=1)
    tracker = Tracker()
    snap = Snapshot(source="mock", monotonic=0.0, wall=1.7e9)
    for i in range(len(model.keys)):
        s = model.sample_index(i)
        snap.ports[s.key] = s
    views = tracker.update(snap)
    return FabricState(generated=1.7e9, ports=MappingProxyType(views)), model


def _key(model: FabricModel, n: int) -> PortKey:
    guid, port = model.fabric.links[n].a
    return (guid, str(port))


def test_a_2000_port_fabric_renders_with_its_faulty_links_in_colour() -> None:
    dot = require_binary("dot")
    state, model = fabric_state(2200)
    assert len(state.ports) >= 2000
    views: dict[PortKey, PortView] = dict(state.ports)
    down, degraded, congested = (_key(model, n) for n in (10, 500, 1000))
    views[down].state = 1
    views[down].conditions = frozenset({"down"})
    views[degraded].conditions = frozenset({"degraded"})
    views[congested].conditions = frozenset({"congestion"})
    state = FabricState(generated=state.generated, ports=MappingProxyType(views))
    nodes = [node for _, node in node_rows(state)]
    links = [link for n in nodes for link in n["links"]]
    assert len(links) == len(model.fabric.links)  # every cable once
    text = to_dot(nodes)
    assert len(re.findall(r"color=red, penwidth=3", text)) == 2  # down and degraded
    assert text.count('color="#ff8c00"') == 1
    started = time.monotonic()
    proc = subprocess.run([dot, "-Tsvg"], input=text, capture_output=True, text=True,
                          timeout=600, check=False)
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-2000:]
    svg = proc.stdout
    assert svg.count('stroke="red"') >= 2
    assert 'stroke="#ff8c00"' in svg
    assert "leaf01" in svg
    assert "host001 mlx5_0" in svg
    print(f"dot -Tsvg: {len(state.ports)} ports, {len(links)} links, {took:.1f} s, "
          f"{len(svg) / 1e6:.1f} MB")


def test_node_descriptions_stay_labels() -> None:
    dot = require_binary("dot")
    hostile = 'x" ]; "evil" -- "y" [color=red'
    assert dot_quote(hostile) == '"x\\" ]; \\"evil\\" -- \\"y\\" [color=red"'
    assert dot_quote("a\\b\nc\x1b") == '"a\\\\b c "'
    node = {"guid": "0x1", "node_desc": hostile, "node_type": "ca", "ports": [], "links": []}
    proc = subprocess.run([dot, "-Tsvg"], input=to_dot([node]), capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("<g id=\"node") == 1  # one node, no "evil" node, no edge
    assert "<g id=\"edge" not in proc.stdout
    assert 'stroke="red"' not in proc.stdout
