#!/usr/bin/env python3
"""Generate ibmon's Grafana dashboards as JSON (``grafana/dashboards/*.json``).

Dashboards are code so that a review sees PromQL and layout, not 3,000 lines of JSON, and so that
every panel gets the same datasource variable, units and ``$__rate_interval`` by construction.
Plain dictionaries rather than a builder library: see grafana/README.md for the reasoning.

    python grafana/build.py           # rewrite the committed JSON
    python grafana/build.py --check   # exit 1 if the committed JSON is stale (CI does this)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ibmon.detect.congestion import CongestionSettings
from ibmon.detect.errors import HighBerSettings
from ibmon.detect.link import LinkFlappingSettings

__all__ = ["DASHBOARDS", "OUT_DIR", "check", "dashboards", "panel_exprs", "render", "write"]

Json = dict[str, Any]

OUT_DIR = Path(__file__).resolve().parent / "dashboards"
DS: Json = {"type": "prometheus", "uid": "${datasource}"}
SCHEMA_VERSION = 38  # Grafana 10.x
RI = "$__rate_interval"

# The descriptive labels of a port, joined onto port series (keys: docs/architecture.md).
NODE = "* on(guid, port) group_left(node_desc) ibmon_port_info"
SWITCH_PORTS = 'max by (guid, port) (ibmon_port_info{node_type="switch"})'
SWITCH_NAMES = 'max by (guid, node_desc) (ibmon_port_info{node_type="switch"})'
# Thresholds the panels draw and explain are the detectors' defaults, read from their settings
# models: a changed default changes the dashboards (and --check fails until they are rebuilt).
_CONGESTION = CongestionSettings()
HOTSPOT_UTILIZATION = _CONGESTION.hotspot_utilization
CONGESTED = _CONGESTION.warning
_BER = HighBerSettings()
_FLAP = LinkFlappingSettings()
FLAP_RULE = f"{_FLAP.count} or more link-downs in {_FLAP.window / 60:g} minutes"


# --- panels ---------------------------------------------------------------------------------


def target(expr: str, legend: str = "", *, ref: str = "A", instant: bool = False,
           fmt: str = "time_series") -> Json:
    return {
        "datasource": DS,
        "expr": expr,
        "legendFormat": legend or "__auto",
        "refId": ref,
        "instant": instant,
        "range": not instant,
        "format": fmt,
        "editorMode": "code",
    }


def _targets(queries: Sequence[tuple[str, str]], **kw: Any) -> list[Json]:
    return [target(e, lg, ref=chr(ord("A") + i), **kw) for i, (e, lg) in enumerate(queries)]


def _panel(kind: str, title: str, description: str, targets: list[Json], unit: str, *,
           w: int, h: int, **extra: Any) -> Json:
    defaults: Json = {"unit": unit}
    defaults.update(extra.pop("defaults", {}))
    panel: Json = {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": extra.pop("overrides", [])},
        "gridPos": {"w": w, "h": h},
    }
    panel.update(extra)
    return panel


def timeseries(title: str, description: str, queries: Sequence[tuple[str, str]], unit: str, *,
               w: int = 12, h: int = 8, log: bool = False, bars: bool = False,
               minimum: float | None = 0) -> Json:
    custom: Json = {"drawStyle": "bars" if bars else "line", "fillOpacity": 10,
                    "showPoints": "never", "spanNulls": False}
    if log:
        custom["scaleDistribution"] = {"type": "log", "log": 10}
    defaults: Json = {"custom": custom}
    if minimum is not None and not log:
        defaults["min"] = minimum
    return _panel("timeseries", title, description, _targets(queries), unit, w=w, h=h,
                  defaults=defaults,
                  options={"legend": {"displayMode": "table", "placement": "right",
                                      "calcs": ["max", "lastNotNull"]},
                           "tooltip": {"mode": "multi", "sort": "desc"}})


def stat(title: str, description: str, expr: str, unit: str, *, w: int = 6, h: int = 4,
         thresholds: Sequence[tuple[float | None, str]] = ((None, "green"),),
         mappings: Sequence[Json] = (), legend: str = "") -> Json:
    return _panel("stat", title, description, _targets([(expr, legend)], instant=True), unit,
                  w=w, h=h,
                  defaults={"thresholds": {"mode": "absolute", "steps": [
                      {"value": v, "color": c} for v, c in thresholds]},
                      "mappings": list(mappings)},
                  options={"reduceOptions": {"calcs": ["lastNotNull"], "values": False},
                           "colorMode": "background", "graphMode": "none",
                           "textMode": "value_and_name" if legend else "auto"})


def table(title: str, description: str, expr: str, unit: str, *, w: int = 12, h: int = 8,
          columns: Sequence[str] = (), value_name: str = "Value",
          links: Sequence[Json] = ()) -> Json:
    """An instant query as a table; ``columns`` are the labels to show, in order."""
    order = {name: i for i, name in enumerate([*columns, "Value"])}
    hidden = {"Time": True, "__name__": True, "instance": True, "job": True}
    return _panel("table", title, description,
                  _targets([(expr, "")], instant=True, fmt="table"), unit, w=w, h=h,
                  defaults={"links": list(links)},
                  options={"showHeader": True, "footer": {"show": False},
                           "sortBy": [{"displayName": value_name, "desc": True}]},
                  transformations=[
                      {"id": "organize", "options": {
                          "excludeByName": hidden, "indexByName": order,
                          "renameByName": {"Value": value_name}}},
                  ])


def heatmap(title: str, description: str, expr: str, legend: str, unit: str, *,
            w: int = 24, h: int = 12) -> Json:
    """One row per series (a port), colour by value: no bucketing by Grafana."""
    return _panel("heatmap", title, description, _targets([(expr, legend)]), unit, w=w, h=h,
                  options={"calculate": False, "yAxis": {"axisPlacement": "left"},
                           "rowsFrame": {"layout": "auto"},
                           "color": {"mode": "scheme", "scheme": "Oranges", "fill": "dark",
                                     "scale": "linear", "exponent": 0.5, "steps": 64,
                                     "min": 0, "max": 1},
                           "cellGap": 1, "legend": {"show": True},
                           "tooltip": {"show": True, "yHistogram": False},
                           "yAxisLabels": "auto"})


def row(title: str) -> Json:
    return {"type": "row", "title": title, "collapsed": False, "panels": [],
            "gridPos": {"w": 24, "h": 1}}


PORT_LINK = {
    "title": "Port detail",
    "url": "/d/ibmon-port-detail/ibmon-port-detail?${datasource:queryparam}"
           "&var-node=${__data.fields.node_desc}&var-port=${__data.fields.port}",
}
STATE_MAPPINGS: list[Json] = [{"type": "value", "options": {
    "1": {"text": "Down", "color": "red"}, "2": {"text": "Init", "color": "orange"},
    "3": {"text": "Armed", "color": "orange"}, "4": {"text": "Active", "color": "green"},
    "5": {"text": "ActiveDefer", "color": "orange"}}}]
PHYS_MAPPINGS: list[Json] = [{"type": "value", "options": {
    "1": {"text": "Sleep", "color": "red"}, "2": {"text": "Polling", "color": "red"},
    "3": {"text": "Disabled", "color": "red"}, "4": {"text": "Training", "color": "orange"},
    "5": {"text": "LinkUp", "color": "green"}, "6": {"text": "ErrorRecovery", "color": "orange"},
    "7": {"text": "PhyTest", "color": "orange"}}}]


# --- dashboards -----------------------------------------------------------------------------


def _variable_datasource() -> Json:
    return {"name": "datasource", "label": "Data source", "type": "datasource",
            "query": "prometheus", "current": {}, "hide": 0, "refresh": 1, "regex": "",
            "options": [], "includeAll": False, "multi": False}


def _variable_query(name: str, label: str, query: str, *, multi: bool = False,
                    include_all: bool = False, hide: int = 0) -> Json:
    var: Json = {"name": name, "label": label, "type": "query", "datasource": DS,
                 "query": {"query": query, "refId": f"{name}-var"}, "definition": query,
                 "current": {}, "hide": hide, "refresh": 2, "regex": "", "sort": 1,
                 "options": [], "multi": multi, "includeAll": include_all}
    if include_all:
        var["allValue"] = ".*"
    return var


def _layout(panels: list[Json]) -> list[Json]:
    """Flow panels left to right, top to bottom, on Grafana's 24-column grid."""
    x = y = row_h = 0
    for i, panel in enumerate(panels, start=1):
        pos = panel["gridPos"]
        if x + pos["w"] > 24 or panel["type"] == "row":
            x, y, row_h = 0, y + row_h, 0
        pos.update(x=x, y=y)
        panel["id"] = i
        x += pos["w"]
        row_h = max(row_h, pos["h"])
        if panel["type"] == "row":
            x, y, row_h = 0, y + pos["h"], 0
    return panels


