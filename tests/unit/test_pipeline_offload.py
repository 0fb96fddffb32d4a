"""A large sample is tracked and detected in a worker thread (issue 12: scrapes never wait
behind a poll), without changing what a poll means: the loop keeps running meanwhile, and a
cancelled poll is still ingested and its events handed back before the cancellation lands."""

from __future__ import annotations

import asyncio

from ibmon.config import MockSourceConfig
from ibmon.events import Event
from ibmon.pipeline import OFFLOAD_PORTS, Pipeline
from ibmon.selfmetrics import SelfMetrics
from ibmon.sources.mock import ManualClock, MockSource


def _setup() -> tuple[Pipeline, MockSource, ManualClock]:
    clock = ManualClock()
    source = MockSource.from_scenario("demo", clock=clock)
    assert len(source.model.keys) >= OFFLOAD_PORTS  # the threaded path
    pipeline = Pipeline(MockSourceConfig(name="mock", interval=1.0), metrics=SelfMetrics())
    return pipeline, source, clock


def test_the_loop_runs_while_a_large_poll_is_ingested() -> None:
    pipeline, source, clock = _setup()

    async def main() -> int:
        await pipeline.poll(source)
        clock.t = 1.0
        task = asyncio.create_task(pipeline.poll(source))
        turns = 0
        while not pipeline.ingesting:  # noqa: ASYNC110 - counting the loop's turns is the point
            await asyncio.sleep(0)
        while pipeline.ingesting:  # the loop gets turns while the worker thread ingests
            turns += 1
            await asyncio.sleep(0)
        await task
        return turns

    assert asyncio.run(main()) >= 1
    assert len(pipeline.views) == len(source.model.keys)
    assert pipeline.sampled_at == 1.0


def test_a_cancelled_poll_is_ingested_and_emitted_before_it_ends() -> None:
    pipeline, source, _ = _setup()
    emitted: list[list[Event]] = []

    async def poll_loop() -> None:  # as the daemon's: emit right after the poll returns
        emitted.append(await pipeline.poll(source))
        await asyncio.sleep(3600)

    async def main() -> asyncio.Task[None]:
        task = asyncio.create_task(poll_loop())
        while not pipeline.ingesting:  # noqa: ASYNC110 - cancel exactly while the thread runs
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.wait({task})
        return task

    task = asyncio.run(main())
    assert task.cancelled()
    assert len(emitted) == 1  # the poll came back (with its events) before the cancellation
    assert not pipeline.ingesting
    assert len(pipeline.views) == len(source.model.keys)
