"""``ibmon scan --format prom --output FILE`` feeding the real node_exporter textfile collector.

node_exporter (every default collector, plus ``textfile`` on the scan's directory and
``infiniband`` on the same sysfs tree) must serve ibmon's series next to its own: no textfile
scrape error, one HELP and one TYPE per family in the whole output, promtool finds no problem
with any ``ibmon_`` family (node_exporter's own names have lint findings of their own, e.g.
``node_memory_MemFree_bytes``), and ibmon's byte totals equal node_exporter's for every port.
The tree is the simulated fabric rendered live (``ibmon sim sysfs``, re-written every second), so
the two samples 1.5 s (``--interval``) apart give real rates.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.node_exporter import http_get, running_node_exporter, stop_group
from tests.sysfs_tree import class_dir, write_device, write_port
from tests.syspkg import require_binary

pytestmark = pytest.mark.system

IBMON = [sys.executable, "-m", "ibmon"]
ENV = {k: v for k, v in os.environ.items() if not k.startswith("IBMON_")}


@contextmanager
def node_exporter(textfiles: Path, sysfs: Path, log: Path) -> Iterator[str]:
    """node_exporter with its default collectors plus the textfile collector; yields /metrics."""
    with running_node_exporter(
        [f"--collector.textfile.directory={textfiles}", "--collector.infiniband",
         f"--path.sysfs={sysfs}"],
        log,
    ) as url:
        yield url


@pytest.fixture
def live_tree(tmp_path: Path) -> Iterator[Path]:
    """The demo fabric's HCAs as a live sysfs tree, traffic moving at 10x."""
    root = tmp_path / "sys"
    log = (tmp_path / "sim.log").open("wb")
    proc = subprocess.Popen([*IBMON, "sim", "sysfs", "--out", str(root), "--speed", "10"],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=ENV,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not (class_dir(root).is_dir() and any(class_dir(root).iterdir())):
            assert proc.poll() is None, (tmp_path / "sim.log").read_text()
            assert time.monotonic() < deadline, "the simulated sysfs tree did not appear"
            time.sleep(0.1)
        time.sleep(0.5)  # every device written once
        yield root
    finally:
        stop_group(proc)
        log.close()


def scan(root: Path, out: Path, *, interval: str = "1.5") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*IBMON, "scan", "--sysfs-root", str(root), "--interval", interval, "--format", "prom",
         "--output", str(out)],
        capture_output=True, text=True, timeout=60, check=False, env=ENV,
    )


def families(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_node_exporter_serves_the_scan_next_to_its_own_series(
    live_tree: Path, tmp_path: Path
) -> None:
    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    target = textfiles / "ibmon.prom"
    old = os.umask(0o077)  # systemd's UMask=0077 must not make the file unreadable to others
    try:
        # 3 s apart: the simulator rewrites the tree every second after a render that itself
        # takes a while, so 1.5 s sometimes saw no rewrite in between (all rates 0)
        proc = scan(live_tree, target, interval="3")
    finally:
        os.umask(old)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""  # the exposition went to the file only
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert sorted(p.name for p in textfiles.iterdir()) == ["ibmon.prom"]  # no temporary left

    with node_exporter(textfiles, live_tree, tmp_path / "node_exporter.log") as url:
        body = http_get(url)
    got = families(body)
    assert got["node_textfile_scrape_error"] == [({}, 0.0)]
    assert got["ibmon_source_up"] == [({"source": "sysfs"}, 1.0)]
    # two samples --interval apart: rates exist, and the busy demo fabric moves data
    util = [v for labels, v in got["ibmon_port_utilization_ratio"]
            if labels["direction"] == "transmit"]
    assert util and max(util) > 0
    # one-shot self metrics only: no counter or histogram of a process that has exited
    assert not [n for n in got if n.startswith(("ibmon_source_poll_", "ibmon_pipeline_",
                                                "ibmon_events_"))]

    # No family is described twice, by ibmon and node_exporter or by anyone.
    for kind in ("HELP", "TYPE"):
        names = re.findall(rf"^# {kind} (\S+)", body, re.MULTILINE)
        assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})

    # promtool: the whole output parses; no lint finding concerns an ibmon family.
    check = subprocess.run([require_binary("promtool"), "check", "metrics"], input=body,
                           capture_output=True, text=True, timeout=60, check=False)
    findings = (check.stdout + check.stderr).splitlines()
    assert check.returncode in (0, 3), findings  # 1 would be a parse error; 3 is lint only
    assert not [f for f in findings if f.startswith("ibmon_")], findings

    # ibmon's totals are node_exporter's (the first sample starts at the hardware value; the
    # tree moved between ibmon's read and node_exporter's, so ibmon's are never above them).
    devices = {(labels["guid"], labels["port"]): labels["device"]
               for labels, _ in got["ibmon_port_info"]}
    ours = {(devices[(lb["guid"], lb["port"])], lb["port"]): v
            for lb, v in got["ibmon_port_transmit_data_bytes_total"]}
    theirs = {(lb["device"], lb["port"]): v
              for lb, v in got["node_infiniband_port_data_transmitted_bytes_total"]}
    assert ours.keys() == theirs.keys() and len(ours) > 10
    assert all(0 < ours[k] <= theirs[k] for k in ours)


