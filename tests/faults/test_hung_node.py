"""Fault: one node whose perfquery hangs must not slow the polling of the whole fabric.

The real ``diags`` source polls a real ibsim + opensm fabric through the real infiniband-diags,
on the daemon's cadence (a poll every second, the next one as soon as the last ended when it ran
late). A fake ``perfquery`` first on the runner's PATH hangs for the LIDs a control file names and
runs the real tool for everything else; it hangs before attaching to ibsim, so killing it on its
timeout is safe for the simulator.

What a user relies on: the healthy ports keep the configured cadence while one node hangs, the
hung node's ports are reported (a ``timeout`` SourceError for each, every poll) and carry no
values, and once the node answers again its ports are read again.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ibmon.infiniband.model import PortKey, Snapshot
from ibmon.sources.diags import DiagsSource, SubprocessRunner
from mocks.ibsim import IbSim
from tests.ibsim_fixtures import sim_for
from tests.syspkg import require_binary

NET = """\
Switch 8 "S1"
[1] "H1"[1]
[2] "H2"[1]
[3] "H3"[1]

Hca 2 "H1"
[1] "S1"[1]

Hca 2 "H2"
[1] "S1"[2]

Hca 2 "H3"
[1] "S1"[3]
"""

PERFQUERY = r'''#!{python}
"""A perfquery that hangs for the LIDs the control file names (else the real one)."""
import json, os, sys, time
try:
    with open({control!r}) as f:
        hung = json.load(f)
except (OSError, ValueError):
    hung = []
args = sys.argv[1:]
lid = args[args.index("-l") + 1] if "-l" in args else ""
if lid in hung:
    time.sleep(3600)
os.execv({real!r}, [{real!r}, *args])
'''

INTERVAL = 1.0


@pytest.fixture(scope="module")
def sim() -> Iterator[IbSim]:
    yield from sim_for(NET)


def fake_perfquery(tmp: Path) -> tuple[Path, Path]:
    """The fake tool's directory and its control file (a JSON list of LIDs, as text)."""
    bindir = tmp / "bin"
    bindir.mkdir()
    control = tmp / "hung.json"
    control.write_text("[]")
    tool = bindir / "perfquery"
    tool.write_text(PERFQUERY.format(python=sys.executable, control=str(control),
                                     real=require_binary("perfquery")))
    tool.chmod(0o755)
    return bindir, control


async def cadence(src: DiagsSource, seconds: float) -> list[Snapshot]:
    """Poll as the pipeline does for ``seconds``: every INTERVAL, or right away when late."""
    snaps: list[Snapshot] = []
    start = time.monotonic()
    due = start
    while True:
        now = time.monotonic()
        if now < due:
            await asyncio.sleep(due - now)
        if time.monotonic() - start >= seconds:
            return snaps
        due = time.monotonic() + INTERVAL
        snap = await src.sample()
        if time.monotonic() - start <= seconds:
            snaps.append(snap)


def timeouts(snap: Snapshot) -> set[PortKey]:
    return {e.key for e in snap.errors if e.reason == "timeout" and e.key is not None}


def test_one_hung_node_keeps_the_rest_on_cadence(sim: IbSim, tmp_path: Path) -> None:
    bindir, control = fake_perfquery(tmp_path)
    env = sim.tool_env()
    env["PATH"] = f"{bindir}:{env.get('PATH', '')}"

    async def run() -> None:
        src = DiagsSource(runner=SubprocessRunner(concurrency=8, env=env, cwd=sim.workdir),
                          interval=INTERVAL, state_interval=3600.0)
        try:
            topo = await src.discover()
            h3 = {k for k, p in topo.ports.items() if p.node_desc.startswith("H3")}
            assert len(h3) == 1
            (h3_key,) = h3
            h3_lid = topo.ports[h3_key].lid
            healthy = {k for k, p in topo.ports.items() if k not in h3 and p.lid}
            assert len(healthy) >= 3
            first = await src.sample()
            assert healthy | h3 <= set(first.ports)

            control.write_text(json.dumps([str(h3_lid)]))
            hung = await cadence(src, 10.0)
            # before: the hung node's command timeout (2.5 s here) in every poll, 4 polls
            assert len(hung) >= 8, f"{len(hung)} polls in 10 s with one node hung"
            for snap in hung:
                assert healthy <= set(snap.ports), "a healthy port went unread"
                assert h3_key not in snap.ports, "a hung node's port has values"
                assert h3_key in timeouts(snap), "a hung node's port went unreported"
                assert not timeouts(snap) & healthy

            control.write_text("[]")
            back = await cadence(src, 6.0)
            assert back and h3_key in back[-1].ports, "the node did not come back"
            assert not timeouts(back[-1])
            assert all(healthy <= set(s.ports) for s in back)
        finally:
            await src.close()

    asyncio.run(run())
