"""Pure parsers for what fabric tools print and what the fabric answers.

Text: ``perfquery`` (extended and plain blocks), ``ibnetdiscover -p`` (ports format), plain
``ibnetdiscover`` topology files, node-name-map files. Binary: libibnetdisc's fabric cache
(``ibnetdiscover --cache``), and the raw SMP/PMA attribute payloads (NodeInfo, NodeDescription,
PortInfo, ClassPortInfo, PortCounters, PortCountersExtended) that the ``mad`` source receives.

Both fabric sources decode PortInfo and counters through the same functions here, which is what
makes their topologies and snapshots identical. Offsets follow rdma-core's libibmad ``fields.c``
(checked against the installed ``mad_decode_field`` in the tests). Nothing here runs a process or
touches the network, so every function is tested on recorded output.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

from ibmon.counters import BY_PMA
from ibmon.model import LinkInfo, PortIdentity, Topology, normalize_guid

__all__ = [
    "CPI_CAP2_ADDL_EXT",
    "CPI_CAP_EXT_WIDTH",
    "CPI_CAP_EXT_WIDTH_NOIETF",
    "CPI_CAP_XMIT_WAIT",
    "CacheFabric",
    "CacheNode",
    "ClassPortInfo",
    "DiscoveredPort",
    "NodeInfo",
    "PerfBlock",
    "PortCounterValues",
    "PortInfo",
    "clean_node_desc",
    "decode_class_port_info",
    "decode_node_desc",
    "decode_node_info",
    "decode_port_counters",
    "decode_port_counters_ext",
    "decode_port_info",
    "merge_counters",
    "parse_ibnd_cache",
    "parse_ibnetdiscover",
    "parse_ibnetdiscover_ports",
    "parse_node_name_map",
    "parse_perfquery",
    "parse_perfquery_blocks",
    "parse_topology_file",
    "topology_from_ports",
]

#: ClassPortInfo.CapabilityMask bits (PMA): PortCountersExtended with all eight 64-bit fields,
#: only the four data fields (NoIETF), and a valid PortCounters.PortXmitWait.
CPI_CAP_EXT_WIDTH = 1 << 9
CPI_CAP_EXT_WIDTH_NOIETF = 1 << 10
CPI_CAP_XMIT_WAIT = 1 << 12
#: ClassPortInfo.CapabilityMask2 bit 1: 64-bit copies of every error counter in PortCountersExt.
CPI_CAP2_ADDL_EXT = 1 << 1

_NODE_TYPES = {1: "ca", 2: "switch", 3: "router"}
_TEXT_TYPES = {"CA": "ca", "SW": "switch", "RT": "router"}

_EXT_DATA = ("PortXmitData", "PortRcvData", "PortXmitPkts", "PortRcvPkts")
_EXT_CASTS = (
    "PortUnicastXmitPkts",
    "PortUnicastRcvPkts",
    "PortMulticastXmitPkts",
    "PortMulticastRcvPkts",
)
_EXT_ERRORS = (
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


# ---------------------------------------------------------------------------------------------
# Node descriptions


def clean_node_desc(raw: bytes | str) -> str:
    """NodeDescription as infiniband-diags prints it.

    The attribute is 64 bytes, NUL-terminated when shorter; every byte that is not printable
    ASCII (control characters, every byte of a UTF-8 sequence) becomes one space. Both fabric
    sources apply this, so a description is identical whichever source read it.
    """
    data = raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else raw
    data = data[:64]
    nul = data.find(b"\0")
    if nul >= 0:
        data = data[:nul]
    return "".join(chr(b) if 0x20 <= b < 0x7F else " " for b in data)


def decode_node_desc(data: bytes) -> str:
    """The NodeDescription SMP payload, cleaned (see ``clean_node_desc``)."""
    return clean_node_desc(data)


# ---------------------------------------------------------------------------------------------
# SMP / PMA payload decoding (offsets from libibmad fields.c)


@dataclass(frozen=True, slots=True)
class NodeInfo:
    node_type: str  # ca | switch | router | unknown
    num_ports: int
    system_guid: str
    node_guid: str
    port_guid: str
    device_id: int
    vendor_id: int
    local_port: int


def _hex_guid(value: int) -> str:
    return f"0x{value:016x}"


def decode_node_info(data: bytes) -> NodeInfo:
    if len(data) < 40:
        raise ValueError("NodeInfo payload shorter than 40 bytes")
    ntype, nports = data[2], data[3]
    sysguid, nguid, pguid = struct.unpack_from(">QQQ", data, 4)
    devid = struct.unpack_from(">H", data, 30)[0]
    local_port = data[36]
    vendor = int.from_bytes(data[37:40], "big")
    return NodeInfo(
        node_type=_NODE_TYPES.get(ntype, "unknown"),
        num_ports=nports,
        system_guid=_hex_guid(sysguid),
        node_guid=_hex_guid(nguid),
        port_guid=_hex_guid(pguid),
        device_id=devid,
        vendor_id=vendor,
        local_port=local_port,
    )


@dataclass(frozen=True, slots=True)
class PortInfo:
    """The PortInfo fields ibmon uses; widths and speeds as the raw IBA codes / bit masks."""

    lid: int
    sm_lid: int
    cap_mask: int
    local_port: int
    width_enabled: int
    width_supported: int
    width_active: int
    speed_supported: int
    state: int
    phys_state: int
    lmc: int
    speed_active: int
    speed_enabled: int
    cap_mask2: int
    speed_ext_active: int
    speed_ext_supported: int
    speed_ext_enabled: int


def decode_port_info(data: bytes) -> PortInfo:
    if len(data) < 64:
        raise ValueError("PortInfo payload shorter than 64 bytes")
    lid, smlid, capmask = struct.unpack_from(">HHI", data, 16)
    return PortInfo(
        lid=lid,
        sm_lid=smlid,
        cap_mask=capmask,
        local_port=data[28],
        width_enabled=data[29],
        width_supported=data[30],
        width_active=data[31],
        speed_supported=data[32] >> 4,
        state=data[32] & 0x0F,
        phys_state=data[33] >> 4,
        lmc=data[34] & 0x07,
        speed_active=data[35] >> 4,
        speed_enabled=data[35] & 0x0F,
        cap_mask2=struct.unpack_from(">H", data, 60)[0],
        speed_ext_active=data[62] >> 4,
        speed_ext_supported=data[62] & 0x0F,
        speed_ext_enabled=data[63] & 0x1F,
    )


@dataclass(frozen=True, slots=True)
class ClassPortInfo:
    cap_mask: int
    cap_mask2: int


def decode_class_port_info(data: bytes) -> ClassPortInfo:
    if len(data) < 8:
        raise ValueError("ClassPortInfo payload shorter than 8 bytes")
    cap = struct.unpack_from(">H", data, 2)[0]
    cap2 = struct.unpack_from(">I", data, 4)[0] >> 5
    return ClassPortInfo(cap_mask=cap, cap_mask2=cap2)


_PC_FIELDS: tuple[tuple[str, int, int, int], ...] = (
    # name, byte offset, byte length, (shift, width) packed as (shift << 8 | bits) for nibbles
    ("SymbolErrorCounter", 4, 2, 0),
    ("LinkErrorRecoveryCounter", 6, 1, 0),
    ("LinkDownedCounter", 7, 1, 0),
    ("PortRcvErrors", 8, 2, 0),
    ("PortRcvRemotePhysicalErrors", 10, 2, 0),
    ("PortRcvSwitchRelayErrors", 12, 2, 0),
    ("PortXmitDiscards", 14, 2, 0),
    ("PortXmitConstraintErrors", 16, 1, 0),
    ("PortRcvConstraintErrors", 17, 1, 0),
    ("QP1Dropped", 20, 2, 0),
    ("VL15Dropped", 22, 2, 0),
    ("PortXmitData", 24, 4, 0),
    ("PortRcvData", 28, 4, 0),
    ("PortXmitPkts", 32, 4, 0),
    ("PortRcvPkts", 36, 4, 0),
    ("PortXmitWait", 40, 4, 0),
)


def decode_port_counters(data: bytes, cap_mask: int | None = None) -> dict[str, int]:
    """PortCounters (0x12) payload -> PMA field name -> value.

    PortXmitWait is left out when ``cap_mask`` says the port does not support it (perfquery
    prints 0 then; a value we know to be meaningless is better absent than zero).
    """
    if len(data) < 44:
        raise ValueError("PortCounters payload shorter than 44 bytes")
    out = {name: int.from_bytes(data[off : off + ln], "big") for name, off, ln, _ in _PC_FIELDS}
    out["LocalLinkIntegrityErrors"] = data[19] >> 4
    out["ExcessiveBufferOverrunErrors"] = data[19] & 0x0F
    if cap_mask is not None and not cap_mask & CPI_CAP_XMIT_WAIT:
        del out["PortXmitWait"]
    return out


def decode_port_counters_ext(
    data: bytes, cap_mask: int | None, cap_mask2: int | None
) -> dict[str, int]:
    """PortCountersExtended (0x1D) payload -> the fields the capability masks say are valid."""
    if len(data) < 72:
        raise ValueError("PortCountersExtended payload shorter than 72 bytes")
    out: dict[str, int] = {}
    for i, name in enumerate(_EXT_DATA):
        out[name] = struct.unpack_from(">Q", data, 8 + 8 * i)[0]
    if cap_mask is None or cap_mask & CPI_CAP_EXT_WIDTH:
        for i, name in enumerate(_EXT_CASTS):
            out[name] = struct.unpack_from(">Q", data, 40 + 8 * i)[0]
    if cap_mask2 is not None and cap_mask2 & CPI_CAP2_ADDL_EXT and len(data) >= 184:
        for i, name in enumerate(_EXT_ERRORS):
            out[name] = struct.unpack_from(">Q", data, 72 + 8 * i)[0]
    return out


@dataclass(slots=True)
class PortCounterValues:
    """One port's counters by catalogue name, and which of them came from a 64-bit field."""

    counters: dict[str, int] = field(default_factory=dict)
    wide: set[str] = field(default_factory=set)


