"""Performance-management payloads: ClassPortInfo, PortCounters, PortCountersExtended, and the
detail attributes PortRcvErrorDetails (0x15) and PortXmitDiscardDetails (0x16).

Which fields of a counter attribute are real depends on the port's ClassPortInfo capability
masks; the rules live here once, for the ``mad`` source's binary replies and (through
``merge_counters``) for the ``diags`` source's perfquery text. Offsets follow libibmad
``fields.c``.

No capability bit announces the detail attributes: rdma-core's ``iba_types.h`` defines PMA
CapabilityMask bits 8-15 (AllPortSelect ... IsQP1DropSupported) and CapabilityMask2 bits 0-1,
none of them for PortRcvErrorDetails or PortXmitDiscardDetails, which the IBA makes optional.
A PMA without them answers a Get with an error status, and that answer is how the fabric
sources learn it (``ibmon.sources.fabric.DetailReads``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import itemgetter

from ibmon.infiniband.counters import BY_PMA, DETAIL_ATTRIBUTES
from ibmon.sources.parse.errors import ParseError

__all__ = [
    "CPI_CAP2_ADDL_EXT",
    "CPI_CAP_EXT_WIDTH",
    "CPI_CAP_EXT_WIDTH_NOIETF",
    "CPI_CAP_XMIT_WAIT",
    "EXT_CASTS",
    "EXT_DATA",
    "EXT_ERRORS",
    "ClassPortInfo",
    "PortCounterValues",
    "decode_class_port_info",
    "decode_counters",
    "decode_details",
    "decode_samples_control_tick",
    "merge_counters",
]

#: ClassPortInfo.CapabilityMask bits (PMA): PortCountersExtended with all eight 64-bit fields,
#: only the four data fields (NoIETF), and a valid PortCounters.PortXmitWait.
CPI_CAP_EXT_WIDTH = 1 << 9
CPI_CAP_EXT_WIDTH_NOIETF = 1 << 10
CPI_CAP_XMIT_WAIT = 1 << 12
#: ClassPortInfo.CapabilityMask2 bit 1: 64-bit copies of every error counter in PortCountersExt.
CPI_CAP2_ADDL_EXT = 1 << 1

#: PortCountersExtended fields, in payload order: data (always), unicast/multicast (CapMask
#: bit 9), and the 64-bit error copies (CapMask2 bit 1).
EXT_DATA = ("PortXmitData", "PortRcvData", "PortXmitPkts", "PortRcvPkts")
EXT_CASTS = (
    "PortUnicastXmitPkts",
    "PortUnicastRcvPkts",
    "PortMulticastXmitPkts",
    "PortMulticastRcvPkts",
)
EXT_ERRORS = (
    "SymbolErrorCounter",
    "LinkErrorRecoveryCounter",
    "LinkDownedCounter",
    "PortRcvErrors",
    "PortRcvRemotePhysicalErrors",
    "PortRcvSwitchRelayErrors",
    "PortXmitDiscards",
    "PortXmitConstraintErrors",
    "PortRcvConstraintErrors",
    "LocalLinkIntegrityErrors",
    "ExcessiveBufferOverrunErrors",
    "VL15Dropped",
    "PortXmitWait",
    "QP1Dropped",
)


@dataclass(frozen=True, slots=True)
class ClassPortInfo:
    cap_mask: int
    cap_mask2: int


def decode_class_port_info(data: bytes) -> ClassPortInfo:
    if len(data) < 8:
        raise ParseError("ClassPortInfo payload shorter than 8 bytes")
    cap = struct.unpack_from(">H", data, 2)[0]
    cap2 = struct.unpack_from(">I", data, 4)[0] >> 5
    return ClassPortInfo(cap_mask=cap, cap_mask2=cap2)


def decode_samples_control_tick(data: bytes, *, port: int | None = None) -> int:
    """PortSamplesControl (0x10) payload -> its Tick (byte 2: OpCode, PortSelect, Tick), what
    one PortXmitWait count of the port stands for (``ibmon.infiniband.xmitwait.unit_for``). With
    ``port``, a reply for another port raises ParseError, as for the counters."""
    if len(data) < 3:
        raise ParseError("PortSamplesControl payload shorter than 3 bytes")
    _check_select(data, port, "PortSamplesControl")
    return data[2]


_PC_FIELDS: tuple[tuple[str, int, int], ...] = (
    # name, byte offset, byte length (the two 4-bit fields at byte 19 are decoded apart)
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


def _check_select(data: bytes, port: int | None, what: str) -> None:
    """A counter reply echoes the PortSelect it answers (byte 1); another port's reply is
    refused whole rather than booked on the port that asked."""
    if port is not None and data[1] != port:
        raise ParseError(f"{what} reply for port {data[1]} where port {port} was asked")


#: The fixed PortCounters layout of ``_PC_FIELDS`` plus byte 19 (two 4-bit fields) in one
#: unpack: a sweep decodes thousands of these per poll, and one ``Struct`` call is several
#: times cheaper than a slice and ``int.from_bytes`` per field.
_PC_STRUCT = struct.Struct(">4xHBBHHHHBBxBHHIIIII")
_PC_NAMES = tuple(name for name, _off, _len in _PC_FIELDS)
assert _PC_STRUCT.size == 44
assert len(_PC_NAMES) == 16


_EXT_DATA_STRUCT = struct.Struct(">8x4Q")
_EXT_CASTS_STRUCT = struct.Struct(">40x4Q")
_EXT_ERRORS_STRUCT = struct.Struct(">72x14Q")


def decode_details(attribute: str, data: bytes, *, port: int | None = None) -> dict[str, int]:
    """PortRcvErrorDetails / PortXmitDiscardDetails payload -> catalogue name -> value.

    Both attributes are PortSelect (byte 1), CounterSelect (bytes 2-3), then 16-bit counters
    from byte 4 in ``DETAIL_ATTRIBUTES`` order (libibmad ``IB_PC_RCV_LOCAL_PHY_ERR_F`` ...
    ``IB_PC_RCV_LOOPING_ERR_F``, ``IB_PC_XMT_INACT_DISC_F`` ... ``IB_PC_XMT_SW_HOL_DISC_F``).
    With ``port``, a reply whose PortSelect is another port raises ParseError.
    """
    specs = DETAIL_ATTRIBUTES.get(attribute)
    if specs is None:
        raise ParseError(f"{attribute} is not a detail attribute")
    need = 4 + 2 * len(specs)
    if len(data) < need:
        raise ParseError(f"{attribute} payload shorter than {need} bytes")
    _check_select(data, port, attribute)
    return {
        spec.name: int.from_bytes(data[4 + 2 * i : 6 + 2 * i], "big")
        for i, spec in enumerate(specs)
    }


@dataclass(slots=True)
class PortCounterValues:
    """One port's counters by catalogue name, and which of them came from a 64-bit field
    (one shared object per distinct set: ``merge_counters``)."""

    counters: dict[str, int] = field(default_factory=dict)
    wide: frozenset[str] = frozenset()


#: The distinct sets of 64-bit counters seen (a fabric has a few: one per kind of port).
_WIDE: dict[frozenset[str], frozenset[str]] = {}


def _shared_wide(names: frozenset[str]) -> frozenset[str]:
    """One object for every port with the same 64-bit counters.

    Why: a set of 8-22 names is 0.7-2.3 KB, and every port of a sweep
    had its own (and its sample a copy): up to 4.6 KB a port while a poll of a 100,000-port
    fabric was held, for a handful of distinct sets.
    """
    found = _WIDE.get(names)
    if found is None:
        if len(_WIDE) >= 64:  # only a fabric of odd ports gets here: bounded all the same
            _WIDE.clear()
        found = _WIDE[names] = names
    return found


def merge_counters(
    narrow: dict[str, int] | None, extended: dict[str, int] | None, cap_mask: int | None
) -> PortCounterValues:
    """Combine PortCounters and PortCountersExtended values: the 64-bit copy wins.

    Extended data counters are trusted only when the port claims extended support (CapMask bit
    9 or 10) or when the mask is unknown; otherwise they may be garbage.
    """
    counters: dict[str, int] = {}
    wide: list[str] = []
    if narrow:
        names = _COUNTER_NAME
        for name, value in narrow.items():
            cname = names.get(name)
            if cname is not None:
                counters[cname] = value
    if extended:
        ext_ok = cap_mask is None or bool(cap_mask & (CPI_CAP_EXT_WIDTH | CPI_CAP_EXT_WIDTH_NOIETF))
        names = _COUNTER_NAME if ext_ok else _COUNTER_NAME_NO_EXT_DATA
        for name, value in extended.items():
            cname = names.get(name)
            if cname is not None:
                counters[cname] = value
                wide.append(cname)
    return PortCounterValues(counters, _shared_wide(frozenset(wide)))


#: PMA field name -> catalogue name, for the fields of the counter attributes themselves (not
#: the detail attributes); and the same without the extended data fields (EXT_DATA), which a
#: port without extended support may fill with garbage. Built once: the sweep merges thousands.
_COUNTER_NAME: dict[str, str] = {
    pma: spec.name for pma, spec in BY_PMA.items() if spec.attribute is None
}
_COUNTER_NAME_NO_EXT_DATA: dict[str, str] = {
    pma: name for pma, name in _COUNTER_NAME.items() if pma not in EXT_DATA
}


#: How ``decode_counters`` decodes one kind of port: which parts of PortCountersExtended to
#: unpack (unicast/multicast, 64-bit error copies), then the catalogue names in
#: ``merge_counters``' order, a getter of their values among the unpacked fields, the 64-bit ones.
_Getter = Callable[[tuple[int, ...]], tuple[int, ...]]
_Plan = tuple[bool, bool, tuple[str, ...], _Getter, frozenset[str]]
#: Plans by (CapabilityMask, CapabilityMask2, PortCounters read, PortCountersExtended read): a
#: fabric has a few kinds of port; bounded all the same.
_PLANS: dict[tuple[int | None, int | None, bool, bool], _Plan] = {}
#: PortCounters' fields as ``decode_counters`` unpacks them: ``_PC_STRUCT``'s 17 values (byte 19
#: whole at position 9), then byte 19's two halves.
_PC_POSITIONS = (*range(9), *range(10, 17), 17, 18)
_PC_UNPACKED = 19  # how many values that is, byte 19 whole included: the extended ones follow
assert len(_PC_STRUCT.unpack(bytes(44))) + 2 == _PC_UNPACKED
_PC_ALL_NAMES = (*_PC_NAMES, "LocalLinkIntegrityErrors", "ExcessiveBufferOverrunErrors")


def _plan(cap_mask: int | None, cap_mask2: int | None, narrow: bool, ext: bool) -> _Plan:
    """What ``merge_counters`` would make of one kind of port's two attributes decoded field by
    field (``tests/pma_reference.py``), worked out once by field name under the mask rules:
    PortXmitWait only with CapabilityMask bit 12, unicast/multicast with bit 9, the 64-bit
    error copies with CapabilityMask2 bit 1, the 64-bit data fields trusted with bit 9 or 10.
    A field the masks call invalid is absent, not 0 (perfquery prints 0 for it): a value known
    to be meaningless is better missing than zero."""
    xmit_wait = cap_mask is None or bool(cap_mask & CPI_CAP_XMIT_WAIT)
    casts = cap_mask is None or bool(cap_mask & CPI_CAP_EXT_WIDTH)
    errors = cap_mask2 is not None and bool(cap_mask2 & CPI_CAP2_ADDL_EXT)
    ext_ok = cap_mask is None or bool(cap_mask & (CPI_CAP_EXT_WIDTH | CPI_CAP_EXT_WIDTH_NOIETF))
    at: dict[str, int] = {}  # catalogue name -> position; a 64-bit copy overwrites in place
    wide: list[str] = []
    if narrow:
        for name, pos in zip(_PC_ALL_NAMES, _PC_POSITIONS, strict=True):
            cname = _COUNTER_NAME.get(name)
            if cname is not None and (xmit_wait or name != "PortXmitWait"):
                at[cname] = pos
    if ext:
        names = _COUNTER_NAME if ext_ok else _COUNTER_NAME_NO_EXT_DATA
        fields = EXT_DATA + (EXT_CASTS if casts else ()) + (EXT_ERRORS if errors else ())
        for pos, name in enumerate(fields, start=_PC_UNPACKED if narrow else 0):
            cname = names.get(name)
            if cname is not None:
                at[cname] = pos
                wide.append(cname)
    positions = tuple(at.values())

    def few(vals: tuple[int, ...]) -> tuple[int, ...]:  # itemgetter of one is not a tuple
        return tuple(vals[p] for p in positions)

    getter = itemgetter(*positions) if len(positions) > 1 else few
    return casts, errors, tuple(at), getter, _shared_wide(frozenset(wide))


def decode_counters(
    narrow: bytes | None,
    ext: bytes | None,
    cap_mask: int | None,
    cap_mask2: int | None,
    *,
    port: int | None = None,
) -> PortCounterValues:
    """One port's PortCounters (``narrow``) and PortCountersExtended (``ext``) replies, either
    absent, as catalogue counters: the 64-bit copy of a field wins, and the capability masks
    say which fields are real (``_plan``). With ``port``, a reply whose PortSelect is another
    port raises ParseError, as does a payload too short for what the masks say it holds.

    Why one pass: the ``mad`` source decodes every port of a poll while its worker is still
    sending MADs, on the same CPUs. The field-by-field merge is worked out once per kind of
    port; a port costs its unpacks and one gather, not a dict an attribute and a merge
    (``tests/pma_reference.py`` decodes that way; the tests hold the two to the same answers).
    """
    key = (cap_mask, cap_mask2, narrow is not None, ext is not None)
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= 256:
            _PLANS.clear()
        plan = _PLANS[key] = _plan(*key)
    casts, errors, names, getter, wide = plan
    vals: tuple[int, ...] = ()
    if narrow is not None:
        if len(narrow) < 44:
            raise ParseError("PortCounters payload shorter than 44 bytes")
        _check_select(narrow, port, "PortCounters")
        vals = _PC_STRUCT.unpack_from(narrow)
        vals += (vals[9] >> 4, vals[9] & 0x0F)
    if ext is not None:
        if len(ext) < 72:
            raise ParseError("PortCountersExtended payload shorter than 72 bytes")
        _check_select(ext, port, "PortCountersExtended")
        vals += _EXT_DATA_STRUCT.unpack_from(ext)
        if casts:
            vals += _EXT_CASTS_STRUCT.unpack_from(ext)
        if errors:
            if len(ext) < 184:
                raise ParseError(
                    "PortCountersExtended payload too short for its 64-bit error copies"
                )
            vals += _EXT_ERRORS_STRUCT.unpack_from(ext)
    return PortCounterValues(dict(zip(names, getter(vals), strict=True)), wide)
