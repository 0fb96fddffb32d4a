"""What the two fabric sources (``mad`` and ``diags``) share.

The config they take, the per-port view a discovery produces, how a view plus counters becomes
a PortSample, and the steps around discovery and polling that do not depend on how the fabric
is asked: node-name map, include/exclude and shard filters, links to filtered-out peers,
grouping ports by the LID their PMA answers on, and when to re-read port state between
discoveries.

Keeping this in one place is what makes both sources report byte-identical topologies and
snapshots for the same fabric: same state rules, same width/speed decoding, same max-common
rule, same rate (``linkspeed.effective_rate_bps``: the data rate after line encoding).

A discovery is merged into what the source already knows (``TopologyMemory``), never simply
swapped in, because lost MADs must not rewrite the topology: a node (or port) that does not
answer a discovery is *unreachable*, not gone. It keeps its last known ports, LIDs and links (so
its ports are still asked, and report their silence as errors, which the pipeline turns into
stale ports) until it has missed ``unreachable_discoveries`` discoveries in a row (default 3),
counted at most once per ``0.9 x topology_interval`` so that the extra discoveries ibmon runs
after a failed poll cannot use up a node's allowance in seconds: by default a node is dropped
after 10 to 15 minutes of silence. A known node description is never replaced by an empty one
(a lost NodeDescription MAD), nor a known link by none while the port is still up (a lost
NodeInfo through it). A discovery that reached nothing beyond the local node while the known
fabric has more is blind (``BlindDiscoveryError``): it is not adopted at all.

Error and discard details (PortRcvErrorDetails, PortXmitDiscardDetails) are read by both sources
under one rule, ``DetailReads``: a port's detail attribute is read only in a poll where its
aggregate (PortRcvErrors, PortXmitDiscards) moved, plus once as a baseline for a port new to the
source, so a healthy fabric's poll costs not one read more. Between reads a port reports the
detail values it last read: its aggregate did not move, so neither did they.

What one PortXmitWait count of a port stands for is decided once per discovery, under one rule
for both sources (``WaitUnits``): by the node's ASIC family (NodeInfo.DeviceID) when it is a
documented one, else by the port's PortSamplesControl.Tick (one PMA read per port in ``mad``,
one ``perfquery -c`` per device model in ``diags``), else the default unit.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import structlog
from pydantic import Field, field_validator

from ibmon.config import Duration, SourceConfigBase
from ibmon.infiniband.counters import BY_NAME, DETAIL_ATTRIBUTES
from ibmon.infiniband.linkspeed import active_speed, active_width, effective_rate_bps, max_common
from ibmon.infiniband.model import (
    LinkInfo,
    PortIdentity,
    PortKey,
    PortSample,
    Snapshot,
    SourceError,
    Topology,
    normalize_guid,
)
from ibmon.infiniband.xmitwait import DEFAULT_UNIT, WaitUnit, family_of, unit_for
from ibmon.sources.parse import PortCounterValues, PortInfo, load_node_name_map, may_be_fdr10
from ibmon.sources.shard import filter_topology, parse_shard
from ibmon.track.totals import packed_counters

__all__ = [
    "DETAIL_BASELINES_PER_POLL",
    "DETAIL_MISSES_TO_GIVE_UP",
    "DETAIL_TRIGGERS",
    "BlindDiscoveryError",
    "DetailRead",
    "DetailReads",
    "FabricPort",
    "FabricSource",
    "FabricSourceConfig",
    "FabricView",
    "NodeFilter",
    "StateSchedule",
    "TickOutcome",
    "TopologyMemory",
    "WaitUnits",
    "link_of",
    "make_sample",
]

#: A poll this soon after a discovery started uses the port state that discovery read instead
#: of asking every port again (the daemon samples right after each discovery).
DISCOVERY_STATE_FRESH = 1.0
#: A miss counts towards dropping an unreachable port only this fraction of
#: ``topology_interval`` after its previous counted miss (scheduled discoveries drift a little).
MISS_GAP_FRACTION = 0.9
_LINK_UP = 5  # PortPhysicalState LinkUp

log = structlog.get_logger("ibmon.sources.fabric")

#: Detail attribute -> the aggregate counter whose movement makes it worth reading.
DETAIL_TRIGGERS: dict[str, str] = {
    attr: specs[0].part_of or "" for attr, specs in DETAIL_ATTRIBUTES.items()
}
#: First reads (baselines) of ports new to a source, at most this many (port, attribute) reads
#: per poll: a fabric of thousands of ports gets its baselines over its first polls instead of
#: in one (the ``diags`` source pays one perfquery process per read).
DETAIL_BASELINES_PER_POLL = 64
#: A detail attribute that went unanswered this many polls in a row, while the same port's
#: counters answered, counts as unsupported (a PMA that drops what it does not know) until the
#: next discovery.
DETAIL_MISSES_TO_GIVE_UP = 3


class FabricSourceConfig(SourceConfigBase):
    """What the fabric-wide sources (``mad``, ``diags``) are configured with."""

    interval: Duration = 10.0
    #: local CA whose port the MADs leave from; None = the first CA with an active port
    ca: str | None = None
    #: that CA's port; None (or 0) = its first active port, chosen as infiniband-diags choose
    #: (a switch's management port is 0); see ``ibmon.sources.localport``
    port: int | None = Field(default=None, ge=0, le=254)
    topology_interval: Duration = 300.0
    concurrency: int = Field(default=8, ge=1, le=256)
    timeout: Duration = 1.0
    retries: int = Field(default=2, ge=0, le=10)
    include: list[str] = Field(default_factory=list)
    exclude: list[str] = Field(default_factory=list)
    shard: str | None = Field(default=None, pattern=r"^\d+/\d+$")
    #: seconds between port-state refreshes between discoveries; None = the source's default
    #: (mad: every poll, in the same MAD batch; diags: 30 s, one ibnetdiscover for the fabric)
    state_interval: Duration | None = None
    #: a node that misses this many discoveries in a row (counted at most once per 0.9 x
    #: topology_interval) is dropped from the topology; until then it is unreachable, not gone
    unreachable_discoveries: int = Field(default=3, ge=1, le=1000)

    @field_validator("shard")
    @classmethod
    def _check_shard(cls, v: str | None) -> str | None:
        if v is not None:
            parse_shard(v)  # K < N: "3/3" would poll nothing, and only fail at start
        return v


@dataclass(slots=True)
class FabricPort:
    """One port as the latest discovery saw it. ``lid`` addresses its PMA (switch: base LID)."""

    identity: PortIdentity
    lid: int | None
    info: PortInfo | None = None
    state: int | None = None
    phys_state: int | None = None
    active_width: str = ""
    active_speed: str = ""
    remote: tuple[str, int] | None = None
    link: LinkInfo | None = None


@dataclass(slots=True)
class FabricView:
    """The fabric as discovered: ports by key plus the node each belongs to."""

    source: str
    ports: dict[PortKey, FabricPort] = field(default_factory=dict)
    #: Node GUIDs this discovery found but gave to another shard (``keep_shard``): known
    #: ports of theirs are handed off, not unreachable (``TopologyMemory.merge``).
    handed_off: frozenset[str] = frozenset()

    def topology(self) -> Topology:
        topo = Topology(source=self.source)
        for key, fp in self.ports.items():
            topo.ports[key] = fp.identity
            if fp.link is not None:
                topo.links[key] = fp.link
        return topo

    def add(
        self,
        guid: str,
        port: int,
        *,
        desc: str,
        node_type: str,
        lid: int | None,
        xmit_wait: WaitUnit = DEFAULT_UNIT,
    ) -> tuple[PortKey, FabricPort]:
        """A discovered port (an unknown node type is reported as a CA, like the kernel does)."""
        key = (guid, str(port))
        ident = PortIdentity(
            guid=guid,
            port=key[1],
            node_desc=desc,
            node_type=node_type if node_type in ("ca", "switch", "router") else "ca",
            lid=lid,
            source=self.source,
            xmit_wait=xmit_wait,
        )
        fp = self.ports[key] = FabricPort(identity=ident, lid=lid)
        return key, fp

    def apply_port_info(self, key: PortKey, info: PortInfo) -> None:
        """Take state, phys state and active width/speed from a PortInfo (one rule for both)."""
        fp = self.ports[key]
        fp.info = info
        fp.state = info.state or None
        fp.phys_state = info.phys_state or None
        if info.state > 1:  # Init/Armed/Active: the link trained, the active fields mean something
            fp.active_width = active_width(info.width_active)
            fp.active_speed = active_speed(info.speed_active, info.speed_ext_active,
                                           info.speed_ext2_active, info.mlnx_speed_active)
        else:
            fp.active_width = fp.active_speed = ""

    def refresh_port(self, key: PortKey, info: PortInfo) -> None:
        """A poll-time PortInfo: new state and active rate; the discovered peer and max stay.

        Both fabric sources refresh state between discoveries; peers and links change only at
        discovery, but a link that retrained narrower or slower shows it at once.
        """
        fp = self.ports[key]
        last = fp.info
        if (last is not None and last.mlnx_speed_supported and not info.mlnx_speed_supported
                and may_be_fdr10(info)):
            # No ExtendedPortInfo this time (the diags cache never has it; a Get was lost):
            # FDR10 or not holds while the link stays up at QDR.
            info = info._replace(mlnx_speed_supported=last.mlnx_speed_supported,
                                 mlnx_speed_enabled=last.mlnx_speed_enabled,
                                 mlnx_speed_active=last.mlnx_speed_active)
        self.apply_port_info(key, info)
        link = fp.link
        if (
            link is not None
            and fp.active_width
            and (link.active_width, link.active_speed) != (fp.active_width, fp.active_speed)
        ):
            fp.link = link_of(
                fp,
                (link.remote_guid, link.remote_port),
                link.remote_node_desc,
                link.max_width,
                link.max_speed,
            )

    def finish_links(self, peer_desc: Mapping[str, str]) -> None:
        """Fill every link's remote description and max common width/speed from both ends.

        A peer outside the view (filtered out by include/exclude) still names the link: its
        description comes from ``peer_desc`` (node GUID -> description, name map applied),
        and with only one end's capabilities known the link has no max width/speed.
        """
        for fp in self.ports.values():
            if fp.remote is None:
                fp.link = None
                continue
            rkey = (fp.remote[0], str(fp.remote[1]))
            peer = self.ports.get(rkey)
            max_w = max_s = ""
            if peer is None:
                rdesc = peer_desc.get(rkey[0], "")
            else:
                rdesc = peer.identity.node_desc
                if fp.info is not None and peer.info is not None:
                    max_w, max_s = max_common(fp.info, peer.info)
            fp.link = link_of(fp, rkey, rdesc, max_w, max_s)

    def keep_shard(self, shard: tuple[int, int] | None) -> None:
        """Drop the ports another shard polls (``shard`` = (K, N); None keeps all); their
        nodes go to ``handed_off``."""
        if shard is not None:
            keep = filter_topology(self.topology(), *shard).ports
            self.handed_off = frozenset(k[0] for k in self.ports if k not in keep)
            self.ports = {k: v for k, v in self.ports.items() if k in keep}

    def by_lid(self) -> dict[int, list[PortKey]]:
        """Ports grouped by the LID their PMA answers on (a switch: all ports on its base LID).

        LIDs ascending, ports in numeric order; ports without a LID (a down CA port) are left
        out: nothing can be asked of them.
        """
        groups: dict[int, list[PortKey]] = {}
        for key, fp in self.ports.items():
            if fp.lid:
                groups.setdefault(fp.lid, []).append(key)
        return {lid: sorted(groups[lid], key=lambda k: int(k[1])) for lid in sorted(groups)}


def link_of(fp: FabricPort, rkey: PortKey, rdesc: str, max_w: str, max_s: str) -> LinkInfo:
    return LinkInfo(
        remote_guid=rkey[0],
        remote_port=rkey[1],
        remote_node_desc=rdesc,
        active_width=fp.active_width,
        active_speed=fp.active_speed,
        max_width=max_w,
        max_speed=max_s,
    )


def make_sample(fp: FabricPort, values: PortCounterValues | None) -> PortSample:
    rate = effective_rate_bps(fp.active_width, fp.active_speed) if fp.active_width else None
    return PortSample(
        identity=fp.identity,
        state=fp.state,
        phys_state=fp.phys_state,
        rate_bps=rate,
        active_width=fp.active_width,
        active_speed=fp.active_speed,
        # Packed, and the poll's shared set of 64-bit names, not copies: nothing changes the
        # values once the sample is made (``FabricSource._fill`` is their last use), and a
        # dict and a set a port were 1-3 KB (benchmarks/bench_sample_memory.py).
        counters=packed_counters(values.counters) if values else {},
        wide=values.wide if values else frozenset(),
        link=fp.link,
    )


class NodeFilter:
    """include/exclude by node GUID or node description (shell-style globs on descriptions).

    A node is kept when ``include`` is empty or matches it, and ``exclude`` does not.
    """

    def __init__(self, include: Iterable[str] = (), exclude: Iterable[str] = ()) -> None:
        self._inc = self._compile(include)
        self._exc = self._compile(exclude)

    @staticmethod
    def _compile(items: Iterable[str]) -> tuple[frozenset[str], tuple[str, ...]]:
        guids: set[str] = set()
        globs: list[str] = []
        for item in items:
            try:
                guids.add(normalize_guid(item))
            except ValueError:
                globs.append(item)
            else:
                if not item.lower().startswith("0x") and ":" not in item:
                    globs.append(item)  # "abc" is a hex number *and* a plausible name
        return frozenset(guids), tuple(globs)

    @staticmethod
    def _hit(rules: tuple[frozenset[str], tuple[str, ...]], guid: str, desc: str) -> bool:
        return guid in rules[0] or any(fnmatch.fnmatchcase(desc, g) for g in rules[1])

    @property
    def active(self) -> bool:
        return bool(self._inc[0] or self._inc[1] or self._exc[0] or self._exc[1])

    def keep(self, guid: str, desc: str) -> bool:
        if (self._inc[0] or self._inc[1]) and not self._hit(self._inc, guid, desc):
            return False
        return not self._hit(self._exc, guid, desc)


class StateSchedule:
    """When a fabric source re-reads port state between discoveries (``state_interval``).

    Discovery reads every port's state, so it counts as a refresh; and the poll that directly
    follows a discovery (within ``DISCOVERY_STATE_FRESH`` of its start: the daemon samples right
    after each one) never refreshes, whatever the interval, because the state it would read is
    less than a second old.
    """

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._at: float | None = None
        self._discovery_started: float | None = None

    def discovered(self, started: float, ended: float) -> None:
        """A discovery ran from ``started`` to ``ended`` (monotonic) and read every port's state."""
        self._at = ended
        self._discovery_started = started

    def due(self, now: float) -> bool:
        """Whether this poll (at ``now``) refreshes state; a refresh is recorded as done."""
        refresh = self._at is None or now - self._at >= self.interval
        started, self._discovery_started = self._discovery_started, None
        if started is not None and now - started < DISCOVERY_STATE_FRESH:
            refresh = False
        if refresh:
            self._at = now
        return refresh