def merge_counters(
    narrow: dict[str, int] | None, extended: dict[str, int] | None, cap_mask: int | None
) -> PortCounterValues:
    """Combine PortCounters and PortCountersExtended values: the 64-bit copy wins.

    Extended data counters are trusted only when the port claims extended support (CapMask bit
    9 or 10) or when the mask is unknown; otherwise they may be garbage.
    """
    out = PortCounterValues()
    for name, value in (narrow or {}).items():
        spec = BY_PMA.get(name)
        if spec is not None:
            out.counters[spec.name] = value
    if extended:
        ext_ok = cap_mask is None or bool(cap_mask & (CPI_CAP_EXT_WIDTH | CPI_CAP_EXT_WIDTH_NOIETF))
        for name, value in extended.items():
            spec = BY_PMA.get(name)
            if spec is None or (name in _EXT_DATA and not ext_ok):
                continue
            out.counters[spec.name] = value
            out.wide.add(spec.name)
    return out


# ---------------------------------------------------------------------------------------------
# perfquery text

_PQ_HEADER = re.compile(
    r"^#\s*(?P<title>[^:]*?)\s*:\s*(?:Lid\s+(?P<lid>\d+)|(?P<addr>.*?))\s+port\s+(?P<port>\d+)"
    r"(?:\s*\(CapMask:\s*0x(?P<cm>[0-9a-fA-F]+)(?:\s+CapMask2:\s*0x(?P<cm2>[0-9a-fA-F]+))?\))?"
)
_PQ_FIELD = re.compile(r"^(?P<name>[A-Za-z0-9_]+):\.*(?P<value>\S+)\s*$")


