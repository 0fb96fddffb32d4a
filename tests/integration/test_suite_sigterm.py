"""A test run ended by SIGTERM (a cancelled CI job, ``timeout``) leaves no simulator behind, and a
test that hangs fails on its own, with its stack, leaving none either.

ibsim and opensm run in sessions of their own, so a signal to the run's process group never
reaches them: only the fixtures' teardown stops them, which ``tests/conftest.py`` runs on SIGTERM
as on Ctrl-C. Without it each killed run left both running, a CPU busy and a work directory. A
hung test is failed by pytest-timeout (``timeout`` in pyproject.toml), so it costs that test, not
the run: without it one hang held ``make test`` until CI's 90-minute limit killed it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from tests.ibsim_fixtures import REPO, require_ibsim

pytestmark = pytest.mark.system

_TEST = """
import os, time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mocks.ibsim import IbSim
from tests.ibsim_fixtures import sim_for

NET = 'Switch 4 "S1"\\n[1] "H1"[1]\\n\\nHca 1 "H1"\\n[1] "S1"[1]\\n'


@pytest.fixture(scope="module")
def sim() -> Iterator[IbSim]:
    yield from sim_for(NET)


def test_waits_for_its_signal(sim: IbSim) -> None:
    pids = [sim._ibsim.pid, sim._opensm.pid]
    Path(os.environ["SIM_STARTED"]).write_text(f"{pids[0]} {pids[1]} {sim.workdir}")
    time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _inner_run(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[bytes], list[int], str]:
    """A pytest run of ``_TEST`` once its simulator is up: the run, ibsim's and opensm's pids and
    the simulator's work directory."""
    require_ibsim()
    (tmp_path / "test_inner.py").write_text(_TEST)
    started = tmp_path / "started"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), *args, str(tmp_path / "test_inner.py")],
        cwd=REPO, env={**os.environ, "SIM_STARTED": str(started), "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not started.exists() or not started.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("the inner run never started its simulator:\n"
                                 + proc.communicate()[0].decode(errors="replace"))
        time.sleep(0.1)
    ibsim, opensm, workdir = started.read_text().split()
    return proc, [int(ibsim), int(opensm)], workdir


def _cleanup(proc: subprocess.Popen[bytes], pids: list[int]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_sigterm_to_the_run_stops_its_simulators(tmp_path: Path) -> None:
    proc, pids, workdir = _inner_run(tmp_path)
    try:
        assert all(map(_alive, pids))
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=30)[0].decode(errors="replace")
        assert proc.returncode != 0, out  # interrupted, not passed
        assert not [pid for pid in pids if _alive(pid)], out
        assert not Path(workdir).exists()
    finally:
        _cleanup(proc, pids)


def test_a_hung_test_fails_with_its_stack_and_stops_its_simulators(tmp_path: Path) -> None:
    """Under the project's pytest settings, with only the limit lowered (the same ini key)."""
    ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert 0 < ini["timeout"] <= 600  # a hang costs minutes, not the run
    proc, pids, workdir = _inner_run(tmp_path, "-c", str(REPO / "pyproject.toml"),
                                     "-o", "timeout=4")
    try:
        out = proc.communicate(timeout=60)[0].decode(errors="replace")
        assert proc.returncode == pytest.ExitCode.TESTS_FAILED, out
        assert "Timeout (>4.0s)" in out, out
        assert "time.sleep(120)" in out, out  # where it hung
        assert "1 failed" in out, out
        assert not [pid for pid in pids if _alive(pid)], out
        assert not Path(workdir).exists()
    finally:
        _cleanup(proc, pids)
