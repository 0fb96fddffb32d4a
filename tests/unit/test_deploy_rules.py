"""deploy/: Prometheus rules (promtool), Alertmanager routing (amtool), the systemd unit
(systemd-analyze) and the example config (ibmon's own validation)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from ibmon.config import load_settings
from ibmon.detect.congestion import CongestionSettings
from ibmon.detect.engine import parse_detect_tables
from ibmon.detect.errors import HighBerSettings
from ibmon.detect.link import LinkFlappingSettings
from tests.promql_sources import ALERT_RULES, RECORDING_RULES, REPO, rule_exprs
from tests.syspkg import require_binary

DEPLOY = REPO / "deploy"
PROM = DEPLOY / "prometheus"
ALERT_TESTS = PROM / "tests" / "ibmon-alerts.test.yml"
RECORDING_TESTS = PROM / "tests" / "ibmon-recording.test.yml"
AM_CONFIG = DEPLOY / "alertmanager" / "alertmanager.yml"
UNIT = DEPLOY / "systemd" / "ibmon.service"
EXAMPLE_CONFIG = DEPLOY / "ibmon.toml"
# Keys newer than Debian 12's systemd 252; older versions warn "Unknown key" and ignore them.
NEWER_UNIT_KEYS = {"RestartSteps": 254, "RestartMaxDelaySec": 254}
# Example values in ibmon.toml that are not defaults (the default is "unset").
EXAMPLE_NON_DEFAULTS: dict[str, dict[str, Any]] = {"link_degraded": {"expected_rate_gbps": 100}}


def run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, **kw)


def alerts() -> list[dict[str, Any]]:
    data = yaml.safe_load(ALERT_RULES.read_text(encoding="utf-8"))
    return [r for g in data["groups"] for r in g["rules"] if "alert" in r]


# --- Prometheus rules -----------------------------------------------------------------------


@pytest.mark.system
@pytest.mark.parametrize("path", [RECORDING_RULES, ALERT_RULES], ids=lambda p: p.name)
def test_promtool_check_rules(path: Path) -> None:
    proc = run([require_binary("promtool"), "check", "rules", str(path)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


@pytest.mark.system
@pytest.mark.parametrize("path", [ALERT_TESTS, RECORDING_TESTS], ids=lambda p: p.name)
def test_promtool_unit_tests(path: Path) -> None:
    proc = run([require_binary("promtool"), "test", "rules", path.name], cwd=path.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


@pytest.mark.system
def test_example_prometheus_config_loads_the_rules(tmp_path: Path) -> None:
    text = (PROM / "prometheus.yml").read_text(encoding="utf-8")
    for rules in (RECORDING_RULES, ALERT_RULES):
        (tmp_path / rules.name).write_text(rules.read_text(encoding="utf-8"))
    text = text.replace("/etc/prometheus/rules/", f"{tmp_path}/")
    config = tmp_path / "prometheus.yml"
    config.write_text(text)
    proc = run([require_binary("promtool"), "check", "config", str(config)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 rule files found" in proc.stdout
    job = yaml.safe_load(text)["scrape_configs"][0]["job_name"]
    assert any('up{job="' + job + '"}' in r["expr"] for r in alerts())


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    tests = yaml.safe_load(ALERT_TESTS.read_text(encoding="utf-8"))["tests"]
    fired: set[tuple[str, str]] = set()
    quiet: set[str] = set()
    for case in tests:
        for t in case.get("alert_rule_test", []):
            if t["exp_alerts"]:
                fired.update((t["alertname"], a["exp_labels"]["severity"]) for a in t["exp_alerts"])
            else:
                quiet.add(t["alertname"])
    for rule in alerts():
        key = (rule["alert"], rule["labels"]["severity"])
        assert key in fired, f"no test where {key} fires"
        assert rule["alert"] in quiet, f"no test where {rule['alert']} stays quiet"


def test_alerts_carry_runbook_annotations_and_severity() -> None:
    for rule in alerts():
        name = rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        summary = rule["annotations"]["summary"]
        description = rule["annotations"]["description"]
        assert len(description) > 120, f"{name}: description too short to act on"
        if name.startswith("IB"):  # port alerts name the node, port and, except counters, peer
            assert "$labels.node_desc" in summary, name
            assert "$labels.port" in summary, name
            assert "$labels.remote_node_desc" in summary or name == "IBCounterSaturated", name
            assert "group_left(node_desc, node_type, remote_node_desc, remote_port, switch)" in (
                rule["expr"]), name
        if name not in {"IbmonDown", "IbmonMQTTDisconnected", "IbmonConfigReloadFailed"}:  # value 0
            quoted = ("$value", "$labels.counter", "| query")
            assert any(q in description for q in quoted), (
                f"{name}: description should quote the measured value"
            )


def test_rules_use_rate_or_increase_on_counters_never_delta() -> None:
    for e in rule_exprs(RECORDING_RULES) + rule_exprs(ALERT_RULES):
        assert "delta(" not in e.expr, e.where
        for m in re.finditer(r"(?<![\w:])ibmon_\w+_(?:total|bucket)\b", e.expr):
            before = e.expr[: m.start()]
            assert re.search(r"\b(rate|increase)\($", before), (
                f"{e.where}: counter {m.group()} not inside rate()/increase()"
            )


def _alert(name: str, severity: str) -> dict[str, Any]:
    (rule,) = [r for r in alerts() if r["alert"] == name and r["labels"]["severity"] == severity]
    return rule


def _threshold(expr: str, metric: str) -> float:
    # the series alone, or its one-per-port max (HA pairs): `max by (guid, port) (metric) >= x`
    (value,) = re.findall(rf"{re.escape(metric)}\)?\s*>=\s*([0-9.e+-]+)", expr)
    return float(value)


def test_rule_levels_equal_the_detector_defaults() -> None:
    """The levels the rules restate (their header says so) are the [detect] defaults."""
    ber, congestion, flap = HighBerSettings(), CongestionSettings(), LinkFlappingSettings()
    rule = _alert("IBLinkHighBER", "critical")
    assert _threshold(rule["expr"], "ibmon_port_symbol_error_ber") == ber.critical
    assert f"critical at {ber.critical:g}" in rule["annotations"]["description"]
    rule = _alert("IBPortCongestion", "critical")
    assert _threshold(rule["expr"], "rate(ibmon_port_transmit_wait_seconds_total[5m])") == (
        congestion.critical)
    assert f"critical at {congestion.critical:.0%}" in rule["annotations"]["description"]
    # the warning's runbook tells hotspot from backpressure at the detector's utilization
    text = _alert("IBPortCongestion", "warning")["annotations"]["description"]
    assert f"ge (first . | value) {congestion.hotspot_utilization}" in text
    rule = _alert("IBLinkFlapping", "warning")
    assert f"[{flap.window / 60:g}m]" in rule["expr"]
    assert f"ibmon flags {flap.count} or more" in rule["annotations"]["description"]
    header = ALERT_RULES.read_text(encoding="utf-8").split("groups:", 1)[0]
    assert f"BER >= {ber.critical:g}" in header
    assert f"ibmon_port_transmit_wait_seconds_total, >= {congestion.critical:g}" in header


# --- Alertmanager ---------------------------------------------------------------------------


@pytest.mark.system
def test_amtool_check_config() -> None:
    proc = run([require_binary("amtool"), "check-config", str(AM_CONFIG)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


@pytest.mark.system
@pytest.mark.parametrize(("labels", "receivers"), [
    (["alertname=IBPortDown", "severity=critical", "switch=leaf01"], "pager,chat"),
    (["alertname=IBLinkHighBER", "severity=warning", "switch=leaf01"], "chat"),
    (["alertname=IbmonDown", "severity=critical", "instance=mgmt01:9683"], "pager,chat"),
    (["alertname=IbmonDataStale", "severity=warning", "instance=mgmt01:9683"], "chat"),
])
def test_critical_pages_and_warnings_go_to_chat(labels: list[str], receivers: str) -> None:
    proc = run([require_binary("amtool"), "config", "routes", "test",
                f"--config.file={AM_CONFIG}", *labels])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == receivers


def test_port_alerts_grouped_by_switch_and_down_inhibits_ber_and_flaps() -> None:
    cfg = yaml.safe_load(AM_CONFIG.read_text(encoding="utf-8"))
    port_route = next(r for r in cfg["route"]["routes"] if r["matchers"] == ['switch=~".+"'])
    assert port_route["group_by"] == ["switch"]
    down = next(i for i in cfg["inhibit_rules"]
                if i["source_matchers"] == ['alertname="IBPortDown"'])
    targets = down["target_matchers"][0]
    assert "IBLinkHighBER" in targets
    assert "IBLinkFlapping" in targets
    assert down["equal"] == ["guid", "port"]
    # every alert name an inhibit rule mentions exists
    names = {r["alert"] for r in alerts()}
    for rule in cfg["inhibit_rules"]:
        for matcher in rule["source_matchers"] + rule["target_matchers"]:
            m = re.fullmatch(r'alertname=~?"(.*)"', matcher)
            if m:
                assert set(m.group(1).split("|")) <= names, matcher


# --- systemd --------------------------------------------------------------------------------


def _systemd_version(analyze: str) -> int:
    out = run([analyze, "--version"]).stdout
    m = re.search(r"systemd (\d+)", out)
    assert m, out
    return int(m.group(1))


@pytest.mark.system
def test_systemd_unit_verifies(tmp_path: Path) -> None:
    analyze = require_binary("systemd-analyze")
    version = _systemd_version(analyze)
    # verify checks that ExecStart exists: point it at this checkout's ibmon.
    ibmon = Path(sys.executable).with_name("ibmon")
    assert ibmon.is_file(), ibmon
    unit = tmp_path / "ibmon.service"
    unit.write_text(UNIT.read_text(encoding="utf-8").replace("/opt/ibmon/bin/ibmon", str(ibmon)))
    proc = run([analyze, "verify", str(unit)])
    problems = [
        line for line in (proc.stdout + proc.stderr).splitlines()
        if line.strip()
        and not any(f"Unknown key '{key}'" in line and version < since
                    for key, since in NEWER_UNIT_KEYS.items())
    ]
    assert not problems, "\n".join(problems)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.system
def test_systemd_security_rating_is_ok() -> None:
    analyze = require_binary("systemd-analyze")
    proc = run([analyze, "security", "--offline=yes", "--threshold=20", str(UNIT)])
    m = re.search(r"Overall exposure level for ibmon.service: (\d+\.\d+) (\w+)", proc.stdout)
    assert m, proc.stdout + proc.stderr
    assert float(m.group(1)) <= 2.0, proc.stdout
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_unit_is_notify_with_watchdog_and_hardening() -> None:
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text(encoding="utf-8").splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            settings.setdefault(key, []).append(value)
    expected = {
        "Type": "notify", "KillMode": "control-group", "Restart": "on-failure",
        "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
        "NoNewPrivileges": "yes", "CapabilityBoundingSet": "", "StateDirectory": "ibmon",
        "User": "ibmon", "NotifyAccess": "main",
    }
    for key, value in expected.items():
        assert settings.get(key) == [value], key
    # the service set minus privileged and resource calls, but setpriority: the bulk threads
    # lower their own priority (ibmon/runtime/sizes.py), and a filtered call fails with EPERM
    assert settings["SystemCallFilter"] == ["@system-service", "~@privileged @resources",
                                            "setpriority"]
    assert settings["SystemCallErrorNumber"] == ["EPERM"]
    assert "WatchdogSec" in settings
    assert "ExecReload" in settings
    assert settings["DeviceAllow"] == ["char-infiniband_mad rw"]
    # the state directory the unit makes writable is where the example config keeps state
    # (read the file itself: the test suite points IBMON_STATE__PATH at a temporary file)
    state = Path(tomllib.loads(EXAMPLE_CONFIG.read_text(encoding="utf-8"))["state"]["path"])
    assert state.parent == Path("/var/lib") / settings["StateDirectory"][0]


# --- example config -------------------------------------------------------------------------


def test_example_config_passes_check_config() -> None:
    proc = run([str(Path(sys.executable).with_name("ibmon")), "check-config",
                str(EXAMPLE_CONFIG)])
    assert proc.returncode == 0, proc.stderr
    assert "OK" in proc.stdout


def _uncommented(text: str) -> str:
    """The example with every commented-out setting and table switched on."""
    out = []
    for line in text.splitlines():
        m = re.match(r"# (\[\[?[a-z_.]+\]\]?|[a-z_]+ = .*?)(\s+#.*)?$", line)
        out.append(m.group(1) if m else line)
    return "\n".join(out) + "\n"


def test_every_commented_example_setting_is_valid(tmp_path: Path) -> None:
    full = tmp_path / "full.toml"
    full.write_text(_uncommented(EXAMPLE_CONFIG.read_text(encoding="utf-8")))
    settings = load_settings(full)
    assert [s.type for s in settings.sources] == ["sysfs", "mad", "diags"]
    assert settings.mqtt is not None
    assert settings.mqtt.tls is not None
    tables = settings.detect.model_dump()
    detectors = parse_detect_tables(tables)
    assert set(detectors) == {"congestion", "high_ber", "link_flapping", "link_integrity",
                              "receive_errors", "discards", "link_degraded", "topology_changed"}
    # the example documents the defaults, so switching it all on changes no threshold; the one
    # exception is a value with no default (the rate expected of node-local ports)
    for name, model in detectors.items():
        default = type(model)().model_copy(update=EXAMPLE_NON_DEFAULTS.get(name, {}))
        assert model == default, f"[detect.{name}] example differs from the defaults"


def test_port_alerts_carry_the_cause_and_its_action_for_every_cause() -> None:
    """Every port alert (but a saturated counter's) is labelled with the cause ibmon decided,
    and its ``action`` annotation has, for every cause, the same sentence ibmon's events give."""
    from ibmon.detect.cause import ACTIONS, CAUSES, HOTSPOT_ACTION

    def go(text: str) -> str:
        return text.replace("{here}", "{{ $here }}").replace("{peer}", "{{ $peer }}")

    checked = 0
    for rule in alerts():
        name = rule["alert"]
        if not name.startswith("IB") or name == "IBCounterSaturated":
            continue
        checked += 1
        expr = rule["expr"]
        assert "group_left(cause)" in expr or '"cause", "physical"' in expr, name
        assert "likely cause {{ $labels.cause }}" in rule["annotations"]["summary"], name
        act = rule["annotations"]["action"]
        for cause in CAUSES:
            if cause != "unknown":
                assert f'eq $labels.cause "{cause}"' in act, (name, cause)
            hotspot = cause == "unknown" and name == "IBPortCongestion"
            assert go(HOTSPOT_ACTION if hotspot else ACTIONS[cause]) in act, (name, cause)
    assert checked >= 10