@dataclass(frozen=True, slots=True)
class PerfBlock:
    """One ``# ...: Lid L port P (CapMask ...)`` block of perfquery output."""

    kind: str  # extended | counters | other
    title: str
    lid: int | None
    port: int
    cap_mask: int | None
    cap_mask2: int | None
    fields: dict[str, int]
    #: fields printed after CounterSelect2 in an extended block (the 64-bit error copies)
    ext_errors: frozenset[str] = frozenset()


def _int(text: str) -> int | None:
    try:
        return int(text, 16) if text.lower().startswith("0x") else int(text)
    except ValueError:
        return None


def parse_perfquery_blocks(text: str) -> tuple[list[PerfBlock], list[str]]:
    """Every block in perfquery output, plus the lines that were neither header nor field.

    Stray lines (``ibwarn: ...`` on a merged stream, truncated output) are returned rather than
    raised, so one bad line never costs the rest of a node.
    """
    blocks: list[PerfBlock] = []
    stray: list[str] = []
    cur: dict[str, int] | None = None
    meta: tuple[str, str, int | None, int, int | None, int | None] | None = None
    after_cs2 = False
    errs: set[str] = set()

    def close() -> None:
        if cur is not None and meta is not None:
            blocks.append(
                PerfBlock(
                    kind=meta[0],
                    title=meta[1],
                    lid=meta[2],
                    port=meta[3],
                    cap_mask=meta[4],
                    cap_mask2=meta[5],
                    fields=cur,
                    ext_errors=frozenset(errs),
                )
            )

    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        m = _PQ_HEADER.match(line)
        if m:
            close()
            title = m.group("title")
            low = title.lower()
            kind = (
                "extended"
                if "extended counters" in low
                else "counters"
                if low == "port counters"
                else "other"
            )
            cm = int(m.group("cm"), 16) if m.group("cm") else None
            cm2 = int(m.group("cm2"), 16) if m.group("cm2") else None
            lid = int(m.group("lid")) if m.group("lid") else None
            meta = (kind, title, lid, int(m.group("port")), cm, cm2)
            cur, after_cs2, errs = {}, False, set()
            continue
        f = _PQ_FIELD.match(line)
        if f and cur is not None:
            value = _int(f.group("value"))
            if value is None:
                stray.append(raw)
                continue
            name = f.group("name")
            cur[name] = value
            if name == "CounterSelect2":
                after_cs2 = True
            elif after_cs2 and meta is not None and meta[0] == "extended":
                errs.add(name)
            continue
        stray.append(raw)
    close()
    return blocks, stray


