"""A counter reset survives a kill -9 that follows its publication.

The real daemon (``python -m ibmon run``) reads a simulated sysfs tree with a long periodic save
interval. A port's symbol_error counter drops (a reset); as soon as ``ibmon_port_resets_total``
shows it the daemon is killed with SIGKILL, the counter grows, and a new daemon starts. A user
who saw the reset must not see it undone: the restart keeps the reset count and the total keeps
every count that happened after the reset.
"""

from __future__ import annotations

import functools
import json
import operator
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from mocks.sysfs import SysfsRenderer
from mocks.topology import fat_tree
from mocks.traffic import FabricModel

REPO = Path(__file__).resolve().parents[2]


def _metric(body: str, name: str, guid: str) -> int | None:
    m = re.search(rf'^{name}\{{guid="{guid}",port="1"[^}}]*\}} (\d+)$', body, re.M)
    return int(m[1]) if m else None


class _Daemon:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.model = FabricModel(fat_tree(levels=2, radix=16, leaves=4, hosts_per_leaf=12), seed=3)
        self.renderer = SysfsRenderer(self.model, tmp / "sys")
        self.renderer.render()
        self.config = tmp / "ibmon.toml"
        self.config.write_text(
            f'[prometheus]\nlisten = "127.0.0.1:0"\n'
            f'[[sources]]\ntype = "sysfs"\nname = "node"\nroot = "{tmp / "sys"}"\n'
            f'interval = "0.2s"\n'
            f'[state]\npath = "{tmp / "state.json"}"\nsave_interval = "60s"\n'
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.starts = 0

    def start(self) -> None:
        env = {**os.environ, "IBMON_LOG__FORMAT": "json"}
        env.pop("IBMON_STATE__PATH", None)
        self.starts += 1
        log = self.tmp / f"daemon-{self.starts}.log"
        with log.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ibmon", "run", "--config", str(self.config)],
                cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err,
                start_new_session=True,
            )
        deadline = time.monotonic() + 30
        while True:
            assert self.proc.poll() is None, log.read_text()
            found = [json.loads(line)["port"] for line in log.read_text().splitlines()
                     if '"listening"' in line]
            if found:
                self.port = int(found[0])
                return
            assert time.monotonic() < deadline, "daemon never listened"
            time.sleep(0.05)

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            return str(resp.read().decode())

    def wait_for(
        self, name: str, guid: str, pred: Callable[[int], bool], timeout: float = 20.0
    ) -> int:
        deadline = time.monotonic() + timeout
        while True:
            value = _metric(self.metrics(), name, guid)
            if value is not None and pred(value):
                return value
            assert time.monotonic() < deadline, f"timed out waiting for {name}"
            time.sleep(0.005)

    def kill(self, sig: int) -> None:
        if self.proc is None:
            return
        os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None


def test_reset_seen_before_a_kill9_is_kept_after_restart(tmp_path: Path) -> None:
    d = _Daemon(tmp_path)
    guid = d.model.fabric.node_by_desc("host001 mlx5_0").guid
    key = (guid, 1)
    total = "ibmon_port_symbol_errors_total"
    resets = "ibmon_port_resets_total"
    try:
        d.model.set_value(key, "symbol_errors", 100)
        d.renderer.render()
        d.start()
        expected = d.wait_for(total, guid, lambda v: v >= 100)
        # The periodic (60 s) save never comes: only the reset itself may force a save. The
        # kill races the daemon, so the reset-kill-restart cycle runs a few times.
        for cycle in range(1, 4):
            d.model.set_value(key, "symbol_errors", 0)
            d.renderer.render()
            d.wait_for(resets, guid, functools.partial(operator.le, cycle), timeout=10)
            d.kill(signal.SIGKILL)
            d.model.set_value(key, "symbol_errors", 140)
            d.renderer.render()
            d.start()
            expected += 140
            d.wait_for(total, guid, lambda v: v >= 0)
            time.sleep(0.6)  # a few polls more
            body = d.metrics()
            assert (_metric(body, total, guid), _metric(body, resets, guid)) == (
                expected, cycle), f"after kill -9 number {cycle}"
    finally:
        d.kill(signal.SIGTERM)
