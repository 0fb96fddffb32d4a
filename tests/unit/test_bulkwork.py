"""Bulk threads (``ibmon.runtime.sizes``): a large poll's work runs below the event loop's CPU
priority, and nothing else does."""

from __future__ import annotations

import asyncio
import contextvars
import os
import threading

import pytest

from ibmon.runtime.sizes import NICE, run_bulk, submit_bulk

pytestmark = pytest.mark.skipif(not hasattr(os, "getpriority"), reason="no nice values here")

_REQUEST = contextvars.ContextVar("request", default="none")


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def _where() -> tuple[str, int, str]:
    return threading.current_thread().name, _nice(), _REQUEST.get()


def test_bulk_work_runs_below_the_loop_and_the_default_executor() -> None:
    async def main() -> tuple[int, tuple[str, int, str], int, int]:
        _REQUEST.set("poll 7")
        bulk = await run_bulk(_where)
        default = await asyncio.to_thread(_nice)
        return _nice(), bulk, default, submit_bulk(_nice).result(10)

    before = _nice()
    loop_nice, (name, bulk_nice, request), default_nice, submitted = asyncio.run(main())
    assert name.startswith("ibmon-bulk")
    assert bulk_nice == submitted == min(19, before + NICE)
    assert loop_nice == default_nice == _nice() == before  # only the bulk threads changed
    assert request == "poll 7"  # the caller's context went along


def test_an_exception_in_bulk_work_reaches_the_caller() -> None:
    def fail() -> None:
        raise ValueError("bad block")

    async def main() -> None:
        await run_bulk(fail)

    with pytest.raises(ValueError, match="bad block"):
        asyncio.run(main())