def dashboard(uid: str, title: str, description: str, panels: list[Json],
              variables: Sequence[Json] = ()) -> Json:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["ibmon", "infiniband"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": SCHEMA_VERSION,
        "time": {"from": "now-3h", "to": "now"},
        "timezone": "",
        "templating": {"list": [_variable_datasource(), *variables]},
        "annotations": {"list": []},
        "links": [{"title": "ibmon", "type": "dashboards", "tags": ["ibmon"], "asDropdown": True,
                   "includeVars": False, "keepTime": True}],
        "panels": _layout(panels),
    }


def overview() -> Json:
    tx = f"rate(ibmon_port_transmit_data_bytes_total[{RI}])"
    return dashboard("ibmon-overview", "ibmon / Fabric overview",
                     "Throughput, the busiest and most erroring ports, active conditions and "
                     "events across the fabric.", [
        stat("Fabric throughput", "Sum of all ports' transmitted data.",
             f"sum({tx})", "Bps"),
        stat("Ports", "Ports ibmon reports, from every source.",
             "count(ibmon_port_info)", "none"),
        stat("Active conditions", "Ports with a detector firing (down, BER, congestion...).",
             "count(ibmon_port_condition == 1) or vector(0)", "none",
             thresholds=((None, "green"), (1, "orange"))),
        stat("Ports down", "Ports that were active and are now down.",
             'count(ibmon_port_condition{condition="down"} == 1) or vector(0)', "none",
             thresholds=((None, "green"), (1, "red"))),
        timeseries("Fabric throughput", "Transmitted data, all ports and switch ports only.",
                   [(f"sum({tx})", "all ports"),
                    (f"sum({tx} * on(guid, port) group_left() {SWITCH_PORTS})", "switch ports")],
                   "Bps"),
        timeseries("Busiest switches", "Top 10 switches by transmitted data.",
                   [(f"topk(10, sum by (guid) ({tx} * on(guid, port) group_left() "
                     f"{SWITCH_PORTS}) * on(guid) group_left(node_desc) {SWITCH_NAMES})",
                     "{{node_desc}}")], "Bps"),
        table("Busiest ports", "Top 10 ports by transmit utilization (data rate over link "
              "rate). Click a row for the port detail.",
              'topk(10, max by (guid, port) (ibmon_port_utilization_ratio{direction="transmit"}) '
              f"{NODE})", "percentunit", columns=("node_desc", "port", "guid"),
              value_name="Utilization", links=[PORT_LINK]),
        table("Most errors", "Top 10 ports by error rate over 5 minutes, all error counters "
              "(recording rule guid_port:ibmon_port_errors:rate5m).",
              f"topk(10, guid_port:ibmon_port_errors:rate5m {NODE})", "cps",
              columns=("node_desc", "port", "guid"), value_name="Errors/s", links=[PORT_LINK]),
        table("Active conditions", "Every port a detector currently flags, with its peer.",
              f"ibmon_port_condition {NODE}", "none",
              columns=("node_desc", "port", "condition", "guid"), value_name="Active",
              links=[PORT_LINK]),
        timeseries("Events", "Events the detectors emitted, by type and severity.",
                   [(f"sum by (type, severity) (increase(ibmon_events_total[{RI}]))",
                     "{{type}} ({{severity}})")], "none", bars=True),
    ])


