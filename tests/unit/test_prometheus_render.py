"""The port exposition: exact text, grouping, escaping of hostile strings, promtool acceptance."""

from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporters.prometheus import exposition
from exporters.render import (
    PortRenderer,
    _EscapeMemo,
    escape_help,
    escape_label_value,
    format_float,
    render_ports,
)
from ibmon.infiniband.counters import BY_NAME, CATALOGUE
from ibmon.infiniband.model import LinkInfo, PortIdentity, PortView
from ibmon.infiniband.xmitwait import family_of
from ibmon.runtime.selfmetrics import SelfMetrics
from ibmon.sources.sysfs import SysfsSource
from ibmon.state import FabricState
from ibmon.track.tracker import Tracker
from tests.syspkg import require_binary

REPO = Path(__file__).resolve().parents[2]

HOSTILE = [
    'quote " inside',
    "back\\slash and \\n literal",
    "new\nline\r\ncarriage",
    "tab\there \x00 nul \x7f del",
    "non-ASCII: nœud Überlänge 交换机 🚀",
    "lone surrogate \udcff from fsdecode",
    '"}, injected{a="b"} 1\n# TYPE evil counter\nevil_total 1',
    "x" * 10_000,
    "",
]


def _port_a() -> PortView:
    return PortView(
        identity=PortIdentity(
            guid="0x0002c90300a1b2c3", port="1", device="mlx5_0", node_desc="node01 HCA-1",
            node_type="ca", lid=12, link_layer="InfiniBand", source="sysfs",
        ),
        state=4, phys_state=5, rate_bytes_per_second=25e9,
        active_width="2X", active_speed="",
        link=LinkInfo(remote_guid="0x0002c90300ffee01", remote_port="7",
                      remote_node_desc="leaf01", active_width="4X", active_speed="HDR",
                      max_width="4X", max_speed="HDR"),
        totals={"transmit_data": 4000, "receive_data": 8000, "symbol_errors": 3},
        saturated=frozenset({"symbol_errors"}),
        resets={"transmit_data": 2},
        hw_totals={"np_cnp_sent": 17},
        hw_gauges={"lifespan": 10},
        utilization_tx=0.25, utilization_rx=0.5, xmit_wait_ratio=0.125,
        symbol_error_ber=1.5e-14,
        conditions=frozenset({"high_ber", "congestion"}),
    )


def _port_b() -> PortView:
    return PortView(
        identity=PortIdentity(guid="0x0002c90300a1b2c4", port="2", node_type="switch",
                              source="mad"),
        state=1, phys_state=3,
        totals={"transmit_data": 0, "link_downed": 5},
    )


