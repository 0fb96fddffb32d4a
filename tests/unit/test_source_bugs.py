"""A bug in a source or a parser is seen: its traceback logged (once per ten minutes per
source, however often it repeats), every occurrence counted as ``reason="source_bug"``, never
only "poll_failed"; the ports keep their last views. Exceptions of work nobody awaits (a bulk
thread freeing a poll's views) are logged too."""

from __future__ import annotations

import asyncio
import logging

import pytest
from structlog.testing import capture_logs

from ibmon.runtime.pipeline import BUG_LOG_SECONDS
from ibmon.runtime.sizes import submit_bulk
from tests.unit.test_pipeline import GUID, Clock, FakeFabric, metric, pipeline


async def test_a_source_bug_is_logged_with_its_traceback_once_and_counted_every_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    src = FakeFabric(clock=clock)
    p = pipeline(clock=clock)
    await p.poll(src)
    src.raise_ = KeyError("PortXmitWait")  # a parser that met a field it did not expect
    with capture_logs() as logs:
        for _ in range(3):
            clock.t += 1
            await p.poll(src)
    bugs = [e for e in logs if e["event"] == "source_bug"]
    assert len(bugs) == 1
    assert isinstance(bugs[0]["exc_info"], KeyError) and "PortXmitWait" in bugs[0]["error"]
    assert metric(p, "ibmon_source_poll_errors_total", source="src", reason="source_bug") == 3
    assert metric(p, "ibmon_source_up", source="src") == 0
    assert (GUID, "1") in p.views and p.views[(GUID, "1")].stale
    # later, the same bug is logged again (rate-limited, not silenced)
    monkeypatch.setattr("ibmon.runtime.pipeline.time.monotonic", lambda: 1e9)
    with capture_logs() as logs:
        await p.poll(src)
    assert [e["event"] for e in logs].count("source_bug") == 1
    assert BUG_LOG_SECONDS > 0


async def test_a_source_that_cannot_see_is_not_a_bug() -> None:
    clock = Clock()
    src = FakeFabric(clock=clock)
    p = pipeline(clock=clock)
    src.raise_ = OSError("umad: no such device")
    with capture_logs() as logs:
        await p.poll(src)
    assert "source_bug" not in [e["event"] for e in logs]
    assert metric(p, "ibmon_source_poll_errors_total", source="src", reason="poll_failed") == 1


def test_an_exception_in_unawaited_bulk_work_is_logged() -> None:
    def broken() -> None:
        raise ZeroDivisionError("freeing went wrong")

    with capture_logs() as logs:
        future = submit_bulk(broken)
        with pytest.raises(ZeroDivisionError):
            future.result(timeout=10)
        for _ in range(100):  # the callback runs in the worker right after the function
            if logs:
                break
            asyncio.run(asyncio.sleep(0.01))
    assert [e["event"] for e in logs] == ["bulk_work_failed"]
    assert logs[0]["log_level"] == logging.getLevelName(logging.ERROR).lower()
