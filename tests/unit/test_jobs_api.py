"""``/api/v1/jobs`` and ``/api/v1/jobs/{id}``, and the jobs in a port's answer, over a real
listener: what a client (``ibmon jobs``, ``ibmon explain``, a script) relies on."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import aiohttp
import pytest

from exporters.api import ApiProvider, api_routes
from exporters.prometheus import PrometheusExporter
from ibmon.jobs.model import JobLink
from ibmon.runtime.selfmetrics import SelfMetrics
from ibmon.state import FabricState
from tests.job_outputs_state import (
    CONGESTED_PORT,
    DOWN_PORT,
    HOSTS,
    JOBS,
    LEAF,
    SPINE,
    TRICKY_NAME,
    jobs_view,
    state,
)


@pytest.fixture
async def served() -> AsyncIterator[tuple[str, dict[str, Any]]]:
    holder: dict[str, Any] = {"state": state()}
    provider = ApiProvider(state=lambda: holder["state"], events=lambda: [], ready=lambda: True)
    exporter = PrometheusExporter(listen="127.0.0.1:0", self_metrics=SelfMetrics())
    exporter.add_routes(api_routes(provider))
    async with exporter:
        yield f"http://127.0.0.1:{exporter.port}", holder


async def get(base: str, path: str) -> tuple[int, Any, str]:
    async with aiohttp.ClientSession() as session, session.get(base + path) as resp:
        text = await resp.text()
        return resp.status, json.loads(text), text


async def test_jobs_lists_running_jobs_with_known_flag_and_routing(
    served: tuple[str, dict[str, Any]],
) -> None:
    base, _ = served
    status, doc, _ = await get(base, "/api/v1/jobs")
    assert status == 200
    assert doc["known"] is True and doc["source"] is True and doc["error"] is None
    assert doc["routing"] == "tables"
    assert doc["count"] == 3 and doc["hosts_unmatched"] == 1
    assert [j["id"] for j in doc["jobs"]] == ["101", "102", "103"]
    first = doc["jobs"][0]
    assert first == {
        "id": "101", "user": "alice", "name": TRICKY_NAME, "partition": "gpu",
        "state": "RUNNING", "start": 1_700_000_000.0, "hosts": 2,
        "transmit_bytes_per_second": 1e9, "receive_bytes_per_second": 2e9,
        "shared_hosts": 1, "rates_exact": False, "conditions": ["congestion", "down"],
    }
    assert doc["jobs"][2]["rates_exact"] is True  # 103 has its hosts to itself


async def test_one_job_has_its_hosts_ports_conditions_links_and_rates(
    served: tuple[str, dict[str, Any]],
) -> None:
    base, _ = served
    status, doc, _ = await get(base, "/api/v1/jobs/101")
    assert status == 200
    assert doc["job"]["hosts"] == ["host01", "host02"]
    assert doc["conditions"] == ["congestion", "down"]
    assert (doc["transmit_bytes_per_second"], doc["receive_bytes_per_second"]) == (1e9, 2e9)
    assert doc["rates_exact"] is False and doc["shared_hosts"] == 1
    hosts = {h["host"]: h for h in doc["hosts"]}
    assert hosts["host02"]["shared"] is True and hosts["host01"]["shared"] is False
    (port,) = hosts["host01"]["ports"]
    assert (port["guid"], port["port"]) == (HOSTS["host01"], "1")
    assert port["node_desc"] == "host01 mlx5_0" and port["state"] == 1
    assert port["transmit_bytes_per_second"] == 1e8
    assert [(lk["guid"], lk["port"], lk["how"], lk["conditions"]) for lk in doc["links"]] == [
        (LEAF, "1", "host", ["down"]), (LEAF, "10", "route", ["congestion"])]
    # a host of another job that matches no port
    _, other, _ = await get(base, "/api/v1/jobs/103")
    assert {h["host"]: h["matched"] for h in other["hosts"]} == {"host03": True,
                                                                 "host99": False}


async def test_unknown_job_is_404_and_unknown_jobs_are_503(
    served: tuple[str, dict[str, Any]],
) -> None:
    base, holder = served
    status, doc, _ = await get(base, "/api/v1/jobs/424242")
    assert status == 404 and "424242" in doc["error"]
    status, doc, _ = await get(base, "/api/v1/jobs/" + "9" * 65)
    assert status == 400
    holder["state"] = state(jobs_view(known=False, error="timeout"), generated=2e9)
    status, doc, _ = await get(base, "/api/v1/jobs/101")
    assert status == 503 and "timeout" in doc["error"]
    status, doc, _ = await get(base, "/api/v1/jobs")
    assert status == 200
    assert (doc["known"], doc["error"], doc["count"], doc["jobs"]) == (False, "timeout", 0, [])
    assert doc["hosts_unmatched"] is None and doc["fetched"] is None  # unknown, not zero
    # no job source at all: said so, not "no jobs"
    holder["state"] = FabricState(generated=3e9, ports=state().ports)
    status, doc, _ = await get(base, "/api/v1/jobs")
    assert (doc["source"], doc["known"]) == (False, False)


async def test_a_job_that_ended_is_gone_from_the_next_answer(
    served: tuple[str, dict[str, Any]],
) -> None:
    base, holder = served
    assert (await get(base, "/api/v1/jobs/102"))[0] == 200
    holder["state"] = state(jobs_view(tuple(j for j in JOBS if j.id != "102")), generated=2e9)
    _, doc, _ = await get(base, "/api/v1/jobs")
    assert [j["id"] for j in doc["jobs"]] == ["101", "103"]
    assert (await get(base, "/api/v1/jobs/102"))[0] == 404


async def test_untrusted_name_is_escaped_json(served: tuple[str, dict[str, Any]]) -> None:
    base, _ = served
    _, doc, raw = await get(base, "/api/v1/jobs/101")
    assert doc["job"]["name"] == TRICKY_NAME
    assert "\n" not in raw  # the newline travels as \n inside the string
    assert '\\"llm\\"' in raw


async def test_a_port_answer_lists_the_jobs_on_its_link(
    served: tuple[str, dict[str, Any]],
) -> None:
    base, holder = served
    # the host end of the down cable: the job runs on that host (its peer carries the fault)
    guid, port = HOSTS["host01"], "1"
    _, doc, _ = await get(base, f"/api/v1/ports/{guid}/{port}")
    assert doc["jobs"]["known"] is True and doc["jobs"]["total"] == 1
    assert [(j["id"], j["how"]) for j in doc["jobs"]["list"]] == [("101", "host")]
    _, doc, _ = await get(base, f"/api/v1/ports/{CONGESTED_PORT[0]}/{CONGESTED_PORT[1]}")
    assert [(j["id"], j["how"]) for j in doc["jobs"]["list"]] == [("101", "route"),
                                                                  ("103", "route")]
    # a quiet inter-switch link: only the attribution's indexes know who crosses it
    _, doc, _ = await get(base, f"/api/v1/ports/{SPINE}/1")
    assert doc["jobs"]["total"] == 2  # its peer is the congested leaf port
    view = jobs_view()
    spans = (JobLink(view.table.jobs["102"], "leaf_span"),)  # the same from either end
    quiet = {(SPINE, "1"): spans, CONGESTED_PORT: spans}
    holder["state"] = state(replace(view, links_of=lambda key: quiet.get(
        key, view.port_jobs.get(key, ()))), generated=2e9)
    _, doc, _ = await get(base, f"/api/v1/ports/{SPINE}/1")
    assert [(j["id"], j["how"]) for j in doc["jobs"]["list"]] == [("102", "leaf_span")]
    _, doc, _ = await get(base, f"/api/v1/ports/{DOWN_PORT[0]}/{DOWN_PORT[1]}")
    assert [j["id"] for j in doc["jobs"]["list"]] == ["101"]


def test_a_rate_that_is_not_finite_is_unknown_in_the_json() -> None:
    """JSON has no NaN or infinity (a strict client refuses the whole answer): such a job
    rate is null, like a rate not measured yet."""
    from types import MappingProxyType

    from exporters.jobs import job_detail_json, jobs_json

    view = jobs_view()
    odd = replace(view, rates=MappingProxyType(
        {**view.rates, "101": (float("nan"), float("inf"))}))
    doc = jobs_json(state(odd))
    (job,) = [j for j in doc["jobs"] if j["id"] == "101"]
    assert (job["transmit_bytes_per_second"], job["receive_bytes_per_second"]) == (None, None)
    detail = job_detail_json(state(odd), "101")
    assert detail is not None and detail["transmit_bytes_per_second"] is None
    json.dumps(doc, allow_nan=False)