class BlindDiscoveryError(RuntimeError):
    """A discovery that reached nothing beyond the local node while more is known: the fabric
    (or the local link) is gone, so the known topology stays and the poll fails."""


class TopologyMemory:
    """Merges each discovery into the topology a fabric source already knows (module docstring).

    The contract, for both fabric sources: ``merge(known, found, reached=N)`` takes the view in
    use (None before the first discovery) and a freshly discovered, finished view (links and
    shard applied) that reached ``N`` nodes before filtering, and returns the view to use:
    ``found`` with known descriptions put back where it has empty ones, known links put back on
    ports that are up but lost theirs, and the known ports it lacks kept until they have missed
    ``misses_to_drop`` discoveries in a row. It raises ``BlindDiscoveryError`` (and changes nothing)
    when ``reached`` is 1 or less while the previous discovery reached more. ``unreachable``
    then names the nodes kept although none of their ports answered the latest discovery.

    A known node that the discovery found but the shard assignment now gives to another shard
    (``found.handed_off``: a host re-cabled to a switch of another shard) is dropped at once,
    all its ports: it answered, so it is not unreachable, and its new shard polls it from that
    shard's next discovery. ``handed_off`` then names the known nodes so dropped.
    """

    def __init__(self, *, misses_to_drop: int = 3, min_gap: float = 0.0) -> None:
        self.misses_to_drop = max(1, misses_to_drop)
        self.min_gap = min_gap
        self.unreachable: frozenset[str] = frozenset()
        self.handed_off: frozenset[str] = frozenset()
        self._misses: dict[PortKey, tuple[int, float]] = {}  # key -> (misses, when last counted)
        self._descs: dict[str, str] = {}  # node GUID -> its last non-empty description
        self._reached = 0

    def merge(
        self,
        known: FabricView | None,
        found: FabricView,
        *,
        reached: int,
        now: float | None = None,
    ) -> FabricView:
        if reached <= 1 < self._reached:
            raise BlindDiscoveryError(
                f"discovery reached {reached} node(s), the previous one {self._reached}: "
                "the fabric (or the local link) stopped answering; keeping the known topology"
            )
        now = time.monotonic() if now is None else now
        self._reached = reached
        self._remember_descs(found)
        kept: set[str] = set()
        gone: set[str] = set()
        if known is not None:
            for key, old in known.ports.items():
                new = found.ports.get(key)
                if new is not None:
                    self._misses.pop(key, None)
                    self._keep_link(new, old)
                    continue
                if key[0] in found.handed_off:
                    self._misses.pop(key, None)
                    gone.add(key[0])
                    continue
                misses, counted = self._misses.get(key, (0, float("-inf")))
                if now - counted >= self.min_gap:
                    misses, counted = misses + 1, now
                if misses >= self.misses_to_drop:
                    self._misses.pop(key, None)
                    continue
                self._misses[key] = (misses, counted)
                found.ports[key] = old
                kept.add(key[0])
        for key in [k for k in self._misses if k not in found.ports]:
            del self._misses[key]
        self._restore_descs(found)
        answered = {k[0] for k in found.ports if k not in self._misses}
        self.unreachable = frozenset(kept - answered)
        self.handed_off = frozenset(gone)
        return found

    def _remember_descs(self, found: FabricView) -> None:
        for fp in found.ports.values():
            if fp.identity.node_desc:
                self._descs[fp.identity.guid] = fp.identity.node_desc
            link = fp.link
            if link is not None and link.remote_node_desc:
                self._descs.setdefault(link.remote_guid, link.remote_node_desc)

    def _restore_descs(self, found: FabricView) -> None:
        """Put known descriptions back where a lost NodeDescription MAD left them empty."""
        descs = self._descs
        for fp in found.ports.values():
            ident = fp.identity
            if not ident.node_desc and ident.guid in descs:
                fp.identity = dataclasses.replace(ident, node_desc=descs[ident.guid])
            link = fp.link
            if link is not None and not link.remote_node_desc and link.remote_guid in descs:
                fp.link = dataclasses.replace(link, remote_node_desc=descs[link.remote_guid])

    @staticmethod
    def _keep_link(new: FabricPort, old: FabricPort) -> None:
        """A port still up whose peer did not answer this discovery keeps its known link."""
        if new.remote is not None or old.remote is None or old.link is None:
            return
        if new.phys_state != _LINK_UP:
            return  # down: the missing peer is news (a down link is reported, not invented)
        new.remote = old.remote
        new.link = link_of(
            new,
            (old.link.remote_guid, old.link.remote_port),
            old.link.remote_node_desc,
            old.link.max_width,
            old.link.max_speed,
        )


