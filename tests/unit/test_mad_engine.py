"""The MAD wire layout the engine writes and how it reads an answer's status (no device
needed; the GC pause around sweeps: ``tests/unit/test_gcpause.py``)."""

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
    answer,
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


def _reply(mgmt_class: int, status: int) -> bytes:
    """A response (GetResp) with ``status`` and a payload of 0xab bytes."""
    raw = bytearray(256)
    raw[:4] = bytes([1, mgmt_class, 1, 0x81])
    struct.pack_into(">H", raw, 4, status)
    raw[64:] = b"\xab" * 192
    return bytes(raw)


def test_an_answer_with_status_zero_is_its_payload() -> None:
    assert answer(_reply(CLASS_PMA, 0)) == (b"\xab" * 192, None)
    # a directed-route SMP coming back has its direction bit set: not an error
    assert answer(_reply(CLASS_SMI_DIRECT, 0x8000)) == (b"\xab" * 192, None)
    assert answer(memoryview(_reply(CLASS_SMI, 0))) == (b"\xab" * 192, None)


def test_a_busy_or_redirecting_responder_gives_no_values() -> None:
    """perfquery (libibmad's mad_rpc) refuses any status but 0; so does the engine, or a busy
    switch's echoed payload would read as counters at zero: a reset that never happened."""
    assert answer(_reply(CLASS_PMA, 0x0001)) == (None, "busy")
    assert answer(_reply(CLASS_PMA, 0x0002)) == (None, "redirect")
    assert answer(_reply(CLASS_SMI_DIRECT, 0x8001)) == (None, "busy")
    # class-specific bits (8-14) are no answer either
    assert answer(_reply(CLASS_PMA, 0x0100)) == (None, "status_0x0100")


def test_an_unsupported_request_says_its_status() -> None:
    """Bits 2-4: bad version, method, attribute or value; the source stops asking for an
    unsupported detail attribute on ``status_`` (``tests/unit/test_detail_reads.py``)."""
    assert answer(_reply(CLASS_PMA, 0x000C)) == (None, "status_0x000c")
    assert answer(_reply(CLASS_SMI_DIRECT, 0x801C)) == (None, "status_0x001c")
    assert answer(_reply(CLASS_SMI, 0x0004)) == (None, "status_0x0004")
