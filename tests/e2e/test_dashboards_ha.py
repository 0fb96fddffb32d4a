"""Every dashboard panel gives the same numbers for an HA pair as for one daemon.

Two replicas of one shard export identical series apart from ``instance`` (and ``pod`` in
Kubernetes). The test records a real ``ibmon demo`` run's ``/metrics`` (a dozen scrapes while
the demo's faults fire), writes them as OpenMetrics with explicit timestamps twice, once under one
instance and once under two, turns each into a TSDB with ``promtool tsdb create-blocks-from
openmetrics`` and serves each with a real Prometheus. Every dashboard query (variables
substituted, recording-rule names expanded to their shipped expressions, since rules are not
evaluated over backfilled data) is sent to both at the same instant: the results must be equal
after dropping ``instance`` and ``pod``, row for row. Identical timestamps on both sides make the
comparison exact; live scrapes of two daemons would differ by scrape timing.

The health dashboard is per daemon by design (a replica is a daemon, and a dead replica must
show), so its per-daemon panels are listed in ``PER_DAEMON`` and allowed to show each replica.
"""

from __future__ import annotations

import contextlib
import math
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.test_prometheus_alertmanager import Proc, demo_port, http_get, wait_until
from tests.mqtt_broker import free_port
from tests.promql_sources import (
    RECORDING_RULES,
    Expr,
    dashboard_exprs,
    substitute,
    variable_queries,
)
from tests.syspkg import require_binary

pytestmark = pytest.mark.system

IBMON = Path(sys.executable).with_name("ibmon")
STEP = 15  # seconds between the recorded scrapes, as a common scrape interval
SCRAPES = 12
REPLICAS = ({"instance": "10.0.0.1:9683", "pod": "ibmon-fabric-0"},
            {"instance": "10.0.0.2:9683", "pod": "ibmon-fabric-0-b"})
#: Health panels that show each daemon (instance in the legend or the row): a replica is a
#: daemon of its own there. Every other panel of every dashboard must not see the pair.
PER_DAEMON = {
    "dashboard ibmon-health.json / Sources up / A",
    "dashboard ibmon-health.json / Poll errors / A",
    "dashboard ibmon-health.json / Data age / A",
    "dashboard ibmon-health.json / Ports per source / A",
    "dashboard ibmon-health.json / MQTT messages / A",
    "dashboard ibmon-health.json / MQTT messages / B",
    "dashboard ibmon-health.json / Versions / A",
}
_SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(\{.*\})? (\S+)$")


def record_scrapes(tmp_path: Path) -> list[str]:
    """``SCRAPES`` bodies of a live demo's /metrics, one a second (10 simulated seconds)."""
    proc = Proc("ibmon demo", [str(IBMON), "demo", "--scenario", "demo",
                               "--listen", "127.0.0.1:0", "--speed", "10", "--interval", "0.1"],
                tmp_path / "ibmon.log")
    proc.start()
    try:
        wait_until("ibmon demo to listen", lambda: demo_port(proc) is not None, 90, [proc])
        url = f"http://127.0.0.1:{demo_port(proc)}/metrics"
        bodies = []
        for _ in range(SCRAPES):
            with urllib.request.urlopen(url, timeout=10) as resp:  # loopback only
                bodies.append(resp.read().decode())
            time.sleep(1.0)
        proc.alive()
        return bodies
    finally:
        proc.stop()


def openmetrics(bodies: list[str], replicas: tuple[dict[str, str], ...], start: int) -> str:
    """The scrapes as OpenMetrics samples at ``start + i * STEP``, once per replica, with the
    labels Prometheus (and the operator) would attach. Samples of a series are kept together
    and in time order, families together, as promtool's backfill wants."""
    series: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for i, body in enumerate(bodies):
        ts = start + i * STEP
        for line in body.splitlines():
            if not line or line.startswith("#"):
                continue
            m = _SAMPLE.match(line)
            assert m, line
            name, labels, value = m.group(1), (m.group(2) or "{}")[1:-1], m.group(3)
            for rep in replicas:
                extra = ",".join(f'{k}="{v}"' for k, v in
                                 (("job", "ibmon"), *sorted(rep.items())))
                key = "{" + extra + ("," + labels if labels else "") + "}"
                series[name][key].append(f"{name}{key} {value} {ts}")
    lines = [s for by_key in series.values() for samples in by_key.values() for s in samples]
    return "\n".join(lines) + "\n# EOF\n"


def expand_rules(expr: str, rules: dict[str, list[tuple[str, dict[str, str]]]]) -> str:
    """Recording-rule names replaced by their shipped expressions (with the rule's labels)."""
    for _ in range(5):  # rules refer to rules; the shipped nesting is two deep
        changed = False
        for record, defs in rules.items():
            pattern = re.compile(rf"(?<![\w:]){re.escape(record)}(?![\w:])")
            if not pattern.search(expr):
                continue
            parts = []
            for body, labels in defs:
                part = f"({body.strip()})"
                for k, v in labels.items():
                    part = f'label_replace({part}, "{k}", "{v}", "", "")'
                parts.append(part)
            replacement = "(" + " or ".join(parts) + ")"
            expr = replacement.join(pattern.split(expr))
            changed = True
        if not changed:
            return expr
    raise AssertionError(f"recording rules nest too deep in {expr}")


