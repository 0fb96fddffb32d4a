"""The MAD wire layout the engine writes (no device needed; the GC pause around sweeps:
``tests/unit/test_gcpause.py``)."""

from __future__ import annotations

import struct

from ibmon.sources.libibmad import (
    ATTR_NODE_INFO,
    ATTR_PORT_COUNTERS_EXT,
    ATTR_PORT_INFO,
    CLASS_PMA,
    CLASS_SMI,
    CLASS_SMI_DIRECT,
    MadRequest,
    _build_into,
)


def _mad(req: MadRequest, tid: int) -> bytes:
    buf = bytearray(256)
    _build_into(buf, req, tid)
    return bytes(buf)


def test_directed_route_smp_layout() -> None:
    raw = _mad(MadRequest(CLASS_SMI, ATTR_NODE_INFO, path=(1, 3, 7)), 0x1234)
    assert raw[:4] == bytes([1, CLASS_SMI_DIRECT, 1, 0x01])  # base/class version, Get
    assert raw[6] == 0 and raw[7] == 3  # hop pointer, hop count
    tid, attr, _resv, mod = struct.unpack_from(">QHHI", raw, 8)
    assert (tid, attr, mod) == (0x1234, ATTR_NODE_INFO, 0)
    assert raw[32:36] == b"\xff\xff\xff\xff"  # DrSLID, DrDLID permissive
    assert raw[128:132] == bytes([0, 1, 3, 7])  # initial path, slot 0 unused
    assert raw[132:] == bytes(124)


def test_lid_routed_smp_and_pma_layout() -> None:
    smp = _mad(MadRequest(CLASS_SMI, ATTR_PORT_INFO, attr_mod=5, lid=9), 7)
    assert smp[1] == CLASS_SMI and smp[7] == 0
    assert struct.unpack_from(">QHHI", smp, 8) == (7, ATTR_PORT_INFO, 0, 5)
    assert smp[32:] == bytes(224)  # no DR fields, no path
    pma = _mad(MadRequest(CLASS_PMA, ATTR_PORT_COUNTERS_EXT, lid=9, port_select=17), 8)
    assert pma[1] == CLASS_PMA
    assert pma[65] == 17  # PortSelect, first byte after the 64-byte header is reserved
    assert pma[64] == 0 and pma[66:] == bytes(190)


def test_building_over_a_used_buffer_needs_the_zeroing_the_engine_does() -> None:
    buf = bytearray(b"\xaa" * 256)
    buf[:] = bytes(256)
    _build_into(buf, MadRequest(CLASS_SMI, ATTR_NODE_INFO, path=(2,)), 1)
    assert bytes(buf) == _mad(MadRequest(CLASS_SMI, ATTR_NODE_INFO, path=(2,)), 1)
