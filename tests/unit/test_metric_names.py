"""Every metric name (and selector label) the rules and dashboards use exists in ibmon's output.

The reference exposition is built through ibmon's own code: the port renderer on a PortView with
every field set, plus the self-metrics registry with every family touched (MQTT included), plus
the golden ``tests/golden/scan.prom``. A renamed metric breaks this test, not a 3 a.m. page.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from exporters.prometheus import exposition
from ibmon.config import Settings
from ibmon.infiniband.counters import CATALOGUE
from ibmon.infiniband.model import LinkInfo, PortIdentity, PortView
from ibmon.runtime.daemon import Daemon
from ibmon.runtime.selfmetrics import SelfMetrics
from ibmon.sources.mad import MadSourceConfig
from ibmon.state import FabricState
from tests.job_outputs_state import jobs_view
from tests.promql_sources import (
    ALERT_RULES,
    RECORDING_RULES,
    Expr,
    dashboard_exprs,
    metric_selectors,
    rule_exprs,
    variable_queries,
)

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "scan.prom"
SCRAPE_LABELS = {"instance", "job"}
CONDITIONS = ("down", "degraded", "flapping", "high_ber", "link_integrity", "receive_errors",
              "discards", "congestion")


def full_view() -> PortView:
    ident = PortIdentity(guid="0x0002c90300000001", port="1", device="mlx5_0",
                         node_desc="host01 HCA-1", node_type="ca", lid=5, source="mock")
    return PortView(
        identity=ident, state=4, phys_state=5, rate_bytes_per_second=25e9,
        active_width="4X", active_speed="HDR",
        link=LinkInfo(remote_guid="0x0002c90300000101", remote_port="7",
                      remote_node_desc="leaf01", active_width="4X", active_speed="HDR",
                      max_width="4X", max_speed="HDR"),
        totals={spec.name: 1 for spec in CATALOGUE},
        rates={spec.name: 1.0 for spec in CATALOGUE},
        saturated=frozenset({"symbol_errors"}), resets={"transmit_data": 1},
        hw_totals={"out_of_buffer": 1}, hw_rates={"out_of_buffer": 1.0},
        hw_gauges={"lifespan": 10},
        utilization_tx=0.5, utilization_rx=0.25, xmit_wait_ratio=0.1, symbol_error_ber=1e-12,
        conditions=frozenset(CONDITIONS),
        causes=dict.fromkeys(CONDITIONS, "physical"),
        stale=True,  # not a real combination (a stale port has no rates): every family once
    )


def parse_exposition(text: str) -> dict[str, set[str]]:
    """Sample name -> label names."""
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][\w:]*)(\{(.*)\})?\s", line)
        assert m, line
        labels = set(re.findall(r'(\w+)="', m.group(3) or ""))
        out.setdefault(m.group(1), set()).update(labels)
    return out


@pytest.fixture(scope="module")
def known() -> dict[str, set[str]]:
    metrics = SelfMetrics()
    metrics.source_up.labels("mock").set(1)
    metrics.poll_duration.labels("mock").observe(0.01)
    metrics.poll_errors.labels("mock", "timeout").inc()
    metrics.last_success.labels("mock").set(1.0)
    metrics.source_ports.labels("mock").set(1)
    metrics.events.labels("high_ber", "warning").inc()
    mqtt = metrics.enable_mqtt()
    mqtt.connected.set(1)
    mqtt.published.inc()
    mqtt.dropped.inc()
    metrics.describe_sources("main", [MadSourceConfig(shard="0/2")])  # the shard families
    view = full_view()
    state = FabricState(generated=1.0, ports={view.key: view}, jobs=jobs_view())
    names = parse_exposition(exposition(metrics, state).decode())
    # the families only the daemon registers (state file, reloads, dropped events)
    daemon = Daemon(Settings())
    for name, labels in parse_exposition(daemon.metrics.render().decode()).items():
        names.setdefault(name, set()).update(labels)
    if GOLDEN.is_file():
        for name, labels in parse_exposition(GOLDEN.read_text(encoding="utf-8")).items():
            names.setdefault(name, set()).update(labels)
    return names


def all_exprs() -> list[Expr]:
    return (rule_exprs(RECORDING_RULES) + rule_exprs(ALERT_RULES) + dashboard_exprs()
            + variable_queries())


def annotation_texts() -> list[Expr]:
    data = yaml.safe_load(ALERT_RULES.read_text(encoding="utf-8"))
    return [Expr(f"annotation {r['alert']}", text)
            for g in data["groups"] for r in g["rules"] if "alert" in r
            for text in r["annotations"].values()]


def test_reference_exposition_has_the_contract_metrics(known: dict[str, set[str]]) -> None:
    """The names the README promises and the rules rely on are really produced."""
    for name in ("ibmon_port_condition", "ibmon_port_transmit_wait_ratio",
                 "ibmon_port_symbol_error_ber", "ibmon_events_total", "ibmon_mqtt_connected",
                 "ibmon_mqtt_published_total", "ibmon_mqtt_dropped_total", "ibmon_link_info",
                 "ibmon_port_saturated", "ibmon_port_resets_total", "ibmon_port_hw_stat_total",
                 "ibmon_port_hw_stat", "ibmon_source_poll_errors_total",
                 "ibmon_source_poll_duration_seconds_bucket"):
        assert name in known, name
    assert known["ibmon_port_condition"] == {"guid", "port", "condition"}
    assert known["ibmon_port_saturated"] == {"guid", "port", "counter"}
    assert known["ibmon_port_hw_stat"] == {"guid", "port", "stat"}
    # promtool's lint: no metric name contains a type word ("counter" is a label here)
    assert not [n for n in known if re.search(r"counter|gauge|histogram|summary", n)]
    assert known["ibmon_port_info"] == {"guid", "port", "device", "node_desc", "node_type", "lid",
                                        "link_layer", "source"}


@pytest.mark.parametrize("expr", all_exprs() + annotation_texts(), ids=lambda e: e.where)
def test_metrics_and_selector_labels_exist(expr: Expr, known: dict[str, set[str]]) -> None:
    for name, labels in metric_selectors(expr.expr):
        assert name in known, f"{expr.where}: unknown metric {name}"
        unknown = labels - known[name] - SCRAPE_LABELS
        assert not unknown, f"{expr.where}: {name} has no label(s) {sorted(unknown)}"


def test_recording_rule_names_used_are_defined() -> None:
    defined = {e.where.split()[1] for e in rule_exprs(RECORDING_RULES) + rule_exprs(ALERT_RULES)}
    for expr in all_exprs():
        for used in re.findall(r"(?<![\w:])([a-z_]+:[a-z0-9_]+:[a-z0-9_]+)", expr.expr):
            assert used in defined, f"{expr.where}: undefined recording rule {used}"


def test_selector_parser_sees_names_but_not_recording_rules() -> None:
    found = metric_selectors(
        'rate(ibmon_port_symbol_errors_total{guid="x",port=~"1"}[5m]) '
        "/ guid_port:ibmon_port_errors:rate5m"
    )
    assert found == [("ibmon_port_symbol_errors_total", {"guid", "port"})]
