"""PortXmitWait in the hardware's own unit: how much port time one count stands for.

A PortXmitWait count is not a fixed time. IBA defines a tick as (Tick + 1) symbol times, a
symbol time being the time one byte takes on one lane (PortSamplesControl.Tick, PMA attribute
0x10), and NVIDIA's ibdiagnet manual ("Congestion Assessment on InfiniBand Links") gives what
its ASICs count as lost bytes:

- Quantum, Quantum-2, Quantum-3 (Tick = 7): one count = 8 bytes **per port**, whatever the width;
  NVIDIA/ib-traffic-monitor#3 says the same for current HCAs (ConnectX-6 and later);
- Switch-IB, Switch-IB 2, SwitchX (Tick = 31): one count = 32 bytes **per lane** (the IBA rule).

So the fraction of time a port stalled is ``counts x bytes_per_count / (data rate x seconds)``
(``stall_share``): the one formula the tracker and docs/infiniband.md use; the simulator
makes counts with its inverse (``counts_for``). The rule that gives a port's
``bytes_per_count`` is decided once per discovery (``unit_for``) and exported with where it
came from (``WaitUnit.source``): the ASIC family by PCI device ID (NodeInfo.DeviceID; sysfs
``hca_type`` is ``MT`` + the same ID in decimal), else the Tick the port reports, else a
default, or the operator's configuration.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from ibmon.infiniband.linkspeed import WIDTH_LANES

__all__ = [
    "DEFAULT_UNIT",
    "FAMILIES",
    "WaitUnit",
    "configured_unit",
    "counts_for",
    "device_id_of_hca_type",
    "family_of",
    "parse_unit",
    "stall_fraction",
    "stall_share",
    "unit_for",
]

Source = Literal["tick", "family", "default", "config"]


@dataclass(frozen=True, slots=True)
class WaitUnit:
    """Bytes of lost transmission one PortXmitWait count stands for, per port or per lane."""

    bytes: int
    per_lane: bool
    source: Source
    #: The ASIC family that decided it ("" unless ``source`` is "family").
    family: str = ""

    def bytes_per_count(self, width: str) -> float | None:
        """Bytes one count stands for on the whole port at ``width`` ("4X"); None when the
        rule is per lane and the width is unknown."""
        if not self.per_lane:
            return float(self.bytes)
        lanes = WIDTH_LANES.get(width.upper()) if width else None
        return None if lanes is None else float(self.bytes * lanes)

    @property
    def text(self) -> str:
        """``8/port`` or ``32/lane``: the configuration's spelling."""
        return f"{self.bytes}/{'lane' if self.per_lane else 'port'}"


#: ASIC families whose unit is documented, by PCI device ID (NodeInfo.DeviceID). IDs from
#: rdma-core (infiniband-diags/vendstat.c, providers/mlx5/mlx5.c) and the PCI ID Repository
#: (vendor 15b3); units from ibdiagnet's "Congestion Assessment" table (switches) and
#: NVIDIA/ib-traffic-monitor#3 (ConnectX-6 and later HCAs: Tick 7, 8 bytes per port).
FAMILIES: Final[dict[int, tuple[str, int, bool]]] = {
    **dict.fromkeys(range(0xC738, 0xC73C), ("SwitchX", 32, True)),
    0xCB20: ("Switch-IB", 32, True),
    0xCF08: ("Switch-IB 2", 32, True),
    0xD2F0: ("Quantum", 8, False),
    0xD2F2: ("Quantum-2", 8, False),
    0xD2F4: ("Quantum-3", 8, False),
    0xD2F6: ("Quantum-3", 8, False),
    0x101B: ("ConnectX-6", 8, False),
    0x101C: ("ConnectX-6", 8, False),
    0x101D: ("ConnectX-6 Dx", 8, False),
    0x101F: ("ConnectX-6 Lx", 8, False),
    0x1021: ("ConnectX-7", 8, False),
    0x1023: ("ConnectX-8", 8, False),
    0x1025: ("ConnectX-9", 8, False),
    0xA2D6: ("BlueField-2", 8, False),
    0xA2DC: ("BlueField-3", 8, False),
}

