"""How a port is shown to people and programs: its JSON and its state names.

One function each, shared by ``ibmon scan``, the JSON API and ``ibmon top``, so the same port
reads the same way whichever way you ask. JSON keeps the IBA numbers (``state`` 4,
``phys_state`` 5) for programs and adds their names; tables print the names only, with the
physical state where it explains a port that is not Active (``DOWN/Polling``,
``DOWN/Disabled``, ``INIT/LinkUp``: the link trained but no subnet manager configured it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ibmon.detect.engine import ActiveCondition
from ibmon.model import PhysState, PortState, PortView

__all__ = ["phys_state_name", "port_json", "state_label", "state_name"]


def state_name(state: int | None) -> str | None:
    """``ACTIVE``, ``DOWN``, ``INIT``, ``ARMED`` as the kernel spells them; unknown: the number."""
    if state is None:
        return None
    try:
        return PortState(state).name
    except ValueError:
        return str(state)


def phys_state_name(phys: int | None) -> str | None:
    """``LinkUp``, ``Polling``, ``Disabled``, ``LinkErrorRecovery``... (sysfs's spelling)."""
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


def port_json(view: PortView, active: Sequence[ActiveCondition] = ()) -> dict[str, Any]:
    """Everything ibmon knows about one port, as JSON types (``scan --format json``, the API)."""
    ident = view.identity
    link = view.link
    return {
        "guid": ident.guid, "port": ident.port, "device": ident.device,
        "node_desc": ident.node_desc, "node_type": ident.node_type, "lid": ident.lid,
        "link_layer": ident.link_layer, "source": ident.source,
        "state": view.state, "state_name": state_name(view.state),
        "phys_state": view.phys_state, "phys_state_name": phys_state_name(view.phys_state),
        "rate_bytes_per_second": view.rate_bytes_per_second,
        "active_width": view.active_width, "active_speed": view.active_speed,
        "remote": None if link is None else {
            "guid": link.remote_guid, "port": link.remote_port,
            "node_desc": link.remote_node_desc, "max_width": link.max_width,
            "max_speed": link.max_speed,
        },
        "utilization": {"transmit": view.utilization_tx, "receive": view.utilization_rx},
        "transmit_wait_ratio": view.xmit_wait_ratio,
        "symbol_error_ber": view.symbol_error_ber,
        "totals": view.totals, "rates": view.rates, "saturated": sorted(view.saturated),
        "resets": view.resets, "hw_totals": view.hw_totals, "hw_gauges": view.hw_gauges,
        "conditions": sorted(view.conditions),
        "stale": view.stale,
        "active": [
            {"type": a.type, "severity": a.finding.severity, "since": a.since,
             "value": a.finding.value, "message": a.finding.message,
             "details": a.finding.details}
            for a in active
        ],
    }
