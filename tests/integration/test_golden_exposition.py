"""Golden exposition: /metrics bodies on fixed inputs, compared with committed files.

Two goldens:

- ``scan.prom``: ``ibmon scan --format prom`` on a fixed tree (the first read: totals, states,
  saturation, info series). The CLI output users pipe into promtool or the textfile collector
  must stay byte-stable.
- ``two_polls.prom``: the same kind of tree polled twice, ten simulated seconds apart, with
  counters moving in between: utilization and transmit-wait ratios, a counter reset, a port that
  went down, a link-integrity error, and the conditions and event counts that follow.

A golden changes only on purpose: run with ``IBMON_UPDATE_GOLDEN=1`` to rewrite it (the test then
fails, so a regeneration can never pass silently), review the diff, commit. The update mode is
refused under ``CI``. Values that depend on the machine or the clock (poll durations and, for the
CLI, timestamps) are masked, not dropped, so their presence is still checked. ``ibmon_build_info``
is compared in full: its labels must be this ibmon's version and the running Python's version.
"""

from __future__ import annotations

import asyncio
import os
import platform
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from exporters.prometheus import exposition
from ibmon import __version__
from ibmon.infiniband.model import Snapshot, Topology
from ibmon.runtime import sizes
from ibmon.runtime.pipeline import Pipeline, build_state
from ibmon.runtime.selfmetrics import SelfMetrics
from ibmon.sources.sysfs import SysfsSource, SysfsSourceConfig
from tests.sysfs_tree import FULL_COUNTERS, class_dir, write_device, write_port
from tests.syspkg import require_binary

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "golden"
SCAN_GOLDEN = GOLDEN_DIR / "scan.prom"
POLLS_GOLDEN = GOLDEN_DIR / "two_polls.prom"
UPDATE = "IBMON_UPDATE_GOLDEN"

#: Poll durations depend on the machine; the CLI's timestamps on the real clock.
DURATIONS = re.compile(
    r"^((?:ibmon_source_poll_duration|ibmon_pipeline_stage)_seconds_(?:bucket|sum)\{[^}]*\}) .*$",
    re.MULTILINE,
)
TIMESTAMPS = re.compile(r"^(ibmon_source_last_success_timestamp_seconds\{[^}]*\}) .*$",
                        re.MULTILINE)
BUILD_INFO = re.compile(r'^ibmon_build_info\{deflate="[^"]*",'
                        r'numpy="[^"]*",python="([^"]*)",version="([^"]*)"\}', re.MULTILINE)


def normalised(text: str, *, real_clock: bool = False) -> str:
    """Mask volatile values (kept as ``<volatile>``, so the series must still be there).

    build_info's labels become ``<python>`` / ``<version>`` only where they are the running
    interpreter's Python version and this ibmon's version; anything else stays as it is, and
    so differs from the golden. Its backends (what this install built) are masked.
    """
    text = DURATIONS.sub(lambda m: m.group(1) + " <volatile>", text)
    if real_clock:
        text = TIMESTAMPS.sub(lambda m: m.group(1) + " <volatile>", text)

    def labels(m: re.Match[str]) -> str:
        python = "<python>" if m.group(1) == platform.python_version() else m.group(1)
        version = "<version>" if m.group(2) == __version__ else m.group(2)
        return (f'ibmon_build_info{{deflate="<b>",numpy="<b>",'
                f'python="{python}",version="{version}"}}')

    return BUILD_INFO.sub(labels, text)


def check_golden(path: Path, got: str) -> None:
    """Compare with the committed golden, or (``IBMON_UPDATE_GOLDEN=1``) rewrite it and fail."""
    if os.environ.get(UPDATE):
        if os.environ.get("CI"):
            pytest.fail(f"{UPDATE} is refused under CI: regenerate locally, review, commit")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got)
        pytest.fail(f"{path.name} regenerated: review the diff (git diff -- {path}), commit it, "
                    f"and run again without {UPDATE}")
    assert path.exists(), f"no golden file {path}: run with {UPDATE}=1 and review it"
    assert got == path.read_text(), (
        f"exposition differs from {path.name}; if the change is intended, regenerate with "
        f"{UPDATE}=1 and review the diff"
    )


# ------------------------------------------------------------------ the CLI golden (first read)


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


def test_scan_prom_matches_golden(tmp_path: Path) -> None:
    build_tree(tmp_path)
    check_golden(SCAN_GOLDEN, normalised(scan_prom(tmp_path), real_clock=True))


# ------------------------------------------------------------------ two polls, in process