def congestion() -> Json:
    wait = "ibmon_port_transmit_wait_ratio"
    util_tx = 'ibmon_port_utilization_ratio{direction="transmit"}'
    sw = 'ibmon_port_info{node_type="switch", node_desc=~"$switch"}'
    return dashboard("ibmon-congestion", "ibmon / Congestion",
                     "Where the fabric waits: transmit-wait ratio per switch port, and whether a "
                     "congested port is a hotspot (busy) or suffers backpressure (idle, blocked "
                     "downstream).", [
        heatmap("Transmit wait by switch port",
                "Fraction of time each switch port had data but no credits to send it "
                "(PortXmitWait). One row per port; dark is congested.",
                f"max by (guid, port) ({wait}) * on(guid, port) group_left(node_desc) {sw}",
                "{{node_desc}} [{{port}}]", "percentunit"),
        timeseries("Hotspots: congested and busy",
                   f"Ports waiting at least {CONGESTED:.0%} of the time while sending at least "
                   f"{HOTSPOT_UTILIZATION:.0%} of line rate: too much traffic aimed at this "
                   "link. Rebalance jobs or routing.",
                   [(f"({wait} >= {CONGESTED}) and on(guid, port) "
                     f"({util_tx} >= {HOTSPOT_UTILIZATION}) {NODE}", "{{node_desc}} [{{port}}]")],
                   "percentunit"),
        timeseries("Backpressure: congested but idle",
                   f"Ports waiting at least {CONGESTED:.0%} of the time while sending less than "
                   f"{HOTSPOT_UTILIZATION:.0%} of line rate: blocked by congestion downstream. "
                   "Follow the link to the hotspot.",
                   [(f"({wait} >= {CONGESTED}) and on(guid, port) "
                     f"({util_tx} < {HOTSPOT_UTILIZATION}) {NODE}", "{{node_desc}} [{{port}}]")],
                   "percentunit"),
        timeseries("Most congested switches", "Highest transmit-wait ratio of any port, per "
                   "switch (recording rule guid:ibmon_switch_transmit_wait:max_ratio).",
                   [("topk(10, guid:ibmon_switch_transmit_wait:max_ratio * on(guid) "
                     f"group_left(node_desc) {SWITCH_NAMES})", "{{node_desc}}")],
                   "percentunit"),
        timeseries("Transmit wait ticks", "Raw PortXmitWait increase per second, top 10 ports "
                   "(the ratio assumes the configured tick length).",
                   [(f"topk(10, rate(ibmon_port_transmit_wait_ticks_total[{RI}]) {NODE})",
                     "{{node_desc}} [{{port}}]")], "cps"),
        table("Congested ports now", "Ports the congestion detector flags, with wait ratio "
              "and transmit utilization.",
              f"{wait} and on(guid, port) ibmon_port_condition{{condition=\"congestion\"}} "
              f"{NODE}", "percentunit", w=24, columns=("node_desc", "port", "guid"),
              value_name="Wait ratio", links=[PORT_LINK]),
    ], variables=[_variable_query("switch", "Switch",
                                  'label_values(ibmon_port_info{node_type="switch"}, node_desc)',
                                  multi=True, include_all=True)])


