"""Subnet-management payloads: NodeInfo, NodeDescription and PortInfo as raw bytes.

The ``mad`` source receives these from its SMPs; the ``diags`` source finds the same bytes in
libibnetdisc's cache. Decoding both through this module is what makes the two sources agree.
Offsets follow rdma-core's libibmad ``fields.c`` (checked against the installed
``mad_decode_field`` in the tests).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from ibmon.infiniband.linkspeed import active_speed
from ibmon.infiniband.model import PhysState
from ibmon.sources.parse.errors import ParseError

__all__ = [
    "NODE_TYPES",
    "NodeInfo",
    "PortInfo",
    "clean_node_desc",
    "decode_node_desc",
    "decode_node_info",
    "decode_port_info",
    "has_mlnx_ext_port_info",
    "hex_guid",
    "may_be_fdr10",
    "with_mlnx_speeds",
]

#: NodeInfo.NodeType codes; anything else is "unknown".
NODE_TYPES = {1: "ca", 2: "switch", 3: "router"}


def hex_guid(value: int) -> str:
    """A 64-bit GUID in ibmon's key form (``0x`` + 16 lower-case hex digits)."""
    return f"0x{value:016x}"


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


class NodeInfo(NamedTuple):
    """The NodeInfo fields ibmon uses. A named tuple, not a frozen dataclass: a sweep decodes
    one per link, and a tuple is built several times faster (immutable all the same)."""

    node_type: str  # ca | switch | router | unknown
    num_ports: int
    system_guid: str
    node_guid: str
    port_guid: str
    device_id: int
    vendor_id: int
    local_port: int


#: NodeInfo bytes 0-39 in one unpack: type, ports, the three GUIDs, device id, local port and
#: the 24-bit vendor id as a byte and a half-word.
_NODE_INFO = struct.Struct(">2xBBQQQ2xH4xBBH")


def decode_node_info(data: bytes) -> NodeInfo:
    if len(data) < 40:
        raise ParseError("NodeInfo payload shorter than 40 bytes")
    ntype, nports, sysguid, nguid, pguid, devid, local_port, v_hi, v_lo = (
        _NODE_INFO.unpack_from(data)
    )
    vendor = v_hi << 16 | v_lo
    return NodeInfo(
        NODE_TYPES.get(ntype, "unknown"),  # node_type
        nports,  # num_ports
        hex_guid(sysguid),  # system_guid
        hex_guid(nguid),  # node_guid
        hex_guid(pguid),  # port_guid
        devid,  # device_id
        vendor,  # vendor_id
        local_port,  # local_port
    )


class PortInfo(NamedTuple):
    """The PortInfo fields ibmon uses; widths and speeds as the raw IBA codes / bit masks.

    A named tuple for the reason ``NodeInfo`` is one: a sweep decodes one per port, and so does
    every poll that refreshes port state."""

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
    #: LinkSpeedExt{Active,Supported,Enabled}2 (IBA 1.7, XDR): byte 56, reserved (0) before.
    speed_ext2_active: int = 0
    speed_ext2_supported: int = 0
    speed_ext2_enabled: int = 0
    #: LinkSpeed{Supported,Enabled,Active} of Mellanox's vendor ExtendedPortInfo (FDR10), when
    #: it was read (``with_mlnx_speeds``); 0 otherwise.
    mlnx_speed_supported: int = 0
    mlnx_speed_enabled: int = 0
    mlnx_speed_active: int = 0


#: PortInfo bytes 16-63 in one unpack (a sweep decodes one per port, thousands per discovery
#: and, with the per-poll state refresh, per poll): LID, SMLID, CapabilityMask, then bytes 28-35
#: one by one, the XDR speeds' byte 56, then CapabilityMask2 and the two extended-speed bytes
#: at 60-63.
_PORT_INFO = struct.Struct(">16xHHI4xBBBBBBBB20xB3xHBB")


