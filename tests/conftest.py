"""Suite-wide rules.

- Isolation: no test reads or writes the real /var/lib/ibmon state file, and each test starts
  with no object frozen out of the GC's collections.
- Under ``CI`` a skipped test fails the session. Helpers already turn a missing binary, library
  or real fixture into a failure there (``tests.syspkg``, ``tests.fixtures``), but a plain
  ``pytest.skip`` or ``skipif`` added later would still pass silently; this guard makes sure a
  CI run never reports green with a part of the suite not run.
- Fabric paths by default: in-process tests run every poll the way a fabric-sized one runs
  (``ibmon.runtime.sizes.OFFLOAD_PORTS`` is 1); ``@pytest.mark.node_sized`` keeps the node path.
- A SIGTERM (a cancelled CI job, ``timeout``, ``kill``) ends a run the way Ctrl-C does, with
  every fixture's teardown: ibsim, opensm, Mosquitto and the other real components run in
  sessions of their own, out of reach of a signal to the run's process group, and would
  otherwise outlive the run, holding a CPU and their temporary directories.
"""

from __future__ import annotations

import gc
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

from ibmon.runtime import sizes
from tests.mqtt_broker import Mosquitto
from tests.syspkg import require_binary

_SKIPPED: list[tuple[str, str]] = []  # (test id, reason) of every skip in this session


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    """A real Mosquitto on a free loopback port, in the test's temporary directory."""
    mosq = Mosquitto(require_binary("mosquitto"), tmp_path / "broker")
    mosq.start()
    try:
        yield mosq
    finally:
        mosq.stop()


@pytest.fixture(autouse=True)
def _private_state_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A daemon restores totals from its state file; tests must not share one (or touch /var)."""
    monkeypatch.setenv("IBMON_STATE__PATH", str(tmp_path / "ibmon-state.json"))
    return


@pytest.fixture(autouse=True)
def _fabric_paths(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every poll of an in-process test is fabric-sized (``ibmon.runtime.sizes``): a 20-port test
    fabric runs the column store, the worker threads and the column readers a 20,000-port
    fabric runs. Tests of the node-sized path (a node's HCAs: port by port, no numpy) say so
    with ``@pytest.mark.node_sized`` and keep the daemon's threshold. A daemon started as a
    subprocess keeps it too."""
    if request.node.get_closest_marker("node_sized") is None:
        monkeypatch.setattr(sizes, "OFFLOAD_PORTS", 1)


@pytest.fixture(autouse=True)
def _process_wide_defaults() -> Iterator[None]:
    """Leave the GC as the test found it."""
    yield
    # A large poll's work freezes every object of the process when it ends
    # (``ibmon.runtime.gcpause``, as the daemon's first poll does): a cycle some test left would
    # then never be collected.
    gc.unfreeze()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends a teardown that hangs
    raise KeyboardInterrupt


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before every test, not once: an in-process daemon's signal handling (asyncio's
    ``remove_signal_handler``) puts SIGTERM back to its default when it stops."""
    signal.signal(signal.SIGTERM, _interrupt)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Remember every skip (setup or call phase); an expected failure is not a skip."""
    if report.skipped and not hasattr(report, "wasxfail"):
        _SKIPPED.append((report.nodeid, _reason(report)))


def pytest_collectreport(report: pytest.CollectReport) -> None:
    """A whole module skipped at import (``pytest.skip(allow_module_level=True)``) counts too."""
    if report.skipped:
        _SKIPPED.append((report.nodeid, _reason(report)))


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    text = str(longrepr[2]) if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("CI") and _SKIPPED and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if os.environ.get("CI") and _SKIPPED:
        terminalreporter.section("skipped tests fail the run under CI", sep="=", red=True)
        for nodeid, reason in _SKIPPED:
            terminalreporter.line(f"SKIPPED {nodeid}: {reason}", red=True)