def test_two_port_fabric_renders_exactly() -> None:
    h = {name: BY_NAME[name].help for name in ("transmit_data", "receive_data",
                                               "symbol_errors", "link_downed")}
    a = 'guid="0x0002c90300a1b2c3",port="1"'
    b = 'guid="0x0002c90300a1b2c4",port="2"'
    expected = (
        "# HELP ibmon_port_info Descriptive data of a port; always 1. Join on (guid, port).\n"
        "# TYPE ibmon_port_info gauge\n"
        f'ibmon_port_info{{{a},device="mlx5_0",node_desc="node01 HCA-1",node_type="ca",'
        'lid="12",link_layer="InfiniBand",source="sysfs"} 1\n'
        f'ibmon_port_info{{{b},device="",node_desc="",node_type="switch",lid="",'
        'link_layer="InfiniBand",source="mad"} 1\n'
        "# HELP ibmon_link_info The far end of a port's link and its active and best width and "
        "speed; always 1.\n"
        "# TYPE ibmon_link_info gauge\n"
        f'ibmon_link_info{{{a},remote_guid="0x0002c90300ffee01",remote_port="7",'
        'remote_node_desc="leaf01",active_width="2X",active_speed="HDR",max_width="4X",'
        'max_speed="HDR"} 1\n'
        "# HELP ibmon_port_state IBA PortState: 1 down, 2 init, 3 armed, 4 active, 5 active "
        "defer.\n"
        "# TYPE ibmon_port_state gauge\n"
        f"ibmon_port_state{{{a}}} 4\n"
        f"ibmon_port_state{{{b}}} 1\n"
        "# HELP ibmon_port_physical_state IBA PortPhysicalState: 1 sleep, 2 polling, "
        "3 disabled, 4 training, 5 link up, 6 link error recovery, 7 phy test.\n"
        "# TYPE ibmon_port_physical_state gauge\n"
        f"ibmon_port_physical_state{{{a}}} 5\n"
        f"ibmon_port_physical_state{{{b}}} 3\n"
        "# HELP ibmon_port_rate_bytes_per_second Effective data rate of the link (after "
        "encoding), bytes per second.\n"
        "# TYPE ibmon_port_rate_bytes_per_second gauge\n"
        f"ibmon_port_rate_bytes_per_second{{{a}}} 25000000000.0\n"
        f"# HELP ibmon_port_transmit_data_bytes_total {h['transmit_data']}\n"
        "# TYPE ibmon_port_transmit_data_bytes_total counter\n"
        f"ibmon_port_transmit_data_bytes_total{{{a}}} 4000\n"
        f"ibmon_port_transmit_data_bytes_total{{{b}}} 0\n"
        f"# HELP ibmon_port_receive_data_bytes_total {h['receive_data']}\n"
        "# TYPE ibmon_port_receive_data_bytes_total counter\n"
        f"ibmon_port_receive_data_bytes_total{{{a}}} 8000\n"
        f"# HELP ibmon_port_symbol_errors_total {h['symbol_errors']}\n"
        "# TYPE ibmon_port_symbol_errors_total counter\n"
        f"ibmon_port_symbol_errors_total{{{a}}} 3\n"
        f"# HELP ibmon_port_link_downed_total {h['link_downed']}\n"
        "# TYPE ibmon_port_link_downed_total counter\n"
        f"ibmon_port_link_downed_total{{{b}}} 5\n"
        "# HELP ibmon_port_hw_stat_total Driver hw_counters of the port that count (sysfs), "
        "software-accumulated.\n"
        "# TYPE ibmon_port_hw_stat_total counter\n"
        f'ibmon_port_hw_stat_total{{{a},stat="np_cnp_sent"}} 17\n'
        "# HELP ibmon_port_hw_stat Driver hw_counters of the port that are settings or levels "
        "(sysfs), as read, e.g. lifespan in milliseconds.\n"
        "# TYPE ibmon_port_hw_stat gauge\n"
        f'ibmon_port_hw_stat{{{a},stat="lifespan"}} 10\n'
        "# HELP ibmon_port_utilization_ratio Data rate over link rate, 0 to 1, per direction.\n"
        "# TYPE ibmon_port_utilization_ratio gauge\n"
        f'ibmon_port_utilization_ratio{{{a},direction="transmit"}} 0.25\n'
        f'ibmon_port_utilization_ratio{{{a},direction="receive"}} 0.5\n'
        "# HELP ibmon_port_transmit_wait_ratio Fraction of time the port had data to send but "
        "could not (PortXmitWait).\n"
        "# TYPE ibmon_port_transmit_wait_ratio gauge\n"
        f"ibmon_port_transmit_wait_ratio{{{a}}} 0.125\n"
        "# HELP ibmon_port_symbol_error_ber Symbol errors per bit received over the detector's "
        "window.\n"
        "# TYPE ibmon_port_symbol_error_ber gauge\n"
        f"ibmon_port_symbol_error_ber{{{a}}} 1.5e-14\n"
        "# HELP ibmon_port_condition 1 while a detector reports the condition on the port.\n"
        "# TYPE ibmon_port_condition gauge\n"
        f'ibmon_port_condition{{{a},condition="congestion"}} 1\n'
        f'ibmon_port_condition{{{a},condition="high_ber"}} 1\n'
        "# HELP ibmon_port_saturated 1 while the hardware counter is stuck at its "
        "maximum (rate unknown).\n"
        "# TYPE ibmon_port_saturated gauge\n"
        f'ibmon_port_saturated{{{a},counter="symbol_errors"}} 1\n'
        "# HELP ibmon_port_resets_total Hardware counter resets ibmon observed and "
        "accumulated across.\n"
        "# TYPE ibmon_port_resets_total counter\n"
        f'ibmon_port_resets_total{{{a},counter="transmit_data"}} 2\n'
    )
    assert render_ports([_port_a(), _port_b()]).decode() == expected


def test_optional_families_absent_when_nothing_to_report() -> None:
    text = render_ports([_port_b()]).decode()
    for family in ("ibmon_link_info", "ibmon_port_rate_bytes_per_second",
                   "ibmon_port_hw_stat", "ibmon_port_utilization_ratio",
                   "ibmon_port_transmit_wait_ratio", "ibmon_port_symbol_error_ber",
                   "ibmon_port_condition", "ibmon_port_saturated",
                   "ibmon_port_resets_total"):
        assert family not in text
    assert "ibmon_port_info{" in text
    assert render_ports([]) == b""