def link_health() -> Json:
    return dashboard("ibmon-link-health", "ibmon / Link health",
                     "Bit error rate, symbol errors, flaps, integrity errors and links running "
                     "below their capability.", [
        stat("High BER", "Ports whose symbol-error BER the detector flags.",
             'count(ibmon_port_condition{condition="high_ber"} == 1) or vector(0)', "none",
             thresholds=((None, "green"), (1, "orange"))),
        stat("Flapping", f"Links with {FLAP_RULE}.",
             'count(ibmon_port_condition{condition="flapping"} == 1) or vector(0)', "none",
             thresholds=((None, "green"), (1, "orange"))),
        stat("Degraded", "Links below the width or speed both ends support.",
             'count(ibmon_port_condition{condition="degraded"} == 1) or vector(0)', "none",
             thresholds=((None, "green"), (1, "orange"))),
        stat("Integrity errors", "Ports with recent local link integrity or buffer overrun "
             "errors.",
             'count(ibmon_port_condition{condition="link_integrity"} == 1) or vector(0)',
             "none", thresholds=((None, "green"), (1, "red"))),
        timeseries("Symbol error BER (worst 10)", "Symbol errors over bits carried, over "
                   f"ibmon's sliding window. IBTA limit 1e-12; ibmon warns at {_BER.warning:g} "
                   f"and is critical at {_BER.critical:g}.",
                   [(f"topk(10, ibmon_port_symbol_error_ber > 0) {NODE}",
                     "{{node_desc}} [{{port}}]")], "sci", log=True),
        timeseries("Symbol errors per second (worst 10)", "Rate of SymbolErrorCounter.",
                   [(f"topk(10, rate(ibmon_port_symbol_errors_total[{RI}]) {NODE})",
                     "{{node_desc}} [{{port}}]")], "cps"),
        timeseries("Link downs (flaps)", "LinkDownedCounter increases per port; "
                   f"{FLAP_RULE} is flapping.",
                   [(f"topk(10, increase(ibmon_port_link_downed_total[{RI}]) {NODE})",
                     "{{node_desc}} [{{port}}]")], "none", bars=True),
        timeseries("Link error recoveries and integrity errors", "Retrains, local link "
                   "integrity and excessive buffer overrun errors per second, top 10.",
                   [(f"topk(10, rate(ibmon_port_link_error_recovery_total[{RI}]) {NODE})",
                     "{{node_desc}} [{{port}}] recovery"),
                    (f"topk(10, rate(ibmon_port_local_link_integrity_errors_total[{RI}]) "
                     f"{NODE})", "{{node_desc}} [{{port}}] integrity"),
                    (f"topk(10, rate(ibmon_port_excessive_buffer_overrun_errors_total[{RI}]) "
                     f"{NODE})", "{{node_desc}} [{{port}}] overrun")], "cps"),
        table("Links below capability", "Degraded links: active width and speed versus the "
              "best both ends support and have enabled.",
              "ibmon_link_info and on(guid, port) "
              'ibmon_port_condition{condition="degraded"}', "none", w=24,
              columns=("guid", "port", "active_width", "active_speed", "max_width",
                       "max_speed", "remote_node_desc", "remote_port"), value_name="Degraded"),
        table("Links with errors", "Per-port error rates over 5 minutes by counter "
              "(recording rule guid_port_counter:ibmon_port_errors:rate5m).",
              f"(guid_port_counter:ibmon_port_errors:rate5m > 0) {NODE}", "cps", w=24,
              columns=("node_desc", "port", "counter", "guid"), value_name="Per second",
              links=[PORT_LINK]),
    ])