def parse_perfquery(text: str) -> tuple[dict[int, PortCounterValues], list[str]]:
    """perfquery output (``-x``, plain, ``-l`` loops, or both concatenated) -> port -> counters.

    Rules mirror what perfquery itself trusts: extended data fields are 64-bit; unicast and
    multicast are printed only with CapMask bit 9; error fields after ``CounterSelect2`` in an
    extended block are the 64-bit copies, trusted only with CapMask2 bit 1 (or no CapMask2 in
    the header): without it they are reserved bytes, and the narrow block must supply the error
    counters. A narrow block's PortXmitWait is kept
    only with CapMask bit 12. A 64-bit value always wins over the narrow one.
    """
    blocks, stray = parse_perfquery_blocks(text)
    narrow: dict[int, tuple[dict[str, int], int | None]] = {}
    wide: dict[int, tuple[dict[str, int], int | None]] = {}
    for b in blocks:
        if b.kind == "counters":
            # libibmad (rdma-core 44) decodes PortCounters.QP1Dropped from VL15Dropped's bits,
            # so perfquery's narrow QP1Dropped is VL15Dropped again: never trust it.
            vals = {k: v for k, v in b.fields.items() if k in BY_PMA and k != "QP1Dropped"}
            if b.cap_mask is not None and not b.cap_mask & CPI_CAP_XMIT_WAIT:
                vals.pop("PortXmitWait", None)
            narrow[b.port] = (vals, b.cap_mask)
        elif b.kind == "extended":
            vals = {}
            errs_ok = b.cap_mask2 is None or bool(b.cap_mask2 & CPI_CAP2_ADDL_EXT)
            for k, v in b.fields.items():
                if (
                    k in _EXT_DATA
                    or k in _EXT_CASTS
                    or (errs_ok and k in b.ext_errors and k in BY_PMA)
                ):
                    vals[k] = v
            wide[b.port] = (vals, b.cap_mask)
    out: dict[int, PortCounterValues] = {}
    for port in sorted(set(narrow) | set(wide)):
        n = narrow.get(port)
        w = wide.get(port)
        cap = w[1] if w and w[1] is not None else (n[1] if n else None)
        out[port] = merge_counters(n[0] if n else None, w[0] if w else None, cap)
    return out, stray