T0_MONOTONIC = 5000.0
T0_WALL = 1_700_000_000.0
INTERVAL = 10.0


class _FixedClock:
    """The sysfs source with each snapshot stamped ``INTERVAL`` simulated seconds apart."""

    def __init__(self, source: SysfsSource) -> None:
        self.name = source.name
        self._source = source
        self.polls = 0

    async def discover(self) -> Topology:
        return await self._source.discover()

    async def sample(self) -> Snapshot:
        snap = await self._source.sample()
        snap.monotonic = T0_MONOTONIC + self.polls * INTERVAL
        snap.wall = T0_WALL + self.polls * INTERVAL
        self.polls += 1
        return snap

    async def close(self) -> None:
        await self._source.close()


async def two_polls_exposition(root: Path, change: Callable[[Path], None]) -> bytes:
    """Poll the sysfs tree, apply ``change``, poll again: the ``/metrics`` body after that.

    Through ``ibmon.runtime.pipeline`` exactly as the daemon and ``ibmon scan`` poll, on a fixed
    clock (``INTERVAL`` seconds between polls) so rates are reproducible.
    """
    cfg = SysfsSourceConfig(root=root)
    metrics = SelfMetrics()
    pipeline = Pipeline(cfg, metrics=metrics, fabric="golden")
    source = _FixedClock(SysfsSource(root=root, name=cfg.label))
    try:
        for i in range(2):
            if i:
                change(root)
            for event in await pipeline.poll(source):
                metrics.events.labels(event.type, event.severity).inc()
    finally:
        await source.close()
    assert pipeline.error is None, pipeline.error
    return exposition(metrics, build_state([pipeline], generated=T0_WALL + INTERVAL))


def build_busy_tree(root: Path) -> None:
    """Four ports that will each do something different between the two polls."""
    write_device(root, "mlx5_0", node_guid="0002:c903:00a1:b2c3", node_desc='host01 "HCA-1"')
    # port 1: busy and healthy; port 2: about to go down, its narrow counters already pinned
    write_port(root, "mlx5_0", 1, lid="0x12\n",
               counters={**FULL_COUNTERS, "port_xmit_data": 2_880_761_508_848,
                         "port_rcv_data": 1_000_000_000, "port_xmit_wait": 1_000},
               hw_counters={"out_of_buffer": 3, "np_cnp_sent": 11})
    write_port(root, "mlx5_0", 2, lid="0x13\n",
               counters={**FULL_COUNTERS, "symbol_error": 65535, "port_xmit_wait": 4294967295})
    # someone will run perfquery -R on this one
    write_device(root, "mlx5_2", node_guid="0002:c903:00a1:b2c5", node_desc="host01 HCA-3")
    write_port(root, "mlx5_2", 1, lid="0x14\n",
               counters={**FULL_COUNTERS, "port_xmit_data": 9_000_000, "port_xmit_packets": 900})
    write_device(root, "mlx5_1", node_guid="0002:c903:00a1:b2c4", node_desc="host01 roce\\nic")
    write_port(root, "mlx5_1", 1, link_layer="Ethernet\n", rate="25 Gb/sec (1X EDR)\n",
               lid="0x0\n", counters={"port_xmit_data": 10, "port_rcv_data": 20},
               hw_counters={"rp_cnp_handled": 100, "np_ecn_marked_roce_packets": 50})