def recording_rules() -> dict[str, list[tuple[str, dict[str, str]]]]:
    out: dict[str, list[tuple[str, dict[str, str]]]] = defaultdict(list)
    for group in yaml.safe_load(RECORDING_RULES.read_text(encoding="utf-8"))["groups"]:
        for rule in group["rules"]:
            out[rule["record"]].append((rule["expr"], rule.get("labels", {})))
    return out


@contextlib.contextmanager
def prometheus_on(tsdb: Path, log: Path) -> Iterator[str]:
    port = free_port()
    cfg = log.with_suffix(".yml")
    cfg.write_text("global: {}\n", encoding="utf-8")
    proc = Proc("prometheus", [
        require_binary("prometheus"), f"--config.file={cfg}", f"--storage.tsdb.path={tsdb}",
        f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=100y",
    ], log)
    proc.start()
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until("prometheus ready", lambda: urllib.request.urlopen(
            f"{base}/-/ready", timeout=2).status == 200, 60, [proc])
        yield base
    finally:
        proc.stop()


def instant(base: str, expr: str, at: int) -> list[dict[str, Any]] | str:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr, "time": str(at)})
    try:
        data = http_get(url, timeout=30)
    except urllib.error.HTTPError as exc:  # 400/422 with the error in the body
        return f"error: {exc.read().decode(errors='replace')}"
    result: list[dict[str, Any]] = data["data"]["result"]
    return result


def rows(result: list[dict[str, Any]] | str) -> list[tuple[tuple[tuple[str, str], ...], float]]:
    """The result as a user sees it, without the labels that tell replicas apart."""
    if isinstance(result, str):
        return [((("error", result),), 0.0)]
    return sorted((tuple(sorted((k, v) for k, v in r["metric"].items()
                                if k not in {"instance", "pod"})), float(r["value"][1]))
                  for r in result)


def same(a: list[tuple[Any, float]], b: list[tuple[Any, float]]) -> bool:
    return len(a) == len(b) and all(
        la == lb and (va == vb or math.isclose(va, vb, rel_tol=1e-9)
                      or (math.isnan(va) and math.isnan(vb)))
        for (la, va), (lb, vb) in zip(a, b, strict=True))


def variable_values(base: str, at: int) -> dict[str, str]:
    """A port with an active condition, and its peer, as a user would pick them."""
    got = instant(base, "ibmon_port_condition * on(guid, port) group_left(node_desc) "
                        "ibmon_port_info", at)
    assert isinstance(got, list) and got, f"the demo had no condition in its first minutes: {got}"
    labels = got[0]["metric"]
    link = instant(base, f'ibmon_link_info{{guid="{labels["guid"]}", port="{labels["port"]}"}}',
                   at)
    assert isinstance(link, list) and link, labels
    return {"node": labels["node_desc"], "port": labels["port"], "guid": labels["guid"],
            "peer_guid": link[0]["metric"]["remote_guid"],
            "peer_port": link[0]["metric"]["remote_port"],
            "switch": ".*", "job": "ibmon", "datasource": "prometheus",
            "user": ".*", "job_id": ".*"}


def test_every_panel_counts_an_ha_pair_once(tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    bodies = record_scrapes(tmp_path)
    start = (int(time.time()) - 3 * 3600) // STEP * STEP
    at = start + (SCRAPES - 1) * STEP
    tsdbs = {}
    for name, replicas in (("single", REPLICAS[:1]), ("pair", REPLICAS)):
        src = tmp_path / f"{name}.om"
        src.write_text(openmetrics(bodies, replicas, start), encoding="utf-8")
        tsdbs[name] = tmp_path / f"tsdb-{name}"
        subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(src),
                        str(tsdbs[name])], check=True, capture_output=True, timeout=300)

    rules = recording_rules()
    with (prometheus_on(tsdbs["single"], tmp_path / "single.log") as single,
          prometheus_on(tsdbs["pair"], tmp_path / "pair.log") as pair):
        values = variable_values(single, at)
        exprs: list[Expr] = dashboard_exprs() + variable_queries()
        differ, per_daemon_seen, with_data = [], set(), 0
        for e in exprs:
            expr = expand_rules(substitute(e.expr, values, rate_interval="1m"), rules)
            got_one, got_two = instant(single, expr, at), instant(pair, expr, at)
            assert not isinstance(got_one, str), f"{e.where}: {got_one}"
            one, two = rows(got_one), rows(got_two)
            with_data += bool(one)
            if e.where in PER_DAEMON:
                per_daemon_seen.add(e.where)
            elif "/ variable " in e.where:  # label_values: a set of values, not rows
                if set(one) != set(two):
                    differ.append(f"{e.where}: {len(set(one))} != {len(set(two))} values")
            elif not same(one, two):
                differ.append(f"{e.where}: one replica {len(one)} rows {one[:2]}, "
                              f"two replicas {len(two)} rows {two[:2]}\n  {expr}")
    assert not differ, "panels that count an HA pair twice:\n" + "\n".join(differ)
    assert per_daemon_seen == PER_DAEMON, PER_DAEMON - per_daemon_seen  # no stale names
    # The comparison means something only if the panels show data.
    assert with_data >= len(exprs) * 3 // 4, f"only {with_data} of {len(exprs)} with data"
