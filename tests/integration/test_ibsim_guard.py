"""A tool killed while it attaches to ibsim costs that tool, never the simulator.

ibsim IBPANICs (exits) when a client is gone by the time it connects back to it
(``sim_ctl_new_client``): the daemon under test kills tools on timeouts, so any test could lose
its simulator, and with it every later test of the module (the CI failures that led here). The
window is made wide on purpose: ibsim is stopped (SIGSTOP) while a perfquery sends its attach
request, the perfquery is killed, then ibsim goes on and finds the client gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest

from mocks.ibsim import IbSim, guard_library
from tests.ibsim_fixtures import sim_for
from tests.syspkg import require_binary

pytestmark = pytest.mark.system

NET = """\
Switch 4 "S1"
[1] "H1"[1]

Hca 1 "H1"
[1] "S1"[1]
"""


@pytest.fixture(scope="module")
def sim() -> Iterator[IbSim]:
    require_binary("gcc")
    yield from sim_for(NET)


def perfquery(sim: IbSim) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["perfquery", "-x", "-l", "1", "1"], env=sim.tool_env(), cwd=sim.workdir,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )


def attached_pids(sim: IbSim) -> set[int]:
    return {pid for _slot, pid in sim._attached()}


def test_a_tool_killed_while_attaching_leaves_the_simulator_running(sim: IbSim) -> None:
    assert guard_library() is not None
    proc = sim._ibsim
    assert proc is not None
    restarts = sim.restarts
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        tool = perfquery(sim)
        time.sleep(0.5)  # it has sent its attach request and waits for the answer
        tool.kill()
        tool.communicate()
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    deadline = time.monotonic() + 10
    while "died while attaching" not in sim.output():
        assert sim.running, sim.how_it_ended()
        assert time.monotonic() < deadline, sim.output()[-500:]
        time.sleep(0.05)
    assert sim.running and sim.restarts == restarts
    # The dead client holds a slot as if attached; the harness frees it like any other.
    assert tool.pid in attached_pids(sim)
    assert sim.reap_clients() == 1
    assert tool.pid not in attached_pids(sim)
    # And the simulator still answers: opensm's slot and a new tool work.
    ok = perfquery(sim)
    out, err = ok.communicate(timeout=60)
    assert ok.returncode == 0, err
    assert "PortXmitData" in out
    assert sim.subnet_up_count() >= 1
