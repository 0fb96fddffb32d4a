"""Build PortViews for detector, renderer and view unit tests: by hand, or a poll of the
tracker's column store."""

from __future__ import annotations

import asyncio
from typing import Any

from ibmon.infiniband.model import LinkInfo, PortIdentity, PortView
from ibmon.sources.mock import MockSource
from ibmon.track.tracker import Tracker
from mocks.scenario import ManualClock
from tests.tracker_paths import ColumnTracker

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


_ColumnTracker = ColumnTracker  # the column store for any poll


def store_views(polls: int = 3) -> list[PortView]:
    """The views of the last of ``polls`` polls of the ``healthy`` scenario through a tracker
    that takes every poll through its column store: rows of the store, with rates."""
    return store_poll(polls)[0]


def store_poll(polls: int = 3) -> tuple[list[PortView], Tracker]:
    """``store_views`` and the tracker that made them (``Tracker.take_layout``)."""
    clock = ManualClock()
    source = MockSource.from_scenario("healthy", clock=clock)
    tracker = _ColumnTracker()
    views: list[PortView] = []
    for t in range(polls):
        clock.t = float(t * 10)
        views = list(tracker.update(asyncio.run(source.sample())).values())
    return views, tracker
