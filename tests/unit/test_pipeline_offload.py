"""A large sample is tracked and detected in a worker thread (scrapes never wait
behind a poll), without changing what a poll means: the loop keeps running meanwhile, and a
cancelled poll is still ingested and its events handed back before the cancellation lands.

``pipeline.lock`` is held exactly while a large poll is ingested: the worker thread runs
inside it (and nothing else here takes it)."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import pytest

from ibmon.detect.events import Event
from ibmon.infiniband.model import PortView
from ibmon.runtime.pipeline import Pipeline
from ibmon.runtime.selfmetrics import SelfMetrics
from ibmon.runtime.sizes import fabric_sized
from ibmon.sources.mock import MockSource, MockSourceConfig
from mocks.scenario import ManualClock

T = TypeVar("T")


def _setup(name: str = "mock") -> tuple[Pipeline, MockSource, ManualClock]:
    clock = ManualClock()
    source = MockSource.from_scenario("demo", clock=clock, name=name)
    assert fabric_sized(len(source.model.keys))  # the threaded path
    pipeline = Pipeline(MockSourceConfig(name="mock", interval=1.0), metrics=SelfMetrics())
    return pipeline, source, clock


def test_the_loop_runs_while_a_large_poll_is_ingested() -> None:
    pipeline, source, clock = _setup()

    async def main() -> int:
        await pipeline.poll(source)
        clock.t = 1.0
        task = asyncio.create_task(pipeline.poll(source))
        turns = 0
        while not pipeline.lock.locked():  # noqa: ASYNC110 - counting the loop's turns is the point
            await asyncio.sleep(0)
        while pipeline.lock.locked():  # the loop gets turns while the worker thread ingests
            turns += 1
            await asyncio.sleep(0)
        await task
        return turns

    assert asyncio.run(main()) >= 1
    assert len(pipeline.views) == len(source.model.keys)
    assert pipeline.sampled_at == 1.0


def test_a_large_poll_is_sampled_and_ingested_in_bulk_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Below the loop's CPU priority (``ibmon.runtime.sizes``), so a scrape's wake-ups go
    first."""
    pipeline, source, _ = _setup()
    threads: list[str] = []
    ingest, sample = pipeline._ingest_and_free, source._sample_sync

    def recorded(step: Callable[..., T]) -> Callable[..., T]:
        def run(*args: object) -> T:
            threads.append(threading.current_thread().name)
            return step(*args)
        return run

    monkeypatch.setattr(pipeline, "_ingest_and_free", recorded(ingest))
    monkeypatch.setattr(source, "_sample_sync", recorded(sample))
    asyncio.run(pipeline.poll(source))
    assert len(threads) == 2
    assert all(name.startswith("ibmon-bulk") for name in threads)


def test_a_cancelled_poll_is_ingested_and_emitted_before_it_ends() -> None:
    pipeline, source, _ = _setup()
    emitted: list[list[Event]] = []

    async def poll_loop() -> None:  # as the daemon's: emit right after the poll returns
        emitted.append(await pipeline.poll(source))
        await asyncio.sleep(3600)

    async def main() -> asyncio.Task[None]:
        task = asyncio.create_task(poll_loop())
        while not pipeline.lock.locked():  # noqa: ASYNC110 - cancel exactly while the thread runs
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.wait({task})
        return task

    task = asyncio.run(main())
    assert task.cancelled()
    assert len(emitted) == 1  # the poll came back (with its events) before the cancellation
    assert not pipeline.lock.locked()
    assert len(pipeline.views) == len(source.model.keys)


def test_a_large_poll_runs_without_collections_and_its_views_stay_out_of_later_ones() -> None:
    pipeline, source, clock = _setup("gc-paused")
    started: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and pipeline.lock.locked():
            started.append(info["generation"])

    async def main() -> None:
        await pipeline.poll(source)
        clock.t = 1.0
        gc.callbacks.append(seen)
        try:
            await pipeline.poll(source)
        finally:
            gc.callbacks.remove(seen)

    gc.enable()
    asyncio.run(main())
    assert started == []  # thousands of views made, not one collection while they were
    assert gc.isenabled()
    tracked = {id(o) for o in gc.get_objects()}  # what collections traverse
    assert not any(id(view) in tracked for view in pipeline.views.values())


def _views_alive(source: str) -> int:
    """PortViews of ``source``'s ports alive in the process (other tests' may be, too)."""
    gc.unfreeze()  # a large poll's objects are frozen after it (runtime.gcpause): list them
    return sum(1 for o in gc.get_objects()
               if isinstance(o, PortView) and o.identity.source == source)


def test_the_views_a_poll_replaced_are_not_kept_once_the_new_ones_are_published() -> None:
    pipeline, source, clock = _setup("release-after-publish")

    async def main() -> int:
        await pipeline.poll(source)
        pipeline.observe_publish(0.0)
        clock.t = 1.0
        await pipeline.poll(source)
        old = _views_alive(source.name)
        pipeline.observe_publish(0.0)  # the daemon's call after the state is published
        return old

    before_publish = asyncio.run(main())
    assert before_publish >= 2 * len(pipeline.views)  # two polls' views until published
    deadline = time.monotonic() + 10  # freed by a bulk thread, a few hundred at a time
    while _views_alive(source.name) > len(pipeline.views) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _views_alive(source.name) == len(pipeline.views)


def test_a_pipeline_nobody_publishes_keeps_one_generation_of_views() -> None:
    pipeline, source, clock = _setup("never-published")  # as ``top --source``: no publish

    async def main() -> None:
        await pipeline.poll(source)
        clock.t = 1.0
        await pipeline.poll(source)

    asyncio.run(main())
    assert _views_alive(source.name) == len(pipeline.views)