# ---------------------------------------------------------------------------------------------
# ibnetdiscover


@dataclass(frozen=True, slots=True)
class DiscoveredPort:
    """One port line of a discovery, with its far end when connected."""

    guid: str
    port: int
    node_type: str
    lid: int | None
    desc: str
    width: str = ""  # "4X"
    speed: str = ""  # "EDR"; "" when the tool printed ???
    remote_guid: str | None = None
    remote_port: int | None = None
    remote_type: str | None = None
    remote_lid: int | None = None
    remote_desc: str | None = None


_PORTS_LINE = re.compile(
    r"^(?P<t>CA|SW|RT)\s+(?P<lid>\d+)\s+(?P<port>\d+)\s+(?P<guid>0x[0-9a-fA-F]+)\s+"
    r"(?P<w>\d+)x\s+(?P<s>\S+)(?P<rest>.*)$"
)
_PORTS_REMOTE = re.compile(
    r"^\s*-\s+(?P<t>CA|SW|RT)\s+(?P<lid>\d+)\s+(?P<port>\d+)\s+(?P<guid>0x[0-9a-fA-F]+)\s+"
    r"\(\s*'(?P<descs>.*)'\s*\)\s*$"
)


def _speed(text: str) -> str:
    return "" if "?" in text else text.upper()


