#!/usr/bin/env python3
"""Generate ibmon's Grafana dashboards as JSON (``grafana/dashboards/*.json``).

Dashboards are code so that a review sees PromQL and layout, not 3,000 lines of JSON, and so that
every panel gets the same datasource variable, units and ``$__rate_interval`` by construction.
Panels, queries, variables and dashboards are made with Grafana's own typed builders
(``grafana-foundation-sdk``, pinned to the Grafana 11.6 schema in pyproject's ``test`` extra), so
option names, enums and the JSON shape follow Grafana's schema rather than our memory of it; the
small functions below only fix ibmon's conventions (datasource variable on every panel and query,
a unit on every panel, tables that link to the port detail).

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

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import heatmap as hm
from grafana_foundation_sdk.builders import nodegraph as ng
from grafana_foundation_sdk.builders import prometheus as prom
from grafana_foundation_sdk.builders import stat as st
from grafana_foundation_sdk.builders import table as tb
from grafana_foundation_sdk.builders import timeseries as ts
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import heatmap as hmm
from grafana_foundation_sdk.models import prometheus as pm

from ibmon.detect.congestion import CongestionSettings
from ibmon.detect.errors import HighBerSettings
from ibmon.detect.link import LinkFlappingSettings

__all__ = ["DASHBOARDS", "OUT_DIR", "check", "dashboards", "panel_exprs", "render", "write"]

Json = dict[str, Any]
Panel = ts.Panel | st.Panel | tb.Panel | hm.Panel | ng.Panel

OUT_DIR = Path(__file__).resolve().parent / "dashboards"
DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
RI = "$__rate_interval"



def one(expr: str) -> str:
    """``expr`` once per port however many daemons export it. Two replicas of a shard (an HA
    pair) export identical series apart from ``instance`` (and ``pod`` in Kubernetes); every
    panel that sums, counts, ranks or lists ports reads them through this, so a pair is never
    counted twice and never shows a port twice (tests/e2e/test_dashboards_ha.py proves each
    panel gives the same numbers with one replica and with two)."""
    return f"max without (instance, pod) ({expr})"


def active(condition: str = "") -> str:
    """How many ports have ``condition`` (any condition if empty) active, 0 when none."""
    sel = "ibmon_port_condition" + (f'{{condition="{condition}"}}' if condition else "")
    return f"count({one(sel)} == 1) or vector(0)"


# The descriptive labels of a port, joined onto port series (keys: docs/architecture.md); the
# right side of a join must be one series per (guid, port), hence the max.
NODE = "* on(guid, port) group_left(node_desc) max by (guid, port, node_desc) (ibmon_port_info)"
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
           table_format: bool = False) -> prom.Dataquery:
    query = (prom.Dataquery().datasource(DS).expr(expr).legend_format(legend or "__auto")
             .ref_id(ref).editor_mode(pm.QueryEditorMode.CODE)
             .format(pm.PromQueryFormat.TABLE if table_format else pm.PromQueryFormat.TIME_SERIES))
    return query.instant() if instant else query.range()


def _targets(panel: Panel, queries: Sequence[tuple[str, str]], **kw: Any) -> None:
    for i, (expr, legend) in enumerate(queries):
        panel.with_target(target(expr, legend, ref=chr(ord("A") + i), **kw))


def _common(panel: Panel, title: str, description: str, unit: str, *, w: int, h: int) -> None:
    panel.title(title).description(description).datasource(DS).unit(unit).span(w).height(h)


def _thresholds(steps: Sequence[tuple[float | None, str]]) -> db.ThresholdsConfig:
    return (db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE)
            .steps([dm.Threshold(value=v, color=c) for v, c in steps]))


def timeseries(title: str, description: str, queries: Sequence[tuple[str, str]], unit: str, *,
               w: int = 12, h: int = 8, log: bool = False, bars: bool = False,
               minimum: float | None = 0) -> Panel:
    panel = ts.Panel()
    _common(panel, title, description, unit, w=w, h=h)
    _targets(panel, queries)
    panel.draw_style(cm.GraphDrawStyle.BARS if bars else cm.GraphDrawStyle.LINE)
    panel.fill_opacity(10).show_points(cm.VisibilityMode.NEVER).span_nulls(False)
    if log:
        panel.scale_distribution(cb.ScaleDistributionConfig().type(cm.ScaleDistribution.LOG)
                                 .log(10))
    elif minimum is not None:
        panel.min(minimum)
    panel.legend(cb.VizLegendOptions().display_mode(cm.LegendDisplayMode.TABLE)
                 .placement(cm.LegendPlacement.RIGHT).show_legend(True)
                 .calcs(["max", "lastNotNull"]))
    panel.tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI)
                  .sort(cm.SortOrder.DESCENDING))
    return panel


def stat(title: str, description: str, expr: str, unit: str, *, w: int = 6, h: int = 4,
         thresholds: Sequence[tuple[float | None, str]] = ((None, "green"),),
         mappings: Sequence[dm.ValueMap] = (), legend: str = "") -> Panel:
    panel = st.Panel()
    _common(panel, title, description, unit, w=w, h=h)
    _targets(panel, [(expr, legend)], instant=True)
    panel.thresholds(_thresholds(thresholds)).mappings(list(mappings))
    panel.reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    panel.color_mode(cm.BigValueColorMode.BACKGROUND).graph_mode(cm.BigValueGraphMode.NONE)
    panel.text_mode(cm.BigValueTextMode.VALUE_AND_NAME if legend else cm.BigValueTextMode.AUTO)
    return panel


def table(title: str, description: str, expr: str, unit: str, *, w: int = 12, h: int = 8,
          columns: Sequence[str] = (), value_name: str = "Value",
          links: Sequence[db.DashboardLink] = ()) -> Panel:
    """An instant query as a table; ``columns`` are the labels to show, in order."""
    order = {name: i for i, name in enumerate([*columns, "Value"])}
    hidden = {"Time": True, "__name__": True, "instance": True, "job": True}
    panel = tb.Panel()
    _common(panel, title, description, unit, w=w, h=h)
    _targets(panel, [(expr, "")], instant=True, table_format=True)
    panel.data_links(list(links)).show_header(True)
    panel.footer(cb.TableFooterOptions().show(False).reducer([]))
    panel.sort_by([cb.TableSortByFieldState().display_name(value_name).desc(True)])
    panel.with_transformation(dm.DataTransformerConfig(id_val="organize", options={
        "excludeByName": hidden, "indexByName": order, "renameByName": {"Value": value_name}}))
    return panel


def heatmap(title: str, description: str, expr: str, legend: str, unit: str, *,
            w: int = 24, h: int = 12) -> Panel:
    """One row per series (a port), colour by value: no bucketing by Grafana."""
    panel = hm.Panel()
    _common(panel, title, description, unit, w=w, h=h)
    _targets(panel, [(expr, legend)])
    panel.calculate(False).y_axis(hm.YAxisConfig().axis_placement(cm.AxisPlacement.LEFT))
    panel.rows_frame(hm.RowsHeatmapOptions().layout(cm.HeatmapCellLayout.AUTO))
    panel.color(hm.HeatmapColorOptions().mode(hmm.HeatmapColorMode.SCHEME).scheme("Oranges")
                .fill("dark").scale(hmm.HeatmapColorScale.LINEAR).exponent(0.5).steps(64)
                .reverse(False).min(0).max(1))
    panel.cell_gap(1).show_legend().show_y_histogram()
    panel.mode(cm.TooltipDisplayMode.SINGLE)
    return panel


def node_graph(title: str, description: str, nodes: str, edges: str, *,
               w: int = 24, h: int = 18) -> Panel:
    """Grafana's node graph from two instant table queries, refIds ``nodes`` and ``edges``
    (the panel takes frames by those refIds). The queries name their columns with the field
    names the panel reads (``id``, ``title``, ``subtitle``; ``id``, ``source``, ``target``) via
    ``label_replace``; the value column, ``Value #<refId>`` when a panel has two table queries,
    becomes ``mainstat``."""
    panel = ng.Panel()
    _common(panel, title, description, "none", w=w, h=h)
    panel.with_target(target(nodes, ref="nodes", instant=True, table_format=True))
    panel.with_target(target(edges, ref="edges", instant=True, table_format=True))
    panel.with_transformation(dm.DataTransformerConfig(id_val="organize", options={
        "excludeByName": {"Time": True},
        "renameByName": {"Value #nodes": "mainstat", "Value #edges": "mainstat"}}))
    panel.nodes(ng.NodeOptions().main_stat_unit("none"))
    panel.edges(ng.EdgeOptions().main_stat_unit("none"))
    return panel


def row(title: str) -> db.Row:
    return db.Row(title).collapsed(False)


def _value_mappings(options: dict[str, tuple[str, str]]) -> list[dm.ValueMap]:
    return [dm.ValueMap(options={
        value: dm.ValueMappingResult(text=text, color=color)
        for value, (text, color) in options.items()})]


PORT_LINK = (db.DashboardLink("Port detail")
             .url("/d/ibmon-port-detail/ibmon-port-detail?${datasource:queryparam}"
                  "&var-node=${__data.fields.node_desc}&var-port=${__data.fields.port}"))
STATE_MAPPINGS = _value_mappings({
    "1": ("Down", "red"), "2": ("Init", "orange"), "3": ("Armed", "orange"),
    "4": ("Active", "green"), "5": ("ActiveDefer", "orange")})
PHYS_MAPPINGS = _value_mappings({
    "1": ("Sleep", "red"), "2": ("Polling", "red"), "3": ("Disabled", "red"),
    "4": ("Training", "orange"), "5": ("LinkUp", "green"), "6": ("ErrorRecovery", "orange"),
    "7": ("PhyTest", "orange")})


# --- dashboards -----------------------------------------------------------------------------


def _variable_datasource() -> db.DatasourceVariable:
    return (db.DatasourceVariable("datasource").label("Data source").type("prometheus")
            .hide(dm.VariableHide.DONT_HIDE).regex("").multi(False).include_all(False))


def _variable_query(name: str, label: str, query: str, *, multi: bool = False,
                    include_all: bool = False, hide: int = 0) -> db.QueryVariable:
    var = (db.QueryVariable(name).label(label).datasource(DS)
           .query({"query": query, "refId": f"{name}-var"})
           .hide(dm.VariableHide(hide)).refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
           .regex("").sort(dm.VariableSort.ALPHABETICAL_ASC).multi(multi)
           .include_all(include_all))
    if include_all:
        var.all_value(".*")
    return var


def dashboard(uid: str, title: str, description: str, panels: Sequence[Panel | db.Row],
              variables: Sequence[Builder[dm.VariableModel]] = ()) -> Json:
    """The dashboard as JSON. Panels flow left to right, top to bottom, on Grafana's 24-column
    grid (the builder lays them out); ids are their positions, so they are stable."""
    board = (db.Dashboard(title).uid(uid).description(description).tags(["ibmon", "infiniband"])
             .editable().tooltip(dm.DashboardCursorSync.CROSSHAIR).refresh("30s")
             .time("now-3h", "now").timezone("")
             .link(db.DashboardLink("ibmon").type(dm.DashboardLinkType.DASHBOARDS)
                   .tags(["ibmon"]).as_dropdown(True).include_vars(False).keep_time(True)))
    board.with_variable(_variable_datasource())
    for var in variables:
        board.with_variable(var)
    for i, panel in enumerate(panels, start=1):
        if isinstance(panel, db.Row):
            board.with_row(panel.id(i))
        else:
            board.with_panel(panel.id(i))
    data: Json = json.loads(JSONEncoder(sort_keys=True).encode(board.build()))
    return data


def overview() -> Json:
    tx = one(f"rate(ibmon_port_transmit_data_bytes_total[{RI}])")
    return dashboard("ibmon-overview", "ibmon / Fabric overview",
                     "Throughput, the busiest and most erroring ports, active conditions and "
                     "events across the fabric.", [
        stat("Fabric throughput", "Sum of all ports' transmitted data.",
             f"sum({tx})", "Bps"),
        stat("Ports", "Ports ibmon reports, from every source.",
             "count(max by (guid, port) (ibmon_port_info))", "none"),
        stat("Active conditions", "Ports with a detector firing (down, BER, congestion...).",
             active(), "none",
             thresholds=((None, "green"), (1, "orange"))),
        stat("Ports down", "Ports that were active and are now down.",
             active("down"), "none",
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
              "(recording rule guid_port_counter:ibmon_port_errors:rate5m, summed per port).",
              "topk(10, sum by (guid, port) ("
              f"{one('guid_port_counter:ibmon_port_errors:rate5m')}) {NODE})", "cps",
              columns=("node_desc", "port", "guid"), value_name="Errors/s", links=[PORT_LINK]),
        table("Active conditions", "Every port a detector currently flags, with its peer.",
              f"{one('ibmon_port_condition')} {NODE}", "none",
              columns=("node_desc", "port", "condition", "guid"), value_name="Active",
              links=[PORT_LINK]),
        timeseries("Events", "Events the detectors emitted, by type and severity.",
                   [(f"sum by (type, severity) ({one(f'increase(ibmon_events_total[{RI}])')})",
                     "{{type}} ({{severity}})")], "none", bars=True),
    ])


def congestion() -> Json:
    wait = one(f"rate(ibmon_port_transmit_wait_seconds_total[{RI}])")
    util_tx = one('ibmon_port_utilization_ratio{direction="transmit"}')
    sw = ('max by (guid, port, node_desc) '
          '(ibmon_port_info{node_type="switch", node_desc=~"$switch"})')
    return dashboard("ibmon-congestion", "ibmon / Congestion",
                     "Where the fabric waits: the stall fraction per switch port, and whether a "
                     "congested port is a hotspot (busy) or suffers backpressure (idle, blocked "
                     "downstream).", [
        heatmap("Transmit wait by switch port",
                "Fraction of time each switch port had data but sent nothing (PortXmitWait in "
                "the port's unit over its data rate). One row per port; dark is congested.",
                f"max by (guid, port) (rate(ibmon_port_transmit_wait_seconds_total[{RI}])) "
                f"* on(guid, port) group_left(node_desc) {sw}",
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
        timeseries("Most congested switches", "Highest stall fraction of any port, per "
                   "switch (recording rule guid:ibmon_switch_transmit_wait:max_ratio).",
                   [("topk(10, guid:ibmon_switch_transmit_wait:max_ratio * on(guid) "
                     f"group_left(node_desc) {SWITCH_NAMES})", "{{node_desc}}")],
                   "percentunit"),
        timeseries("Transmit wait counts", "Raw PortXmitWait increase per second, top 10 "
                   "ports; one count's size is device-defined "
                   "(ibmon_port_transmit_wait_unit_bytes).",
                   [(f"topk(10, {one(f'rate(ibmon_port_transmit_wait_ticks_total[{RI}])')} "
                     f"{NODE})",
                     "{{node_desc}} [{{port}}]")], "cps"),
        table("Congested ports now", "Ports the congestion detector flags, with their stall "
              "fraction.",
              f"{wait} and on(guid, port) ibmon_port_condition{{condition=\"congestion\"}} "
              f"{NODE}", "percentunit", w=24, columns=("node_desc", "port", "guid"),
              value_name="Stall fraction", links=[PORT_LINK]),
    ], variables=[_variable_query("switch", "Switch",
                                  'label_values(ibmon_port_info{node_type="switch"}, node_desc)',
                                  multi=True, include_all=True)])


def link_health() -> Json:
    return dashboard("ibmon-link-health", "ibmon / Link health",
                     "Bit error rate, symbol errors, flaps, integrity errors and links running "
                     "below their capability.", [
        stat("High BER", "Ports whose symbol-error BER the detector flags.",
             active("high_ber"), "none",
             thresholds=((None, "green"), (1, "orange"))),
        stat("Flapping", f"Links with {FLAP_RULE}.",
             active("flapping"), "none",
             thresholds=((None, "green"), (1, "orange"))),
        stat("Degraded", "Links below the width or speed both ends support.",
             active("degraded"), "none",
             thresholds=((None, "green"), (1, "orange"))),
        stat("Integrity errors", "Ports with recent local link integrity or buffer overrun "
             "errors.",
             active("link_integrity"),
             "none", thresholds=((None, "green"), (1, "red"))),
        timeseries("Symbol error BER (worst 10)", "Symbol errors over bits carried, over "
                   f"ibmon's sliding window. IBTA limit 1e-12; ibmon warns at {_BER.warning:g} "
                   f"and is critical at {_BER.critical:g}.",
                   [(f"topk(10, {one('ibmon_port_symbol_error_ber')} > 0) {NODE}",
                     "{{node_desc}} [{{port}}]")], "sci", log=True),
        timeseries("Symbol errors per second (worst 10)", "Rate of SymbolErrorCounter.",
                   [(f"topk(10, {one(f'rate(ibmon_port_symbol_errors_total[{RI}])')} {NODE})",
                     "{{node_desc}} [{{port}}]")], "cps"),
        timeseries("Link downs (flaps)", "LinkDownedCounter increases per port; "
                   f"{FLAP_RULE} is flapping.",
                   [(f"topk(10, {one(f'increase(ibmon_port_link_downed_total[{RI}])')} {NODE})",
                     "{{node_desc}} [{{port}}]")], "none", bars=True),
        timeseries("Link error recoveries and integrity errors", "Retrains, local link "
                   "integrity and excessive buffer overrun errors per second, top 10.",
                   [(f"topk(10, {one(f'rate(ibmon_port_link_error_recovery_total[{RI}])')} "
                     f"{NODE})",
                     "{{node_desc}} [{{port}}] recovery"),
                    (f"topk(10, "
                     f"{one(f'rate(ibmon_port_local_link_integrity_errors_total[{RI}])')} "
                     f"{NODE})", "{{node_desc}} [{{port}}] integrity"),
                    (f"topk(10, "
                     f"{one(f'rate(ibmon_port_excessive_buffer_overrun_errors_total[{RI}])')} "
                     f"{NODE})", "{{node_desc}} [{{port}}] overrun")], "cps"),
        table("Links below capability", "Degraded links: active width and speed versus the "
              "best both ends support and have enabled.",
              f"{one('ibmon_link_info')} and on(guid, port) "
              'ibmon_port_condition{condition="degraded"}', "none", w=24,
              columns=("guid", "port", "active_width", "active_speed", "max_width",
                       "max_speed", "remote_node_desc", "remote_port"), value_name="Degraded"),
        table("Links with errors", "Per-port error rates over 5 minutes by counter "
              "(recording rule guid_port_counter:ibmon_port_errors:rate5m).",
              f"({one('guid_port_counter:ibmon_port_errors:rate5m')} > 0) {NODE}", "cps", w=24,
              columns=("node_desc", "port", "counter", "guid"), value_name="Per second",
              links=[PORT_LINK]),
    ])


def port_detail() -> Json:
    here = 'guid="$guid", port="$port"'
    peer = 'guid="$peer_guid", port="$peer_port"'
    ends = (("this end", here), ("peer", peer))

    def both(expr: str, legend: str = "") -> list[tuple[str, str]]:
        return [(one(expr.replace("SEL", sel)), f"{name}{legend}") for name, sel in ends]

    return dashboard("ibmon-port-detail", "ibmon / Port detail",
                     "One port and the port at the other end of its cable.", [
        stat("State", "IBA PortState of this end.", one(f"ibmon_port_state{{{here}}}"), "none",
             mappings=STATE_MAPPINGS, w=4),
        stat("Physical state", "IBA PortPhysicalState of this end.",
             one(f"ibmon_port_physical_state{{{here}}}"), "none", mappings=PHYS_MAPPINGS, w=4),
        stat("Link rate", "Effective data rate of the link.",
             one(f"ibmon_port_rate_bytes_per_second{{{here}}}"), "Bps", w=4),
        stat("Peer state", "IBA PortState of the far end.", one(f"ibmon_port_state{{{peer}}}"),
             "none", mappings=STATE_MAPPINGS, w=4),
        table("Link", "Width and speed: active versus the best both ends support.",
              one(f"ibmon_link_info{{{here}}}"), "none", w=8,
              columns=("remote_node_desc", "remote_port", "active_width", "active_speed",
                       "max_width", "max_speed"), value_name="Info"),
        timeseries("Throughput", "Data sent (+) per second at both ends.",
                   both(f"rate(ibmon_port_transmit_data_bytes_total{{SEL}}[{RI}])", " transmit")
                   + both(f"rate(ibmon_port_receive_data_bytes_total{{SEL}}[{RI}])",
                          " receive"), "Bps"),
        timeseries("Utilization", "Data rate over link rate, latest poll, both ends.",
                   both("ibmon_port_utilization_ratio{SEL}", " {{direction}}"), "percentunit"),
        timeseries("Transmit stall fraction", "Time the port had data but sent nothing "
                   "(PortXmitWait in the port's unit over its data rate).",
                   both(f"rate(ibmon_port_transmit_wait_seconds_total{{SEL}}[{RI}])"),
                   "percentunit"),
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
              one(f"ibmon_port_condition{{{here}}} or ibmon_port_condition{{{peer}}}"), "none",
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
                     "staleness and MQTT. Per daemon: each replica of an HA pair is a daemon "
                     "of its own here (a dead replica shows); events are counted once.", [
        stat("Sources up", "Sources whose latest poll succeeded, out of all.",
             "sum(ibmon_source_up)", "none", legend="up"),
        stat("Sources down", "Sources whose latest poll failed.",
             "count(ibmon_source_up == 0) or vector(0)", "none",
             thresholds=((None, "green"), (1, "red"))),
        stat("MQTT connected", "1 when connected to the broker (absent when MQTT is off).",
             "min(ibmon_mqtt_connected)", "none",
             mappings=_value_mappings({"0": ("disconnected", "red"),
                                       "1": ("connected", "green")})),
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
                   [(f"sum by (instance, source, reason) "
                     f"(rate(ibmon_source_poll_errors_total[{RI}])) "
                     "or on(instance, source) sum by (instance, source) (0 * ibmon_source_up)",
                     "{{instance}} {{source}} {{reason}}")], "cps"),
        timeseries("Data age", "Seconds since each source's last successful poll.",
                   [("time() - ibmon_source_last_success_timestamp_seconds",
                     "{{instance}} {{source}}")],
                   "s", minimum=None),
        timeseries("Ports per source", "Ports each source reported in its latest poll.",
                   [("ibmon_source_ports", "{{instance}} {{source}}")], "none"),
        timeseries("MQTT messages", "Messages published and dropped per second.",
                   [(f"sum(rate(ibmon_mqtt_published_total[{RI}]))", "published"),
                    (f"sum(rate(ibmon_mqtt_dropped_total[{RI}]))", "dropped")], "cps"),
        timeseries("Events", "Detector events per second by type.",
                   [(f"sum by (type) ({one(f'rate(ibmon_events_total[{RI}])')})", "{{type}}")],
                   "cps"),
        table("Versions", "Running ibmon versions.", "ibmon_build_info", "none", w=24,
              columns=("instance", "version", "python"), value_name="Running"),
    ], variables=[_variable_query("job", "Job", "label_values(ibmon_build_info, job)",
                                  multi=True, include_all=True)])


def fabric_map() -> Json:
    """Nodes and cables with the conditions on them. The node graph is Grafana's only panel
    that draws a graph, and it takes plain frames, so two Prometheus table queries can feed it
    (``node_graph``) without a plugin. The table below it lists the cable ends with conditions,
    for fabrics beyond the node graph's 1,500 nodes and for sorting."""
    conditions = f"count by (guid, port) ({one('ibmon_port_condition')} == 1)"
    nodes = (
        'label_replace(label_replace(label_replace(\n'
        "  max by (guid, node_desc, node_type) (ibmon_port_info)\n"
        "  * on(guid) group_left() (\n"
        f"    count by (guid) ({one('ibmon_port_condition')} == 1)\n"
        "    or on(guid) 0 * max by (guid) (ibmon_port_info)\n"
        "  ),\n"
        '"id", "$1", "guid", "(.*)"), "title", "$1", "node_desc", "(.*)"), '
        '"subtitle", "$1", "node_type", "(.*)")'
    )
    edges = (
        "label_replace(label_replace(label_join(\n"
        "  max by (guid, port, remote_guid) (ibmon_link_info)\n"
        "  * on(guid, port) group_left() (\n"
        f"    {conditions}\n"
        "    or on(guid, port) 0 * max by (guid, port) (ibmon_link_info)\n"
        "  ),\n"
        '"id", "/", "guid", "port"), "source", "$1", "guid", "(.*)"), '
        '"target", "$1", "remote_guid", "(.*)")'
    )
    return dashboard("ibmon-fabric-map", "ibmon / Fabric map",
                     "The fabric as a graph of nodes and cables (fabric sources: ibmon_link_info),"
                     " with the conditions active on each.", [
        node_graph("Fabric map", "Every node (switch or HCA) and every cable ibmon's fabric "
                   "sources know. A node's number is how many of its ports have an active "
                   "condition; an edge's number is the conditions active at the port it "
                   "leaves from (each cable is drawn once from each end). Grafana's node graph "
                   "shows at most 1,500 nodes: on a larger fabric use the table below.",
                   nodes, edges),
        table("Links and their conditions", "Every cable end with a detector firing, with "
              "its peer: the map's non-zero numbers as rows.",
              f"{one('ibmon_port_condition')} * on(guid, port) "
              "group_left(remote_node_desc, remote_port) "
              "max by (guid, port, remote_node_desc, remote_port) (ibmon_link_info) "
              f"{NODE}", "none", w=24,
              columns=("node_desc", "port", "condition", "remote_node_desc", "remote_port",
                       "guid"), value_name="Active", links=[PORT_LINK]),
    ])


