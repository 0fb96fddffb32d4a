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
    "DETAILS",
    "DETAIL_ATTRIBUTES",
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
    """One PortCounters / PortCountersExtended field, or one field of a detail attribute.

    ``bits`` is the field's width in the narrow PortCounters attribute (64 for fields that only
    exist in PortCountersExtended). Narrow fields saturate at ``2**bits - 1``; a source that read
    the 64-bit copy says so per sample, and the tracker then uses 64.

    A detail counter (``attribute`` set: PortRcvErrorDetails or PortXmitDiscardDetails) splits
    an aggregate counter (``part_of``) by cause: every increment of a detail field is also an
    increment of its aggregate. The kernel exposes none of them in sysfs, and the fabric sources
    read them only for ports whose aggregate moved (``ibmon.sources.fabric.DetailReads``).
    """

    name: str
    pma: str
    sysfs: str | None
    sysfs_ext: str | None
    bits: int
    data: bool
    metric: str
    help: str
    attribute: str | None = None
    part_of: str | None = None

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


def _detail(name: str, attribute: str, pma: str, part_of: str, help_: str) -> CounterSpec:
    """A 16-bit field of PortRcvErrorDetails (0x15) or PortXmitDiscardDetails (0x16)."""
    return CounterSpec(
        name=name,
        pma=pma,
        sysfs=None,
        sysfs_ext=None,
        bits=16,
        data=False,
        metric=f"ibmon_port_{name}_total",
        help=help_,
        attribute=attribute,
        part_of=part_of,
    )


_RCV = "PortRcvErrorDetails"
_XMIT = "PortXmitDiscardDetails"


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
       "Raw PortXmitWait counts: ticks in which the port had data to send but sent nothing; "
       "one count's size is device-defined (ibmon_port_transmit_wait_unit_bytes).",
       metric="ibmon_port_transmit_wait_ticks_total"),
    # PMA field names as libibmad (and so perfquery -E / -D) spells them.
    _detail("receive_local_physical_errors", _RCV, "PortLocalPhysicalErrors", "receive_errors",
            "Received packets with local physical errors (ICRC, VCRC, LPCRC, bad packet "
            "delimiters): part of PortRcvErrors."),
    _detail("receive_malformed_packet_errors", _RCV, "PortMalformedPktErrors", "receive_errors",
            "Received packets that were malformed (bad header fields, length, VL): part of "
            "PortRcvErrors."),
    _detail("receive_buffer_overrun_errors", _RCV, "PortBufferOverrunErrors", "receive_errors",
            "Received packets discarded because the receive buffer overran (flow-control "
            "credits): part of PortRcvErrors."),
    _detail("receive_dlid_mapping_errors", _RCV, "PortDLIDMappingErrors", "receive_errors",
            "Received packets a switch could not forward: no route for the destination LID. "
            "Part of PortRcvErrors."),
    _detail("receive_vl_mapping_errors", _RCV, "PortVLMappingErrors", "receive_errors",
            "Received packets a switch could not forward: the SL-to-VL mapping gives no valid "
            "output VL. Part of PortRcvErrors."),
    _detail("receive_looping_errors", _RCV, "PortLoopingErrors", "receive_errors",
            "Received packets a switch discarded because they would leave by the port they "
            "came in on (a routing loop): part of PortRcvErrors."),
    _detail("transmit_inactive_discards", _XMIT, "PortInactiveDiscards", "transmit_discards",
            "Outbound packets discarded because the port was not Active: part of "
            "PortXmitDiscards."),
    _detail("transmit_neighbor_mtu_discards", _XMIT, "PortNeighborMTUDiscards",
            "transmit_discards",
            "Outbound packets discarded because they were larger than the neighbour's MTU: "
            "part of PortXmitDiscards."),
    _detail("transmit_sw_lifetime_limit_discards", _XMIT, "PortSwLifetimeLimitDiscards",
            "transmit_discards",
            "Outbound packets a switch discarded because they outlived the switch lifetime "
            "limit: part of PortXmitDiscards."),
    _detail("transmit_sw_hoq_lifetime_limit_discards", _XMIT, "PortSwHOQLifetimeLimitDiscards",
            "transmit_discards",
            "Outbound packets a switch discarded because they waited at the head of the queue "
            "past the HOQ lifetime (congestion downstream): part of PortXmitDiscards."),
)

BY_NAME: dict[str, CounterSpec] = {c.name: c for c in CATALOGUE}
BY_PMA: dict[str, CounterSpec] = {c.pma: c for c in CATALOGUE}
BY_SYSFS: dict[str, CounterSpec] = {c.sysfs: c for c in CATALOGUE if c.sysfs}
BY_SYSFS_EXT: dict[str, CounterSpec] = {c.sysfs_ext: c for c in CATALOGUE if c.sysfs_ext}

#: Counters that PortCountersExtended always carries as 64-bit fields (the legacy ``counters_ext/``
#: files); the error counters have 64-bit copies only with CapMask2 bit 1.
EXTENDED: frozenset[str] = frozenset(c.name for c in CATALOGUE if c.sysfs_ext)

#: Detail attribute -> its counters, in payload order (PortSelect, CounterSelect, then these).
DETAIL_ATTRIBUTES: dict[str, tuple[CounterSpec, ...]] = {
    attr: tuple(c for c in CATALOGUE if c.attribute == attr) for attr in (_RCV, _XMIT)
}
#: Aggregate counter -> the names of the detail counters that split it by cause.
DETAILS: dict[str, tuple[str, ...]] = {
    specs[0].part_of or "": tuple(c.name for c in specs) for specs in DETAIL_ATTRIBUTES.values()
}


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
        files = " / ".join(f"`{f}`" for f in (c.sysfs, c.sysfs_ext) if f) or "none (PMA only)"
        unit = "bytes (words x4)" if c.data else (
            "counts (device-defined size)" if c.name == "transmit_wait" else "count")
        pma = f"{c.attribute}.{c.pma}" if c.attribute else c.pma
        rows.append(f"| `{c.metric}` | {pma} | {files} | {c.bits} | {unit} |")
    return "\n".join(rows) + "\n"
