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

from exporters.ports import port_json
from ibmon.detect.engine import ActiveCondition
from ibmon.events import Event, severity_rank
from ibmon.model import PortKey, PortView
from ibmon.state import FabricState, in_port_order

__all__ = ["ApiProvider", "api_routes", "port_json", "worst_first"]

MAX_LIMIT = 100_000


@dataclass(frozen=True, slots=True)
class ApiProvider:
    """What the API reads, as callables so it always sees the daemon's latest objects."""

    state: Callable[[], FabricState]
    conditions: Callable[[], Iterable[ActiveCondition]]
    events: Callable[[], Sequence[Event]]
    ready: Callable[[], bool]


def _score(view: PortView, active: Sequence[ActiveCondition]) -> tuple[float, ...]:
    worst = max((severity_rank(a.finding.severity) for a in active), default=-1)
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
    """Ports by how bad they look; equally bad ports in the one port order (stable sort)."""
    by_port: dict[PortKey, list[ActiveCondition]] = {}
    for a in conditions:
        by_port.setdefault(a.key, []).append(a)
    rows = [(v, by_port.get(v.key, [])) for v in in_port_order(state.ports.values())]
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
