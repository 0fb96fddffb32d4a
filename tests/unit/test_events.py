"""The event bus never blocks its producer; consumers: structured log and a rotating file."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import structlog

from ibmon.detect.events import (
    Event,
    EventBus,
    EventFileWriter,
    PortRef,
    log_events,
    read_event_file,
)


def ev(n: int = 0, *, kind: str = "congestion", status: str = "firing") -> Event:
    return Event.model_validate({
        "time": Event.at(1_700_000_000 + n), "fabric": "main", "type": kind, "status": status,
        "severity": "warning", "port": PortRef(guid="0x0002c90300a1b2c3", port="1"),
        "value": 0.3, "threshold": 0.1, "details": {"kind": "hotspot", "n": n},
        "message": f"event {n}",
    })


def test_event_json_is_the_design_contract() -> None:
    data = json.loads(ev().model_dump_json())
    assert data["time"] == "2023-11-14T22:13:20Z"
    assert data["peer"] is None
    assert data["port"]["guid"] == "0x0002c90300a1b2c3"
    assert len(data["id"]) == 32
    with pytest.raises(ValueError, match="type"):
        Event.model_validate({**data, "type": "not_a_type"})


async def test_slow_consumer_never_blocks_and_its_drops_are_counted() -> None:
    dropped: list[str] = []
    published: list[Event] = []
    bus = EventBus(history=5, on_publish=published.append, on_drop=dropped.append)
    slow = bus.subscribe("slow", maxsize=3)  # nobody reads it
    fast = bus.subscribe("fast", maxsize=1000)
    got: list[Event] = []

    async def reader() -> None:
        async for e in fast:
            got.append(e)

    task = asyncio.create_task(reader())
    loop = asyncio.get_running_loop()
    started = loop.time()
    for n in range(500):
        bus.publish(ev(n))  # synchronous: returns at once whatever the consumers do
    assert loop.time() - started < 1.0
    await asyncio.sleep(0.05)
    task.cancel()
    assert len(got) == 500
    assert [e.details["n"] for e in got] == list(range(500))
    assert slow.queue.qsize() == 3
    assert slow.dropped == 497
    assert dropped == ["slow"] * 497
    assert bus.dropped == {"slow": 497, "fast": 0}
    assert len(published) == 500
    assert [e.details["n"] for e in bus.history] == [495, 496, 497, 498, 499]  # bounded


async def test_file_consumer_appends_json_lines_and_rotates(tmp_path: Path) -> None:
    path = tmp_path / "events" / "events.jsonl"
    writer = EventFileWriter(path, max_bytes=2000, backups=2)
    bus = EventBus()
    task = asyncio.create_task(writer.consume(bus.subscribe("file")))
    for n in range(40):
        bus.publish(ev(n))
        await asyncio.sleep(0)
    for _ in range(200):
        if writer.written == 40:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    assert writer.written == 40
    files = [path, path.with_name("events.jsonl.1"), path.with_name("events.jsonl.2")]
    assert all(f.exists() for f in files)
    assert not path.with_name("events.jsonl.3").exists()
    assert all(f.stat().st_size <= 2000 for f in files)
    newest = read_event_file(path)
    assert newest[-1]["details"]["n"] == 39
    assert newest[-1]["time"].endswith("Z")
    kept = [e["details"]["n"] for f in reversed(files) for e in read_event_file(f)]
    assert kept == sorted(kept)
    assert kept[-1] == 39


async def test_log_consumer_writes_one_structured_line_per_event() -> None:
    bus = EventBus()
    with structlog.testing.capture_logs() as logs:
        task = asyncio.create_task(log_events(bus.subscribe("log")))
        bus.publish(ev(1))
        bus.publish(ev(2, status="resolved"))
        for _ in range(100):
            if len(logs) == 2:
                break
            await asyncio.sleep(0.01)
        task.cancel()
    assert [(x["event"], x["log_level"], x["type"]) for x in logs] == [
        ("event_firing", "warning", "congestion"), ("event_resolved", "info", "congestion")]
    assert logs[0]["guid"] == "0x0002c90300a1b2c3"
    assert logs[0]["message"] == "event 1"
