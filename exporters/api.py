"""JSON API on the Prometheus listener: ports, events, health and readiness.

``/api/v1/ports`` lists ports worst first (firing conditions, then transmit wait, BER and
utilization) with their active conditions; ``?condition=congestion`` filters, ``?limit=N`` cuts.
``/api/v1/events`` returns recent events, newest last; ``?type=``, ``?since=<event id>`` and
``?limit=`` narrow it. ``/healthz`` answers while the process serves (liveness); ``/readyz``
only once the daemon runs and at least one source's latest poll succeeded (readiness).

Responses are built from the latest immutable FabricState and encoded in a worker thread, so a
large fabric never stalls polling; the routes share the listener's TLS and basic auth.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ibmon.detect.engine import ActiveCondition
from ibmon.events import Event
from ibmon.model import PortKey, PortView
from ibmon.state import FabricState

__all__ = ["ApiProvider", "api_routes", "port_json", "worst_first"]

MAX_LIMIT = 100_000
_SEVERITY = {"info": 0, "warning": 1, "critical": 2}


@dataclass(frozen=True, slots=True)
class ApiProvider:
    """What the API reads, as callables so it always sees the daemon's latest objects."""

    state: Callable[[], FabricState]
    conditions: Callable[[], Iterable[ActiveCondition]]
    events: Callable[[], Sequence[Event]]
    ready: Callable[[], bool]


def port_json(view: PortView, active: Sequence[ActiveCondition] = ()) -> dict[str, Any]:
    ident = view.identity
    link = view.link
    return {
        "guid": ident.guid, "port": ident.port, "device": ident.device,
        "node_desc": ident.node_desc, "node_type": ident.node_type, "lid": ident.lid,
        "link_layer": ident.link_layer, "source": ident.source,
        "state": view.state, "phys_state": view.phys_state,
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
        "resets": view.resets,
        "conditions": sorted(view.conditions),
        "active": [
            {"type": a.type, "severity": a.finding.severity, "since": a.since,
             "value": a.finding.value, "message": a.finding.message,
             "details": a.finding.details}
            for a in active
        ],
    }


def _score(view: PortView, active: Sequence[ActiveCondition]) -> tuple[float, ...]:
    worst = max((_SEVERITY[a.finding.severity] for a in active), default=-1)
    return (
        worst,
        len(active),
        view.xmit_wait_ratio or 0.0,
        view.symbol_error_ber or 0.0,
        max(view.utilization_tx or 0.0, view.utilization_rx or 0.0),
    )


def worst_first(
    state: FabricState, conditions: Iterable[ActiveCondition]
) -> list[tuple[PortView, list[ActiveCondition]]]:
    by_port: dict[PortKey, list[ActiveCondition]] = {}
    for a in conditions:
        by_port.setdefault(a.key, []).append(a)
    rows = [(v, by_port.get(k, [])) for k, v in state.ports.items()]
    rows.sort(key=lambda r: _score(*r), reverse=True)
    return rows


def _limit(query: Mapping[str, str], default: int) -> int:
    raw = query.get("limit")
    if raw is None:
        return default
    if not raw.isdigit():
        raise web.HTTPBadRequest(
            text='{"error":"limit must be a non-negative integer"}', content_type="application/json"
        )
    return min(int(raw), MAX_LIMIT)


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False, default=str).encode()


async def _json(obj: Any) -> web.Response:
    body = await asyncio.to_thread(_dumps, obj)
    return web.Response(body=body, content_type="application/json")


def api_routes(provider: ApiProvider) -> list[web.RouteDef]:
    """The routes, for ``PrometheusExporter.add_routes``."""

    async def ports(request: web.Request) -> web.StreamResponse:
        limit = _limit(request.query, MAX_LIMIT)
        wanted = request.query.get("condition")
        state = provider.state()
        rows = worst_first(state, provider.conditions())
        if wanted:
            rows = [r for r in rows if wanted in r[0].conditions]
        out = [port_json(v, a) for v, a in rows[:limit]]
        return await _json({"generated": state.generated, "count": len(rows), "ports": out})

    async def events(request: web.Request) -> web.StreamResponse:
        limit = _limit(request.query, 1000)
        kind = request.query.get("type")
        since = request.query.get("since")
        items = list(provider.events())
        if since:
            ids = [e.id for e in items]
            items = items[ids.index(since) + 1:] if since in ids else items
        if kind:
            items = [e for e in items if e.type == kind]
        items = items[-limit:] if limit else []
        return await _json({"events": [e.model_dump(mode="json") for e in items]})

    async def healthz(request: web.Request) -> web.StreamResponse:
        return web.Response(body=b'{"ok":true}', content_type="application/json")

    async def readyz(request: web.Request) -> web.StreamResponse:
        state = provider.state()
        up = sorted(name for name, s in state.sources.items() if s.up)
        down = {name: s.last_error for name, s in state.sources.items() if not s.up}
        ok = provider.ready() and bool(up)
        body = _dumps({"ready": ok, "sources_up": up, "sources_down": down})
        return web.Response(body=body, status=200 if ok else 503,
                            content_type="application/json")

    return [
        web.get("/api/v1/ports", ports),
        web.get("/api/v1/events", events),
        web.get("/healthz", healthz),
        web.get("/readyz", readyz),
    ]
