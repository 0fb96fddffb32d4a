"""How the ``mad`` source keeps its MAD worker: a worker that never opens its port is replaced,
one that was open and closes is logged, the poll after a cancelled one runs on a fresh worker,
a worker that cannot be reaped is never replaced, and reopening backs off (no device needed:
the workers are small shell scripts speaking the worker's frames).

The worker process itself is tested in ``test_mad_worker.py``.
"""

from __future__ import annotations

import asyncio
import functools
import re
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from ibmon.sources import mad
from ibmon.sources.libibmad import ATTR_NODE_INFO, CLASS_SMI, MadError, MadRequest
from ibmon.sources.mad import MadSource
from ibmon.sources.madworker import MadWorker
from tests.unit.test_mad_worker import NO_CA, fake_python, frames_file


def _ready_then(tmp_path: Path, then: str) -> str:
    """A fake worker that says ready, then runs ``then`` (sh)."""
    ready = frames_file(tmp_path / "ready.frame", ("ready",))
    return fake_python(tmp_path, f"cat {ready}; {then}")


def _with_python(monkeypatch: pytest.MonkeyPatch, python: str) -> None:
    """The source's workers run ``python``."""
    monkeypatch.setattr(mad, "MadWorker", functools.partial(MadWorker, python=python))


async def test_a_worker_that_never_opens_its_port_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each poll waits for it a little (OPEN_WAIT); past OPEN_GIVE_UP it is killed, and the
    next poll starts another."""
    _with_python(monkeypatch, fake_python(tmp_path, "exec sleep 60"))
    monkeypatch.setattr(mad, "OPEN_WAIT", 0.1)
    monkeypatch.setattr(mad, "OPEN_GIVE_UP", 0.5)
    src = MadSource()
    try:
        with pytest.raises(MadError, match=r"MAD port not open yet after 0s \(still trying\)"):
            await src.discover()
        (first,) = src.worker_pids
        await asyncio.sleep(0.5)
        with pytest.raises(MadError, match="not open yet"):
            await src.discover()  # past the limit: given up
        assert src.worker_pids == []
        with pytest.raises(MadError, match="not open yet"):
            await src.discover()
        (second,) = src.worker_pids
    finally:
        await src.close()
    assert second != first
    assert src.worker_pids == []


async def test_a_port_that_was_open_and_closes_is_logged_with_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _with_python(monkeypatch, _ready_then(tmp_path, "exit 5"))
    src = MadSource()
    try:
        with capture_logs() as logs, pytest.raises(MadError, match="exited with status 5"):
            await src.discover()  # ready, then gone before it answers the sweep
        assert not [e for e in logs if e["event"] == "mad_port_closed"]
        with capture_logs() as logs, pytest.raises(MadError):
            await src.discover()  # the broken worker is closed before a new one starts
    finally:
        await src.close()
    closed = [e for e in logs if e["event"] == "mad_port_closed"]
    assert len(closed) == 1 and closed[0]["log_level"] == "warning"
    assert "exited with status 5" in closed[0]["reason"]


async def test_the_poll_after_a_cancelled_one_runs_on_a_fresh_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A poll cut at its deadline kills its worker; the next poll does not send to the dead
    one (and fail) but starts another."""
    _with_python(monkeypatch, _ready_then(tmp_path, "exec sleep 60"))  # a frozen fabric
    src = MadSource()
    try:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(1.0):
                await src.discover()
        (first,) = src.worker_pids
        with pytest.raises(TimeoutError):  # not "MAD worker killed by signal 9"
            async with asyncio.timeout(1.0):
                await src.discover()
        assert first not in src.worker_pids and len(src.worker_pids) == 1
    finally:
        await src.close()


async def test_a_worker_that_does_not_exit_is_never_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Never two workers on one umad port: while a closed worker cannot be reaped (stuck in
    the kernel), the port is not opened again."""
    started: list[MadWorker] = []

    class Stuck(MadWorker):
        def __init__(self, **kw: Any) -> None:
            super().__init__(python=_ready_then(tmp_path, "exit 5"), **kw)
            started.append(self)

        def close(self, grace: float = 0.5, reap: float = 2.0) -> bool:
            super().close(grace, reap)
            return False  # as if it were still alive

    monkeypatch.setattr(mad, "MadWorker", Stuck)
    src = MadSource()
    try:
        with pytest.raises(MadError, match="exited with status 5"):
            await src.discover()
        for _ in range(2):
            with pytest.raises(MadError, match=r"previous MAD worker \(pid \d+\) does not exit"):
                await src.discover()
    finally:
        await src.close()
    assert len(started) == 1


async def test_an_answered_batch_ends_the_backoff(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A port that failed, reopened and answered is reopened at once when it fails again, not
    after the delay its earlier failures had earned."""
    answers = frames_file(tmp_path / "answers", ("ready",), ("ok", [(b"a", None)]))
    ready = frames_file(tmp_path / "ready", ("ready",))
    opened = tmp_path / "opened"
    # the first worker dies after saying ready; every later one answers one batch
    _with_python(monkeypatch, fake_python(
        tmp_path, f"if [ -e {opened} ]; then cat {answers}; exec cat > /dev/null; fi\n"
                  f"touch {opened}; cat {ready}; exit 5"))
    src = MadSource()
    batch = [MadRequest(CLASS_SMI, ATTR_NODE_INFO, path=())]
    try:
        await src._ensure_worker()
        with pytest.raises(MadError, match="exited with status 5"):
            src._run_sync(batch)
        await src._ensure_worker()  # the first reopen is at once
        assert src._run_sync(batch)[0].data == b"a"
        src._kill_worker("a test")
        await src._ensure_worker()  # at once again: no "reopening in 1.0s"
        assert src._run_sync(batch)[0].data == b"a"
    finally:
        await src.close()


async def test_reopening_a_failing_port_backs_off_1_then_2_then_4_seconds() -> None:
    """The first reopen is at once, then REOPEN_BACKOFF: 1 s, 2 s, 4 s..."""
    src = MadSource(ca=NO_CA)
    waits: list[float] = []
    try:
        for _ in range(2):  # the first failure, and the reopen at once
            with pytest.raises(MadError, match="cannot open a MAD port"):
                await src.discover()
        for _ in range(3):
            with pytest.raises(MadError, match=r"reopening in [\d.]+s") as info:
                await src.discover()
            waits.append(float(re.findall(r"[\d.]+", str(info.value))[-1]))
            src._reopen_at = 0.0  # the wait is over: the next one fails again
            with pytest.raises(MadError, match="cannot open a MAD port"):
                await src.discover()
    finally:
        await src.close()
    assert 0.5 < waits[0] <= 1.0 and 1.5 < waits[1] <= 2.0 and 3.5 < waits[2] <= 4.0
