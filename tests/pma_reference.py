"""PortCounters and PortCountersExtended decoded field by field: the oracle the ``mad``
source's one-pass ``decode_counters`` is checked against (``tests/unit/test_decode_counters.py``),
itself checked against libibmad's field tables (``tests/unit/test_parse.py``).

Each field is read at its byte offset with ``int.from_bytes``, under the same capability-mask
rules (ClassPortInfo CapabilityMask bit 12: PortXmitWait; bit 9: unicast/multicast;
CapabilityMask2 bit 1: the 64-bit error copies), and merged by ``merge_counters``; nothing here
shares ``decode_counters``' structs or plans, so a wrong offset or rule there shows.
"""

from __future__ import annotations

from ibmon.sources.parse import ParseError, PortCounterValues, merge_counters
from ibmon.sources.parse.pma import (
    CPI_CAP2_ADDL_EXT,
    CPI_CAP_EXT_WIDTH,
    CPI_CAP_XMIT_WAIT,
    EXT_CASTS,
    EXT_DATA,
    EXT_ERRORS,
)

#: PortCounters: name, byte offset, byte length (byte 19 holds two 4-bit fields, read apart).
PORT_COUNTERS = (
    ("SymbolErrorCounter", 4, 2),
    ("LinkErrorRecoveryCounter", 6, 1),
    ("LinkDownedCounter", 7, 1),
    ("PortRcvErrors", 8, 2),
    ("PortRcvRemotePhysicalErrors", 10, 2),
    ("PortRcvSwitchRelayErrors", 12, 2),
    ("PortXmitDiscards", 14, 2),
    ("PortXmitConstraintErrors", 16, 1),
    ("PortRcvConstraintErrors", 17, 1),
    ("QP1Dropped", 20, 2),
    ("VL15Dropped", 22, 2),
    ("PortXmitData", 24, 4),
    ("PortRcvData", 28, 4),
    ("PortXmitPkts", 32, 4),
    ("PortRcvPkts", 36, 4),
    ("PortXmitWait", 40, 4),
)


def _select(data: bytes, port: int | None, what: str) -> None:
    if port is not None and data[1] != port:
        raise ParseError(f"{what} reply for port {data[1]} where port {port} was asked")


def port_counters(
    data: bytes, cap_mask: int | None = None, *, port: int | None = None
) -> dict[str, int]:
    """PortCounters payload -> PMA field name -> value; PortXmitWait only when ``cap_mask``
    allows it (or is unknown)."""
    if len(data) < 44:
        raise ParseError("PortCounters payload shorter than 44 bytes")
    _select(data, port, "PortCounters")
    out = {name: int.from_bytes(data[at : at + n], "big") for name, at, n in PORT_COUNTERS}
    out["LocalLinkIntegrityErrors"] = data[19] >> 4
    out["ExcessiveBufferOverrunErrors"] = data[19] & 0x0F
    if cap_mask is not None and not cap_mask & CPI_CAP_XMIT_WAIT:
        del out["PortXmitWait"]
    return out


def port_counters_ext(
    data: bytes, cap_mask: int | None, cap_mask2: int | None, *, port: int | None = None
) -> dict[str, int]:
    """PortCountersExtended payload -> the 64-bit fields the capability masks say are valid:
    data from byte 8, unicast/multicast from byte 40, error copies from byte 72."""
    if len(data) < 72:
        raise ParseError("PortCountersExtended payload shorter than 72 bytes")
    _select(data, port, "PortCountersExtended")

    def words(names: tuple[str, ...], start: int) -> dict[str, int]:
        return {name: int.from_bytes(data[start + 8 * i : start + 8 * i + 8], "big")
                for i, name in enumerate(names)}

    out = words(EXT_DATA, 8)
    if cap_mask is None or cap_mask & CPI_CAP_EXT_WIDTH:
        out.update(words(EXT_CASTS, 40))
    if cap_mask2 is not None and cap_mask2 & CPI_CAP2_ADDL_EXT:
        if len(data) < 184:
            raise ParseError("PortCountersExtended payload too short for its 64-bit error copies")
        out.update(words(EXT_ERRORS, 72))
    return out


def counters(
    narrow: bytes | None, ext: bytes | None, cap: int | None, cap2: int | None,
    *, port: int | None = None,
) -> PortCounterValues:
    """What ``decode_counters`` must answer: both attributes decoded, then merged."""
    return merge_counters(
        port_counters(narrow, cap, port=port) if narrow is not None else None,
        port_counters_ext(ext, cap, cap2, port=port) if ext is not None else None,
        cap,
    )
