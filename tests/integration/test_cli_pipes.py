"""Every command x every output format, piped into its real consumer, on a tree that warns.

stdout carries exactly the requested output; logs go to stderr (JSON lines, since stderr is a
pipe here) at the configured level. The sysfs tree has everything that makes the sysfs source
talk: an unknown file under ``counters/`` (debug), a broken ``/sys/class/infiniband/X`` symlink,
a device without ``node_guid`` and a counter reading ``N/A (no PMA)``. Before the one pipeline,
structlog's default configuration printed those lines on stdout and broke every consumer here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.sysfs_tree import FULL_COUNTERS, class_dir, write_device, write_port
from tests.syspkg import require_binary

REPO = Path(__file__).resolve().parents[2]
GUID = "0x0002c90300a1b2c3"


def noisy_tree(root: Path) -> None:
    """Three ports that all get reported, plus every kind of sysfs trouble we log about."""
    write_device(root, "mlx5_0", node_guid="0002:c903:00a1:b2c3", node_desc="host01 HCA-1")
    write_port(root, "mlx5_0", 1,
               counters={**FULL_COUNTERS, "symbol_error": "N/A (no PMA)\n",
                         "port_mystery_future_counter": 5})
    write_port(root, "mlx5_0", 2, state="1: DOWN\n", phys_state="2: Polling\n",
               rate="10 Gb/sec (4X)\n")
    write_device(root, "mlx5_1", node_guid=None, node_desc="host01 HCA-2")  # missing node_guid
    write_port(root, "mlx5_1", 1)
    os.symlink(root / "devices" / "gone" / "mlx5_9", class_dir(root) / "mlx5_9")  # broken


def ibmon(*args: str, root: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IBMON_LOG")}
    env["COLUMNS"] = "160"  # rich's width when stdout is not a terminal: rows stay one line
    argv = [sys.executable, "-m", "ibmon", *args]
    if root is not None:
        argv += ["--sysfs-root", str(root)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO, env=env,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    return proc


def log_lines(stderr: str) -> list[dict[str, Any]]:
    """Every stderr line is one JSON log record (stderr is not a TTY)."""
    records = []
    for line in stderr.splitlines():
        if line.strip():
            records.append(json.loads(line))
    return records


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    noisy_tree(root)
    return root


@pytest.mark.system
def test_scan_prom_is_valid_exposition_for_promtool(tree: Path) -> None:
    proc = ibmon("scan", "--interval", "0", "--format", "prom", root=tree)
    promtool = require_binary("promtool")
    check = subprocess.run([promtool, "check", "metrics"], input=proc.stdout,
                           capture_output=True, text=True, timeout=60, check=False)
    assert check.returncode == 0 and not (check.stdout + check.stderr).strip(), check
    assert f'ibmon_port_info{{guid="{GUID}",port="1"' in proc.stdout
    # The warnings were logged, on stderr.
    events = {r["event"] for r in log_lines(proc.stderr)}
    assert "sysfs_value_unreadable" in events


def test_scan_json_parses(tree: Path) -> None:
    proc = ibmon("scan", "--interval", "0", "--format", "json", root=tree)
    doc = json.loads(proc.stdout)
    ports = {(p["guid"], p["port"]): p for p in doc["ports"]}
    assert len(ports) == 3
    down = ports[(GUID, "2")]
    assert (down["state"], down["state_name"]) == (1, "DOWN")
    assert (down["phys_state"], down["phys_state_name"]) == (2, "Polling")
    assert ports[(GUID, "1")]["state_name"] == "ACTIVE"
    levels = {r["level"] for r in log_lines(proc.stderr)}
    assert levels and "debug" not in levels  # default level is info


def parse_table(text: str) -> list[dict[str, str]]:
    """Read the scan table back: columns start where the header's words start."""
    header, *rows = text.splitlines()
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    names = header.split()
    out = []
    for row in rows:
        cells = [row[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        out.append(dict(zip(names, cells, strict=True)))
    return out


def test_scan_table_reads_back(tree: Path) -> None:
    proc = ibmon("scan", "--interval", "0", root=tree)
    rows = parse_table(proc.stdout)
    assert len(rows) == 3
    by_key = {(r["GUID"], r["PORT"]): r for r in rows}
    assert by_key[(GUID, "1")]["STATE"] == "ACTIVE"
    assert by_key[(GUID, "2")]["STATE"] == "DOWN/Polling"
    assert by_key[(GUID, "2")]["TX"] == "-"  # a port that is not Active has no rates
    log_lines(proc.stderr)


def test_top_once_reads_back(tree: Path) -> None:
    proc = ibmon("top", "--source", "sysfs", "--once", "--interval", "0.1", root=tree)
    lines = proc.stdout.splitlines()
    assert "3 ports" in lines[0]
    # a row: the port's name (it ends in "[port]"), then state, tx, rx, wait, BER, conditions
    rows = {m[1]: m[2].split() for ln in lines if (m := re.match(r"^(.+? \[\d+\]) +(.*)$", ln))}
    assert rows["host01 HCA-1 [2]"][0] == "DOWN/Polling"
    assert rows["host01 HCA-1 [2]"][1] == "-"  # no utilization for a port that is down
    assert rows["host01 HCA-1 [1]"][0] == "ACTIVE"
    log_lines(proc.stderr)


def test_debug_level_goes_to_stderr_only(tree: Path) -> None:
    proc = ibmon("scan", "--interval", "0", "--format", "json", "--log-level", "debug",
                 root=tree)
    json.loads(proc.stdout)
    events = {r["event"] for r in log_lines(proc.stderr)}
    assert "sysfs_counter_unknown" in events


def test_check_config_and_version_print_one_line(tmp_path: Path, tree: Path) -> None:
    cfg = tmp_path / "ibmon.toml"
    cfg.write_text(f'[[sources]]\ntype = "sysfs"\nroot = "{tree}"\n[log]\nlevel = "debug"\n')
    proc = ibmon("check-config", str(cfg))
    assert proc.stdout == f"{cfg}: OK (1 source(s), listen 127.0.0.1:9683)\n"
    log_lines(proc.stderr)
    proc = ibmon("version")
    assert re.fullmatch(r"ibmon \S+\n", proc.stdout)
    log_lines(proc.stderr)
