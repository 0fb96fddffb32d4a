"""Plain data shared by sources, tracker, detectors and exporters.

Hot-path types are slotted dataclasses (thousands of ports every second); pydantic is used only at
the boundaries (config, events, API). Every port is keyed by ``(guid, port)``: the node GUID as
``0x`` + 16 lowercase hex digits and the port number as a decimal string, for every source.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import IntEnum
from operator import attrgetter
from typing import Any

from ibmon.cli.terminal import printable
from ibmon.infiniband.xmitwait import DEFAULT_UNIT, WaitUnit

__all__ = [
    "GUID_RE",
    "LinkInfo",
    "PhysState",
    "PortIdentity",
    "PortKey",
    "PortSample",
    "PortState",
    "PortView",
    "Snapshot",
    "SourceError",
    "Topology",
    "normalize_guid",
    "phys_state_name",
    "replaced",
    "state_json",
    "state_label",
    "state_name",
    "view_values",
]

PortKey = tuple[str, str]
"""``(guid, port)``: ``("0x0002c90300a1b2c3", "1")``."""

GUID_RE = re.compile(r"^0x[0-9a-f]{16}$")


def normalize_guid(raw: str) -> str:
    """Turn any GUID spelling (``0002:c903:00a1:b2c3``, ``0x2c90300a1b2c3``) into the key form.

    Raises ValueError for anything that is not 1-16 hex digits, so untrusted text never becomes
    a key, a label or an MQTT topic level.
    """
    text = raw.strip().lower()
    if text.startswith("0x"):
        text = text[2:]
    text = text.replace(":", "")
    if not 0 < len(text) <= 16 or any(ch not in "0123456789abcdef" for ch in text):
        raise ValueError(f"not a GUID: {raw!r}")
    return "0x" + text.rjust(16, "0")


class PortState(IntEnum):
    """IBA PortInfo.PortState."""

    NOP = 0
    DOWN = 1
    INIT = 2
    ARMED = 3
    ACTIVE = 4
    ACTIVE_DEFER = 5


class PhysState(IntEnum):
    """IBA PortInfo.PortPhysicalState."""

    NOP = 0
    SLEEP = 1
    POLLING = 2
    DISABLED = 3
    PORT_CONFIGURATION_TRAINING = 4
    LINK_UP = 5
    LINK_ERROR_RECOVERY = 6
    PHY_TEST = 7


# One spelling of port states for every output, so a port reads the same however it is asked:
# JSON keeps the IBA numbers for programs and adds the names; tables print the names only, with
# the physical state where it explains a port that is not Active (``DOWN/Polling``: no light
# from the far end; ``DOWN/Disabled``; ``INIT/LinkUp``: trained, but no subnet manager
# configured it).


def state_name(state: int | None) -> str | None:
    """``ACTIVE``, ``DOWN``, ``INIT``, ``ARMED`` as the kernel spells them; unknown: the number."""
    if state is None:
        return None
    try:
        return PortState(state).name
    except ValueError:
        return str(state)


def phys_state_name(phys: int | None) -> str | None:
    """``LinkUp``, ``Polling``, ``Disabled``, ``PhyTest``... as ibstat spells them (sysfs too,
    but for its "Phy Test")."""
    if phys is None:
        return None
    try:
        name = PhysState(phys).name
    except ValueError:
        return str(phys)
    return "".join(word.capitalize() for word in name.split("_"))


def state_label(state: int | None, phys: int | None) -> str:
    """One table cell: ``ACTIVE``, or ``DOWN/Polling`` for a port that is not Active."""
    name = state_name(state)
    if name is None:
        return "-"
    if state == PortState.ACTIVE or phys is None:
        return name
    return f"{name}/{phys_state_name(phys)}"


def state_json(state: int | None, phys: int | None) -> dict[str, int | str | None]:
    """``state``, ``phys_state`` (IBA numbers) and their names, for JSON and event details."""
    return {"state": state, "state_name": state_name(state),
            "phys_state": phys, "phys_state_name": phys_state_name(phys)}


_UNTRUSTED = ("node_desc", "fw_ver", "hca_type", "board_id")


@dataclass(frozen=True, slots=True)
class PortIdentity:
    """Who a port is. Descriptive strings are untrusted and only ever appear as label values."""

    guid: str
    port: str
    device: str = ""
    node_desc: str = ""
    node_type: str = "ca"  # ca | switch | router
    lid: int | None = None
    link_layer: str = "InfiniBand"  # InfiniBand | Ethernet
    source: str = ""
    fw_ver: str = ""
    hca_type: str = ""
    board_id: str = ""
    sm_lid: int | None = None
    #: What one PortXmitWait count stands for on this port (``ibmon.infiniband.xmitwait``),
    #: decided by the source at discovery.
    xmit_wait: WaitUnit = DEFAULT_UNIT

    def __post_init__(self) -> None:
        # One printable form from ingest on (``ibmon.cli.terminal.printable``): a control byte in
        # a description a host's administrator or firmware set reaches no output as itself.
        for name in _UNTRUSTED:
            text = getattr(self, name)
            if not text.isprintable():
                object.__setattr__(self, name, printable(text))

    @property
    def key(self) -> PortKey:
        return (self.guid, self.port)


@dataclass(frozen=True, slots=True)
class LinkInfo:
    """The far end of a link and the link's active versus best possible width and speed."""

    remote_guid: str
    remote_port: str
    remote_node_desc: str = ""
    active_width: str = ""  # "4X"
    active_speed: str = ""  # "EDR"
    max_width: str = ""
    max_speed: str = ""

    def __post_init__(self) -> None:
        if not self.remote_node_desc.isprintable():  # as ``PortIdentity.node_desc``
            object.__setattr__(self, "remote_node_desc", printable(self.remote_node_desc))


