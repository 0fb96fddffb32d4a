"""End to end for jobs: a real ibmon HTTP server (``PrometheusExporter`` with the JSON API)
serving a state with jobs -> real Prometheus (the shipped rules) -> real Alertmanager -> webhook.

The state is built by hand (``tests.job_outputs_state``): the cable leaf01 port 1 / host01 is
down (job 101 runs on host01) and the uplink leaf01 port 10 is congested (jobs 101 and 103 are
routed over it). The test checks that:

- the port alerts reach Alertmanager's receivers with a ``jobs`` annotation naming exactly the
  jobs on their link (the annotation queries ``ibmon_port_jobs_info`` by the alert's guid/port);
- every query of the Jobs dashboard, and its job picker, returns data for the run;
- a job that ends leaves Prometheus' latest answers (its series are gone from the scrape).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporters.api import ApiProvider, api_routes
from exporters.prometheus import PrometheusExporter
from ibmon.runtime.selfmetrics import SelfMetrics
from ibmon.state import FabricState
from tests.e2e.test_prometheus_alertmanager import (
    Proc,
    alertmanager_proc,
    fast_rules,
    firing,
    http_get,
    prometheus_config,
    query,
    query_range,
    wait_until,
    webhook_server,
)
from tests.job_outputs_state import CONGESTED_PORT, DOWN_PORT, JOBS, jobs_view, state
from tests.mqtt_broker import free_port
from tests.promql_sources import ALERT_RULES, DASHBOARD_DIR, RECORDING_RULES, substitute
from tests.syspkg import require_binary

pytestmark = pytest.mark.system

DEADLINE = 90.0
VALUES = {"datasource": "prometheus", "user": ".*", "job_id": ".*"}


class Served:
    """A real exporter with the API on its own event loop thread, serving the state it is
    given (``publish``), as the daemon serves its latest state."""

    def __init__(self) -> None:
        self.state: FabricState = state()
        self.loop = asyncio.new_event_loop()
        self.exporter = PrometheusExporter(listen="127.0.0.1:0", self_metrics=SelfMetrics(),
                                           fabric="main")
        self.exporter.add_routes(api_routes(ApiProvider(
            state=lambda: self.state, events=lambda: [], ready=lambda: True)))
        self.thread = threading.Thread(target=self.loop.run_forever, name="ibmon-http",
                                       daemon=True)

    def start(self) -> int:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.exporter.start(), self.loop).result(10)
        self.publish(self.state)
        return self.exporter.port

    def publish(self, new: FabricState) -> None:
        async def swap() -> None:
            self.state = new
            self.exporter.publish_now(new)

        asyncio.run_coroutine_threadsafe(swap(), self.loop).result(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.exporter.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@contextlib.contextmanager
def served() -> Iterator[Served]:
    server = Served()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def jobs_board_exprs() -> list[tuple[str, str]]:
    board = json.loads((DASHBOARD_DIR / "ibmon-jobs.json").read_text(encoding="utf-8"))
    return [(f"{panel['title']} / {t['refId']}", t["expr"])
            for panel in board["panels"] for t in panel.get("targets", [])]


def test_port_alerts_name_their_jobs_and_every_jobs_panel_has_data(tmp_path: Path) -> None:
    prometheus = require_binary("prometheus")
    alertmanager = require_binary("prometheus-alertmanager")
    with (webhook_server() as (hook, hook_port), served() as ibmon,
          contextlib.ExitStack() as stack):
        procs: list[Proc] = []
        am, am_port = alertmanager_proc(alertmanager, hook_port, tmp_path)
        am.start()
        procs.append(am)
        stack.callback(am.stop)
        rules = [fast_rules(RECORDING_RULES, tmp_path / RECORDING_RULES.name),
                 fast_rules(ALERT_RULES, tmp_path / ALERT_RULES.name)]
        prom_port = free_port()
        prom = f"http://127.0.0.1:{prom_port}"
        server = Proc("prometheus", [
            prometheus,
            f"--config.file={prometheus_config(ibmon.exporter.port, am_port, rules, tmp_path / 'p.yml')}",  # noqa: E501
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}", "--rules.alert.resend-delay=1s",
        ], tmp_path / "prometheus.log")
        server.start()
        procs.append(server)
        stack.callback(server.stop)
        started = time.time()
        wait_until("alertmanager ready", lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{am_port}/-/ready", timeout=2).status == 200, 30, procs)
        wait_until("prometheus ready", lambda: urllib.request.urlopen(
            f"{prom}/-/ready", timeout=2).status == 200, 30, procs)

        # 1. The port alerts fire with the jobs on their link, and reach the receivers so.
        wait_until("IBPortDown and IBPortCongestion at the webhook",
                   lambda: bool(hook.alerts("IBPortDown", "firing")
                                and hook.alerts("IBPortCongestion", "firing")), DEADLINE, procs)
        down = [a for a in hook.alerts("IBPortDown", "firing")
                if (a["labels"]["guid"], a["labels"]["port"]) == DOWN_PORT]
        assert down, hook.alerts("IBPortDown", "firing")
        assert down[0]["annotations"]["jobs"].startswith("Jobs on this link: 101 (running jobs")
        congested = [a for a in hook.alerts("IBPortCongestion", "firing")
                     if (a["labels"]["guid"], a["labels"]["port"]) == CONGESTED_PORT]
        assert congested
        assert congested[0]["annotations"]["jobs"].startswith("Jobs on this link: 101,103 (")
        # the host end of the down cable carries no condition: no alert, no jobs series
        assert not [a for a in firing(prom, "IBPortDown") if a["node_type"] == "ca"]

        # 2. Every Jobs dashboard query returns data, and the picker offers the running jobs.
        wait_until("a few scrapes of the rates", lambda: len(query_range(
            prom, "ibmon_job_transmit_bytes_per_second", started, time.time())["data"]
            ["result"]) == 3 and time.time() - started > 8, DEADLINE, procs)
        end = time.time()
        failures = []
        for where, expr in jobs_board_exprs():
            data = query_range(prom, substitute(expr, VALUES, rate_interval="5s"), started, end)
            if data["status"] != "success":
                failures.append(f"{where}: {data.get('error')}")
            elif not data["data"]["result"]:
                failures.append(f"{where}: no data for {expr}")
        assert not failures, "\n".join(failures)
        picker = http_get(f"{prom}/api/v1/label/job_id/values?" + urllib.parse.urlencode(
            {"match[]": 'ibmon_job_info{user=~".*"}'}))["data"]
        assert picker == ["101", "102", "103"]
        names = {r["metric"]["job_id"]: r["metric"]["name"] for r in query(prom, "ibmon_job_info")}
        assert names["101"] == JOBS[0].name  # quotes, newline and non-ASCII intact

        # 3. Job 102 ends: its series leave Prometheus' latest answers.
        ibmon.publish(state(jobs_view(tuple(j for j in JOBS if j.id != "102")),
                            generated=time.time()))
        wait_until("job 102 gone from Prometheus", lambda: not query(
            prom, 'ibmon_job_info{job_id="102"}') and not query(
            prom, 'ibmon_job_transmit_bytes_per_second{job_id="102"}'), 30, procs)
        assert {r["metric"]["job_id"] for r in query(prom, "ibmon_job_info")} == {"101", "103"}
        for p in procs:
            p.alive()