#: What a Tick read gave for a port: the Tick, or why there is none. ``unread`` (no answer, or
#: an error status: a PMA without PortSamplesControl, as ibsim's) is no error; anything else
#: that is not an int is the reason of a SourceError (the tool broke or printed junk).
TickOutcome = int | tuple[str, str]


class WaitUnits:
    """Each port's PortXmitWait unit, decided at every discovery (module docstring).

    The rule is ``ibmon.infiniband.xmitwait.unit_for``: a documented ASIC family decides, and such a
    node's Tick is never asked (it could not change the answer; on a fabric of current
    hardware that is every node, so the rule costs nothing). For any other node the Tick its
    port reported decides; where a read gets no Tick this discovery, the Tick the port last
    reported (a lost MAD must not move a port's unit, which would bend its stall fraction),
    else the default unit.

    No Tick is asked at a LID a PortInfo names as its master SM's (MasterSMLID): ibsim has no
    PortSamplesControl handler and hands such a Get to the subnet manager attached at that
    port, and opensm (3.3) exits on it. Only the simulator needs this; on hardware it costs
    the SM's node its own read (``diags`` still books its model's Tick on it).

    A PMA that answers PortSamplesControl with an error status or not at all (ibsim has no
    handler for it) is not an error: the port has the fallback unit, and says so in its
    ``source``; one log line per discovery counts them. A Tick without a vendor rule (read as
    IBA's (Tick + 1) bytes per lane) is a SourceError ``odd_tick`` per port, and a read that
    failed otherwise (a tool killed on its timeout, junk output) one with its reason.
    """

    __slots__ = ("_ticks", "asked", "unread")

    def __init__(self) -> None:
        #: the Tick each port last reported (ports whose family is unknown only)
        self._ticks: dict[PortKey, int] = {}
        #: Tick reads of the last discovery, and how many of them gave no Tick
        self.asked = 0
        self.unread = 0

    @staticmethod
    def needs_tick(device_id: int | None) -> bool:
        """Whether a node's Tick is worth a read: its family does not decide its unit."""
        return family_of(device_id) is None

    def decide(
        self,
        source: str,
        view: FabricView,
        device_ids: Mapping[str, int],
        outcomes: Mapping[PortKey, TickOutcome],
    ) -> list[SourceError]:
        """Set every port's ``xmit_wait`` in ``view`` (a fresh discovery's) from its node's
        device ID (``device_ids``: node GUID -> NodeInfo.DeviceID) and this discovery's Tick
        reads (``outcomes``: only ports that were asked); the errors to report with it."""
        errors: list[SourceError] = []
        unread: list[tuple[PortKey, str]] = []
        ticks = self._ticks
        for key, fp in view.ports.items():
            got = outcomes.get(key)
            if isinstance(got, int):
                ticks[key] = got
            elif got is not None:
                reason, detail = got
                if reason == "unread":
                    unread.append((key, detail))
                else:
                    errors.append(SourceError(
                        reason, f"{key[0]} port {key[1]}: PortSamplesControl: {detail}", key))
            tick = ticks.get(key)
            unit, odd = unit_for(device_ids.get(key[0]), tick)
            if odd:
                errors.append(SourceError(
                    "odd_tick",
                    f"{key[0]} port {key[1]}: PortSamplesControl.Tick {tick} has no vendor "
                    f"rule; one PortXmitWait count read as {unit.text} (IBA)",
                    key,
                ))
            if fp.identity.xmit_wait != unit:
                fp.identity = dataclasses.replace(fp.identity, xmit_wait=unit)
        for key in [k for k in ticks if k not in view.ports]:
            del ticks[key]
        self.asked = len(outcomes)
        self.unread = len(unread)
        if unread:
            key, why = unread[0]
            log.info(
                "xmit_wait_tick_unread",
                source=source,
                ports=len(unread),
                example=f"{key[0]} port {key[1]}: {why}",
                unit="their last Tick's, else the default",
                until="the next discovery",
            )
        return errors


