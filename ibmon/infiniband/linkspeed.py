"""InfiniBand link width and speed: PortInfo code tables, rates, and the best common link.

Rates: every source reports a port's ``rate_bps`` as the *data* rate after line encoding,
computed here by ``effective_rate_bps`` from the active width and speed: lanes x the lane's data
rate (8b/10b up to QDR, 64b/66b for FDR10 to EDR: FDR's 14.0625 Gbaud carry 13.636 Gb/s; from
HDR on the signalling rate covers Reed-Solomon FEC too, and a 53.125 Gb/s lane carries 50 Gb/s:
docs/infiniband.md §3). 4X QDR is 32 Gb/s, not the 40 Gb/s signalling rate sysfs prints; 4X FDR
54.55 Gb/s, not 56.
Utilization is bytes moved against this rate, so it can reach 100 %.
A RoCE/iWARP port (link layer Ethernet) is the exception, see ``port_rate_bps``.

A link is degraded when it runs below the highest width or speed that *both* ends support *and*
have enabled (docs/infiniband.md §3). rdma-core's iblinkinfo uses the supported masks only, which
flags links an administrator limited on purpose (and every ibsim link); ibmon intersects the
enabled masks too. Both fabric sources compute ``max_width``/``max_speed`` here.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Protocol

__all__ = [
    "EXT_SPEED_BITS",
    "FDR10_BIT",
    "LANE_EFFECTIVE_GBPS",
    "LANE_SIGNAL_GBPS",
    "SPEED_BITS",
    "SPEED_ORDER",
    "WIDTH_BITS",
    "WIDTH_LANES",
    "LinkCaps",
    "active_speed",
    "active_width",
    "effective_rate_bps",
    "enabled_speeds",
    "enabled_widths",
    "ext_speeds",
    "is_degraded",
    "max_common",
    "port_rate_bps",
    "speed_names",
    "width_names",
]

#: PortInfo LinkWidth{Active,Enabled,Supported} bits.
WIDTH_BITS: dict[int, str] = {1: "1X", 2: "4X", 4: "8X", 8: "12X", 16: "2X"}
WIDTH_LANES: dict[str, int] = {"1X": 1, "2X": 2, "4X": 4, "8X": 8, "12X": 12}
#: PortInfo LinkSpeed{Active,Enabled,Supported} bits (the original speeds).
SPEED_BITS: dict[int, str] = {1: "SDR", 2: "DDR", 4: "QDR"}
#: Extended speeds as rdma-core aggregates them (libibnetdisc ``ibnd_get_agg_linkspeedext``):
#: LinkSpeedExt{Active,Enabled,Supported} bits (IBA 1.3+; NDR since 1.5), and XDR (IBA 1.7)
#: from LinkSpeedExt*2, whose bit 0 counts as bit 5 (``ext_speeds``). 16 is unused.
EXT_SPEED_BITS: dict[int, str] = {1: "FDR", 2: "EDR", 4: "HDR", 8: "NDR", 32: "XDR"}
_EXT_DISABLED = 30
"""LinkSpeedExtEnabled's "extended speeds disabled" (rdma-core reads it as none enabled)."""
#: FDR10's bit in the LinkSpeed{Supported,Enabled,Active} fields of Mellanox's vendor
#: ExtendedPortInfo (SMP attribute 0xff90; rdma-core libibmad ``iba_types.h`` ``FDR10``). FDR10
#: is never in PortInfo: an FDR10 port reports QDR there.
FDR10_BIT = 0x01
#: FDR10 in a base-speed mask (``enabled_speeds``): bit 4, outside PortInfo's 4-bit fields.
_FDR10_IN_BASE = 0x10
_BASE_NAMES = {**SPEED_BITS, _FDR10_IN_BASE: "FDR10"}
#: Slowest to fastest.
SPEED_ORDER: tuple[str, ...] = ("SDR", "DDR", "QDR", "FDR10", "FDR", "EDR", "HDR", "NDR", "XDR")
#: Per-lane signalling rate in Gb/s.
LANE_SIGNAL_GBPS: dict[str, float] = {
    "SDR": 2.5,
    "DDR": 5.0,
    "QDR": 10.0,
    "FDR10": 10.3125,
    "FDR": 14.0625,
    "EDR": 25.78125,
    "HDR": 53.125,
    "NDR": 106.25,
    "XDR": 212.5,
}
#: Per-lane data rate after line encoding and FEC (docs/infiniband.md §3): 4X = 8..800 Gb/s.
LANE_EFFECTIVE_GBPS: dict[str, float] = {
    "SDR": 2.0,
    "DDR": 4.0,
    "QDR": 8.0,
    "FDR10": 10.0,
    "FDR": 14.0625 * 64 / 66,  # 13.636...: the signalling rate after 64b/66b
    "EDR": 25.0,
    "HDR": 50.0,
    "NDR": 100.0,
    "XDR": 200.0,
}
_SPEED_RANK = {s: i for i, s in enumerate(SPEED_ORDER)}


class LinkCaps(Protocol):
    """The PortInfo masks of one port (``ibmon.sources.parse.PortInfo`` has them)."""

    @property
    def width_supported(self) -> int: ...
    @property
    def width_enabled(self) -> int: ...
    @property
    def speed_supported(self) -> int: ...
    @property
    def speed_enabled(self) -> int: ...
    @property
    def speed_ext_supported(self) -> int: ...
    @property
    def speed_ext_enabled(self) -> int: ...
    @property
    def speed_ext2_supported(self) -> int: ...
    @property
    def speed_ext2_enabled(self) -> int: ...
    @property
    def mlnx_speed_supported(self) -> int: ...
    @property
    def mlnx_speed_enabled(self) -> int: ...


