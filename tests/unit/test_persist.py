"""The state file: atomic saves, a missing or corrupt file is reported and replaced."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ibmon.detect.engine import Engine
from ibmon.model import PortIdentity, PortSample, Snapshot
from ibmon.persist import StateFile
from ibmon.tracker import Tracker


def test_round_trip_of_tracker_and_engine(tmp_path: Path) -> None:
    ident = PortIdentity(guid="0x0002c90300a1b2c3", port="1")
    tracker, engine = Tracker(), Engine()
    for t, wait in enumerate([0, 10**7, 2 * 10**7, 3 * 10**7, 4 * 10**7]):
        snap = Snapshot("s", float(t), 1e9 + t, {ident.key: PortSample(
            ident, state=4, rate_bps=100e9, counters={"transmit_wait": wait})})
        engine.process(tracker.update(snap), monotonic=t, wall=1e9 + t)
    assert [a.type for a in engine.active()] == ["congestion"]
    sf = StateFile(tmp_path / "sub" / "state.json")
    sf.save({"s": {"tracker": tracker.dump(), "engine": engine.dump()}}, fabric="main")
    loaded = sf.load()
    assert loaded.problem is None
    assert loaded.saved_at is not None
    t2, e2 = Tracker(), Engine()
    t2.load(loaded.sources["s"]["tracker"])
    e2.load(loaded.sources["s"]["engine"])
    assert [a.type for a in e2.active()] == ["congestion"]
    assert t2.dump() == tracker.dump()
    assert not list((tmp_path / "sub").glob(".*tmp"))  # no temporary left behind


def test_missing_file_is_a_first_start(tmp_path: Path) -> None:
    result = StateFile(tmp_path / "state.json").load()
    assert (result.problem, result.sources) == ("missing", {})


@pytest.mark.parametrize("content", [b"{not json", b"[]", b'{"version": 7}', b"\xff\xfe",
                                     b'{"version": 1, "sources": {"a": 3}}'])
def test_corrupt_file_is_moved_aside_and_replaced(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(content)
    sf = StateFile(path)
    result = sf.load()
    assert result.problem == "corrupt"
    assert result.sources == {}
    assert str(path) in result.detail
    assert (tmp_path / "state.json.corrupt").read_bytes() == content
    sf.save({})
    assert sf.load().problem is None


def test_save_replaces_atomically(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    sf = StateFile(path)
    sf.save({"a": {"n": 1}})
    inode = os.stat(path).st_ino
    sf.save({"a": {"n": 2}})
    assert json.loads(path.read_text())["sources"] == {"a": {"n": 2}}
    assert os.stat(path).st_ino != inode  # a new file renamed over, not rewritten in place


def test_unwritable_directory_raises_oserror(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OSError, match=r"file|directory"):
        StateFile(blocker / "state.json").save({})