#: Where neither the family nor the Tick is known (sysfs of an older HCA, ibsim's nodes, a
#: device that does not answer PortSamplesControl): the current generations' unit.
DEFAULT_UNIT: Final = WaitUnit(8, False, "default")

#: Tick values with a vendor rule of their own (ibdiagnet's table); any other follows IBA.
_TICK_RULES: Final[dict[int, WaitUnit]] = {
    7: WaitUnit(8, False, "tick"),
    31: WaitUnit(32, True, "tick"),
}


def family_of(device_id: int | None) -> WaitUnit | None:
    """The unit of a documented ASIC family; None for any other device."""
    if device_id is None:
        return None
    found = FAMILIES.get(device_id)
    if found is None:
        return None
    name, size, per_lane = found
    return WaitUnit(size, per_lane, "family", name)


def unit_for(device_id: int | None, tick: int | None) -> tuple[WaitUnit, bool]:
    """A port's unit from its device ID and PortSamplesControl.Tick (either may be unknown),
    and whether it is a guess worth flagging: a Tick with no vendor rule is read as IBA
    defines it, (Tick + 1) bytes per lane, and the caller reports it."""
    unit = family_of(device_id)
    if unit is not None:
        return unit, False
    if tick is None:
        return DEFAULT_UNIT, False
    rule = _TICK_RULES.get(tick)
    if rule is not None:
        return rule, False
    return WaitUnit(tick + 1, True, "tick"), True


_HCA_TYPE_RE: Final = re.compile(r"^MT(\d{4,5})$")


def device_id_of_hca_type(hca_type: str) -> int | None:
    """The PCI device ID in an mlx4/mlx5 ``hca_type`` (``MT4123`` is 0x101b, ConnectX-6)."""
    m = _HCA_TYPE_RE.match(hca_type.strip())
    return int(m.group(1)) if m else None


_UNIT_RE: Final = re.compile(r"^\s*(\d{1,4})\s*/\s*(port|lane)\s*$")


def parse_unit(text: str) -> WaitUnit:
    """``"8/port"`` or ``"32/lane"`` (the configuration's spelling); ValueError otherwise."""
    m = _UNIT_RE.match(text) if isinstance(text, str) else None
    if m is None or int(m.group(1)) == 0:
        raise ValueError(f"{text!r}: expected bytes per count as e.g. '8/port' or '32/lane'")
    return WaitUnit(int(m.group(1)), m.group(2) == "lane", "config")


def configured_unit(device: str, units: Mapping[str, WaitUnit]) -> WaitUnit | None:
    """The configured unit of the first device glob that matches ``device``, if any."""
    for pattern, unit in units.items():
        if fnmatch.fnmatchcase(device, pattern):
            return unit
    return None


def stall_share(wait_rate: Any, bytes_per_count: Any, link_bytes: Any, minimum: Any = min,
                maximum: Any = max) -> Any:
    """The formula: the share of a second a port stalled, from its PortXmitWait counts a
    second, the bytes a count stands for and the link's data bytes a second, at most 1. Scalars,
    or numpy columns with ``np.minimum``/``np.maximum`` (the tracker's column store)."""
    return minimum(1.0, maximum(0.0, wait_rate * bytes_per_count / link_bytes))


def stall_fraction(counts: float, bytes_per_count: float | None, rate_bytes: float | None,
                   seconds: float = 1.0) -> float | None:
    """The fraction of ``seconds`` a port stalled (``stall_share`` of the counts' rate). None
    where the link rate or the unit is unknown (a port that is down has no rate), as for
    utilization."""
    if (bytes_per_count is None or rate_bytes is None or not rate_bytes > 0
            or not seconds > 0 or not math.isfinite(rate_bytes)):
        return None
    return float(stall_share(counts / seconds, bytes_per_count, rate_bytes))


def counts_for(fraction: float, bytes_per_count: float, rate_bytes: float,
               seconds: float) -> float:
    """``stall_fraction``'s inverse: the counts a port stalled ``fraction`` of ``seconds``
    reports (the simulator's model of the hardware)."""
    return fraction * rate_bytes * seconds / bytes_per_count