#: One read: a port and a detail attribute (PortRcvErrorDetails or PortXmitDiscardDetails).
DetailRead = tuple[PortKey, str]


class DetailReads:
    """Which ports' detail attributes a fabric source reads in a poll, and what they last read.

    The rule both fabric sources follow (one place, so ``mad`` and ``diags`` report the same):

    - **moved**: in a poll where a port's PortRcvErrors (PortXmitDiscards) differs from the
      value it had at the port's previous answer, its PortRcvErrorDetails
      (PortXmitDiscardDetails) is read in the same poll, right after the counters. A narrow
      aggregate pinned at its maximum cannot move, so while it is pinned the details are read
      every poll (a saturated error counter is an erroring port).
    - **baseline**: a port new to the source (found by a discovery) has both attributes read
      once, at most ``baselines_per_poll`` reads per poll, in the order the poll asks its ports.
    - **owed**: a read that failed (no answer, unreadable) is tried again next poll whatever the
      aggregate does, so an increase is never left unread until the next error.
    - **unsupported**: a port whose PMA answers a detail Get with an error status, or leaves it
      unanswered ``DETAIL_MISSES_TO_GIVE_UP`` polls in a row while its counters answer, is not
      asked for that attribute again until the next discovery, and costs nothing else: no error,
      no read. After the discovery it is asked again the next time its aggregate moves.

    Between reads a port reports the values it last read (``fill``): its aggregate did not move,
    so neither did they, and the tracker keeps their rates at 0 instead of losing them. A read
    that failed leaves the attribute out of that poll's sample (stale in the tracker: no rate
    that poll, and the next read still counts the whole increase). Nothing here decreases.
    """

    __slots__ = (
        "_baseline",
        "_known",
        "_last",
        "_learned",
        "_misses",
        "_owed",
        "_unsupported",
        "baselines_per_poll",
        "enabled",
        "values",
    )

    def __init__(
        self, *, baselines_per_poll: int = DETAIL_BASELINES_PER_POLL, enabled: bool = True
    ) -> None:
        self.enabled = enabled
        self.baselines_per_poll = max(0, baselines_per_poll)
        #: per port: detail counter name -> the value last read
        self.values: dict[PortKey, dict[str, int]] = {}
        #: per port: (PortRcvErrors, PortXmitDiscards) at its last answer (None: not read)
        self._last: dict[PortKey, tuple[int | None, int | None]] = {}
        self._baseline: set[DetailRead] = set()
        self._owed: set[DetailRead] = set()
        self._unsupported: set[DetailRead] = set()
        self._misses: dict[DetailRead, int] = {}
        self._known: set[PortKey] = set()
        self._learned: list[DetailRead] = []

    @property
    def unsupported(self) -> frozenset[DetailRead]:
        return frozenset(self._unsupported)

    def discovered(self, keys: Iterable[PortKey]) -> None:
        """A discovery was adopted: ``keys`` are the ports the source now polls.

        New ports owe a baseline; ports gone from the topology are forgotten; what was learned
        about unsupported attributes is forgotten (firmware may have changed).
        """
        if not self.enabled:
            return
        now = set(keys)
        gone = self._known - now
        if gone:
            for key in gone:
                self.values.pop(key, None)
                self._last.pop(key, None)
            self._baseline = {r for r in self._baseline if r[0] in now}
            self._owed = {r for r in self._owed if r[0] in now}
        for key in now - self._known:
            for attr in DETAIL_TRIGGERS:
                self._baseline.add((key, attr))
        self._known = now
        self._unsupported.clear()
        self._misses.clear()

    def planned(self, keys: Iterable[PortKey]) -> list[DetailRead]:
        """Reads known before the poll, for the ports it asks (``keys``, in asking order): every
        owed read, then baselines up to ``baselines_per_poll``."""
        if not self.enabled or not (self._owed or self._baseline):
            return []
        owed, base = self._owed, self._baseline
        out: list[DetailRead] = []
        budget = self.baselines_per_poll
        for key in keys:
            for attr in DETAIL_TRIGGERS:
                read = (key, attr)
                if read in owed:
                    out.append(read)
                elif budget > 0 and read in base:
                    out.append(read)
                    budget -= 1
        return out

    def moved(
        self, values: Mapping[PortKey, PortCounterValues], done: Collection[DetailRead] = ()
    ) -> list[DetailRead]:
        """Reads due because an aggregate moved (class docstring), given this poll's counters;
        records the aggregates as the new "last" values. ``done``: reads already made this poll.
        """
        if not self.enabled:
            return []
        last = self._last
        unsupported = self._unsupported
        rcv_max = BY_NAME["receive_errors"].max_value
        disc_max = BY_NAME["transmit_discards"].max_value
        out: list[DetailRead] = []
        for key, pcv in values.items():
            counters = pcv.counters
            now = (counters.get("receive_errors"), counters.get("transmit_discards"))
            prev = last.get(key)
            last[key] = now if prev is None else (
                prev[0] if now[0] is None else now[0], prev[1] if now[1] is None else now[1])
            rcv, disc = now
            if prev == now and not (
                (rcv is not None and rcv >= rcv_max) or (disc is not None and disc >= disc_max)
            ):
                continue  # the usual port: nothing moved, nothing pinned
            for attr, agg, value, top, before in (
                ("PortRcvErrorDetails", "receive_errors", rcv, rcv_max,
                 prev[0] if prev else None),
                ("PortXmitDiscardDetails", "transmit_discards", disc, disc_max,
                 prev[1] if prev else None),
            ):
                if value is None:
                    continue
                pinned = value >= top and agg not in pcv.wide
                if not pinned and (before is None or value == before):
                    continue
                read = (key, attr)
                if read not in unsupported and read not in done:
                    out.append(read)
        return out

    def answered(self, read: DetailRead, values: Mapping[str, int]) -> None:
        """A read came back: its values are the port's from now on."""
        self._baseline.discard(read)
        self._owed.discard(read)
        self._misses.pop(read, None)
        self.values.setdefault(read[0], {}).update(values)

    def refused(self, read: DetailRead) -> None:
        """The PMA answered with an error status: unsupported until the next discovery."""
        self._baseline.discard(read)
        self._owed.discard(read)
        self._misses.pop(read, None)
        self._forget_values(read)
        self._unsupported.add(read)
        self._learned.append(read)

    def missed(self, read: DetailRead, *, port_answered: bool) -> bool:
        """A read got no usable answer: it is owed. True when this gave up on the attribute
        (``DETAIL_MISSES_TO_GIVE_UP`` misses in a row while the port's counters answered)."""
        self._baseline.discard(read)
        self._forget_values(read)
        if port_answered:
            misses = self._misses.get(read, 0) + 1
            if misses >= DETAIL_MISSES_TO_GIVE_UP:
                self._owed.discard(read)
                self._misses.pop(read, None)
                self._unsupported.add(read)
                self._learned.append(read)
                return True
            self._misses[read] = misses
        self._owed.add(read)
        return False

    def report_learned(self, source: str) -> None:
        """One log line for the reads found unsupported since the last call (if any): on a
        fabric whose PMAs lack the attributes that is one line per attribute and discovery,
        never one per port."""
        learned, self._learned = self._learned, []
        by_attr: dict[str, list[PortKey]] = {}
        for key, attr in learned:
            by_attr.setdefault(attr, []).append(key)
        for attr, keys in by_attr.items():
            log.info(
                "detail_counters_unsupported",
                source=source,
                attribute=attr,
                ports=len(keys),
                example=f"{keys[0][0]} port {keys[0][1]}",
                until="the next discovery",
            )

    def _forget_values(self, read: DetailRead) -> None:
        """This poll reports no value for the attribute (it is unknown now, not unchanged)."""
        have = self.values.get(read[0])
        if have:
            for spec in DETAIL_ATTRIBUTES[read[1]]:
                have.pop(spec.name, None)

    def fill(self, values: Mapping[PortKey, PortCounterValues]) -> None:
        """Add every port's last detail values to its counters for this poll."""
        for key, det in self.values.items():
            pcv = values.get(key)
            if pcv is not None and det:
                pcv.counters.update(det)