async def test_real_mlx5_hw_counters_export_counts_as_totals_and_lifespan_as_gauge() -> None:
    """A real capture through source, tracker and renderer: the setting is no total."""
    root = (REPO / ".." / "shared" / "real-fixtures" / "procfs" / "testdata"
            / "fixtures.ttar.d" / "fixtures" / "sys")
    if not root.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"real fixtures absent: {root}")
        pytest.skip(f"real fixtures absent: {root}")
    snap = await SysfsSource(root=root, include=["mlx5_0"]).sample()
    text = render_ports(Tracker().update(snap).values()).decode()
    totals = re.findall(r'^ibmon_port_hw_stat_total\{[^}]*stat="(\w+)"\} \d+$', text, re.M)
    gauges = re.findall(r'^ibmon_port_hw_stat\{[^}]*stat="(\w+)"\} (\d+)$', text, re.M)
    assert len(totals) == 24
    assert "req_cqe_error" in totals
    assert "lifespan" not in totals
    assert gauges == [("lifespan", "10")]


def test_down_port_without_state_values_keeps_info_and_totals() -> None:
    view = PortView(identity=PortIdentity(guid="0x0000000000000001", port="1"),
                    totals={"link_downed": 1})
    text = render_ports([view]).decode()
    assert "ibmon_port_state{" not in text
    assert 'ibmon_port_link_downed_total{guid="0x0000000000000001",port="1"} 1\n' in text


def _hostile_fabric(n: int) -> list[PortView]:
    views = []
    for i in range(n):
        desc = HOSTILE[i % len(HOSTILE)]
        ident = PortIdentity(
            guid=f"0x{i:016x}", port=str(i % 7 + 1), device=f"dev{desc[:5]}", node_desc=desc,
            node_type="switch", lid=i or None, link_layer="InfiniBand", source=desc[:3],
        )
        views.append(PortView(
            identity=ident, state=i % 5, phys_state=i % 8,
            rate_bytes_per_second=[12.5e9, float("nan"), float("inf"), 0.0][i % 4],
            link=LinkInfo(remote_guid=f"0x{i + 1:016x}", remote_port="1",
                          remote_node_desc=HOSTILE[(i + 3) % len(HOSTILE)],
                          active_width="4X", active_speed="EDR", max_width="4X",
                          max_speed="EDR") if i % 3 else None,
            totals={spec.name: i * 1000 + k for k, spec in enumerate(CATALOGUE)},
            hw_totals={"np_cnp_sent": i, f"vendor {desc[:8]}": 1},
            hw_gauges={"lifespan": i, f"active {desc[:8]}": 2} if i % 2 else {},
            utilization_tx=float("-inf") if i == 5 else i / 100, utilization_rx=0.0,
            xmit_wait_ratio=1e-300 if i % 2 else None, symbol_error_ber=1e300 if i % 2 else None,
            conditions=frozenset({"down", "flapping"}) if i % 10 == 0 else frozenset(),
            saturated=frozenset({desc[:4]}) if i % 11 == 0 else frozenset(),
            resets={"symbol_errors": i} if i % 4 == 0 else {},
        ))
    return views


def _samples(text: str) -> set[tuple[str, frozenset[tuple[str, str]], str]]:
    out = set()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            value = "nan" if math.isnan(s.value) else repr(float(s.value))
            out.add((s.name, frozenset(s.labels.items()), value))
    return out


def test_hostile_strings_round_trip_through_a_parser() -> None:
    views = _hostile_fabric(len(HOSTILE) * 2)
    text = render_ports(views).decode("utf-8")
    parsed = {
        (s.labels["guid"], s.labels["port"]): s.labels["node_desc"]
        for fam in text_string_to_metric_families(text) if fam.name == "ibmon_port_info"
        for s in fam.samples
    }
    assert len(parsed) == len(views)
    for v in views:
        want = v.identity.node_desc.replace("\udcff", "\ufffd")
        assert parsed[v.key] == want
    # Nothing smuggled in a node description becomes a series of its own.
    assert "evil" not in {fam.name for fam in text_string_to_metric_families(text)}
    # Only "\n" ends a line in the format (str.splitlines would also split on "\r" etc.).
    lines = text.split("\n")
    assert lines.pop() == ""
    assert all(line.startswith(("ibmon_", "# HELP ibmon_", "# TYPE ibmon_")) for line in lines)


