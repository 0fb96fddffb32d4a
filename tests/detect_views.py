"""Build PortViews by hand for detector unit tests."""

from __future__ import annotations

from typing import Any

import pytest

from ibmon.detect import columns
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


@pytest.fixture(autouse=True, params=["each-answer", "memo"])
def shortcut_reuse(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every detector test of a module that imports this runs twice: as a node's few ports
    are judged (every ``needs`` answer computed each poll), and as a fabric's 512+ are
    (``GATHER_FROM``: answers kept from poll to poll by ``columns.Memo`` and computed again
    only where a port's inputs or the detector's state for it changed)."""
    if request.param == "memo":
        monkeypatch.setattr(columns, "GATHER_FROM", 1)
    return str(request.param)
