"""Every PromQL expression ibmon ships: dashboard panels and variables, recording and alert rules.

Shared by the dashboard, metric-name and end-to-end tests so they all check the same list.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

__all__ = [
    "ALERT_RULES",
    "BUILD_PY",
    "DASHBOARD_DIR",
    "RECORDING_RULES",
    "REPO",
    "Expr",
    "dashboard_exprs",
    "load_build",
    "metric_selectors",
    "rule_exprs",
    "substitute",
    "variable_queries",
]

REPO = Path(__file__).resolve().parents[1]
BUILD_PY = REPO / "grafana" / "build.py"
DASHBOARD_DIR = REPO / "grafana" / "dashboards"
PROM_DIR = REPO / "deploy" / "prometheus"
RECORDING_RULES = PROM_DIR / "ibmon-recording.rules.yml"
ALERT_RULES = PROM_DIR / "ibmon-alerts.rules.yml"


@dataclass(frozen=True)
class Expr:
    where: str  # "dashboard ibmon-overview.json / Busiest ports" or "rule IBPortDown"
    expr: str


@cache
def load_build() -> ModuleType:
    """grafana/build.py is a script, not a package: load it by path."""
    spec = importlib.util.spec_from_file_location("ibmon_grafana_build", BUILD_PY)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _committed_dashboards() -> dict[str, dict[str, Any]]:
    return {
        p.name: json.loads(p.read_text(encoding="utf-8"))
        for p in sorted(DASHBOARD_DIR.glob("*.json"))
    }


def dashboard_exprs() -> list[Expr]:
    """Panel queries of the committed JSON (what users import), not of the generator."""
    out = []
    for name, board in _committed_dashboards().items():
        for panel in board["panels"]:
            for tgt in panel.get("targets", []):
                out.append(Expr(f"dashboard {name} / {panel['title']} / {tgt['refId']}",
                                tgt["expr"]))
    return out


def variable_queries() -> list[Expr]:
    """``label_values(<selector>, label)`` variables, as the selector expression."""
    out = []
    for name, board in _committed_dashboards().items():
        for var in board["templating"]["list"]:
            if var["type"] != "query":
                continue
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", query)
            assert m, f"{name}: variable {var['name']} is not label_values(...)"
            out.append(Expr(f"dashboard {name} / variable {var['name']}", m.group(1)))
    return out


def rule_exprs(path: Path) -> list[Expr]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    out = []
    for group in data["groups"]:
        for rule in group["rules"]:
            name = rule.get("record") or rule["alert"]
            out.append(Expr(f"rule {name} ({path.name})", rule["expr"]))
    return out


def substitute(expr: str, values: dict[str, str], rate_interval: str = "1m") -> str:
    """Replace Grafana variables as Grafana would before sending the query."""
    expr = expr.replace("$__rate_interval", rate_interval)

    def var(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name.isdigit():  # label_replace's "$1": Grafana leaves names it does not know alone
            return m.group(0)
        if name not in values:
            raise KeyError(f"no value for ${name} in {expr!r}")
        return values[name]

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", var, expr)


_SELECTOR = re.compile(r"(?<![\w:])(ibmon_[a-z0-9_]+)(?![\w:])(\{[^}]*\})?")
_MATCHER = re.compile(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)")


def metric_selectors(expr: str) -> list[tuple[str, set[str]]]:
    """``ibmon_*`` metric names in ``expr`` with the label names their selectors match on.

    Recording-rule names (``level:metric:ops``) are not metric names and are skipped.
    """
    found = []
    for m in _SELECTOR.finditer(expr):
        labels = set(_MATCHER.findall(m.group(2) or ""))
        found.append((m.group(1), labels))
    return found
