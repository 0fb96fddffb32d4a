"""The ports API pages: worst first, bounded, a cursor that walks every port once, JSON encoded
once per state however many clients read it, and numbers in queries that are ASCII or a 400."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

import exporters.api
from exporters.api import (
    DEFAULT_PAGE,
    MAX_PAGE,
    ApiProvider,
    PortsIndex,
    api_routes,
    decode_cursor,
    encode_cursor,
    query_count,
    worst_first,
)
from exporters.prometheus import PrometheusExporter
from exporters.server import HttpError
from ibmon.detect.base import Finding
from ibmon.detect.engine import ActiveCondition
from ibmon.infiniband.model import PortIdentity, PortView
from ibmon.runtime.selfmetrics import SelfMetrics
from ibmon.state import FabricState


def _views(n: int, generated: float = 1.0) -> FabricState:
    views = [
        PortView(
            identity=PortIdentity(guid=f"0x{i // 10:016x}", port=str(i % 10 + 1),
                                  node_desc=f"node {i}"),
            state=4, phys_state=5, rate_bytes_per_second=12.5e9,
            xmit_wait_ratio=(i % 7) / 10, utilization_tx=(i % 3) / 4,
            conditions=frozenset({"congestion"}) if i % 5 == 0 else frozenset(),
        )
        for i in range(n)
    ]
    state = FabricState(generated=generated, ports={v.key: v for v in views})
    return dataclasses.replace(state, conditions=tuple(_active(state)))


def _active(state: FabricState) -> list[ActiveCondition]:
    return [
        ActiveCondition(type="congestion", key=v.key, since=0.0, identity=v.identity, peer=None,
                        finding=Finding(severity="warning", value=0.5, message="congested"))
        for v in state.ports.values() if "congestion" in v.conditions
    ]


def test_cursor_round_trip_and_refusals() -> None:
    key = (-2.0, -1.0, -0.5, -1e-12, -0.0, "0x0000000000000001", 2, "10")
    assert decode_cursor(encode_cursor(key)) == key
    for bad in ["", "!!!", "a" * 600, encode_cursor(key)[:-3], "W10", "WzEsMiwzXQ",
                "\u00e9", "WyJhIiwxLDEsMSwxLCJnIiwxLCJwIl0"]:
        with pytest.raises(ValueError, match="cursor"):
            decode_cursor(bad)


@pytest.mark.parametrize("condition", [None, "congestion", "down"])
def test_walking_the_cursor_gives_every_port_once_worst_first(condition: str | None) -> None:
    state = _views(2345)
    active = _active(state)
    index = PortsIndex(state, active)
    want = [v.key for v, _ in worst_first(state, active)
            if condition is None or condition in v.conditions]
    seen: list[tuple[str, str]] = []
    after = None
    pages = 0
    while True:
        doc = json.loads(index.page(condition, after, 100))
        assert len(doc["ports"]) <= 100
        assert doc["count"] == len(want)
        seen += [(p["guid"], p["port"]) for p in doc["ports"]]
        pages += 1
        if doc["next"] is None:
            break
        after = decode_cursor(doc["next"])
    assert seen == want
    assert pages == max(1, -(-len(want) // 100))


def test_worst_first_weighs_the_busier_direction_then_numbers_ports_as_numbers() -> None:
    """Among ports with nothing firing, the one receiving most comes before one sending
    less (utilization is the busier direction of the two); equally quiet ports come by GUID
    and port number, port 2 before port 10 (as ``ibmon top`` and the switch label them)."""
    def port(guid: str, port: str, tx: float = 0.0, rx: float = 0.0) -> PortView:
        return PortView(identity=PortIdentity(guid=guid, port=port), state=4, phys_state=5,
                        utilization_tx=tx, utilization_rx=rx)

    views = [port("0x01", "10"), port("0x01", "2"), port("0x02", "1", tx=0.5),
             port("0x03", "1", tx=0.2, rx=0.9)]
    state = FabricState(generated=1.0, ports={v.key: v for v in views})
    assert [v.key for v, _ in worst_first(state, [])] == [
        ("0x03", "1"), ("0x02", "1"), ("0x01", "2"), ("0x01", "10")]


def test_query_numbers_are_ascii_digits_only() -> None:
    assert query_count({}, "limit", default=7, maximum=10) == 7
    assert query_count({"limit": "0"}, "limit", default=7, maximum=10) == 0
    assert query_count({"limit": "0099"}, "limit", default=7, maximum=1000) == 99
    assert query_count({"limit": "12345"}, "limit", default=7, maximum=10) == 10
    for bad in ["\u00b2", "\uff11", "\u0663", "", "-1", "+1", "1.0", " 1", "1 ", "9" * 13]:
        with pytest.raises(HttpError) as raised:
            query_count({"limit": bad}, "limit", default=7, maximum=10)
        assert raised.value.status == 400


@pytest.fixture
async def served(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """An exporter with the API over a state the test swaps; port_json calls are counted."""
    holder: dict[str, Any] = {"state": _views(3000), "encoded": 0}
    real = exporters.api.port_json

    def counting(*args: Any) -> dict[str, Any]:
        holder["encoded"] += 1
        return real(*args)

    monkeypatch.setattr(exporters.api, "port_json", counting)
    provider = ApiProvider(state=lambda: holder["state"], events=lambda: [], ready=lambda: True)
    exporter = PrometheusExporter(listen="127.0.0.1:0", self_metrics=SelfMetrics())
    exporter.add_routes(api_routes(provider))
    async with exporter:
        yield f"http://127.0.0.1:{exporter.port}", holder


async def _walk(session: aiohttp.ClientSession, base: str) -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []
    cursor = ""
    while True:
        async with session.get(f"{base}/api/v1/ports?limit=250{cursor}") as resp:
            assert resp.status == 200
            doc = await resp.json()
        seen += [(p["guid"], p["port"]) for p in doc["ports"]]
        if doc["next"] is None:
            return seen
        cursor = f"&cursor={doc['next']}"


async def test_each_port_is_encoded_once_per_state_however_many_clients(
    served: tuple[str, dict[str, Any]],
) -> None:
    base, holder = served
    async with aiohttp.ClientSession() as session:
        walks = await asyncio.gather(*(_walk(session, base) for _ in range(8)))
        assert all(len(w) == 3000 == len(set(w)) for w in walks)
        assert holder["encoded"] == 3000  # not 8 x 3000
        holder["state"] = _views(3000, generated=2.0)  # the next poll
        await _walk(session, base)
        assert holder["encoded"] == 6000
        async with session.get(f"{base}/api/v1/ports") as resp:
            doc = await resp.json()
        assert len(doc["ports"]) == DEFAULT_PAGE
        async with session.get(f"{base}/api/v1/ports?limit=100000") as resp:
            doc = await resp.json()
        assert len(doc["ports"]) == MAX_PAGE
        async with session.get(f"{base}/api/v1/ports?cursor=nonsense") as resp:
            assert resp.status == 400
            assert "cursor" in (await resp.json())["error"]
        async with session.get(f"{base}/api/v1/ports?limit=%C2%B2") as resp:
            assert resp.status == 400
