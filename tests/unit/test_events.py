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
    peer_ref,
    read_event_file,
)
from ibmon.infiniband.model import LinkInfo, PortIdentity, PortView


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


def test_an_event_longer_than_the_file_limit_is_written_whole_and_rotates_nothing_empty(
    tmp_path: Path,
) -> None:
    """An event line may be longer than ``max_bytes`` (a long message): it is written whole,
    each in a file of its own, and no rotation ever pushes an empty file into the backups
    (which would drop the oldest events for nothing)."""
    path = tmp_path / "events.jsonl"
    writer = EventFileWriter(path, max_bytes=50, backups=3)
    lines = [(ev(n).model_dump_json() + "\n").encode() for n in range(3)]
    assert all(len(line) > 50 for line in lines)
    writer._append(lines[:1])  # into a file that does not exist yet
    writer._append(lines[1:])
    files = [path, *(path.with_name(f"events.jsonl.{n}") for n in (1, 2))]
    assert [f.read_bytes() for f in files] == lines[::-1]
    assert not path.with_name("events.jsonl.3").exists()
    exact = tmp_path / "exact.jsonl"  # the limit is a size a file may reach, not pass
    EventFileWriter(exact, max_bytes=len(lines[0]) + len(lines[1]))._append(lines[:2])
    assert exact.read_bytes() == lines[0] + lines[1]
    assert not exact.with_name("exact.jsonl.1").exists()


async def test_drain_takes_at_most_its_limit_in_order_and_never_waits() -> None:
    """The file writer's batches: up to the limit, oldest first, the rest left queued."""
    bus = EventBus()
    sub = bus.subscribe("file")
    for n in range(5):
        bus.publish(ev(n))
    assert [e.details["n"] for e in sub.drain(3)] == [0, 1, 2]
    assert [e.details["n"] for e in sub.drain(3)] == [3, 4]
    assert sub.drain(3) == []


def test_an_event_file_reader_takes_only_event_objects(tmp_path: Path) -> None:
    """``ibmon top`` and tests read event files that may end in a torn line or hold other
    JSON: only objects are events."""
    path = tmp_path / "events.jsonl"
    event = ev(7).model_dump_json()
    path.write_text("\n".join(["42", "[1, 2]", '"text"', "null", event, "{torn", ""]))
    assert [e["details"]["n"] for e in read_event_file(path)] == [7]


def test_a_subscription_is_bounded() -> None:
    """A queue of size 0 would be asyncio's unbounded queue: refused, like a negative one."""
    bus = EventBus()
    for size in (0, -1):
        with pytest.raises(ValueError, match="at least one event"):
            bus.subscribe("x", maxsize=size)
    assert bus.subscribe("x", maxsize=1).queue.maxsize == 1


def test_an_event_names_a_peer_only_when_the_far_end_is_known() -> None:
    """A link whose far end is unknown (no GUID: a port polling, or a source that sees one
    end) gives the event no ``peer``, not a peer with an empty GUID."""
    ident = PortIdentity(guid="0x0002c90300a1b2c3", port="1")
    assert peer_ref(PortView(identity=ident)) is None
    assert peer_ref(PortView(identity=ident, link=LinkInfo("", "", "leaf01"))) is None
    far = peer_ref(PortView(identity=ident, link=LinkInfo(
        remote_guid="0x0002c90300000001", remote_port="7", remote_node_desc="leaf01")))
    assert far == PortRef(guid="0x0002c90300000001", port="7", node_desc="leaf01")


@pytest.mark.parametrize(("max_bytes", "backups"), [(0, 3), (-5, 3), (1000, -1)])
def test_an_event_file_needs_a_size_and_a_backup_count_that_mean_something(
    tmp_path: Path, max_bytes: int, backups: int
) -> None:
    with pytest.raises(ValueError, match="max_bytes must be positive and backups non-negative"):
        EventFileWriter(tmp_path / "e.jsonl", max_bytes=max_bytes, backups=backups)


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