JOB = 'job_id=~"$job_id"'
#: A job's descriptive labels joined onto its series (one series per job, however many daemons).
JOB_NAMES = ("* on(fabric, job_id) group_left(user, name) "
             "max by (fabric, job_id, user, name) (ibmon_job_info)")


def jobs() -> Json:
    """Running jobs (a job source such as [slurm]): a job's traffic, whether its rates are
    exact, and the conditions on the links it uses. Job series exist for running jobs only, so
    a finished job leaves the picker; its history stays in the panels' time range."""
    tx = one(f"ibmon_job_transmit_bytes_per_second{{{JOB}}}")
    rx = one(f"ibmon_job_receive_bytes_per_second{{{JOB}}}")
    return dashboard("ibmon-jobs", "ibmon / Jobs",
                     "Which jobs run on the fabric, how much they send and receive, and which "
                     "faults and congestion they ran into (a job source such as [slurm] must be "
                     "configured).", [
        stat("Running jobs", "Jobs the scheduler lists as running.",
             f"count({one('ibmon_job_info')}) or vector(0)", "none"),
        stat("Jobs hit by a condition", "Running jobs with a condition firing on a link they "
             "use (their hosts' links, or inter-switch links their traffic is routed over).",
             f"count(count by (fabric, job_id) ({one('ibmon_job_affected')})) or vector(0)",
             "none", thresholds=((None, "green"), (1, "orange"))),
        stat("Jobs known", "0 while the scheduler cannot be asked (missing, failing, hanging): "
             "then no job series exist.", "min(ibmon_jobs_known)", "none",
             mappings=_value_mappings({"0": ("unknown", "red"), "1": ("known", "green")})),
        stat("Job hosts without a port", "Hosts of running jobs that matched no HCA port: "
             "their traffic and faults are not attributed (check node descriptions or "
             "[slurm] host_pattern).", f"max({one('ibmon_job_hosts_unmatched')})", "none",
             thresholds=((None, "green"), (1, "orange"))),
        timeseries("Transmit rate", "Data the job's hosts' HCA ports send, summed over them. "
                   "Exact only for a job with its hosts to itself (shared hosts: see below).",
                   [(f"{tx} {JOB_NAMES}", "{{job_id}} {{name}} ({{user}})")], "Bps"),
        timeseries("Receive rate", "Data the job's hosts' HCA ports receive, summed over them. "
                   "Exact only for a job with its hosts to itself.",
                   [(f"{rx} {JOB_NAMES}", "{{job_id}} {{name}} ({{user}})")], "Bps"),
        timeseries("Shared hosts", "Hosts the job shares with another job: its rates include "
                   "the other job's traffic while this is above 0.",
                   [(f"{one(f'ibmon_job_shared_hosts{{{JOB}}}')} {JOB_NAMES}",
                     "{{job_id}} {{name}}")], "none"),
        timeseries("Conditions it ran into", "1 while a condition fires on a link the job "
                   "uses, per condition.",
                   [(f"{one(f'ibmon_job_affected{{{JOB}}}')} {JOB_NAMES}",
                     "{{job_id}} {{name}}: {{condition}}")], "none", bars=True),
        table("Affected jobs now", "Running jobs with a condition firing on a link they use. "
              "`ibmon jobs ID` lists the job's hosts, ports and links.",
              f"{one('ibmon_job_affected')} * on(fabric, job_id) group_left(user, name, "
              "partition) max by (fabric, job_id, user, name, partition) (ibmon_job_info)",
              "none", w=24, columns=("job_id", "user", "name", "partition", "condition",
                                     "fabric"), value_name="Active"),
        table("Jobs", "The running jobs picked above with their current rates.",
              f"{tx} * on(fabric, job_id) group_left(user, name, partition) "
              "max by (fabric, job_id, user, name, partition) (ibmon_job_info)",
              "Bps", w=24, columns=("job_id", "user", "name", "partition", "fabric"),
              value_name="Transmit"),
    ], variables=[
        _variable_query("user", "User", "label_values(ibmon_job_info, user)", multi=True,
                        include_all=True),
        _variable_query("job_id", "Job", 'label_values(ibmon_job_info{user=~"$user"}, job_id)',
                        multi=True, include_all=True),
    ])


DASHBOARDS = {
    "ibmon-overview.json": overview,
    "ibmon-congestion.json": congestion,
    "ibmon-link-health.json": link_health,
    "ibmon-port-detail.json": port_detail,
    "ibmon-health.json": health,
    "ibmon-fabric-map.json": fabric_map,
    "ibmon-jobs.json": jobs,
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