@dataclass(frozen=True, slots=True)
class SourceError:
    """One value a source could not read. It costs that value, never the port or the poll."""

    reason: str  # no_pma | einval | eacces | missing | empty | garbage | bad_rate | timeout | ...
    detail: str  # path, node or command: for the log, never a label
    key: PortKey | None = None


@dataclass(slots=True)
class PortSample:
    """Raw values of one port at one instant, exactly as the hardware reported them.

    ``counters`` maps catalogue names to raw values (data counters still in 4-octet words):
    a dict, or an ``ibmon.track.totals.Totals`` over an ``array('Q')`` from a source that keeps its
    values packed (the simulator), which the tracker reads without an int object per value.
    ``wide`` names the counters that were read from a 64-bit field; all others are taken to
    have the catalogue's narrow width and to saturate there. ``hw_counters`` are driver counts
    (accumulated like counters); ``hw_gauges`` are driver entries that are settings or levels
    (``lifespan``, ``active_qps``): reported as read, never accumulated.
    """

    identity: PortIdentity
    state: int | None = None
    phys_state: int | None = None
    rate_bps: float | None = None  # effective data rate in bits/s (sysfs "100 Gb/sec")
    active_width: str = ""
    active_speed: str = ""
    counters: Mapping[str, int] = field(default_factory=dict)
    wide: frozenset[str] = frozenset()
    hw_counters: dict[str, int] = field(default_factory=dict)
    link: LinkInfo | None = None
    hw_gauges: dict[str, int] = field(default_factory=dict)

    @property
    def key(self) -> PortKey:
        return self.identity.key


@dataclass(slots=True)
class Snapshot:
    """One poll of one source: every port it could read plus what it could not."""

    source: str
    monotonic: float
    wall: float
    ports: dict[PortKey, PortSample] = field(default_factory=dict)
    errors: list[SourceError] = field(default_factory=list)
    #: Ports whose key changed since the last poll (a device's GUID arrived), old -> new:
    #: the same hardware, so its totals and history move to the new key.
    renamed: dict[PortKey, PortKey] = field(default_factory=dict)