def port_detail() -> Json:
    here = 'guid="$guid", port="$port"'
    peer = 'guid="$peer_guid", port="$peer_port"'
    ends = (("this end", here), ("peer", peer))

    def both(expr: str, legend: str = "") -> list[tuple[str, str]]:
        return [(expr.replace("SEL", sel), f"{name}{legend}") for name, sel in ends]

    return dashboard("ibmon-port-detail", "ibmon / Port detail",
                     "One port and the port at the other end of its cable.", [
        stat("State", "IBA PortState of this end.", f"ibmon_port_state{{{here}}}", "none",
             mappings=STATE_MAPPINGS, w=4),
        stat("Physical state", "IBA PortPhysicalState of this end.",
             f"ibmon_port_physical_state{{{here}}}", "none", mappings=PHYS_MAPPINGS, w=4),
        stat("Link rate", "Effective data rate of the link.",
             f"ibmon_port_rate_bytes_per_second{{{here}}}", "Bps", w=4),
        stat("Peer state", "IBA PortState of the far end.", f"ibmon_port_state{{{peer}}}",
             "none", mappings=STATE_MAPPINGS, w=4),
        table("Link", "Width and speed: active versus the best both ends support.",
              f"ibmon_link_info{{{here}}}", "none", w=8,
              columns=("remote_node_desc", "remote_port", "active_width", "active_speed",
                       "max_width", "max_speed"), value_name="Info"),
        timeseries("Throughput", "Data sent (+) per second at both ends.",
                   both(f"rate(ibmon_port_transmit_data_bytes_total{{SEL}}[{RI}])", " transmit")
                   + both(f"rate(ibmon_port_receive_data_bytes_total{{SEL}}[{RI}])",
                          " receive"), "Bps"),
        timeseries("Utilization", "Data rate over link rate, latest poll, both ends.",
                   both("ibmon_port_utilization_ratio{SEL}", " {{direction}}"), "percentunit"),
        timeseries("Transmit wait ratio", "Time the port could not send for lack of credits.",
                   both("ibmon_port_transmit_wait_ratio{SEL}"), "percentunit"),
        timeseries("Symbol error BER", "Over ibmon's sliding window.",
                   both("ibmon_port_symbol_error_ber{SEL}"), "sci"),
        timeseries("Errors by counter", "Error counters per second, both ends.",
                   both(f"rate(ibmon_port_symbol_errors_total{{SEL}}[{RI}])", " symbol")
                   + both(f"rate(ibmon_port_receive_errors_total{{SEL}}[{RI}])", " receive")
                   + both(f"rate(ibmon_port_transmit_discards_total{{SEL}}[{RI}])",
                          " discards"), "cps"),
        timeseries("Packets", "Packets per second, both ends.",
                   both(f"rate(ibmon_port_transmit_packets_total{{SEL}}[{RI}])", " transmit")
                   + both(f"rate(ibmon_port_receive_packets_total{{SEL}}[{RI}])", " receive"),
                   "pps"),
        timeseries("Link downs", "LinkDownedCounter increases, both ends.",
                   both(f"increase(ibmon_port_link_downed_total{{SEL}}[{RI}])"), "none",
                   bars=True),
        table("Conditions", "Detectors firing on either end.",
              f"ibmon_port_condition{{{here}}} or ibmon_port_condition{{{peer}}}", "none",
              columns=("guid", "port", "condition"), value_name="Active"),
    ], variables=[
        _variable_query("node", "Node", "label_values(ibmon_port_info, node_desc)"),
        _variable_query("port", "Port", 'label_values(ibmon_port_info{node_desc="$node"}, port)'),
        _variable_query("guid", "GUID",
                        'label_values(ibmon_port_info{node_desc="$node", port="$port"}, guid)'),
        _variable_query("peer_guid", "Peer GUID",
                        'label_values(ibmon_link_info{guid="$guid", port="$port"}, remote_guid)',
                        hide=2),
        _variable_query("peer_port", "Peer port",
                        'label_values(ibmon_link_info{guid="$guid", port="$port"}, remote_port)',
                        hide=2),
    ])


