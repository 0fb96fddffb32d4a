"""FDR10 on the ``mad`` source's polls: every poll that refreshes state asks the vendor
ExtendedPortInfo of the ports whose PortInfo may hide FDR10 (a listed device, LinkUp at QDR),
so a link that retrained from FDR10 to QDR is QDR, and degraded, at that poll, not at the next
discovery. ibsim cannot retrain a link (its FDR10 is fixed by the net file), so the answers come
from here; tests/integration/test_fdr10_ibsim.py reads them from ibsim.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from ibmon.infiniband.linkspeed import is_degraded
from ibmon.sources.fabric import FabricView
from ibmon.sources.libibmad import (
    ATTR_MLNX_EXT_PORT_INFO,
    ATTR_PORT_INFO,
    CLASS_SMI,
    MadRequest,
    MadResult,
)
from ibmon.sources.mad import MadSource
from ibmon.sources.parse import ClassPortInfo, decode_port_info, with_mlnx_speeds

SW, HOST, OTHER = "0x0002c90000000a00", "0x0002c90000001400", "0x0002c90000001200"


def port_info_bytes(lid: int) -> bytes:
    """PortInfo of a 4X port LinkUp and Active at QDR, no extended speeds."""
    data = bytearray(64)
    data[16:18] = lid.to_bytes(2, "big")
    data[29] = data[30] = data[31] = 0x02  # LinkWidth{Enabled,Supported,Active}: 4X
    data[32] = 4 << 4 | 4  # LinkSpeedSupported QDR, LinkState Active
    data[33] = 5 << 4  # PhysLinkState LinkUp
    data[35] = 4 << 4 | 4  # LinkSpeedActive, LinkSpeedEnabled: QDR
    return bytes(data)


def ext_port_info_bytes(active: int) -> bytes:
    """Mellanox ExtendedPortInfo: FDR10 supported and enabled, ``active`` its LinkSpeedActive."""
    data = bytearray(64)
    data[7] = data[11] = 1
    data[15] = active
    return bytes(data)


class Source(MadSource):
    """Answers here: PortInfo as ``port_info_bytes``, ExtendedPortInfo with ``fdr10_active``
    (None: the Get is lost), every PMA Get lost (this test is about state)."""

    def __init__(self) -> None:
        super().__init__()
        self.fdr10_active: int | None = 0
        self.asked: list[MadRequest] = []

    def _results(self, reqs: Sequence[MadRequest], *, keep: bool = True) -> Iterator[MadResult]:
        out = []
        for r in reqs:
            self.asked.append(r)
            if r.mgmt_class == CLASS_SMI and r.attr_id == ATTR_PORT_INFO:
                out.append(MadResult(port_info_bytes(r.lid)))
            elif r.attr_id == ATTR_MLNX_EXT_PORT_INFO and self.fdr10_active is not None:
                out.append(MadResult(ext_port_info_bytes(self.fdr10_active)))
            else:
                out.append(MadResult(None, "timeout"))
        return iter(out)


def fdr10_view() -> FabricView:
    """sw/1 - host/1 discovered at FDR10 (both ends asked), sw/2 - other/1 at QDR (``other``
    is not a device that has ExtendedPortInfo)."""
    view = FabricView(source="mad")
    ends = ((SW, 1, 1, HOST), (HOST, 1, 3, SW), (SW, 2, 1, OTHER), (OTHER, 1, 4, SW))
    for guid, port, lid, peer in ends:
        key, _fp = view.add(guid, port, desc=guid[-4:], node_type="ca", lid=lid)
        info = decode_port_info(port_info_bytes(lid))
        if OTHER not in (guid, peer):
            info = with_mlnx_speeds(info, ext_port_info_bytes(1))
        view.apply_port_info(key, info)
    view.ports[(SW, "1")].remote, view.ports[(HOST, "1")].remote = (HOST, 1), (SW, 1)
    view.ports[(SW, "2")].remote, view.ports[(OTHER, "1")].remote = (OTHER, 1), (SW, 2)
    view.finish_links({})
    return view


def poll(src: Source, view: FabricView) -> list[MadRequest]:
    src.asked.clear()
    src._cpi = {lid: ClassPortInfo(cap_mask=0x1200, cap_mask2=0) for lid in (1, 3, 4)}
    src._epi_nodes = frozenset({SW, HOST})
    src._counters_sync(view, refresh_state=True)
    return [r for r in src.asked if r.attr_id == ATTR_MLNX_EXT_PORT_INFO]


def test_a_link_that_retrained_from_fdr10_to_qdr_is_qdr_and_degraded_at_the_next_poll() -> None:
    src, view = Source(), fdr10_view()
    link = view.ports[(SW, "1")].link
    assert link is not None and (link.active_speed, link.max_speed) == ("FDR10", "FDR10")
    asked = poll(src, view)
    # every port of a listed device up at QDR, the switch's port facing ``other`` too (its
    # own device decides, as in rdma-core); ``other``'s port is not asked
    assert sorted((r.lid, r.attr_mod) for r in asked) == [(1, 1), (1, 2), (3, 1)]
    for key in ((SW, "1"), (HOST, "1")):
        fp = view.ports[key]
        assert fp.link is not None
        assert (fp.active_speed, fp.link.active_speed, fp.link.max_speed) == ("QDR", "QDR", "FDR10")
        assert is_degraded(fp.link.active_width, fp.link.active_speed, fp.link.max_width,
                           fp.link.max_speed)
    # and back at FDR10 on the poll after
    src.fdr10_active = 1
    poll(src, view)
    assert view.ports[(HOST, "1")].active_speed == "FDR10"


def test_a_lost_extended_port_info_keeps_what_the_port_was() -> None:
    src, view = Source(), fdr10_view()
    src.fdr10_active = None
    assert poll(src, view)
    assert view.ports[(HOST, "1")].active_speed == "FDR10"
    assert view.ports[(OTHER, "1")].active_speed == "QDR"
