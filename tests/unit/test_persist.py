"""The state file: atomic saves, a missing or corrupt file is reported and replaced."""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

import pytest

from ibmon.detect.engine import Engine
from ibmon.infiniband.model import PortIdentity, PortSample, Snapshot
from ibmon.state.persist import STALE_TEMP_SECONDS, StateFile
from ibmon.track.tracker import Tracker


def test_round_trip_of_tracker_and_engine(tmp_path: Path) -> None:
    ident = PortIdentity(guid="0x0002c90300a1b2c3", port="1")
    tracker, engine = Tracker(), Engine()
    # 10**9 counts a second of 8 bytes on a 12.5e9-byte/s link: stalled 64 % of the time
    for t, wait in enumerate([0, 10**9, 2 * 10**9, 3 * 10**9, 4 * 10**9]):
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
                                     b'{"version": 1, "sources": {"a": 3}}',
                                     b'{"version": 2, "sources": {"a": {}}}'])
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


def test_a_fifo_is_reported_not_read_and_never_replaced(tmp_path: Path) -> None:
    """Opening a FIFO for reading blocks until a writer comes: it must not even be opened so."""
    path = tmp_path / "state.json"
    os.mkfifo(path)
    sf = StateFile(path)
    result = sf.load()  # returns at once (a blocking open would hang this test)
    assert result.problem == "not_a_file"
    assert "is a FIFO, not a regular file" in result.detail
    with pytest.raises(OSError, match="not replacing it"):
        sf.save({})
    assert path.is_fifo()
    assert not list(tmp_path.glob(".*tmp"))


def test_deeply_nested_json_is_corrupt_and_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(b"[" * 100_000 + b"]" * 100_000)
    result = StateFile(path).load()
    assert result.problem == "corrupt"
    assert "nested deeper" in result.detail
    assert result.aside == tmp_path / "state.json.corrupt"
    assert not path.exists()


def test_a_file_larger_than_any_state_is_corrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ibmon.state.persist

    monkeypatch.setattr(ibmon.state.persist, "MAX_STATE_BYTES", 1000)
    path = tmp_path / "state.json"
    path.write_bytes(b" " * 1001)
    result = StateFile(path).load()
    assert result.problem == "corrupt" and "1001 bytes" in result.detail
    assert (tmp_path / "state.json.corrupt").exists()


def test_a_file_that_says_it_is_empty_is_still_read_no_further_than_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A regular file whose size says 0 but that reads on (procfs) is cut at the limit."""
    import ibmon.state.persist

    monkeypatch.setattr(ibmon.state.persist, "MAX_STATE_BYTES", 100)
    path = tmp_path / "state.json"
    path.symlink_to("/proc/self/status")  # st_size 0, over a kilobyte when read
    result = StateFile(path).load()
    assert result.problem == "corrupt" and "more than the 100 bytes" in result.detail


def test_only_temporaries_of_dead_saves_are_removed(tmp_path: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead = tmp_path / f".state.json.{int(done.stdout)}.tmp"
    mine = tmp_path / f".state.json.{os.getpid()}.tmp"  # this process: not saving now
    live = tmp_path / f".state.json.{os.getppid()}.tmp"  # a live process, perhaps saving
    old = tmp_path / ".state.json.1.tmp"  # pid 1 lives; the file is older than any save
    other = tmp_path / ".other.json.1.tmp"  # another file's temporary
    for p in (dead, mine, live, old, other):
        p.write_bytes(b"{")
    stale = time.time() - 2 * STALE_TEMP_SECONDS  # older than any save takes
    os.utime(old, (stale, stale))  # whoever has that pid now
    removed = StateFile(tmp_path / "state.json").remove_stale_temporaries()
    assert sorted(removed) == sorted([dead, mine, old])
    assert live.exists() and other.exists()


def test_a_save_that_fails_to_write_leaves_the_old_state_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk in the middle of a save: the save raises (the daemon logs and counts it),
    the last good state stays as it was, and no half-written temporary is left to fill the
    disk further."""
    path = tmp_path / "state.json"
    sf = StateFile(path)
    sf.save({"a": {"n": 1}})

    def full(fd: int, data: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError, match="No space left"):
        sf.save({"a": {"n": 2}})
    monkeypatch.undo()
    assert json.loads(path.read_text())["sources"] == {"a": {"n": 1}}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_a_dangling_symlink_at_the_state_path_is_replaced_like_a_missing_file(
    tmp_path: Path,
) -> None:
    """Nothing is behind a dangling link to protect (a state directory moved away): the first
    save writes a regular file in its place instead of refusing every save."""
    path = tmp_path / "state.json"
    path.symlink_to(tmp_path / "gone" / "state.json")
    sf = StateFile(path)
    assert sf.load().problem == "missing"
    sf.save({"a": {"n": 1}})
    assert not path.is_symlink() and sf.load().sources == {"a": {"n": 1}}
