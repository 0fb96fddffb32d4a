"""Golden exposition: `ibmon scan --format prom` on a fixed tree, compared with a committed file.

The file changes only on purpose: run with IBMON_UPDATE_GOLDEN=1 to regenerate, then review the
diff. Lines whose values depend on the machine or the clock (poll durations, timestamps, the
Python version in build_info) are masked, not dropped, so their presence is still checked.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sysfs_tree import FULL_COUNTERS, write_device, write_port
from tests.syspkg import require_binary

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "scan.prom"
VOLATILE = re.compile(
    r"^((?:ibmon_source_poll_duration|ibmon_pipeline_stage)_seconds_(?:bucket|sum)\{[^}]*\}"
    r"|ibmon_source_last_success_timestamp_seconds\{[^}]*\}"
    r"|ibmon_build_info\{[^}]*\}) .*$",
    re.MULTILINE,
)


def build_tree(root: Path) -> None:
    """Two devices, three ports: IB with every counter, a RoCE port, and a saturated narrow one."""
    write_device(
        root,
        "mlx5_0",
        node_guid="0002:c903:00a1:b2c3",
        node_desc='host01 "HCA-1"\n',
        hw_counters=None,
    )
    write_port(
        root,
        "mlx5_0",
        1,
        counters={**FULL_COUNTERS, "port_xmit_data": 2880761508848},
        hw_counters={"out_of_buffer": 3, "np_cnp_sent": 11},
        lid="0x12\n",
        rate="100 Gb/sec (4X EDR)\n",
    )
    write_port(
        root,
        "mlx5_0",
        2,
        counters={**FULL_COUNTERS, "symbol_error": 65535, "port_xmit_wait": 4294967295},
        lid="0x13\n",
        state="1: DOWN\n",
        phys_state="3: Disabled\n",
        rate="0 GB/sec\n",
    )
    write_device(root, "mlx5_1", node_guid="0002:c903:00a1:b2c4", node_desc="host01 roce\\nic")
    write_port(
        root,
        "mlx5_1",
        1,
        counters={"port_xmit_data": 10, "port_rcv_data": 20},
        link_layer="Ethernet\n",
        rate="25 Gb/sec (1X EDR)\n",
        lid="0x0\n",
    )


def scan_prom(root: Path) -> str:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ibmon",
            "scan",
            "--sysfs-root",
            str(root),
            "--interval",
            "0",
            "--format",
            "prom",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        # ibmon refuses IBMON_* variables that are no setting; this one is the test's own.
        env={k: v for k, v in os.environ.items() if k != "IBMON_UPDATE_GOLDEN"},
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def masked(text: str) -> str:
    return VOLATILE.sub(lambda m: m.group(1) + " <volatile>", text)


def test_scan_prom_matches_golden(tmp_path: Path) -> None:
    build_tree(tmp_path)
    got = masked(scan_prom(tmp_path))
    if os.environ.get("IBMON_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(got)
    assert GOLDEN.exists(), "no golden file: run with IBMON_UPDATE_GOLDEN=1 and review it"
    assert got == GOLDEN.read_text()


@pytest.mark.system
def test_scan_prom_passes_promtool(tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    build_tree(tmp_path)
    proc = subprocess.run(
        [promtool, "check", "metrics"],
        input=scan_prom(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # Clean, lint included: no finding is tolerated.
    assert (proc.returncode, proc.stdout + proc.stderr) == (0, "")