def health() -> Json:
    return dashboard("ibmon-health", "ibmon / ibmon health",
                     "Is ibmon itself healthy: scrapes, sources, poll durations, errors, "
                     "staleness and MQTT.", [
        stat("Sources up", "Sources whose latest poll succeeded, out of all.",
             "sum(ibmon_source_up)", "none", legend="up"),
        stat("Sources down", "Sources whose latest poll failed.",
             "count(ibmon_source_up == 0) or vector(0)", "none",
             thresholds=((None, "green"), (1, "red"))),
        stat("MQTT connected", "1 when connected to the broker (absent when MQTT is off).",
             "min(ibmon_mqtt_connected)", "none",
             mappings=[{"type": "value", "options": {
                 "0": {"text": "disconnected", "color": "red"},
                 "1": {"text": "connected", "color": "green"}}}]),
        stat("Scrape duration", "How long Prometheus takes to scrape ibmon.",
             'max(scrape_duration_seconds{job=~"$job"})', "s"),
        timeseries("Poll duration p50 / p99", "Wall time of one poll, per source.",
                   [("histogram_quantile(0.5, sum by (le, source) "
                     f"(rate(ibmon_source_poll_duration_seconds_bucket[{RI}])))",
                     "{{source}} p50"),
                    ("histogram_quantile(0.99, sum by (le, source) "
                     f"(rate(ibmon_source_poll_duration_seconds_bucket[{RI}])))",
                     "{{source}} p99")], "s"),
        timeseries("Poll errors", "Values or polls a source could not read, by reason "
                   "(0 per source when there are none).",
                   [(f"sum by (source, reason) (rate(ibmon_source_poll_errors_total[{RI}])) "
                     "or on(source) sum by (source) (0 * ibmon_source_up)",
                     "{{source}} {{reason}}")], "cps"),
        timeseries("Data age", "Seconds since each source's last successful poll.",
                   [("time() - ibmon_source_last_success_timestamp_seconds", "{{source}}")],
                   "s", minimum=None),
        timeseries("Ports per source", "Ports each source reported in its latest poll.",
                   [("ibmon_source_ports", "{{source}}")], "none"),
        timeseries("MQTT messages", "Messages published and dropped per second.",
                   [(f"sum(rate(ibmon_mqtt_published_total[{RI}]))", "published"),
                    (f"sum(rate(ibmon_mqtt_dropped_total[{RI}]))", "dropped")], "cps"),
        timeseries("Events", "Detector events per second by type.",
                   [(f"sum by (type) (rate(ibmon_events_total[{RI}]))", "{{type}}")], "cps"),
        table("Versions", "Running ibmon versions.", "ibmon_build_info", "none", w=24,
              columns=("instance", "version", "python"), value_name="Running"),
    ], variables=[_variable_query("job", "Job", "label_values(ibmon_build_info, job)",
                                  multi=True, include_all=True)])