def test_families_are_grouped_with_one_header_each() -> None:
    text = render_ports(_hostile_fabric(50)).decode()
    seen: list[str] = []
    typed: dict[str, str] = {}
    for line in text.rstrip("\n").split("\n"):
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert name not in typed, f"second TYPE line for {name}"
            typed[name] = kind
            seen.append(name)
        elif line.startswith("# HELP "):
            assert line.split(" ")[2] not in typed  # HELP comes before TYPE, once
        else:
            name = line.split("{", 1)[0]
            assert seen, "sample before any TYPE line"
            assert seen[-1] == name, f"{name} sample outside its family block"
    assert typed["ibmon_port_transmit_data_bytes_total"] == "counter"
    assert typed["ibmon_port_resets_total"] == "counter"
    assert typed["ibmon_port_hw_stat_total"] == "counter"
    assert typed["ibmon_port_hw_stat"] == "gauge"
    assert typed["ibmon_port_info"] == "gauge"


def test_float_formatting() -> None:
    assert format_float(float("nan")) == "NaN"
    assert format_float(float("inf")) == "+Inf"
    assert format_float(float("-inf")) == "-Inf"
    assert format_float(0.5) == "0.5"
    assert format_float(1.5e-14) == "1.5e-14"
    assert format_float(25e9) == "25000000000.0"
    assert format_float(0) == "0.0"
    assert float(format_float(0.1 + 0.2)) == 0.1 + 0.2  # shortest round-trip repr
    view = replace(_port_b(), rate_bytes_per_second=float("nan"), utilization_tx=float("inf"),
                   utilization_rx=float("-inf"), symbol_error_ber=1e300)
    # Each float family's column on its own: a value that is not finite beside finite ones.
    other = replace(_port_a(), utilization_rx=float("nan"), xmit_wait_ratio=float("nan"),
                    symbol_error_ber=float("-inf"))
    alone = render_ports([other]).decode()
    assert alone.count(" NaN\n") == 2
    assert re.search(r'^ibmon_port_utilization_ratio\{.*"receive"\} NaN$', alone, re.MULTILINE)
    text = render_ports([view, other]).decode()
    assert text.count(" NaN\n") == 3
    assert 'direction="transmit"} +Inf\n' in text
    assert 'direction="receive"} -Inf\n' in text
    assert "} 1e+300\n" in text
    assert re.search(r"^ibmon_port_transmit_wait_ratio\{.*\} NaN$", text, re.MULTILINE)
    assert re.search(r"^ibmon_port_symbol_error_ber\{.*\} -Inf$", text, re.MULTILINE)
    assert re.search(r"^ibmon_port_rate_bytes_per_second\{.*\} 25000000000\.0$", text,
                     re.MULTILINE)
    assert re.search(r'^ibmon_port_utilization_ratio\{.*"transmit"\} 0\.25$', text,
                     re.MULTILINE)
    assert not re.search(r" [-+]?(inf|nan|infinity)$", text, re.MULTILINE)


def test_utilization_renders_each_direction_a_port_has() -> None:
    """Both directions' lines come from one string where a port has both; a port with one
    direction (a source that reads only one data counter) or none still gets exactly its
    own lines, in port order, transmit before receive."""
    base = _port_b()
    views = [
        replace(base, identity=replace(base.identity, port=str(n)), utilization_tx=tx,
                utilization_rx=rx)
        for n, (tx, rx) in enumerate([(0.25, 0.5), (0.125, None), (None, 0.75), (None, None),
                                      (1, 0)], start=1)
    ]
    text = render_ports(views).decode()
    lines = [ln for ln in text.split("\n") if ln.startswith("ibmon_port_utilization_ratio{")]
    got = [(re.search(r'port="(\d)"', ln)[1], re.search(r'direction="(\w+)"', ln)[1],  # type: ignore[index]
            ln.rsplit(" ", 1)[1]) for ln in lines]
    assert got == [("1", "transmit", "0.25"), ("1", "receive", "0.5"),
                   ("2", "transmit", "0.125"), ("3", "receive", "0.75"),
                   ("5", "transmit", "1.0"), ("5", "receive", "0.0")]


