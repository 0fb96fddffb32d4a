"""``/api/v1/topology`` and its DOT map on a hand-made fabric: which links are degraded,
faulty, down or unseen, which nodes are red, what is drawn above what."""

from __future__ import annotations

from types import MappingProxyType

from ibmon.infiniband.model import LinkInfo, PortIdentity, PortView
from ibmon.state import FabricState
from ibmon.state.topology import node_rows, to_dot

SPINE, LEAF, UNSEEN = "0x00000000000000s1", "0x00000000000000l1", "0x00000000000000u1"
HOSTS = [f"0x00000000000000h{n}" for n in range(1, 5)]
NAMES = {SPINE: "spine01", LEAF: "leaf01", UNSEEN: "spine09",
         **{h: f"host0{n} mlx5_0" for n, h in enumerate(HOSTS, 1)}}


def _end(guid: str, port: str, far: str, far_port: str, *, speed: str = "EDR",
         state: int = 4, conditions: frozenset[str] = frozenset()) -> PortView:
    ident = PortIdentity(guid=guid, port=port, node_desc=NAMES[guid],
                         node_type="switch" if guid in (SPINE, LEAF) else "ca")
    return PortView(identity=ident, state=state, phys_state=5 if state == 4 else 2,
                    active_width="4X", active_speed=speed, conditions=conditions,
                    link=LinkInfo(remote_guid=far, remote_port=far_port,
                                  remote_node_desc=NAMES[far], active_width="4X",
                                  active_speed=speed, max_width="4X", max_speed="EDR"))


def _fabric() -> list[dict[str, object]]:
    h1, h2, h3, h4 = HOSTS
    views = [
        _end(SPINE, "1", LEAF, "9"), _end(LEAF, "9", SPINE, "1"),
        _end(LEAF, "10", UNSEEN, "4"),  # its far end is not in the state
        _end(LEAF, "1", h1, "1", speed="FDR"), _end(h1, "1", LEAF, "1", speed="FDR"),
        # the fault shows at the leaf's end; the link is listed from the host's
        _end(LEAF, "2", h2, "1", conditions=frozenset({"high_ber"})), _end(h2, "1", LEAF, "2"),
        _end(LEAF, "3", h3, "1", state=1), _end(h3, "1", LEAF, "3", state=1),
        _end(LEAF, "4", h4, "1"), _end(h4, "1", LEAF, "4", conditions=frozenset({"congestion"})),
    ]
    state = FabricState(generated=1.7e9, ports=MappingProxyType({v.key: v for v in views}))
    return [node for _, node in node_rows(state)]


def test_links_as_the_api_shows_them() -> None:
    nodes = {n["guid"]: n for n in _fabric()}
    leaf = nodes[LEAF]
    assert [p["port"] for p in leaf["ports"]] == ["1", "2", "3", "4", "9", "10"]  # type: ignore[index]
    links = {(lk["a"]["guid"], lk["b"]["guid"]): lk  # type: ignore[index]
             for n in nodes.values() for lk in n["links"]}  # type: ignore[attr-defined]
    h1, h2, h3, h4 = HOSTS
    slow = links[(h1, LEAF)]
    assert (slow["degraded"], slow["active_speed"], slow["best_speed"]) == (True, "FDR", "EDR")
    # a fault at either end is the link's
    assert (links[(h2, LEAF)]["conditions"], links[(h2, LEAF)]["faulty"]) == (["high_ber"], True)
    assert links[(h3, LEAF)]["state"] == "down"
    assert (links[(h4, LEAF)]["congested"], links[(h4, LEAF)]["faulty"]) == (True, False)
    assert links[(LEAF, UNSEEN)]["b"]["seen"] is False


def test_the_map_shows_what_is_wrong_and_puts_the_top_of_the_fabric_on_top() -> None:
    text = to_dot(_fabric())
    edges = {line.split(" [")[0].strip(): line for line in text.splitlines() if " -- " in line}
    h1, h2, h3, h4 = HOSTS
    assert f'"{SPINE}" -- "{LEAF}"' in edges  # the upper end first
    assert 'label="4X FDR (could be 4X EDR)"' in edges[f'"{LEAF}" -- "{h1}"']
    assert "color=red, penwidth=3" in edges[f'"{LEAF}" -- "{h2}"']
    assert "style=dashed" in edges[f'"{LEAF}" -- "{h3}"']
    assert "style=dashed" not in edges[f'"{LEAF}" -- "{h2}"']
    # a node with a fault on a port is red, one that is only congested is not
    node_lines = {line.split(" [")[0].strip(): line for line in text.splitlines()
                  if line.startswith("  \"") and " -- " not in line}
    assert "color=red" in node_lines[f'"{LEAF}"']
    assert "color=red" not in node_lines[f'"{h4}"'] + node_lines[f'"{h2}"']
    # the far end nobody sees is drawn, dashed, by its description
    assert node_lines[f'"{UNSEEN}"'].endswith('[label="spine09", style=dashed];')
    # four hosts under one leaf: rows of two, so the block is about as high as wide
    assert sum(" -- " in line and "[style=invis]" in line for line in text.splitlines()) == 2
