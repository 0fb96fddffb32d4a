"""End to end: `ibmon demo` -> real Prometheus (shipped rules) -> real Alertmanager -> webhook.

The demo scenario plays at 20x simulated speed (one poll per simulated second), so its faults
happen within the first 45 real seconds: BER on host042's cable from 1 s to about 37 s, and the
leaf02 port 3 / host021 link flapping from 14 s to about 40 s (10-minute windows, 600 simulated
seconds). The shipped alert rules are loaded unchanged except for their ``for:`` durations, which
are in Prometheus' real time and are shortened to 2 s; the shipped Alertmanager routing and
inhibitions are loaded with the receivers pointed at this test's webhook and the group timers
shortened. The test then sends every dashboard query and every recording rule to Prometheus as a
range query over the run: each must parse and return data. A second, fast test posts alerts
straight to a real Alertmanager to check the shipped inhibitions and per-switch grouping exactly.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from ibmon.detect.cause import CAUSES
from tests.mqtt_broker import Mosquitto, free_port
from tests.promql_sources import (
    ALERT_RULES,
    RECORDING_RULES,
    REPO,
    Expr,
    dashboard_exprs,
    rule_exprs,
    substitute,
    variable_queries,
)
from tests.syspkg import require_binary

pytestmark = pytest.mark.system

AM_CONFIG = REPO / "deploy" / "alertmanager" / "alertmanager.yml"
IBMON = Path(sys.executable).with_name("ibmon")
SPEED = 20.0
RATE_INTERVAL = "5s"  # Grafana's $__rate_interval at a 1 s scrape interval: at least 4 scrapes
#: Alerts the demo's faults may raise (BER, flap, hotspot/backpressure, degraded uplink, receive
#: errors, the short link-downs of the flap); anything else is a false alarm.
DEMO_FAULT_ALERTS = {"IBLinkHighBER", "IBLinkFlapping", "IBPortCongestion", "IBLinkDegraded",
                     "IBPortReceiveErrors", "IBPortDown"}
DEADLINE = 100.0  # real seconds for the whole scenario part; the demo loop is 45 s


# --- processes ------------------------------------------------------------------------------


@dataclass
class Proc:
    name: str
    argv: list[str]
    log: Path
    env: dict[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                         env=self.env, start_new_session=True)

    def alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited {self.proc.returncode}: {self.tail()}")

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


def http_get(url: str, timeout: float = 10.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # loopback only
        return json.loads(resp.read())


def wait_until(what: str, check: Callable[[], bool], timeout: float,
               procs: Sequence[Proc] = ()) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            p.alive()
        with contextlib.suppress(OSError, ValueError):
            if check():
                return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


# --- webhook receiver -----------------------------------------------------------------------


@dataclass
class Webhook:
    notifications: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def alerts(self, name: str, status: str) -> list[dict[str, Any]]:
        with self.lock:
            return [a for n in self.notifications for a in n["alerts"]
                    if a["labels"]["alertname"] == name and a["status"] == status]


@contextlib.contextmanager
def webhook_server() -> Iterator[tuple[Webhook, int]]:
    hook = Webhook()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            payload = json.loads(body)
            payload["receiver_path"] = self.path
            with hook.lock:
                hook.notifications.append(payload)
            self.send_response(200)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="webhook", daemon=True)
    thread.start()
    try:
        yield hook, int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


# --- configs --------------------------------------------------------------------------------


def fast_rules(src: Path, dst: Path) -> Path:
    """The shipped rules with ``for:`` in seconds: Prometheus' clock is not simulated."""
    text = re.sub(r"(?m)^(\s+for: )\d+m$", r"\g<1>2s", src.read_text(encoding="utf-8"))
    dst.write_text(text, encoding="utf-8")
    return dst