def decode_port_info(data: bytes) -> PortInfo:
    if len(data) < 64:
        raise ParseError("PortInfo payload shorter than 64 bytes")
    lid, smlid, capmask, lport, w_en, w_sup, w_act, b32, b33, b34, b35, b56, cap2, b62, b63 = (
        _PORT_INFO.unpack_from(data)
    )
    return PortInfo(
        lid,  # lid
        smlid,  # sm_lid
        capmask,  # cap_mask
        lport,  # local_port
        w_en,  # width_enabled
        w_sup,  # width_supported
        w_act,  # width_active
        b32 >> 4,  # speed_supported
        b32 & 0x0F,  # state
        b33 >> 4,  # phys_state
        b34 & 0x07,  # lmc
        b35 >> 4,  # speed_active
        b35 & 0x0F,  # speed_enabled
        cap2,  # cap_mask2
        b62 >> 4,  # speed_ext_active
        b62 & 0x0F,  # speed_ext_supported
        b63 & 0x1F,  # speed_ext_enabled
        (b56 >> 5) & 0x3,  # speed_ext2_active (bits 449-450)
        (b56 >> 3) & 0x3,  # speed_ext2_supported (bits 451-452)
        b56 & 0x7,  # speed_ext2_enabled (bits 453-455)
    )


#: Mellanox ExtendedPortInfo (vendor SMP attribute 0xff90): LinkSpeedSupported, LinkSpeedEnabled
#: and LinkSpeedActive are bytes 7, 11 and 15 (libibmad ``fields.c``: bit offsets 56, 88, 120).
_MLNX_SPEEDS = struct.Struct(">7xB3xB3xB")

#: The devices rdma-core asks for ExtendedPortInfo (libibnetdisc ``ibnetdisc.c``
#: ``is_mlnx_ext_port_info_supported``): Mellanox SwitchX to Quantum and ConnectX-3 to ConnectX-6
#: by device ID, and Bull's OEM parts of them by vendor ID 0x119f.
_MLNX_EPI_DEVICES = frozenset(
    [*range(0xC738, 0xC73C), 0xC839, 0xCB20, 0xCF08, 0xCF09, 0xD2F0,
     *range(0x1003, 0x101C), 0xA2D2]
)
_BULL = 0x119F
_BULL_EPI_DEVICES = frozenset(
    [0x1B02, 0x1B50, 0x1BA0, *range(0x1BD0, 0x1BD6), 0x1BF0,
     0x1B33, 0x1B73, 0x1B40, 0x1B41, 0x1B60, 0x1B61, 0x1B83, 0x1B93, 0x1B94,
     0x1BB4, 0x1BB5, 0x1BC4, 0x1BC5, 0x1BC6]
)


def has_mlnx_ext_port_info(vendor_id: int, device_id: int) -> bool:
    """Whether the device answers Mellanox's ExtendedPortInfo (rdma-core's list)."""
    return device_id in _MLNX_EPI_DEVICES or (vendor_id == _BULL and device_id in _BULL_EPI_DEVICES)


def may_be_fdr10(info: PortInfo) -> bool:
    """Whether a port's PortInfo may hide FDR10, so its ExtendedPortInfo is worth a Get: link up
    at QDR, no extended speed active (libibnetdisc asks exactly then)."""
    return info.phys_state == PhysState.LINK_UP and active_speed(
        info.speed_active, info.speed_ext_active, info.speed_ext2_active) == "QDR"


def with_mlnx_speeds(info: PortInfo, data: bytes) -> PortInfo:
    """``info`` with the speeds of the port's ExtendedPortInfo payload."""
    if len(data) < _MLNX_SPEEDS.size:
        raise ParseError("ExtendedPortInfo payload shorter than 16 bytes")
    supported, enabled, active = _MLNX_SPEEDS.unpack_from(data)
    return info._replace(mlnx_speed_supported=supported, mlnx_speed_enabled=enabled,
                         mlnx_speed_active=active)