def parse_ibnetdiscover_ports(text: str) -> tuple[list[DiscoveredPort], list[str]]:
    """``ibnetdiscover -p`` output -> ports (each physical link appears once per end).

    Descriptions are quoted with single quotes and may themselves contain quotes and `` - ``;
    when the split between the two descriptions of a link line is ambiguous, the split that
    agrees with how the same node is described on its other lines wins. Lines that are not port
    lines (stderr noise) are returned separately.
    """
    stray: list[str] = []
    parsed: list[tuple[re.Match[str], re.Match[str] | None, list[tuple[str, str]], str]] = []
    votes: dict[str, dict[str, int]] = {}

    def vote(guid: str, desc: str, weight: int = 1) -> None:
        d = votes.setdefault(guid, {})
        d[desc] = d.get(desc, 0) + weight

    for raw in text.splitlines():
        line = raw.rstrip("\r\n")
        if not line.strip():
            continue
        m = _PORTS_LINE.match(line.strip())
        if not m:
            stray.append(raw)
            continue
        rest = m.group("rest")
        rm = _PORTS_REMOTE.match(rest)
        if rm:
            descs = rm.group("descs")
            cands: list[tuple[str, str]] = []
            for sm in re.finditer(r"' - '", descs):
                cands.append((descs[: sm.start()], descs[sm.end() :]))
            if not cands:
                stray.append(raw)
                continue
            if len(cands) == 1:
                vote(m.group("guid").lower(), cands[0][0], 2)
                vote(rm.group("guid").lower(), cands[0][1], 2)
            parsed.append((m, rm, cands, ""))
        else:
            solo = rest.strip()
            if len(solo) >= 2 and solo[0] == "'" and solo[-1] == "'":
                solo = solo[1:-1]
            vote(m.group("guid").lower(), solo, 2)
            parsed.append((m, None, [], solo))

    out: list[DiscoveredPort] = []
    for m, rm, cands, solo in parsed:
        guid = normalize_guid(m.group("guid"))
        common = {
            "guid": guid,
            "port": int(m.group("port")),
            "node_type": _TEXT_TYPES[m.group("t")],
            "lid": int(m.group("lid")),
            "width": f"{int(m.group('w'))}X",
            "speed": _speed(m.group("s")),
        }
        if rm is None:
            out.append(DiscoveredPort(desc=solo, **common))  # type: ignore[arg-type]
            continue
        lg, rg = m.group("guid").lower(), rm.group("guid").lower()
        best = max(
            cands, key=lambda c: votes.get(lg, {}).get(c[0], 0) + votes.get(rg, {}).get(c[1], 0)
        )
        out.append(
            DiscoveredPort(
                desc=best[0],
                remote_guid=normalize_guid(rm.group("guid")),
                remote_port=int(rm.group("port")),
                remote_type=_TEXT_TYPES[rm.group("t")],
                remote_lid=int(rm.group("lid")),
                remote_desc=best[1],
                **common,  # type: ignore[arg-type]
            )
        )
    return out, stray


_TOPO_HEADER = re.compile(
    r'^(?P<t>Switch|Ca|Hca|Rt)\s+(?P<n>\d+)\s+"(?P<id>[^"]*)"\s*(?P<rest>.*)$'
)
_TOPO_PORT = re.compile(
    r'^\[(?P<p>\d+)\](?:\((?P<pg>[0-9a-fA-F]+)\))?\s*"(?P<rid>[^"]*)"\[(?P<rp>\d+)\]'
    r"(?:\((?P<rpg>[0-9a-fA-F]+)\))?\s*(?P<rest>.*)$"
)
_TOPO_GUIDLINE = re.compile(r"^(switchguid|caguid|rtguid)=(0x[0-9a-fA-F]+)")
_LID = re.compile(r"\blid\s+(\d+)")
_SPEC = re.compile(r"\b(\d+)x([A-Za-z0-9?]+)\b")
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')


def _id_guid(nid: str) -> str | None:
    m = re.match(r"^[SHR]-([0-9a-fA-F]{1,16})$", nid)
    return normalize_guid(m.group(1)) if m else None


