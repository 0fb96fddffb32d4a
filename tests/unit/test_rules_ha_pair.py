"""HA pairs: two replicas of one shard export identical port series apart from ``instance`` (and
``pod`` under Kubernetes). Every shipped recording rule and port alert must answer the same with
the twin as without it, or a pair double-counts every dashboard sum and pages twice per fault.

Rather than a second hand-written copy of each promtool test, this replays every promtool test
in deploy/prometheus/tests with each port and link series doubled by a twin collector and
requires every expectation to hold unchanged. Daemon-level series (``ibmon_source_*``, ``up``,
``ibmon_shard_info``...) are not doubled: they describe one daemon, and their alerts are per
daemon on purpose (a broken replica must be fixed even while its twin covers for it).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.syspkg import require_binary

PROM = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
#: Every promtool test of port alerts (the shard-coverage test models its HA pairs itself).
TESTS = sorted(p for p in (PROM / "tests").glob("*.test.yml")
               if re.search(r"series: '(ibmon_port_|ibmon_link_)", p.read_text(encoding="utf-8")))
PORT_SERIES = re.compile(r"^(ibmon_port_|ibmon_link_)\w*\{")
INSTANCE = re.compile(r'instance="([^"]*)"')


def twin(series: str) -> str:
    """The same series as a second replica of the same shard exports it."""
    if INSTANCE.search(series):
        return INSTANCE.sub(r'instance="\1-twin",pod="ibmon-fabric-1"', series, count=1)
    return series.replace("{", '{instance="twin",pod="ibmon-fabric-1",', 1)


def with_twins(doc: dict[str, Any]) -> int:
    """Add a twin after every port/link input series; returns how many were added."""
    added = 0
    for case in doc["tests"]:
        doubled = []
        for item in case.get("input_series", []):
            doubled.append(item)
            if PORT_SERIES.match(item["series"]):
                doubled.append({**item, "series": twin(item["series"])})
                added += 1
        case["input_series"] = doubled
    return added


def test_twin_changes_only_the_collector() -> None:
    assert twin('ibmon_port_state{guid="g",port="1",instance="i",job="ibmon"}') == (
        'ibmon_port_state{guid="g",port="1",instance="i-twin",pod="ibmon-fabric-1",job="ibmon"}'
    )
    assert twin('ibmon_link_info{guid="g",port="1"}') == (
        'ibmon_link_info{instance="twin",pod="ibmon-fabric-1",guid="g",port="1"}'
    )


@pytest.mark.system
@pytest.mark.parametrize("path", TESTS, ids=lambda p: p.name)
def test_every_rule_test_holds_with_an_ha_twin(path: Path, tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert with_twins(doc) > 0, f"{path.name} has no port series to double"
    for rules in PROM.glob("*.rules.yml"):
        shutil.copy(rules, tmp_path / rules.name)
    (tmp_path / "tests").mkdir()
    twinned = tmp_path / "tests" / path.name
    twinned.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    proc = subprocess.run(
        [promtool, "test", "rules", twinned.name],
        cwd=twinned.parent, capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