def test_escaping_helpers() -> None:
    assert escape_label_value('a"b\\c\nd') == 'a\\"b\\\\c\\nd'
    assert escape_label_value("plain") == "plain"
    assert escape_label_value("bad \udcff") == "bad \ufffd"
    assert escape_help('say "hi"\\\n') == 'say "hi"\\\\\\n'


def test_cache_follows_identity_link_and_membership_changes() -> None:
    renderer = PortRenderer()
    a, b = _port_a(), _port_b()
    first = renderer.render([a, b]).decode()
    assert 'node_desc="node01 HCA-1"' in first
    # Same objects again: identical output.
    assert renderer.render([a, b]).decode() == first
    # Renamed node, new equal-but-not-identical identity objects, dropped link, new width.
    a2 = replace(a, identity=replace(a.identity, node_desc='renamed "x"'), active_width="4X")
    b2 = replace(b, identity=replace(b.identity),
                 link=LinkInfo(remote_guid="0x00000000000000aa", remote_port="3"))
    second = renderer.render([a2, b2]).decode()
    assert second == render_ports([a2, b2]).decode()
    assert 'node_desc="renamed \\"x\\""' in second
    assert "node01" not in second
    assert 'active_width="4X"' in second  # the view's fresher width replaced "2X"
    assert 'active_width="2X"' not in second
    assert 'remote_guid="0x00000000000000aa"' in second
    a3 = replace(a2, link=None)
    third = renderer.render([b2, a3]).decode()
    assert third == render_ports([b2, a3]).decode()
    assert third.count("ibmon_link_info{") == 1
    # A port that disappears loses its series.
    fourth = renderer.render([a3]).decode()
    assert "0x0002c90300a1b2c4" not in fourth


def test_prepare_reports_descriptive_changes_and_chunks_match_render() -> None:
    """The exporter reuses its compressed _info segment exactly when ``prepare`` says so."""
    ports = [replace(_port_a(), identity=replace(_port_a().identity, guid=f"0x{i:016x}"))
             for i in range(1, 6)]
    renderer = PortRenderer(keep_descriptive=False)

    def body(views: list[PortView]) -> bytes:
        return b"".join([*renderer.descriptive_chunks(), *renderer.series_chunks(views)])

    assert renderer.prepare(ports) is True
    assert body(ports) == render_ports(ports)
    # New values, same ports: the descriptive families are unchanged.
    moved = [replace(v, totals={"transmit_data": 10**15}) for v in ports]
    assert renderer.prepare(moved) is False
    assert body(moved) == render_ports(moved)
    # A port inserted in the middle shifts positions; cached labels still follow their port.
    extra = replace(_port_b(), identity=replace(_port_b().identity, guid="0x0000000000000003",
                                                port="9"))
    grown = [*moved[:3], extra, *moved[3:]]
    assert renderer.prepare(grown) is True
    assert body(grown) == render_ports(grown)
    assert renderer.prepare(grown) is False
    # Equal but new identity objects (a source re-creating them each poll) are not a change.
    fresh = [replace(v, identity=replace(v.identity)) for v in grown]
    assert renderer.prepare(fresh) is False
    assert body(fresh) == render_ports(fresh)
    renamed = [*fresh[:-1], replace(fresh[-1], identity=replace(fresh[-1].identity,
                                                                 node_desc="renamed"))]
    assert renderer.prepare(renamed) is True
    assert b'node_desc="renamed"' in body(renamed)
    assert renderer.prepare(renamed[1:]) is True  # a port left


def _load_bench() -> ModuleType:
    path = REPO / "benchmarks" / "bench_exposition.py"
    spec = importlib.util.spec_from_file_location("bench_exposition", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_exposition"] = module
    spec.loader.exec_module(module)
    return module


def test_benchmark_baseline_exports_the_same_series() -> None:
    """The 10x claim compares like with like: both renderers emit identical samples."""
    bench = _load_bench()
    views = bench.build_views(400)
    ours = render_ports(views).decode()
    theirs = bench.reference_render(views).decode()
    assert _samples(ours) == _samples(theirs)
    assert len(_samples(ours)) > 400 * 30


def _promtool_problems(body: bytes) -> list[str]:
    """Everything ``promtool check metrics`` says, lint included: no finding is tolerated."""
    promtool = require_binary("promtool")
    proc = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True,
                          timeout=60, check=False, start_new_session=True)
    problems = (proc.stdout + proc.stderr).decode(errors="replace").strip().splitlines()
    # Exit 3 means lint findings, 1 a parse error.
    if proc.returncode != 0:
        problems.append(f"promtool exit {proc.returncode}")
    return problems


