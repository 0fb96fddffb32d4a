"""``write_atomic``: readers see the old file or the new one, never a partial one or none."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ibmon.state.atomicfile import write_atomic


def test_the_new_content_arrives_whole_with_mode_0644_whatever_the_umask(tmp_path: Path) -> None:
    target = tmp_path / "ibmon.prom"
    old = os.umask(0o077)
    try:
        write_atomic(target, b"a 1\n")
    finally:
        os.umask(old)
    assert target.read_bytes() == b"a 1\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert os.listdir(tmp_path) == ["ibmon.prom"]


def test_a_reader_of_the_old_file_keeps_reading_the_old_file(tmp_path: Path) -> None:
    """Replaced by rename, not rewritten in place: a scrape in progress is never torn."""
    target = tmp_path / "ibmon.prom"
    write_atomic(target, b"old 1\n" * 1000)
    with target.open("rb") as reader:
        reader.read(10)
        write_atomic(target, b"new 2\n")
        assert reader.read() == (b"old 1\n" * 1000)[10:]
    assert target.read_bytes() == b"new 2\n"


def test_the_temporary_is_hidden_beside_the_target_and_not_a_prom_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """node_exporter reads every ``*.prom`` in its directory: the temporary must not be one,
    and it must be on the same filesystem for the rename to be atomic."""
    seen: list[str] = []
    real_replace = os.replace

    def spy(src: str, dst: Path) -> None:
        seen.append(src)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    write_atomic(tmp_path / "ibmon.prom", b"x 1\n")
    (tmp, ) = map(Path, seen)
    assert tmp.parent == tmp_path
    assert tmp.name.startswith(".ibmon.prom.") and not tmp.name.endswith(".prom")


def test_a_failed_write_leaves_the_target_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "ibmon.prom"
    write_atomic(target, b"good 1\n")

    def full(fd: int, data: object) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(target, b"bad 2\n")
    monkeypatch.undo()
    assert target.read_bytes() == b"good 1\n"
    assert os.listdir(tmp_path) == ["ibmon.prom"]


def test_a_directory_in_the_way_is_an_error_and_is_left_alone(tmp_path: Path) -> None:
    target = tmp_path / "ibmon.prom"
    target.mkdir()
    with pytest.raises(IsADirectoryError):
        write_atomic(target, b"x 1\n")
    assert target.is_dir()
    assert os.listdir(tmp_path) == ["ibmon.prom"]
