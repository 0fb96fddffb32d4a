"""What the two fabric sources (``mad`` and ``diags``) share: the per-port view a discovery
produces, filters, and how a view plus counters becomes a PortSample.

Keeping this in one place is what makes both sources report byte-identical topologies and
snapshots for the same fabric: same state rules, same width/speed decoding, same max-common rule.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass, field

from pydantic import Field

from ibmon.config import Duration, SourceConfigBase
from ibmon.linkspeed import active_speed, active_width, effective_rate_bps, max_common
from ibmon.model import LinkInfo, PortIdentity, PortKey, PortSample, Topology, normalize_guid
from ibmon.sources.parse import PortCounterValues, PortInfo

__all__ = [
    "FabricPort",
    "FabricSourceConfig",
    "FabricView",
    "NodeFilter",
    "link_of",
    "make_sample",
]


class FabricSourceConfig(SourceConfigBase):
    """What the fabric-wide sources (``mad``, ``diags``) are configured with."""

    interval: Duration = 10.0
    #: local CA whose port the MADs leave from; None = the first CA with an active port
    ca: str | None = None
    #: that CA's port; None = its first active port, as infiniband-diags choose (a switch: 0)
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

    def topology(self) -> Topology:
        topo = Topology(source=self.source)
        for key, fp in self.ports.items():
            topo.ports[key] = fp.identity
            if fp.link is not None:
                topo.links[key] = fp.link
        return topo

    def apply_port_info(self, key: PortKey, info: PortInfo) -> None:
        """Take state, phys state and active width/speed from a PortInfo (one rule for both)."""
        fp = self.ports[key]
        fp.info = info
        fp.state = info.state or None
        fp.phys_state = info.phys_state or None
        if info.state > 1:  # Init/Armed/Active: the link trained, the active fields mean something
            fp.active_width = active_width(info.width_active)
            fp.active_speed = active_speed(info.speed_active, info.speed_ext_active)
        else:
            fp.active_width = fp.active_speed = ""

    def refresh_port(self, key: PortKey, info: PortInfo) -> None:
        """A poll-time PortInfo: new state and active rate; the discovered peer and max stay.

        Both fabric sources refresh state between discoveries; peers and links change only at
        discovery, but a link that retrained narrower or slower shows it at once.
        """
        fp = self.ports[key]
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

    def finish_links(self) -> None:
        """Fill every link's remote description and max common width/speed from both ends."""
        for _key, fp in self.ports.items():
            if fp.remote is None:
                fp.link = None
                continue
            rkey = (fp.remote[0], str(fp.remote[1]))
            peer = self.ports.get(rkey)
            max_w = max_s = ""
            if fp.info is not None and peer is not None and peer.info is not None:
                max_w, max_s = max_common(fp.info, peer.info)
            rdesc = (
                peer.identity.node_desc
                if peer is not None
                else (fp.link.remote_node_desc if fp.link is not None else "")
            )
            fp.link = link_of(fp, rkey, rdesc, max_w, max_s)


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
        counters=dict(values.counters) if values else {},
        wide=frozenset(values.wide) if values else frozenset(),
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