@pytest.mark.system
def test_promtool_accepts_hostile_fabric() -> None:
    assert _promtool_problems(render_ports(_hostile_fabric(50))) == []


@pytest.mark.system
def test_promtool_accepts_self_metrics_and_ports_together() -> None:
    metrics = SelfMetrics()
    metrics.source_up.labels("mad").set(1)
    metrics.poll_duration.labels("mad").observe(0.2)
    metrics.poll_errors.labels("mad", "timeout").inc()
    metrics.events.labels("congestion", "warning").inc()
    views = _hostile_fabric(50)
    state = FabricState(generated=1.0, ports={v.key: v for v in views})
    body = exposition(metrics, state)
    assert body.startswith(metrics.render())
    assert _promtool_problems(body) == []


@pytest.mark.system
def test_promtool_rejects_what_we_guard_against() -> None:
    """The promtool check can fail: an unescaped quote and a non-_total counter are caught."""
    bad = b'# HELP x_total X.\n# TYPE x_total counter\nx_total{a="q"q"} 1\n'
    assert _promtool_problems(bad) != []
    assert _promtool_problems(b"# HELP x X.\n# TYPE x counter\nx 1\n") != []
    assert _promtool_problems(b"# HELP x_total X.\n# TYPE x_total counter\nx_total 1\n") == []
    # the lint rule the old names broke: a type word inside a metric name
    lint = b"# HELP x_counter_total X.\n# TYPE x_counter_total counter\nx_counter_total 1\n"
    assert any("should not include type 'counter'" in p for p in _promtool_problems(lint))


def test_exposition_orders_ports_by_guid_then_port_number() -> None:
    views = [
        PortView(identity=PortIdentity(guid="0x0000000000000002", port="1"), state=4),
        PortView(identity=PortIdentity(guid="0x0000000000000001", port="10"), state=4),
        PortView(identity=PortIdentity(guid="0x0000000000000001", port="2"), state=4),
    ]
    state = FabricState(generated=1.0, ports={v.key: v for v in views})
    text = exposition(SelfMetrics(), state).decode()
    lines = [ln for ln in text.splitlines() if ln.startswith("ibmon_port_state{")]
    assert lines == [
        'ibmon_port_state{guid="0x0000000000000001",port="2"} 4',
        'ibmon_port_state{guid="0x0000000000000001",port="10"} 4',
        'ibmon_port_state{guid="0x0000000000000002",port="1"} 4',
    ]


def test_several_conditions_and_causes_render_in_name_order_and_units_say_per_lane() -> None:
    """Sets iterate in hash order, which changes from one run to the next: a port's several
    conditions and causes are rendered sorted, so the body is the same every run. A Switch-IB
    2 port's PortXmitWait unit is per lane (32 bytes x 4 lanes a count at 4X)."""
    conditions = ["congestion", "discards", "high_ber", "link_degraded", "link_flapping",
                  "link_integrity", "receive_errors"]
    causes = dict.fromkeys(reversed(conditions), "physical")  # inserted last first
    unit = family_of(0xCF08)
    assert unit is not None
    port = replace(_port_a(), conditions=frozenset(reversed(conditions)), causes=causes,
                   identity=replace(_port_a().identity, xmit_wait=unit),
                   active_width="4X", xmit_wait_seconds=1.5)
    text = render_ports([port]).decode()
    assert re.findall(r'^ibmon_port_condition\{[^}]*condition="(\w+)"\} 1$', text, re.M) == \
        conditions
    assert re.findall(r'^ibmon_port_condition_cause\{[^}]*condition="(\w+)",cause="physical"\} '
                      r'1$', text, re.M) == conditions
    assert re.findall(r'^ibmon_port_transmit_wait_unit_bytes\{[^}]*per="(\w+)",source="family",'
                      r'family="Switch-IB 2"\} (\S+)$', text, re.M) == [("lane", "128.0")]


def test_escaped_names_are_remembered_within_a_bound() -> None:
    """Counter and stat names from hardware are escaped once and remembered, but a driver that
    made up names without end cannot grow the memo past its bound."""
    memo = _EscapeMemo()
    for i in range(10_000):
        assert memo[f'stat"{i}'] == f'stat\\"{i}'
    assert len(memo) <= 4097
