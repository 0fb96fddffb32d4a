"""What mad and diags share (ibmon.sources.fabric): one rule for state refresh, LID grouping,
links to filtered-out peers and node names, exercised through the diags source."""

from __future__ import annotations

from pathlib import Path

from ibmon.infiniband.model import PortIdentity
from ibmon.sources.diags import CommandResult, DiagsSource
from ibmon.sources.fabric import FabricPort, FabricView, NodeFilter, StateSchedule
from ibmon.sources.parse import PortInfo
from tests.unit.test_diags_runner import (
    answer_details,
    answer_discovery,
    answer_tick_read,
    is_tick_read,
)

SW, H1, H2 = "0x0000000000200000", "0x0000000000100001", "0x0000000000100002"
TOPO = f"""\
SW     1  1 {SW} 4x EDR - CA     2  1 {H1} ( 'sw' - 'h1' )
SW     1  2 {SW} 4x EDR - CA     3  1 {H2} ( 'sw' - 'h2' )
CA     2  1 {H1} 4x EDR - SW     1  1 {SW} ( 'h1' - 'sw' )
CA     3  1 {H2} 4x EDR - SW     1  2 {SW} ( 'h2' - 'sw' )
"""


class Runner:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    async def run(self, argv: list[str], timeout: float, max_output: int = 0) -> CommandResult:
        self.calls.append(argv)
        if "ibnetdiscover" in argv[0]:
            return answer_discovery(argv, TOPO)
        if "-E" in argv or "-D" in argv:  # a detail read (the first poll's baselines)
            return answer_details(argv)
        if is_tick_read(argv):
            return answer_tick_read(argv)
        ports = argv[-1].split(",")
        lid = argv[argv.index("-l") + 1]
        if "-x" not in argv:  # CapMask2 0: the narrow query follows the extended one
            return CommandResult(0, "".join(
                f"# Port counters: Lid {lid} port {p} (CapMask: 0x1300)\n"
                f"PortSelect:......{p}\nCounterSelect:....0x0\n"
                + "".join(f"{n}:....0\n" for n in NARROW) for p in ports), "")
        return CommandResult(0, "".join(
            f"# Port extended counters: Lid {lid} port {p} (CapMask: 0x1300 CapMask2: 0x0)\n"
            f"PortSelect:......{p}\nCounterSelect:....0x0\nPortXmitData:....5\n"
            "PortRcvData:....6\nPortXmitPkts:....7\nPortRcvPkts:....8\n"
            "PortUnicastXmitPkts:....1\nPortUnicastRcvPkts:....1\n"
            "PortMulticastXmitPkts:....1\nPortMulticastRcvPkts:....1\n" for p in ports), "")


NARROW = (
    "SymbolErrorCounter", "LinkErrorRecoveryCounter", "LinkDownedCounter", "PortRcvErrors",
    "PortRcvRemotePhysicalErrors", "PortRcvSwitchRelayErrors", "PortXmitDiscards",
    "PortXmitConstraintErrors", "PortRcvConstraintErrors", "LocalLinkIntegrityErrors",
    "ExcessiveBufferOverrunErrors", "VL15Dropped", "PortXmitData", "PortRcvData", "PortXmitPkts",
    "PortRcvPkts",
)


def test_state_schedule_counts_discovery_and_skips_the_poll_right_after() -> None:
    s = StateSchedule(30.0)
    assert s.due(0.0)  # never read: refresh
    s.discovered(started=100.0, ended=100.5)
    assert not s.due(100.6)  # the discovery just read every state
    assert not s.due(110.0)  # and the interval has not passed since
    assert s.due(131.0)
    assert not s.due(132.0)
    assert s.due(161.0)  # exactly state_interval after the last refresh: due


def test_state_schedule_every_poll_still_skips_the_first_after_discovery() -> None:
    s = StateSchedule(0.0)
    s.discovered(started=10.0, ended=10.4)
    assert not s.due(10.5)
    assert s.due(20.0)
    assert s.due(20.1)
    s.discovered(started=30.0, ended=31.5)
    assert s.due(31.6)  # the discovery began over a second ago: its state is not that fresh


def test_node_filter_by_guid_or_case_sensitive_glob() -> None:
    """``include``/``exclude`` take node GUIDs (any spelling ibmon normalizes) or shell globs
    on descriptions, matched case-sensitively as the descriptions are; a bare hex word
    (``abc``, ``cafe01``) is both a GUID and a plausible name, so it is tried as both."""
    by_guid = NodeFilter(include=["0x00000000001000AB"])
    assert by_guid.keep("0x00000000001000ab", "anything")
    assert not by_guid.keep("0x00000000001000ac", "anything")
    globs = NodeFilter(include=["leaf*", "cafe01"], exclude=["*-spare"])
    assert globs.keep("0x1", "leaf07") and not globs.keep("0x2", "Leaf07")
    assert globs.keep("0x3", "cafe01")  # the name, not only GUID 0xcafe01
    assert not globs.keep("0x4", "leaf07-spare")
    assert not NodeFilter().active and NodeFilter(exclude=["x"]).active


