"""The counter catalogue: the single source of truth for every PMA port counter ibmon knows.

Sources map their raw field names through this table, the tracker takes widths and the x4 rule
from it, and the exporter and README take metric names and help text from it. Adding a counter
means adding one row here and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BY_NAME",
    "BY_PMA",
    "BY_SYSFS",
    "BY_SYSFS_EXT",
    "CATALOGUE",
    "DATA_MULTIPLIER",
    "EXTENDED",
    "HW_GAUGE_NAMES",
    "HW_GAUGE_PREFIXES",
    "CounterSpec",
    "is_hw_gauge",
    "markdown_table",
]

#: PortXmitData/PortRcvData count 32-bit words ("octets divided by 4"), whatever the link width.
DATA_MULTIPLIER = 4


@dataclass(frozen=True, slots=True)
class CounterSpec:
    """One PortCounters / PortCountersExtended field.

    ``bits`` is the field's width in the narrow PortCounters attribute (64 for fields that only
    exist in PortCountersExtended). Narrow fields saturate at ``2**bits - 1``; a source that read
    the 64-bit copy says so per sample, and the tracker then uses 64.
    """

    name: str
    pma: str
    sysfs: str | None
    sysfs_ext: str | None
    bits: int
    data: bool
    metric: str
    help: str

    @property
    def multiplier(self) -> int:
        return DATA_MULTIPLIER if self.data else 1

    @property
    def max_value(self) -> int:
        return (1 << self.bits) - 1


def _c(
    name: str,
    pma: str,
    sysfs: str | None,
    bits: int,
    help_: str,
    *,
    ext: str | None = None,
    data: bool = False,
    metric: str | None = None,
) -> CounterSpec:
    return CounterSpec(
        name=name,
        pma=pma,
        sysfs=sysfs,
        sysfs_ext=ext,
        bits=bits,
        data=data,
        metric=metric or f"ibmon_port_{name}_total",
        help=help_,
    )


CATALOGUE: tuple[CounterSpec, ...] = (
    _c("transmit_data", "PortXmitData", "port_xmit_data", 32,
       "Data octets transmitted (PMA counts 4-octet words; ibmon multiplies by 4).",
       ext="port_xmit_data_64", data=True, metric="ibmon_port_transmit_data_bytes_total"),
    _c("receive_data", "PortRcvData", "port_rcv_data", 32,
       "Data octets received (PMA counts 4-octet words; ibmon multiplies by 4).",
       ext="port_rcv_data_64", data=True, metric="ibmon_port_receive_data_bytes_total"),
    _c("transmit_packets", "PortXmitPkts", "port_xmit_packets", 32,
       "Packets transmitted.", ext="port_xmit_packets_64"),
    _c("receive_packets", "PortRcvPkts", "port_rcv_packets", 32,
       "Packets received.", ext="port_rcv_packets_64"),
    _c("unicast_transmit_packets", "PortUnicastXmitPkts", "unicast_xmit_packets", 64,
       "Unicast packets transmitted.", ext="port_unicast_xmit_packets"),
    _c("unicast_receive_packets", "PortUnicastRcvPkts", "unicast_rcv_packets", 64,
       "Unicast packets received.", ext="port_unicast_rcv_packets"),
    _c("multicast_transmit_packets", "PortMulticastXmitPkts", "multicast_xmit_packets", 64,
       "Multicast packets transmitted.", ext="port_multicast_xmit_packets"),
    _c("multicast_receive_packets", "PortMulticastRcvPkts", "multicast_rcv_packets", 64,
       "Multicast packets received.", ext="port_multicast_rcv_packets"),
    _c("symbol_errors", "SymbolErrorCounter", "symbol_error", 16,
       "Minor link errors detected on one or more physical lanes."),
    _c("link_error_recovery", "LinkErrorRecoveryCounter", "link_error_recovery", 8,
       "Successful link error recovery (retrain) procedures."),
    _c("link_downed", "LinkDownedCounter", "link_downed", 8,
       "Times the link failed to recover and went down."),
    _c("receive_errors", "PortRcvErrors", "port_rcv_errors", 16,
       "Received packets with errors."),
    _c("receive_remote_physical_errors", "PortRcvRemotePhysicalErrors",
       "port_rcv_remote_physical_errors", 16,
       "Received packets marked with the EBP delimiter (remote physical error)."),
    _c("receive_switch_relay_errors", "PortRcvSwitchRelayErrors",
       "port_rcv_switch_relay_errors", 16,
       "Received packets the switch could not relay."),
    _c("transmit_discards", "PortXmitDiscards", "port_xmit_discards", 16,
       "Outbound packets discarded (port down, congestion, head-of-queue lifetime)."),
    _c("transmit_constraint_errors", "PortXmitConstraintErrors",
       "port_xmit_constraint_errors", 8,
       "Packets not transmitted because of partition or raw-packet constraints."),
    _c("receive_constraint_errors", "PortRcvConstraintErrors",
       "port_rcv_constraint_errors", 8,
       "Packets received and discarded because of partition or raw-packet constraints."),
    _c("local_link_integrity_errors", "LocalLinkIntegrityErrors",
       "local_link_integrity_errors", 4,
       "Times local physical errors exceeded the LocalPhyErrors threshold."),
    _c("excessive_buffer_overrun_errors", "ExcessiveBufferOverrunErrors",
       "excessive_buffer_overrun_errors", 4,
       "Times consecutive flow-control buffer overruns exceeded the threshold."),
    _c("vl15_dropped", "VL15Dropped", "VL15_dropped", 16,
       "Incoming VL15 (subnet management) packets dropped."),
    _c("qp1_dropped", "QP1Dropped", None, 16,
       "Incoming QP1 (general management) packets dropped."),
    _c("transmit_wait", "PortXmitWait", "port_xmit_wait", 32,
       "Ticks during which the port had data to send but transmitted nothing.",
       metric="ibmon_port_transmit_wait_ticks_total"),
)

BY_NAME: dict[str, CounterSpec] = {c.name: c for c in CATALOGUE}
BY_PMA: dict[str, CounterSpec] = {c.pma: c for c in CATALOGUE}
BY_SYSFS: dict[str, CounterSpec] = {c.sysfs: c for c in CATALOGUE if c.sysfs}
BY_SYSFS_EXT: dict[str, CounterSpec] = {c.sysfs_ext: c for c in CATALOGUE if c.sysfs_ext}

#: Counters that PortCountersExtended always carries as 64-bit fields (the legacy ``counters_ext/``
#: files); the error counters have 64-bit copies only with CapMask2 bit 1.
EXTENDED: frozenset[str] = frozenset(c.name for c in CATALOGUE if c.sysfs_ext)


#: Files in a port's ``hw_counters/`` directory that are not counts. The kernel's RDMA core adds
#: ``lifespan`` to every such directory: how long (ms) read values are cached, a writable setting.
HW_GAUGE_NAMES: frozenset[str] = frozenset({"lifespan"})
#: Driver statistics that are levels, not counts: Broadcom bnxt_re reports the objects in use now
#: (``active_qps``, ``active_mrs``...) and the most ever in use (``watermark_qps``...). The mlx5
#: capture in the tests has no other non-count entry.
HW_GAUGE_PREFIXES: tuple[str, ...] = ("active_", "watermark_")


def is_hw_gauge(name: str) -> bool:
    """True for an ``hw_counters/`` entry that must be exported as it is, never accumulated.

    Accumulating a level or a setting as a total would turn every decrease into a "reset" and
    make ``rate()`` meaningless, so these become ``ibmon_port_hw_stat{stat}`` gauges instead of
    ``ibmon_port_hw_stat_total{stat}``.
    """
    return name in HW_GAUGE_NAMES or name.startswith(HW_GAUGE_PREFIXES)


def markdown_table() -> str:
    """The README's metric table, so documentation cannot drift from the code."""
    rows = [
        "| metric | PMA field | sysfs file | bits | unit |",
        "|---|---|---|---|---|",
    ]
    for c in CATALOGUE:
        files = " / ".join(f"`{f}`" for f in (c.sysfs, c.sysfs_ext) if f) or "-"
        unit = "bytes (words x4)" if c.data else ("ticks" if c.name == "transmit_wait" else "count")
        rows.append(f"| `{c.metric}` | {c.pma} | {files} | {c.bits} | {unit} |")
    return "\n".join(rows) + "\n"
