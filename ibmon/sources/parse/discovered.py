"""What a text discovery (``ibnetdiscover`` in either format) yields: ports and their peers."""

from __future__ import annotations

from dataclasses import dataclass

from ibmon.infiniband.model import LinkInfo, PortIdentity, Topology

__all__ = ["TEXT_TYPES", "DiscoveredPort", "link_speed", "topology_from_ports"]

#: Node type as ``ibnetdiscover -p`` prints it.
TEXT_TYPES = {"CA": "ca", "SW": "switch", "RT": "router"}


def link_speed(text: str) -> str:
    """A printed speed (``EDR``); "" when the tool printed ``???`` (speed unknown to it)."""
    return "" if "?" in text else text.upper()


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