def width_names(mask: int) -> list[str]:
    """Width names in a mask, narrowest first."""
    return sorted((n for b, n in WIDTH_BITS.items() if mask & b), key=WIDTH_LANES.__getitem__)


def speed_names(mask: int, ext_mask: int = 0) -> list[str]:
    """Speed names in the base and extended masks, slowest first."""
    names = [n for b, n in _BASE_NAMES.items() if mask & b]
    names += [n for b, n in EXT_SPEED_BITS.items() if ext_mask & b]
    return sorted(names, key=_SPEED_RANK.__getitem__)


def active_width(code: int) -> str:
    """LinkWidthActive -> "4X"; "" for 0 or an unknown code."""
    return WIDTH_BITS.get(code, "")


def ext_speeds(ext: int, ext2: int = 0) -> int:
    """One extended-speed mask (``EXT_SPEED_BITS``) from a LinkSpeedExt field and its
    LinkSpeedExt*2 companion, as rdma-core aggregates them."""
    return ext | (ext2 << 5)


def active_speed(
    speed_active: int, speed_ext_active: int = 0, speed_ext2_active: int = 0,
    mlnx_speed_active: int = 0,
) -> str:
    """LinkSpeedActive/LinkSpeedExtActive/LinkSpeedExtActive2 -> "EDR"; an extended speed,
    when set, wins, and XDR's over the others. A QDR port whose vendor ExtendedPortInfo says
    FDR10 (``mlnx_speed_active``) is FDR10, as rdma-core's ibnetdiscover and iblinkinfo say."""
    if speed_ext2_active:
        return EXT_SPEED_BITS.get(ext_speeds(0, speed_ext2_active), "")
    if speed_ext_active:
        return EXT_SPEED_BITS.get(speed_ext_active, "")
    base = SPEED_BITS.get(speed_active, "")
    return "FDR10" if base == "QDR" and mlnx_speed_active & FDR10_BIT else base


def enabled_widths(p: LinkCaps) -> int:
    return p.width_supported & p.width_enabled


def enabled_speeds(p: LinkCaps) -> tuple[int, int]:
    """The base and extended (``ext_speeds``) speeds a port supports and has enabled; FDR10,
    from the vendor ExtendedPortInfo, counts as a base speed."""
    enabled = 0 if p.speed_ext_enabled == _EXT_DISABLED else p.speed_ext_enabled
    fdr10 = _FDR10_IN_BASE if p.mlnx_speed_supported & p.mlnx_speed_enabled & FDR10_BIT else 0
    return ((p.speed_supported & p.speed_enabled) | fdr10,
            ext_speeds(p.speed_ext_supported, p.speed_ext2_supported)
            & ext_speeds(enabled, p.speed_ext2_enabled))


def max_common(a: LinkCaps, b: LinkCaps) -> tuple[str, str]:
    """Highest width and speed that both ends support and have enabled ("" when none)."""
    sa, ea = enabled_speeds(a)
    sb, eb = enabled_speeds(b)
    return _best_of(enabled_widths(a) & enabled_widths(b), sa & sb, ea & eb)


@lru_cache(maxsize=1024)
def _best_of(widths: int, speeds: int, ext_speeds: int) -> tuple[str, str]:
    """The widest width and fastest speed in the masks. Cached: a discovery asks this once per
    link, and a fabric's links share a handful of masks (2,310 links cost 12 ms uncached)."""
    w = width_names(widths)
    s = speed_names(speeds, ext_speeds)
    return (w[-1] if w else "", s[-1] if s else "")


def effective_rate_bps(width: str, speed: str) -> float | None:
    """Data rate of a link in bits/s (4X EDR = 100e9); None when either part is unknown."""
    lanes = WIDTH_LANES.get(width.upper())
    lane = LANE_EFFECTIVE_GBPS.get(speed.upper())
    if lanes is None or lane is None:
        return None
    return lanes * lane * 1e9


def port_rate_bps(
    width: str, speed: str, *, link_layer: str = "InfiniBand", reported_bps: float | None = None
) -> float | None:
    """A port's data rate in bits/s, whatever the link layer.

    InfiniBand: ``effective_rate_bps(width, speed)``, the rate after line encoding.

    Ethernet (RoCE, iWARP): the kernel maps the Ethernet speed onto an IB width/speed pair only
    to fill the same fields (10GbE prints ``10 Gb/sec (1X FDR10)``, 40GbE ``40 Gb/sec (4X
    FDR10)``, 100GbE ``100 Gb/sec (4X EDR)``), and the number it prints (``reported_bps``) is the
    Ethernet MAC rate, which already is a data rate: the PCS encoding runs below it. So that
    number is the rate, not the lane table. (1GbE RoCE prints 2.5 Gb/s, the smallest IB rate.)
    """
    if link_layer.lower() == "ethernet":
        return reported_bps if reported_bps else None
    return effective_rate_bps(width, speed)


def is_degraded(active_w: str, active_s: str, max_w: str, max_s: str) -> bool:
    """True when the link runs narrower or slower than its best common setting."""
    if active_w and max_w and WIDTH_LANES.get(active_w, 0) < WIDTH_LANES.get(max_w, 0):
        return True
    return bool(active_s and max_s and _SPEED_RANK.get(active_s, 0) < _SPEED_RANK.get(max_s, 0))