def busy_ten_seconds(root: Path) -> None:
    """What happened in the ten seconds between the polls."""
    ports = class_dir(root)

    def put(device: str, port: int, kind: str, name: str, value: int | str) -> None:
        text = f"{value}\n" if isinstance(value, int) else value
        (ports / device / "ports" / str(port) / kind / name).write_text(text)

    # 2.5e9 B/s sent (20 % of 12.5e9 B/s), 1.25e9 B/s received, 2 s of 10 s stalled (25e9
    # bytes the link could have sent, at 8 bytes a count on a ConnectX-6), 3 symbol errors,
    # 50 receive errors (5/s, below the 10/s threshold)
    put("mlx5_0", 1, "counters", "port_xmit_data", 2_880_761_508_848 + 6_250_000_000)
    put("mlx5_0", 1, "counters", "port_rcv_data", 1_000_000_000 + 3_125_000_000)
    put("mlx5_0", 1, "counters", "port_xmit_wait", 1_000 + 3_125_000_000)
    put("mlx5_0", 1, "counters", "symbol_error", FULL_COUNTERS["symbol_error"] + 3)
    put("mlx5_0", 1, "counters", "port_rcv_errors", FULL_COUNTERS["port_rcv_errors"] + 50)
    put("mlx5_0", 1, "hw_counters", "out_of_buffer", 3 + 20)
    # port 2 went down: link downed once, one local link integrity error on the way
    put("mlx5_0", 2, "counters", "link_downed", FULL_COUNTERS["link_downed"] + 1)
    put("mlx5_0", 2, "counters", "local_link_integrity_errors", 1)
    (ports / "mlx5_0" / "ports" / "2" / "state").write_text("1: DOWN\n")
    (ports / "mlx5_0" / "ports" / "2" / "phys_state").write_text("2: Polling\n")
    # perfquery -R on mlx5_2, then 1000 words and 10 packets before the second poll
    put("mlx5_2", 1, "counters", "port_xmit_data", 1_000)
    put("mlx5_2", 1, "counters", "port_xmit_packets", 10)
    # RoCE: 400 CNP/s handled, 30 ECN-marked/s
    put("mlx5_1", 1, "hw_counters", "rp_cnp_handled", 100 + 4_000)
    put("mlx5_1", 1, "hw_counters", "np_ecn_marked_roce_packets", 50 + 300)


@pytest.mark.parametrize("fabric_sized", [True, False], ids=["fabric-path", "node-path"])
async def test_second_poll_matches_golden(
    tmp_path: Path, fabric_sized: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same body whichever way the poll is done (``ibmon.runtime.sizes``): a fabric's (columns,
    worker threads) or a node's (port by port, on the loop)."""
    monkeypatch.setattr(sizes, "OFFLOAD_PORTS", 1 if fabric_sized else 1 << 62)
    build_busy_tree(tmp_path)
    body = await two_polls_exposition(tmp_path, busy_ten_seconds)
    check_golden(POLLS_GOLDEN, normalised(body.decode()))


# ------------------------------------------------------------------ the update mode itself


def test_update_mode_rewrites_the_golden_and_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    golden = tmp_path / "x.prom"
    golden.write_text("old\n")
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv(UPDATE, "1")
    with pytest.raises(pytest.fail.Exception, match=r"x\.prom regenerated: review the diff"):
        check_golden(golden, "new\n")
    assert golden.read_text() == "new\n"


def test_update_mode_is_refused_under_ci(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    golden = tmp_path / "x.prom"
    golden.write_text("old\n")
    monkeypatch.setenv("CI", "1")
    monkeypatch.setenv(UPDATE, "1")
    with pytest.raises(pytest.fail.Exception, match="refused under CI"):
        check_golden(golden, "new\n")
    assert golden.read_text() == "old\n"


def test_golden_mismatch_fails_without_the_update_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    golden = tmp_path / "x.prom"
    golden.write_text("old\n")
    monkeypatch.delenv(UPDATE, raising=False)
    with pytest.raises(AssertionError, match=r"differs from x\.prom"):
        check_golden(golden, "new\n")
    assert golden.read_text() == "old\n"


def test_build_info_must_name_this_python_and_this_version() -> None:
    b = 'deflate="isal",numpy="yes"'
    m = 'deflate="<b>",numpy="<b>"'
    line = 'ibmon_build_info{{' + b + ',python="{}",version="{}"}} 1.0\n'
    ours = line.format(platform.python_version(), __version__)
    assert normalised(ours) == (
        f'ibmon_build_info{{{m},python="<python>",version="<version>"}} 1.0\n')
    not_this_python = line.format("2.7.18", __version__)
    assert normalised(not_this_python) == (
        f'ibmon_build_info{{{m},python="2.7.18",version="<version>"}} 1.0\n')
    not_this_version = line.format(platform.python_version(), "0.0.0")
    assert normalised(not_this_version) == (
        f'ibmon_build_info{{{m},python="<python>",version="0.0.0"}} 1.0\n')


# ------------------------------------------------------------------ promtool on both bodies


@pytest.mark.system
def test_goldens_pass_promtool(tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    build_tree(tmp_path / "scan")
    build_busy_tree(tmp_path / "polls")
    bodies = {
        "scan": scan_prom(tmp_path / "scan"),
        "two polls": asyncio.run(
            two_polls_exposition(tmp_path / "polls", busy_ten_seconds)).decode(),
    }
    for name, body in bodies.items():
        proc = subprocess.run(
            [promtool, "check", "metrics"],
            input=body,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        # Clean, lint included: no finding is tolerated.
        assert (proc.returncode, proc.stdout + proc.stderr) == (0, ""), name
