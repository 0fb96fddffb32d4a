"""The ibsim driver: real perfquery / iblinkinfo read what the FabricModel scripted.

ibsim adds 72 words and one packet to the data/packet counters of every port a MAD crosses
(including perfquery's own queries), so those four are compared with that much slack; every other
counter must be exact.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mocks.ibsim import IbSimError
from mocks.ibsim_driver import IbSimDriver
from mocks.traffic import COUNTER_NAMES
from tests.ibsim_fixtures import REPO, require_ibsim
from tests.syspkg import require_binary

pytestmark = pytest.mark.system

_FIELD = re.compile(r"^(\w+):\.+(\d+)$", re.MULTILINE)
# PortCounters(Extended) field -> catalogue counter
_EXT = {
    "PortXmitData": "transmit_data",
    "PortRcvData": "receive_data",
    "PortXmitPkts": "transmit_packets",
    "PortRcvPkts": "receive_packets",
    "PortUnicastXmitPkts": "unicast_transmit_packets",
    "PortUnicastRcvPkts": "unicast_receive_packets",
    "PortMulticastXmitPkts": "multicast_transmit_packets",
}
_NARROW = {
    "SymbolErrorCounter": "symbol_errors",
    "LinkErrorRecoveryCounter": "link_error_recovery",
    "LinkDownedCounter": "link_downed",
    "PortRcvErrors": "receive_errors",
    "PortXmitDiscards": "transmit_discards",
    "LocalLinkIntegrityErrors": "local_link_integrity_errors",
    "ExcessiveBufferOverrunErrors": "excessive_buffer_overrun_errors",
    "PortXmitWait": "transmit_wait",
}
_TRAFFIC_SLACK = {"transmit_data": 72, "receive_data": 72, "transmit_packets": 1,
                  "receive_packets": 1}
_MAD_BUDGET = 200  # MADs that may cross one port between a push and the read in these tests


@pytest.fixture(scope="module")
def drv() -> Iterator[IbSimDriver]:
    require_ibsim()
    require_binary("iblinkinfo")
    with IbSimDriver.start("flap") as d:
        yield d


def tool(d: IbSimDriver, *argv: str) -> str:
    res = subprocess.run(list(argv), env=d.sim.tool_env(), cwd=d.sim.workdir, capture_output=True,
                         text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr[-500:]
    return res.stdout


def perfquery(d: IbSimDriver, desc: str, port: int, *extra: str) -> dict[str, int]:
    lid = d.model.fabric.node_by_desc(desc).lid
    return {k: int(v) for k, v in _FIELD.findall(tool(d, "perfquery", *extra, str(lid), str(port)))}


def model_values(d: IbSimDriver, desc: str, port: int) -> dict[str, int]:
    i = d.model.port_index((d.model.fabric.node_by_desc(desc).guid, port))
    return dict(zip(COUNTER_NAMES, d.model.row(i), strict=True))


def assert_counters_match(d: IbSimDriver, desc: str, port: int) -> None:
    want = model_values(d, desc, port)
    ext = perfquery(d, desc, port, "-x")
    narrow = perfquery(d, desc, port)
    for field, name in _EXT.items():
        slack = _TRAFFIC_SLACK.get(name, 0) * _MAD_BUDGET
        assert want[name] <= ext[field] <= want[name] + slack, (desc, port, field)
    for field, name in _NARROW.items():
        assert narrow[field] == want[name], (desc, port, field)
    for field in ("PortXmitData", "PortRcvData", "PortXmitPkts", "PortRcvPkts"):
        # the 32-bit copies saturate, as on real hardware (the model starts with history)
        name = _EXT[field]
        top = 2**32 - 1
        low = min(want[name], top)
        assert low <= narrow[field] <= min(want[name] + _TRAFFIC_SLACK[name] * _MAD_BUDGET, top)


def link_line(d: IbSimDriver, switch: str, port: int) -> str:
    text = tool(d, "iblinkinfo", "--switches-only")
    section = next(s for s in text.split("Switch: ") if s.split("\n", 1)[0].endswith(f"{switch}:"))
    return next(ln for ln in section.splitlines() if re.match(rf"^\s+\d+\s+{port}\[", ln))


def test_perfquery_reads_what_the_model_set(drv: IbSimDriver) -> None:
    stats = drv.step_to(30.0)
    assert stats.lines > 0 and stats.unlinks == stats.relinks == 0
    for desc, port in (("host021 mlx5_0", 1), ("leaf02", 3), ("leaf04", 30), ("spine02", 7)):
        assert_counters_match(drv, desc, port)
    # 64-bit values really are beyond 32 bits: -x shows the model's wide value, not a copy
    assert perfquery(drv, "leaf02", 3, "-x")["PortXmitData"] > 2**32


def test_only_changed_values_are_pushed(drv: IbSimDriver) -> None:
    drv.step_to(40.0)
    assert drv.step_to(40.0).lines == 0  # the clock did not move: nothing changed
    i = drv.model.port_index((drv.model.fabric.node_by_desc("host005 mlx5_0").guid, 1))
    drv.model.bump(drv.model.keys[i], "symbol_errors", 7)
    stats = drv.push()
    assert stats.lines == 1
    assert perfquery(drv, "host005 mlx5_0", 1)["SymbolErrorCounter"] == \
        model_values(drv, "host005 mlx5_0", 1)["symbol_errors"]


def test_a_counter_ibsim_does_not_set_fails_the_push(drv: IbSimDriver) -> None:
    """A PerformanceSet that ibsim answers without "has been set to" (here: a node it does not
    have) is an IbSimError, not a counter silently left behind the model."""
    key = (drv.model.fabric.node_by_desc("host006 mlx5_0").guid, 1)
    i = drv.model.port_index(key)
    prefix = drv._prefix[i]
    drv._prefix[i] = 'PerformanceSet "H-00000000000dead0"[1] '
    try:
        drv.model.bump(key, "symbol_errors", 1)
        with pytest.raises(IbSimError, match=r"PerformanceSet failed \(0/1 applied\)"):
            drv.push()
    finally:
        drv._prefix[i] = prefix
        drv._pushed.pop(i, None)  # push the port whole next time
    drv.push()
    assert perfquery(drv, "host006 mlx5_0", 1)["SymbolErrorCounter"] == \
        model_values(drv, "host006 mlx5_0", 1)["symbol_errors"]


def test_scripted_flap_shows_in_iblinkinfo_and_link_downed(drv: IbSimDriver) -> None:
    assert "Active" in link_line(drv, "leaf02", 3)
    stats = drv.step_to(121.0)  # flap.yaml: leaf02[3] goes down at t=120 for 5 s
    assert stats.unlinks == 1
    line = link_line(drv, "leaf02", 3)
    assert "Down" in line and "Active" not in line, line
    # ibsim's Unlink does not count a link-down: the model's increment reached LinkDowned
    assert perfquery(drv, "leaf02", 3)["LinkDownedCounter"] == 1
    assert model_values(drv, "leaf02", 3)["link_downed"] == 1
    assert_counters_match(drv, "leaf02", 3)
    stats = drv.step_to(126.0)
    assert stats.relinks == 1
    assert "Active" in link_line(drv, "leaf02", 3)
    assert_counters_match(drv, "host021 mlx5_0", 1)  # reachable again, LinkDowned 1 there too
    assert perfquery(drv, "host021 mlx5_0", 1)["LinkDownedCounter"] == 1


def _read_until(proc: subprocess.Popen[bytes], pattern: str, timeout: float) -> re.Match[str]:
    """Raw reads (no buffered readline that select cannot see) until ``pattern`` shows up."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    end = time.monotonic() + timeout
    seen = b""
    while time.monotonic() < end:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            seen += chunk
            m = re.search(pattern, seen.decode("utf-8", "replace"))
            if m:
                return m
    pytest.fail(f"no {pattern!r} in output: {seen[-2000:]!r}")