def fast_alertmanager(hook_port: int, dst: Path) -> Path:
    """The shipped routing and inhibitions; receivers point at the test webhook."""
    cfg = yaml.safe_load(AM_CONFIG.read_text(encoding="utf-8"))

    def shorten(route: dict[str, Any]) -> None:
        for key, value in (("group_wait", "1s"), ("group_interval", "1s"),
                           ("repeat_interval", "1h")):
            if key in route:
                route[key] = value
        for child in route.get("routes", []):
            shorten(child)

    shorten(cfg["route"])
    # the notification templates ship next to the config; the copy lives elsewhere
    cfg["templates"] = [str(AM_CONFIG.parent / t) for t in cfg.get("templates", [])]
    for receiver in cfg["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = f"http://127.0.0.1:{hook_port}/{receiver['name']}"
    dst.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return dst


def alertmanager_proc(binary: str, hook_port: int, tmp: Path) -> tuple[Proc, int]:
    """A real Alertmanager (not started yet) on a free loopback port, with the fast config
    sending to the webhook on ``hook_port``; its data and log in ``tmp``."""
    port = free_port()
    return Proc("alertmanager", [
        binary, f"--config.file={fast_alertmanager(hook_port, tmp / 'am.yml')}",
        f"--storage.path={tmp / 'am-data'}",
        f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
    ], tmp / "alertmanager.log"), port


def prometheus_config(ibmon_port: int, am_port: int, rules: list[Path], dst: Path) -> Path:
    cfg = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s",
                   "scrape_timeout": "1s"},
        "rule_files": [str(r) for r in rules],
        "alerting": {"alertmanagers": [
            {"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
        "scrape_configs": [{"job_name": "ibmon",
                            "static_configs": [{"targets": [f"127.0.0.1:{ibmon_port}"]}]}],
    }
    dst.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return dst


# --- the test -------------------------------------------------------------------------------


def demo_port(proc: Proc) -> int | None:
    text = proc.log.read_text(errors="replace")
    m = re.search(r"metrics:\s+http://127\.0\.0\.1:(\d+)/metrics", text)
    return int(m.group(1)) if m else None


def query(prom: str, expr: str) -> list[dict[str, Any]]:
    url = f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    data = http_get(url)
    assert data["status"] == "success", data
    result: list[dict[str, Any]] = data["data"]["result"]
    return result


def query_range(prom: str, expr: str, start: float, end: float) -> dict[str, Any]:
    url = f"{prom}/api/v1/query_range?" + urllib.parse.urlencode(
        {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": "1"})
    try:
        data: dict[str, Any] = http_get(url, timeout=30)
    except urllib.error.HTTPError as exc:  # 400 with the parse error in the body
        return {"status": "error", "error": exc.read().decode(errors="replace")}
    return data


def firing(prom: str, name: str) -> list[dict[str, str]]:
    alerts = http_get(f"{prom}/api/v1/alerts")["data"]["alerts"]
    return [a["labels"] for a in alerts if a["labels"]["alertname"] == name
            and a["state"] == "firing"]


def test_scenario_alerts_reach_alertmanager_and_every_query_returns_data(
    tmp_path: Path,
) -> None:
    prometheus = require_binary("prometheus")
    alertmanager = require_binary("prometheus-alertmanager")
    mosquitto = require_binary("mosquitto")
    procs: list[Proc] = []
    broker = Mosquitto(binary=mosquitto, workdir=tmp_path / "mosquitto")
    with webhook_server() as (hook, hook_port), contextlib.ExitStack() as stack:
        broker.start()
        stack.callback(broker.stop)

        env = dict(os.environ, IBMON_MQTT__HOST="127.0.0.1", IBMON_MQTT__PORT=str(broker.port),
                   IBMON_LOG__FORMAT="json", IBMON_LOG__LEVEL="warning")
        ibmon = Proc("ibmon demo", [str(IBMON), "demo", "--scenario", "demo",
                                    "--listen", "127.0.0.1:0", "--speed", str(SPEED),
                                    "--interval", str(1.0 / SPEED)],
                     tmp_path / "ibmon.log", env=env)
        am, am_port = alertmanager_proc(alertmanager, hook_port, tmp_path)
        for p in (ibmon, am):
            p.start()
            procs.append(p)
            stack.callback(p.stop)
        started = time.time()
        wait_until("ibmon demo to listen", lambda: demo_port(ibmon) is not None, 90, procs)
        ibmon_port = demo_port(ibmon)
        assert ibmon_port is not None
        wait_until("alertmanager ready", lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{am_port}/-/ready", timeout=2).status == 200, 30, procs)

        rules = [fast_rules(RECORDING_RULES, tmp_path / RECORDING_RULES.name),
                 fast_rules(ALERT_RULES, tmp_path / ALERT_RULES.name)]
        prom_port = free_port()
        prom = f"http://127.0.0.1:{prom_port}"
        server = Proc("prometheus", [
            prometheus,
            f"--config.file={prometheus_config(ibmon_port, am_port, rules, tmp_path / 'p.yml')}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
            "--rules.alert.resend-delay=1s",
        ], tmp_path / "prometheus.log")
        server.start()
        procs.append(server)
        stack.callback(server.stop)
        wait_until("prometheus ready", lambda: urllib.request.urlopen(
            f"{prom}/-/ready", timeout=2).status == 200, 30, procs)

        # 1. The faults fire in Prometheus, with node, port, peer and switch from the joins.
        wait_until("IBLinkHighBER and IBLinkFlapping firing in Prometheus",
                   lambda: bool(firing(prom, "IBLinkHighBER") and firing(prom, "IBLinkFlapping")),
                   DEADLINE, procs)
        ber = firing(prom, "IBLinkHighBER")
        assert any(a["node_desc"].startswith("host042") for a in ber), ber
        flaps = firing(prom, "IBLinkFlapping")
        assert any(a["node_desc"].startswith("leaf02") and a["port"] == "3" for a in flaps), flaps
        for a in ber + flaps:
            assert a["remote_node_desc"] not in {"", "unknown"}, a
            assert a["switch"].startswith(("leaf", "spine")), a
            assert a["cause"] in CAUSES, a
        assert {a["cause"] for a in ber} == {"physical"}
        # the flapping cable is one alert, on its switch end, naming the host end
        assert not any(a["node_desc"].startswith("host021") for a in flaps), flaps
        assert any(a["remote_node_desc"].startswith("host021") for a in flaps), flaps

        # 2. They reach Alertmanager's receivers, grouped by switch.
        wait_until("firing notifications at the webhook",
                   lambda: bool(hook.alerts("IBLinkHighBER", "firing")
                                and hook.alerts("IBLinkFlapping", "firing")),
                   DEADLINE - (time.time() - started), procs)
        with hook.lock:
            port_groups = [n for n in hook.notifications
                           if any(a["labels"]["alertname"].startswith("IB") for a in n["alerts"])]
        assert port_groups
        assert all(list(n["groupLabels"]) == ["switch"] for n in port_groups), port_groups[0]
        critical = [a for a in hook.alerts("IBLinkHighBER", "firing")
                    if a["labels"]["severity"] == "critical"]
        assert critical, "the BER fault (1e-9) should also fire the critical alert"
        with hook.lock:
            paged = {a["labels"]["alertname"] for n in hook.notifications
                     if n["receiver_path"] == "/pager" for a in n["alerts"]}
        assert "IBLinkHighBER" in paged
        flap = hook.alerts("IBLinkFlapping", "firing")[0]
        summary = flap["annotations"]["summary"]
        assert "flapping" in summary
        assert "peer" in summary
        # the notification says the likely cause and what to check first, at both ends
        assert f"likely cause {flap['labels']['cause']}" in summary
        assert "leaf02 port 3" in flap["annotations"]["action"]
        assert "host021" in flap["annotations"]["action"]

        # 3. And resolve once the faults end (before the demo loop starts again at 45 s).
        wait_until("resolved notifications at the webhook",
                   lambda: bool(hook.alerts("IBLinkHighBER", "resolved")
                                and hook.alerts("IBLinkFlapping", "resolved")),
                   DEADLINE - (time.time() - started), procs)

        # Nothing else fires: ibmon is healthy and only the scenario's faults alert.
        with hook.lock:
            seen = {a["labels"]["alertname"] for n in hook.notifications for a in n["alerts"]}
        assert seen <= DEMO_FAULT_ALERTS, f"unexpected alerts: {seen - DEMO_FAULT_ALERTS}"

        # 4. Every dashboard query and recording rule parses and returns data for this run.
        end = time.time()
        values = dashboard_values(prom)
        exprs: list[Expr] = (dashboard_exprs() + variable_queries()
                             + rule_exprs(RECORDING_RULES))
        assert len(exprs) > 80, "the query lists should not be empty"
        failures = []
        for e in exprs:
            expr = substitute(e.expr, values, rate_interval=RATE_INTERVAL)
            data = query_range(prom, expr, started, end)
            if data["status"] != "success":
                failures.append(f"{e.where}: {data.get('error')}")
            elif not data["data"]["result"]:
                failures.append(f"{e.where}: no data for {expr}")
        assert not failures, "\n".join(failures)
        check_fabric_map(prom)
        for p in procs:
            p.alive()


def check_fabric_map(prom: str) -> None:
    """The node graph's two queries give frames it can draw: nodes with unique ``id``,
    ``title`` and ``subtitle`` columns, edges with unique ``id``, ``source`` and ``target``
    columns naming nodes, one edge per cable end."""
    board = json.loads((REPO / "grafana" / "dashboards" / "ibmon-fabric-map.json").read_text())
    (panel,) = [p for p in board["panels"] if p["type"] == "nodeGraph"]
    exprs = {t["refId"]: t["expr"] for t in panel["targets"]}
    assert set(exprs) == {"nodes", "edges"}
    nodes = [r["metric"] for r in query(prom, exprs["nodes"])]
    edges = [r["metric"] for r in query(prom, exprs["edges"])]
    ids = [n["id"] for n in nodes]
    assert nodes and len(ids) == len(set(ids))
    assert all(n["title"] and n["subtitle"] in {"switch", "ca"} for n in nodes), nodes[:3]
    assert edges and len({e["id"] for e in edges}) == len(edges)
    assert all(e["source"] in ids and e["target"] in ids for e in edges), edges[:3]
    assert len(edges) == len(query(prom, "ibmon_link_info"))


def dashboard_values(prom: str) -> dict[str, str]:
    """Variable values a user would pick: the port with the BER fault and its peer."""
    ports = query(prom, 'max_over_time(ibmon_port_info{node_desc=~"host042.*"}[5m])')
    assert ports, "host042 not in the demo fabric"
    labels = ports[0]["metric"]
    links = query(prom, f'max_over_time(ibmon_link_info{{guid="{labels["guid"]}", '
                        f'port="{labels["port"]}"}}[5m])')
    assert links, labels
    link = links[0]["metric"]
    return {"node": labels["node_desc"], "port": labels["port"], "guid": labels["guid"],
            "peer_guid": link["remote_guid"], "peer_port": link["remote_port"],
            "switch": ".*", "job": "ibmon", "datasource": "prometheus",
            "user": ".*", "job_id": ".*"}


def post_json(url: str, payload: object) -> None:
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200


def test_shipped_inhibitions_and_grouping_in_a_real_alertmanager(tmp_path: Path) -> None:
    """Alerts posted as Prometheus would: a down port silences its own BER and flap alerts only,
    critical silences warning, a dead ibmon silences its source alerts; groups are per switch."""
    alertmanager = require_binary("prometheus-alertmanager")
    with webhook_server() as (_hook, hook_port):
        am, am_port = alertmanager_proc(alertmanager, hook_port, tmp_path)
        am.start()
        try:
            base = f"http://127.0.0.1:{am_port}"
            wait_until("alertmanager ready", lambda: urllib.request.urlopen(
                f"{base}/-/ready", timeout=2).status == 200, 30, [am])
            # port alerts are about the port: no instance (the rules take max by (guid, port))
            p1 = {"guid": "0x0002c90300000001", "port": "1", "switch": "leaf01"}
            p2 = {"guid": "0x0002c90300000002", "port": "1", "switch": "leaf01"}
            alerts = [
                ("IBPortDown", "critical", p1), ("IBLinkFlapping", "warning", p1),
                ("IBLinkHighBER", "warning", p1), ("IBLinkHighBER", "warning", p2),
                ("IBLinkHighBER", "critical", p2), ("IBPortCongestion", "warning", p2),
                ("IbmonDown", "critical", {"instance": "mgmt02:9683"}),
                ("IbmonSourceFailing", "critical", {"instance": "mgmt02:9683", "source": "f"}),
                ("IbmonSourceFailing", "critical", {"instance": "mgmt01:9683", "source": "f"}),
                ("IbmonDataStale", "warning", {"instance": "mgmt01:9683", "source": "f"}),
            ]
            post_json(f"{base}/api/v2/alerts", [
                {"labels": {"alertname": name, "severity": sev, "job": "ibmon", **labels}}
                for name, sev, labels in alerts
            ])

            def state() -> dict[tuple[str, str, str, str], bool]:
                got = http_get(f"{base}/api/v2/alerts")
                return {(a["labels"]["alertname"], a["labels"]["severity"],
                         a["labels"].get("guid", ""), a["labels"].get("instance", "")):
                        bool(a["status"]["inhibitedBy"]) for a in got}

            wait_until("alerts received", lambda: len(state()) == len(alerts), 15, [am])
            wait_until("inhibitions evaluated", lambda: state()[
                ("IBLinkFlapping", "warning", p1["guid"], "")], 15, [am])
            inhibited = {k for k, v in state().items() if v}
            assert inhibited == {
                ("IBLinkFlapping", "warning", p1["guid"], ""),  # port 1 is down
                ("IBLinkHighBER", "warning", p1["guid"], ""),
                ("IBLinkHighBER", "warning", p2["guid"], ""),  # critical fires
                ("IbmonSourceFailing", "critical", "", "mgmt02:9683"),  # that ibmon is down
                ("IbmonDataStale", "warning", "", "mgmt01:9683"),  # its source is failing
            }, inhibited
            groups = http_get(f"{base}/api/v2/alerts/groups")
            port_groups = [g["labels"] for g in groups
                           if any(a["labels"]["alertname"].startswith("IB") for a in g["alerts"])]
            assert port_groups
            assert all(labels == {"switch": "leaf01"} for labels in port_groups), port_groups
        finally:
            am.stop()
