"""PortCounters and PortCountersExtended decoded field by field: the oracle the ``mad``
source's one-pass ``decode_counters`` is checked against (``tests/unit/test_decode_counters.py``),
itself checked against libibmad's field tables (``tests/unit/test_parse.py``).

Each field is read with ``int.from_bytes`` at the offset of ``pma._PC_FIELDS`` (PortCounters,
the table that documents ``decode_counters``' struct) or of its place in PortCountersExtended,
under the same capability-mask rules (ClassPortInfo CapabilityMask bit 12: PortXmitWait; bit 9:
unicast/multicast; CapabilityMask2 bit 1: the 64-bit error copies), and merged by
``merge_counters``. Nothing here shares ``decode_counters``' structs or plans, so a wrong offset
or rule there shows; and the table itself is held to libibmad's through this decoder.
"""

from __future__ import annotations

from ibmon.sources.parse import ParseError, PortCounterValues, merge_counters
from ibmon.sources.parse.pma import _PC_FIELDS as PORT_COUNTERS
from ibmon.sources.parse.pma import (
    CPI_CAP2_ADDL_EXT,
    CPI_CAP_EXT_WIDTH,
    CPI_CAP_XMIT_WAIT,
    EXT_CASTS,
    EXT_DATA,
    EXT_ERRORS,
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
