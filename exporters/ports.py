"""How a port is shown to programs: its JSON, shared by ``ibmon scan``, the JSON API and
``ibmon top``, so the same port reads the same way whichever way you ask (state names:
``ibmon.infiniband.model.state_json``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ibmon.detect.cause import DISCARD_DETAILS, RECEIVE_DETAILS
from ibmon.detect.engine import ActiveCondition
from ibmon.detect.events import Event
from ibmon.infiniband.model import PortKey, PortView, state_json
from ibmon.state import FabricState
from ibmon.state.topology import link_json

__all__ = [
    "EVENTS_PER_PORT",
    "breakdown_json",
    "port_detail_json",
    "port_json",
]

#: Recent events in a one-port answer (both ends), newest last.
EVENTS_PER_PORT = 50


def port_json(view: PortView, active: Sequence[ActiveCondition] = ()) -> dict[str, Any]:
    """Everything ibmon knows about one port, as JSON types (``scan --format json``, the API)."""
    ident = view.identity
    link = view.link
    unit = ident.xmit_wait
    return {
        "guid": ident.guid, "port": ident.port, "device": ident.device,
        "node_desc": ident.node_desc, "node_type": ident.node_type, "lid": ident.lid,
        "link_layer": ident.link_layer, "source": ident.source,
        "fw_ver": ident.fw_ver, "hca_type": ident.hca_type, "board_id": ident.board_id,
        **state_json(view.state, view.phys_state),
        "rate_bytes_per_second": view.rate_bytes_per_second,
        "active_width": view.active_width, "active_speed": view.active_speed,
        "remote": None if link is None else {
            "guid": link.remote_guid, "port": link.remote_port,
            "node_desc": link.remote_node_desc, "max_width": link.max_width,
            "max_speed": link.max_speed,
        },
        "utilization": {"transmit": view.utilization_tx, "receive": view.utilization_rx},
        "transmit_wait_ratio": view.xmit_wait_ratio,
        "transmit_wait_seconds_total": view.xmit_wait_seconds,
        "transmit_wait_unit": {
            "bytes": unit.bytes, "per": "lane" if unit.per_lane else "port",
            "bytes_per_count": unit.bytes_per_count(view.active_width),
            "source": unit.source, "family": unit.family,
        },
        "symbol_error_ber": view.symbol_error_ber,
        "totals": dict(view.totals.items()), "rates": dict(view.rates),
        "saturated": sorted(view.saturated),
        "resets": view.resets, "hw_totals": view.hw_totals, "hw_gauges": view.hw_gauges,
        "conditions": sorted(view.conditions),
        "causes": dict(sorted(view.causes.items())),
        "stale": view.stale,
        "active": [
            {"type": a.type, "severity": a.finding.severity, "since": a.since,
             "value": a.finding.value, "message": a.finding.message,
             "details": a.finding.details}
            for a in active
        ],
    }


def breakdown_json(view: PortView) -> dict[str, Any]:
    """The port's receive errors and transmit discards split by detail counter (totals since
    ibmon first saw the port; empty ``details`` where the source has none, e.g. sysfs)."""
    totals = view.totals
    out: dict[str, Any] = {}
    for aggregate, details in (("receive_errors", RECEIVE_DETAILS),
                               ("transmit_discards", DISCARD_DETAILS)):
        out[aggregate] = {
            "total": totals.get(aggregate),
            "details": {name: totals[name] for name in details if name in totals},
        }
    return out


def _condition_json(a: ActiveCondition, where: str) -> dict[str, Any]:
    d = a.finding.details
    return {"type": a.type, "on": where, "guid": a.key[0], "port": a.key[1],
            "severity": a.finding.severity, "since": a.since, "value": a.finding.value,
            "cause": d.get("cause"), "action": d.get("action"),
            "breakdown": d.get("breakdown"), "message": a.finding.message}


def port_detail_json(state: FabricState, key: PortKey, conditions: Iterable[ActiveCondition],
                     events: Iterable[Event], *,
                     max_events: int = EVENTS_PER_PORT) -> dict[str, Any] | None:
    """``/api/v1/ports/{guid}/{port}``: the port and the far end of its link, the link, the
    detail breakdown, the conditions firing on either end (a link fault is carried by one end:
    ``on`` says which) and the recent events of both ends. None for a port not in the state."""
    view = state.ports.get(key)
    if view is None:
        return None
    link = view.link
    peer_key = (link.remote_guid, link.remote_port) if link and link.remote_guid else None
    peer = state.ports.get(peer_key) if peer_key else None
    mine: list[ActiveCondition] = []
    theirs: list[ActiveCondition] = []
    for a in conditions:
        if a.key == key:
            mine.append(a)
        elif peer_key is not None and a.key == peer_key:
            theirs.append(a)
    ends = {key} if peer_key is None else {key, peer_key}
    recent = [e for e in events
              if (e.port is not None and (e.port.guid, e.port.port) in ends)
              or (e.peer is not None and (e.peer.guid, e.peer.port) in ends)]
    far: dict[str, Any] | None
    if peer is not None:
        far = {**port_json(peer, theirs), "breakdown": breakdown_json(peer)}
    elif link is not None and link.remote_guid:
        far = {"guid": link.remote_guid, "port": link.remote_port,
               "node_desc": link.remote_node_desc, "seen": False}
    else:
        far = None
    here = port_json(view, mine)
    here["breakdown"] = breakdown_json(view)
    return {
        "generated": state.generated,
        "port": here,
        "peer": far,
        "link": link_json(view, peer) if link is not None and link.remote_guid else None,
        "conditions": [_condition_json(a, "port") for a in mine]
        + [_condition_json(a, "peer") for a in theirs],
        "events": [e.model_dump(mode="json") for e in recent[-max_events:]],
    }