@dataclass(slots=True)
class Topology:
    """Ports and links a source discovered; diffed between refreshes."""

    source: str
    ports: dict[PortKey, PortIdentity] = field(default_factory=dict)
    links: dict[PortKey, LinkInfo] = field(default_factory=dict)
    #: Node GUIDs kept from earlier discoveries although they did not answer this one: a node
    #: that misses a discovery is unreachable, not gone (fabric sources; see ``sources.fabric``).
    unreachable: frozenset[str] = frozenset()
    #: Node GUIDs this source polled until this discovery gave them to another shard: the
    #: pipeline forgets their ports at once (no stale port, no ``vanished``).
    handed_off: frozenset[str] = frozenset()
    #: Each switch's LinearForwardingTable as read at this discovery, switch node GUID ->
    #: bytes indexed by destination LID, each the egress port (``0xff``: no route). Empty when
    #: the source reads no tables (sysfs, the simulator) or could not read them.
    forwarding: Mapping[str, bytes] = field(default_factory=dict)


@dataclass(slots=True, eq=False)
class PortView:
    """What ibmon knows about a port after the tracker: totals, rates, health.

    ``totals`` are software-accumulated (bytes for data counters) and never decrease. ``rates``
    are per second and absent for a counter that is saturated or has no previous sample.
    ``resets`` lists only counters that were reset at least once. ``hw_gauges`` are the
    sample's driver settings and levels, as read.

    ``stale`` marks a port that did not answer the latest poll (or whose source failed it): the
    view is the last one read, totals and state as they were, with no rates, utilization,
    transmit-wait ratio or BER, because those would claim a measurement that did not happen.
    A port that stops answering stays visible this way instead of vanishing from ``/metrics``.
    """

    identity: PortIdentity
    state: int | None = None
    phys_state: int | None = None
    rate_bytes_per_second: float | None = None
    active_width: str = ""
    active_speed: str = ""
    link: LinkInfo | None = None
    totals: Mapping[str, int] = field(default_factory=dict)
    rates: Mapping[str, float] = field(default_factory=dict)
    saturated: frozenset[str] = frozenset()
    resets: dict[str, int] = field(default_factory=dict)
    hw_totals: dict[str, int] = field(default_factory=dict)
    hw_rates: dict[str, float] = field(default_factory=dict)
    utilization_tx: float | None = None
    utilization_rx: float | None = None
    xmit_wait_ratio: float | None = None
    symbol_error_ber: float | None = None
    conditions: frozenset[str] = frozenset()
    hw_gauges: dict[str, int] = field(default_factory=dict)
    stale: bool = False
    #: Conditions this port carries (a link fault is carried by one end of its link) and the
    #: likely cause of each: ``{"receive_errors": "physical"}`` (``ibmon.detect.cause``).
    causes: dict[str, str] = field(default_factory=dict)
    #: Seconds the port stalled with data to send, accumulated by the tracker over every
    #: interval with a ``xmit_wait_ratio`` (never decreases, persisted); None for a port
    #: without a PortXmitWait counter.
    xmit_wait_seconds: float | None = None

    @property
    def key(self) -> PortKey:
        return self.identity.key

    def __eq__(self, other: object) -> bool:
        # Field by field, as the dataclass's would, but across subclasses: a view whose rows
        # stay in the tracker's store (``ibmon.track.rowview.RowView``) equals a plain one.
        if not isinstance(other, PortView):
            return NotImplemented
        return view_values(self) == view_values(other)  # a tuple's: identical values are equal

    __hash__ = None  # type: ignore[assignment]  # mutable: unhashable, as with the dataclass's eq


_VIEW_FIELDS = tuple(f.name for f in fields(PortView))
#: A view's fields' values, in field order, as one tuple (``PortView(*view_values(v))`` is a
#: plain view equal to ``v``).
view_values = attrgetter(*_VIEW_FIELDS)


def replaced(view: PortView, **changes: Any) -> PortView:
    """``dataclasses.replace`` for any view, one of a subclass too (``ibmon.track.rowview.RowView``,
    whose constructor takes rows): a plain ``PortView`` with ``view``'s values but ``changes``."""
    values = dict(zip(_VIEW_FIELDS, view_values(view), strict=True))
    values.update(changes)
    return PortView(**values)