class FabricSource:
    """The parts of ``MadSource`` and ``DiagsSource`` that do not depend on how they ask.

    Subclasses implement ``discover`` (ending with ``_adopt``) and ``sample`` (starting with
    ``_prepare_sample``) and ``close``.
    """

    def __init__(
        self,
        *,
        name: str,
        include: Sequence[str] = (),
        exclude: Sequence[str] = (),
        shard: str | None = None,
        node_name_map: str | os.PathLike[str] | None = None,
        state_interval: float = 0.0,
        topology_interval: float = 300.0,
        unreachable_discoveries: int = 3,
        details: bool = True,
        detail_baselines_per_poll: int = DETAIL_BASELINES_PER_POLL,
    ) -> None:
        self.name = name
        #: error and discard details: which ports to read, and what they last read
        self.details = DetailReads(baselines_per_poll=detail_baselines_per_poll, enabled=details)
        self._filter = NodeFilter(include, exclude)
        self._shard = parse_shard(shard) if shard else None
        self._names = load_node_name_map(node_name_map)
        #: what one PortXmitWait count of each port stands for, decided at each discovery
        self.wait_units = WaitUnits()
        self._state = StateSchedule(state_interval)
        self._view: FabricView | None = None
        self._discover_errors: list[SourceError] = []
        self._memory = TopologyMemory(
            misses_to_drop=unreachable_discoveries,
            min_gap=MISS_GAP_FRACTION * topology_interval,
        )

    async def discover(self) -> Topology:
        raise NotImplementedError

    def _desc(self, guid: str, discovered: str) -> str:
        """A node's description: the node-name map's name, else what the node reported."""
        return self._names.get(guid, discovered)

    def _finish(self, view: FabricView, peer_desc: Mapping[str, str]) -> FabricView:
        """Links (peers outside the filter included), then the shard's part of the view."""
        view.finish_links(peer_desc)
        view.keep_shard(self._shard)
        return view

    def _adopt(
        self,
        view: FabricView,
        errors: list[SourceError],
        started: float,
        *,
        reached: int | None = None,
    ) -> Topology:
        """Merge ``view`` into the known topology (``TopologyMemory``) and make the result
        current; its discovery's errors go out with the next snapshot. ``reached``: how many
        nodes the discovery reached before filtering (default: the nodes in ``view``).

        Raises ``BlindDiscoveryError`` (the known view stays) when it reached only the local node.
        """
        if reached is None:
            reached = len({k[0] for k in view.ports})
        self._view = self._memory.merge(self._view, view, reached=reached)
        self.details.discovered(self._view.ports)
        self._discover_errors = errors
        self._state.discovered(started, time.monotonic())
        topo = self._view.topology()
        topo.unreachable = self._memory.unreachable
        topo.handed_off = self._memory.handed_off
        return topo

    async def _prepare_sample(self) -> tuple[FabricView, list[SourceError], bool]:
        """The view to poll (discovering first if there is none), the errors of the latest
        discovery (reported once), and whether this poll refreshes port state."""
        if self._view is None:
            await self.discover()
        view = self._view
        assert view is not None
        errors, self._discover_errors = self._discover_errors, []
        return view, errors, self._state.due(time.monotonic())

    @staticmethod
    def _fill(
        snap: Snapshot, view: FabricView, values: Mapping[PortKey, PortCounterValues]
    ) -> None:
        """A sample for every port whose counters were read, in view order; ports without a
        LID (down CA ports) still exist and are reported with their state and no counters.
        A port whose counters failed is left out (its SourceError says why)."""
        for key, fp in view.ports.items():
            if key in values:
                snap.ports[key] = make_sample(fp, values[key])
            elif not fp.lid:
                snap.ports[key] = make_sample(fp, None)
