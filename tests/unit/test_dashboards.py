"""The committed Grafana dashboards: fresh, consistent, and every query valid PromQL."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.promql_sources import (
    DASHBOARD_DIR,
    dashboard_exprs,
    load_build,
    substitute,
    variable_queries,
)
from tests.syspkg import require_binary

BOARDS = sorted(DASHBOARD_DIR.glob("*.json"))
DS_UID = "${datasource}"
# Stand-ins for the dashboards' variables when checking syntax.
VARS = {"datasource": "prom", "switch": ".*", "job": ".*", "node": "host01 HCA-1", "port": "1",
        "guid": "0x0002c90300000001", "peer_guid": "0x0002c90300000101", "peer_port": "7",
        "user": ".*", "job_id": ".*"}


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in board["panels"] if p["type"] != "row"]


def test_the_seven_dashboards_are_committed() -> None:
    assert [p.name for p in BOARDS] == [
        "ibmon-congestion.json", "ibmon-fabric-map.json", "ibmon-health.json",
        "ibmon-jobs.json", "ibmon-link-health.json", "ibmon-overview.json",
        "ibmon-port-detail.json",
    ]


def test_committed_json_matches_the_generator(tmp_path: Path) -> None:
    build = load_build()
    stale = build.check()
    assert stale == [], f"stale dashboards {stale}: run .venv/bin/python grafana/build.py"
    # and the check itself notices an edited copy
    build.write(tmp_path)
    edited = tmp_path / "ibmon-overview.json"
    edited.write_text(edited.read_text().replace("Fabric throughput", "Throughput", 1))
    assert build.check(tmp_path) == ["ibmon-overview.json"]


@pytest.mark.parametrize("path", BOARDS, ids=lambda p: p.name)
def test_every_panel_has_datasource_variable_and_unit(path: Path) -> None:
    board = load(path)
    ds_vars = [v for v in board["templating"]["list"] if v["type"] == "datasource"]
    assert [(v["name"], v["query"]) for v in ds_vars] == [("datasource", "prometheus")]
    for panel in panels(board):
        title = panel["title"]
        assert panel["datasource"]["uid"] == DS_UID, title
        assert panel["targets"], f"{title}: no queries"
        for tgt in panel["targets"]:
            assert tgt["datasource"]["uid"] == DS_UID, title
        unit = panel["fieldConfig"]["defaults"].get("unit")
        assert isinstance(unit, str), f"{title}: no unit"
        assert unit, f"{title}: empty unit"
        assert panel.get("description"), f"{title}: no description"


@pytest.mark.parametrize("path", BOARDS, ids=lambda p: p.name)
def test_rates_use_rate_interval_and_counters_never_delta(path: Path) -> None:
    for panel in panels(load(path)):
        for tgt in panel["targets"]:
            expr = tgt["expr"]
            assert "delta(" not in expr, f"{panel['title']}: delta() on a counter"
            ranges = re.findall(r"\[([^\]]*)\]", expr)
            if re.search(r"\b(rate|irate|increase)\(", expr):
                assert ranges, f"{panel['title']}: rate without range"
            assert all(r == "$__rate_interval" for r in ranges), (
                f"{panel['title']}: range {ranges} is not $__rate_interval"
            )


@pytest.mark.parametrize("path", BOARDS, ids=lambda p: p.name)
def test_variables_used_are_defined_and_layout_fits(path: Path) -> None:
    board = load(path)
    defined = {v["name"] for v in board["templating"]["list"]}
    text = json.dumps(board["panels"]) + json.dumps(board["templating"])
    # "$1" is label_replace's capture group, which Grafana leaves alone (no such variable)
    used = {n for n in re.findall(r"\$\{?(\w+)", text) if not n.isdigit()}
    used -= {"__rate_interval", "__data"}
    assert used <= defined, f"undefined variables {used - defined}"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for p in board["panels"]:
        pos = p["gridPos"]
        assert pos["x"] >= 0, p["title"]
        assert pos["x"] + pos["w"] <= 24, p["title"]


def test_port_detail_shows_both_ends_of_the_link() -> None:
    board = load(DASHBOARD_DIR / "ibmon-port-detail.json")
    names = [v["name"] for v in board["templating"]["list"]]
    assert names[:3] == ["datasource", "node", "port"]
    for panel in panels(board):
        if panel["type"] == "timeseries":
            exprs = " ".join(t["expr"] for t in panel["targets"])
            assert '$guid", port="$port"' in exprs, panel["title"]
            assert '$peer_guid", port="$peer_port"' in exprs, panel["title"]


def test_congestion_has_heatmap_and_hotspot_backpressure_split() -> None:
    board = load(DASHBOARD_DIR / "ibmon-congestion.json")
    kinds = {p["title"]: p["type"] for p in panels(board)}
    assert kinds["Transmit wait by switch port"] == "heatmap"
    assert any(t.startswith("Hotspots") for t in kinds)
    assert any(t.startswith("Backpressure") for t in kinds)


@pytest.mark.system
def test_every_dashboard_query_parses(tmp_path: Path) -> None:
    """promtool parses each query (variables substituted) as a recording rule expression."""
    promtool = require_binary("promtool")
    exprs = dashboard_exprs() + variable_queries()
    rules = [{"record": f"dashboard_check_{i}", "expr": substitute(e.expr, VARS)}
             for i, e in enumerate(exprs)]
    path = tmp_path / "dashboards.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=60, check=False)
    where = {f"rule {i}": e.where for i, e in enumerate(exprs)}
    assert proc.returncode == 0, f"{proc.stdout}{proc.stderr}\n{where}"
    assert f"SUCCESS: {len(rules)} rules found" in proc.stdout