def parse_topology_file(text: str) -> tuple[list[DiscoveredPort], list[str]]:
    """Plain ``ibnetdiscover`` output (the topology file format) -> connected ports.

    Node records give type, id, description, and for switches the base LID; each port line
    gives the peer id and port, the link's width and speed and, on CA records, the local LID.
    Node GUIDs come from ``switchguid=``/``caguid=`` lines or the ``S-``/``H-`` ids.
    """
    stray: list[str] = []
    nodes: dict[str, tuple[str, str, str, int | None]] = {}  # id -> guid, type, desc, lid
    pending_guid: str | None = None
    raw_ports: list[tuple[str, int, str, int, str]] = []  # local id, port, remote id, rport, rest
    cur: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        gm = _TOPO_GUIDLINE.match(line)
        if gm:
            pending_guid = normalize_guid(gm.group(2))
            continue
        if re.match(r"^(vendid|devid|sysimgguid|Non-Chassis|Chassis)", line):
            continue
        hm = _TOPO_HEADER.match(line)
        if hm:
            nid = hm.group("id")
            guid = pending_guid or _id_guid(nid)
            pending_guid = None
            if guid is None:
                stray.append(raw)
                cur = None
                continue
            t = hm.group("t")
            ntype = "switch" if t == "Switch" else "router" if t == "Rt" else "ca"
            rest = hm.group("rest")
            q = _QUOTED.search(rest)
            desc = q.group(1) if q else ""
            lm = _LID.search(rest)
            nodes[nid] = (guid, ntype, desc, int(lm.group(1)) if lm and ntype == "switch" else None)
            cur = nid
            continue
        pm = _TOPO_PORT.match(line)
        if pm and cur is not None:
            raw_ports.append(
                (cur, int(pm.group("p")), pm.group("rid"), int(pm.group("rp")), pm.group("rest"))
            )
            continue
        stray.append(raw)

    out: list[DiscoveredPort] = []
    for lid_, port, rid, rport, rest in raw_ports:
        guid, ntype, desc, lid = nodes[lid_]
        bare = _QUOTED.sub(" ", rest)
        spec = _SPEC.search(bare)
        width = f"{int(spec.group(1))}X" if spec else ""
        speed = _speed(spec.group(2)) if spec else ""
        lids = [int(x) for x in _LID.findall(bare)]
        if ntype != "switch" and lids:
            lid = lids[0]
        remote = nodes.get(rid)
        rguid = remote[0] if remote else _id_guid(rid)
        if rguid is None:
            continue
        rtype = remote[1] if remote else ("switch" if rid.startswith("S-") else "ca")
        q = _QUOTED.search(rest)
        rdesc = remote[2] if remote else (q.group(1) if q else "")
        rlid = lids[-1] if lids else None
        out.append(
            DiscoveredPort(
                guid=guid,
                port=port,
                node_type=ntype,
                lid=lid,
                desc=desc,
                width=width,
                speed=speed,
                remote_guid=rguid,
                remote_port=rport,
                remote_type=rtype,
                remote_lid=rlid,
                remote_desc=rdesc,
            )
        )
    return out, stray


def parse_ibnetdiscover(text: str) -> tuple[list[DiscoveredPort], list[str]]:
    """Either ibnetdiscover format: ports (``-p``) or the topology file; detected by content."""
    for line in text.splitlines():
        s = line.strip()
        if _PORTS_LINE.match(s):
            return parse_ibnetdiscover_ports(text)
        if _TOPO_HEADER.match(s) or _TOPO_GUIDLINE.match(s):
            return parse_topology_file(text)
    return [], [ln for ln in text.splitlines() if ln.strip()]


def topology_from_ports(
    ports: list[DiscoveredPort], source: str, names: dict[str, str] | None = None
) -> Topology:
    """Build the shared Topology; ``names`` (node-name-map) overrides descriptions by GUID."""
    names = names or {}
    topo = Topology(source=source)
    for p in ports:
        key = (p.guid, str(p.port))
        desc = names.get(p.guid, p.desc)
        topo.ports[key] = PortIdentity(
            guid=p.guid,
            port=str(p.port),
            node_desc=desc,
            node_type=p.node_type,
            lid=p.lid,
            source=source,
        )
        if p.remote_guid is not None and p.remote_port is not None:
            rdesc = names.get(p.remote_guid, p.remote_desc or "")
            topo.links[key] = LinkInfo(
                remote_guid=p.remote_guid,
                remote_port=str(p.remote_port),
                remote_node_desc=rdesc,
                active_width=p.width,
                active_speed=p.speed,
            )
    return topo


# ---------------------------------------------------------------------------------------------
# node-name-map

_NNM_LINE = re.compile(r'^\s*(?P<guid>(?:0x)?[0-9a-fA-F]{1,16})\s+"(?P<name>.*)"\s*$')


def parse_node_name_map(text: str) -> tuple[dict[str, str], list[str]]:
    """rdma-core node-name-map: ``<guid> "name"`` per line, ``#`` comments, blank lines.

    Returns GUID (key form) -> name and the lines that could not be read.
    """
    out: dict[str, str] = {}
    bad: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _NNM_LINE.match(line)
        if not m:
            bad.append(raw)
            continue
        out[normalize_guid(m.group("guid"))] = m.group("name")
    return out, bad