def test_cli_prints_the_environment_tools_need() -> None:
    require_ibsim()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("LD_PRELOAD", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "ibmon", "sim", "ibsim", "--scenario", "counter-reset",
         "--speed", "20"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=REPO, bufsize=0,
        start_new_session=True,
    )
    try:
        m = _read_until(proc, r"cd (\S+) && export IBSIM_SOCKNAME=(\S+) LD_PRELOAD=(\S+)", 120)
        workdir, sock, preload = m.group(1), m.group(2), m.group(3)
        tool_env = {**os.environ, "IBSIM_SOCKNAME": sock, "LD_PRELOAD": preload}
        res = subprocess.run(["perfquery", "-x", "1", "1"], env=tool_env, cwd=workdir,
                             capture_output=True, text=True, timeout=60, check=False)
        assert res.returncode == 0, res.stderr[-500:]
        # LID 1 is spine01 (the net file's first switch); the model's history is > 2**32
        assert int(dict(_FIELD.findall(res.stdout))["PortXmitData"]) > 2**32
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()
    assert proc.returncode == 0
    assert not Path(workdir).exists()  # ibsim and opensm stopped, their files removed


async def test_sources_see_a_port_go_down_without_rediscovery(drv: IbSimDriver) -> None:
    """mad refreshes port state every poll; diags every ``state_interval`` (one ibnetdiscover)."""
    from ibmon.sources.diags import DiagsSource, SubprocessRunner
    from mocks.ibsim_driver import MadSourceProcess

    leaf = drv.model.fabric.node_by_desc("leaf03")
    key = (leaf.guid, "5")
    mad = MadSourceProcess(drv.sim, include=[leaf.guid], timeout=0.25, retries=1)

    def diags(interval: float) -> DiagsSource:
        runner = SubprocessRunner(concurrency=4, env=drv.sim.tool_env(), cwd=drv.sim.workdir)
        return DiagsSource(runner=runner, include=[leaf.guid], state_interval=interval)

    every, lazy = diags(0.0), diags(3600.0)
    try:
        for src in (mad, every, lazy):
            await src.discover()
            assert (await src.sample()).ports[key].state == 4
        drv.model.link_down((leaf.guid, 5))
        assert drv.push().unlinks == 1
        m, e, z = await mad.sample(), await every.sample(), await lazy.sample()
        assert m.ports[key].state == e.ports[key].state == 1  # Down, seen at once
        assert m.ports[key].phys_state == e.ports[key].phys_state == 2  # Polling
        assert z.ports[key].state == 4  # the refresh is not due yet: last known state
        drv.model.link_up((leaf.guid, 5))
        assert drv.push().relinks == 1
        assert (await mad.sample()).ports[key].state == 4
        assert (await every.sample()).ports[key].state == 4
    finally:
        for src in (mad, every, lazy):
            await src.close()