def _port(guid: str, port: int, lid: int | None) -> FabricPort:
    return FabricPort(identity=PortIdentity(guid=guid, port=str(port)), lid=lid)


def test_by_lid_groups_a_switch_and_skips_ports_without_lid() -> None:
    view = FabricView(source="t")
    for guid, port, lid in ((SW, 10, 1), (H2, 1, 3), (SW, 2, 1), (H1, 1, None), (SW, 9, 1)):
        view.ports[(guid, str(port))] = _port(guid, port, lid)
    assert view.by_lid() == {1: [(SW, "2"), (SW, "9"), (SW, "10")], 3: [(H2, "1")]}


def _info(widths: int) -> PortInfo:
    return PortInfo(lid=1, sm_lid=1, cap_mask=0, local_port=1, width_enabled=widths,
                    width_supported=widths, width_active=2, speed_supported=4, state=4,
                    phys_state=5, lmc=0, speed_active=4, speed_enabled=4, cap_mask2=0,
                    speed_ext_active=0, speed_ext_supported=0, speed_ext_enabled=0)


def test_finish_links_names_peers_outside_the_view() -> None:
    view = FabricView(source="t")
    for key in ((SW, "1"), (H1, "1")):
        view.ports[key] = _port(key[0], 1, 1)
        view.apply_port_info(key, _info(2 | 4))  # 4X and 8X enabled at both ends
    view.ports[(SW, "1")].remote = (H1, 1)
    view.ports[(H1, "1")].remote = (SW, 1)
    view.ports[(SW, "2")] = _port(SW, 2, 1)
    view.ports[(SW, "2")].remote = (H2, 1)  # H2 filtered out
    view.finish_links({H2: "h2 (mapped)", H1: "unused: h1 is in the view"})
    inside, outside = view.ports[(SW, "1")].link, view.ports[(SW, "2")].link
    assert inside is not None and outside is not None
    assert (inside.max_width, inside.max_speed, inside.remote_node_desc) == ("8X", "QDR", "")
    assert (outside.remote_node_desc, outside.max_width) == ("h2 (mapped)", "")


def test_a_refresh_without_extended_port_info_keeps_fdr10_while_the_link_stays_up_at_qdr() -> None:
    """FDR10 is known only from the vendor ExtendedPortInfo, which the diags state refresh (the
    cache) never has and a mad poll can lose: the port stays FDR10 while PortInfo still says
    LinkUp at QDR, and is QDR again once an ExtendedPortInfo says so or the link went down."""
    view = FabricView(source="t")
    key = (H1, "1")
    view.ports[key] = _port(H1, 1, 2)
    fdr10 = _info(2)._replace(mlnx_speed_supported=1, mlnx_speed_enabled=1, mlnx_speed_active=1)
    view.apply_port_info(key, fdr10)
    assert view.ports[key].active_speed == "FDR10"
    view.refresh_port(key, _info(2))
    assert view.ports[key].active_speed == "FDR10"
    view.refresh_port(key, _info(2)._replace(mlnx_speed_supported=1, mlnx_speed_enabled=1))
    assert view.ports[key].active_speed == "QDR"  # it says QDR now
    view.apply_port_info(key, fdr10)
    view.refresh_port(key, _info(2)._replace(phys_state=2, state=1))
    view.refresh_port(key, _info(2))  # back up: FDR10 or QDR cannot be told without it
    assert view.ports[key].active_speed == "QDR"


async def test_diags_filter_names_and_groups(tmp_path: Path) -> None:
    nnm = tmp_path / "node-name-map"
    nnm.write_text(f'{SW} "leaf-01"\n{H1} "compute-001"\n')
    runner = Runner()
    src = DiagsSource(runner=runner, exclude=[H2], node_name_map=nnm, state_interval=3600)
    try:
        topo = await src.discover()
        snap = await src.sample()
    finally:
        await src.close()
    assert set(topo.ports) == {(SW, "1"), (SW, "2"), (H1, "1")}
    assert topo.ports[(SW, "1")].node_desc == "leaf-01"
    assert topo.links[(SW, "1")].remote_node_desc == "compute-001"
    assert topo.links[(SW, "2")].remote_node_desc == "h2"  # filtered out, still named
    assert topo.links[(H1, "1")].remote_node_desc == "leaf-01"
    perfq = [c[-1] for c in runner.calls if "perfquery" in c[0] and "-x" in c]
    assert sorted(perfq) == ["1", "1,2"]  # one process per LID: the switch's ports together
    assert set(snap.ports) == set(topo.ports)
    # the state refresh is not due: the only ibnetdiscover is the discovery's
    assert sum("ibnetdiscover" in c[0] for c in runner.calls) == 1


async def test_diags_filters_by_node_description() -> None:
    """``exclude`` globs match what the nodes call themselves (``ibnetdiscover``'s
    descriptions), as they do for the other fabric sources."""
    src = DiagsSource(runner=Runner(), exclude=["h2*"], state_interval=3600)
    try:
        topo = await src.discover()
    finally:
        await src.close()
    assert set(topo.ports) == {(SW, "1"), (SW, "2"), (H1, "1")}