def test_a_failed_scan_replaces_the_file_with_source_down(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    write_device(root, "mlx5_0")
    write_port(root, "mlx5_0", 1)
    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    target = textfiles / "ibmon.prom"
    assert scan(root, target, interval="0").returncode == 0
    assert 'ibmon_source_up{source="sysfs"} 1.0' in target.read_text()

    # The port's counters become unreadable: the scan fails, and says so in the file rather
    # than leaving node_exporter to serve the last good numbers as if they were current.
    for f in (class_dir(root) / "mlx5_0" / "ports" / "1" / "counters").iterdir():
        f.unlink()
    proc = scan(root, target, interval="0")
    assert proc.returncode == 2
    assert proc.stderr.startswith("ibmon: error: scan failed:"), proc.stderr
    text = target.read_text()
    assert 'ibmon_source_up{source="sysfs"} 0.0' in text
    assert "ibmon_port_transmit_data_bytes_total{" not in text
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert sorted(p.name for p in textfiles.iterdir()) == ["ibmon.prom"]


def test_an_unwritable_output_is_one_line_before_any_sampling(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    write_device(root, "mlx5_0")
    write_port(root, "mlx5_0", 1)
    proc = scan(root, tmp_path / "missing" / "ibmon.prom", interval="30")
    assert proc.returncode == 2
    assert proc.stderr == f"ibmon: error: --output: {tmp_path / 'missing'} is not a directory\n"


REPO = Path(__file__).resolve().parents[2]
UNITS = [REPO / "deploy" / "systemd" / f"ibmon-textfile.{kind}" for kind in ("service", "timer")]


def test_the_readme_recipe_is_the_shipped_units() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for unit in UNITS:
        assert f"```ini\n{unit.read_text(encoding='utf-8')}```" in readme, unit.name


def test_the_timer_recipe_verifies_and_is_hardened(tmp_path: Path) -> None:
    analyze = require_binary("systemd-analyze")
    ibmon = Path(sys.executable).with_name("ibmon")  # verify checks that ExecStart exists
    assert ibmon.is_file(), ibmon
    for unit in UNITS:
        text = unit.read_text(encoding="utf-8").replace("/opt/ibmon/bin/ibmon", str(ibmon))
        (tmp_path / unit.name).write_text(text)
    service = tmp_path / UNITS[0].name
    timer = tmp_path / UNITS[1].name
    proc = subprocess.run([analyze, "verify", str(service), str(timer)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0 and not (proc.stdout + proc.stderr).strip(), proc.stderr
    rating = subprocess.run([analyze, "security", "--offline=yes", str(service)],
                            capture_output=True, text=True, timeout=60, check=False)
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", rating.stdout)
    assert m and float(m.group(1)) <= 2.0, rating.stdout + rating.stderr
    # what the service runs is the documented textfile command
    command = "scan --interval 10 --format prom --output /var/lib/prometheus/node-exporter/"
    assert command + "ibmon.prom" in UNITS[0].read_text(encoding="utf-8")