# ---------------------------------------------------------------------------------------------
# libibnetdisc fabric cache (ibnetdiscover --cache FILE)

_CACHE_MAGIC = 0x8FE7832B
_CACHE_VERSION = 1


@dataclass(frozen=True, slots=True)
class CacheNode:
    guid: str
    node_type: str
    num_ports: int
    desc: str
    info: NodeInfo


@dataclass(slots=True)
class CacheFabric:
    """Nodes and raw PortInfo of every port libibnetdisc saw, keyed by (node guid, port)."""

    from_guid: str
    nodes: dict[str, CacheNode] = field(default_factory=dict)
    ports: dict[tuple[str, int], PortInfo] = field(default_factory=dict)
    port_lids: dict[tuple[str, int], int] = field(default_factory=dict)
    remote: dict[tuple[str, int], tuple[str, int]] = field(default_factory=dict)
    #: port GUID -> node GUID (``ibnetdiscover -p`` prints CA *port* GUIDs)
    owner: dict[str, str] = field(default_factory=dict)


def parse_ibnd_cache(data: bytes) -> CacheFabric:
    """Decode libibnetdisc's cache format (little-endian, version 1; see ibnetdisc_cache.c).

    Raises ValueError on a bad magic, version or truncation.
    """
    if len(data) < 28:
        raise ValueError("cache shorter than its header")
    magic, version, n_nodes, n_ports, from_guid, _hops = struct.unpack_from("<IIIIQI", data, 0)
    if magic != _CACHE_MAGIC:
        raise ValueError("not an ibnetdisc cache (bad magic)")
    if version != _CACHE_VERSION:
        raise ValueError(f"unsupported ibnetdisc cache version {version}")
    off = 28
    fab = CacheFabric(from_guid=_hex_guid(from_guid))
    port_owner: dict[tuple[int, int], int] = {}  # (port guid, portnum) -> node guid
    try:
        for _ in range(n_nodes):
            off += 2 + 1 + 1 + 64  # smalid, smalmc, smaenhsp0, switchinfo
            guid, ntype, nports = struct.unpack_from("<QBB", data, off)
            off += 10
            info = decode_node_info(data[off : off + 64])
            off += 64
            desc = clean_node_desc(data[off : off + 64])
            off += 64
            stored = data[off]
            off += 1 + stored * 9
            fab.nodes[_hex_guid(guid)] = CacheNode(
                guid=_hex_guid(guid),
                node_type=_NODE_TYPES.get(ntype, "unknown"),
                num_ports=nports,
                desc=desc,
                info=info,
            )
        raw_remote: list[tuple[tuple[int, int], tuple[int, int]]] = []
        for _ in range(n_ports):
            pguid, pnum, _ext, base_lid, _lmc = struct.unpack_from("<QBBHB", data, off)
            off += 13
            pinfo = decode_port_info(data[off : off + 64])
            off += 64
            owner, flag, rguid, rport = struct.unpack_from("<QBQB", data, off)
            off += 18
            port_owner[(pguid, pnum)] = owner
            fab.owner.setdefault(_hex_guid(pguid), _hex_guid(owner))
            key = (_hex_guid(owner), pnum)
            fab.ports[key] = pinfo
            fab.port_lids[key] = base_lid
            if flag:
                raw_remote.append(((pguid, pnum), (rguid, rport)))
    except (struct.error, ValueError, IndexError) as exc:
        raise ValueError(f"truncated ibnetdisc cache: {exc}") from exc
    for (pg, pn), (rg, rp) in raw_remote:
        owner = port_owner.get((pg, pn))
        rowner = port_owner.get((rg, rp))
        if owner is not None and rowner is not None:
            fab.remote[(_hex_guid(owner), pn)] = (_hex_guid(rowner), rp)
    return fab
