"""Build PortViews by hand for detector unit tests."""

from __future__ import annotations

from typing import Any

from ibmon.model import LinkInfo, PortIdentity, PortView

GUID = "0x0002c90300a1b2c3"
PEER = "0x0002c90300ffff01"


def view(
    port: str = "1",
    *,
    guid: str = GUID,
    state: int | None = 4,
    rate_bps: float | None = 100e9,
    link: LinkInfo | None = None,
    node_desc: str = "host042 mlx5_0",
    link_layer: str = "InfiniBand",
    **fields: Any,
) -> PortView:
    ident = PortIdentity(guid=guid, port=port, device="mlx5_0", node_desc=node_desc, lid=7,
                         link_layer=link_layer)
    return PortView(
        identity=ident, state=state, phys_state=5 if state == 4 else 2,
        rate_bytes_per_second=None if rate_bps is None else rate_bps / 8, link=link, **fields,
    )


def link(width: str = "4X", speed: str = "EDR", max_width: str = "4X",
         max_speed: str = "EDR") -> LinkInfo:
    return LinkInfo(remote_guid=PEER, remote_port="12", remote_node_desc="leaf03",
                    active_width=width, active_speed=speed, max_width=max_width,
                    max_speed=max_speed)