DASHBOARDS = {
    "ibmon-overview.json": overview,
    "ibmon-congestion.json": congestion,
    "ibmon-link-health.json": link_health,
    "ibmon-port-detail.json": port_detail,
    "ibmon-health.json": health,
}


def dashboards() -> dict[str, Json]:
    return {name: build() for name, build in DASHBOARDS.items()}


def render(board: Json) -> str:
    return json.dumps(board, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def panel_exprs(board: Json) -> Iterator[tuple[str, str]]:
    """(panel title, PromQL) for every query of every panel."""
    for panel in board["panels"]:
        for tgt in panel.get("targets", []):
            yield panel["title"], tgt["expr"]


def write(out_dir: Path = OUT_DIR) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, board in dashboards().items():
        path = out_dir / name
        path.write_text(render(board), encoding="utf-8")
        paths.append(path)
    return paths


def check(out_dir: Path = OUT_DIR) -> list[str]:
    """Names of committed dashboards that differ from what this file generates (or are extra)."""
    want = {name: render(board) for name, board in dashboards().items()}
    stale = [name for name, text in want.items()
             if not (out_dir / name).is_file()
             or (out_dir / name).read_text(encoding="utf-8") != text]
    extra = [p.name for p in out_dir.glob("*.json") if p.name not in want]
    return sorted(stale + extra)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="fail if the JSON is stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = check()
        if stale:
            print(f"stale dashboards: {', '.join(stale)}; run python grafana/build.py",
                  file=sys.stderr)
            return 1
        return 0
    for path in write():
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
