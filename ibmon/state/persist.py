"""The state file: what a restart needs to count every increment once and announce nothing twice.

One JSON document per daemon: per source, the tracker's ``dump`` (baselines, totals, resets) and
the detection engine's ``dump`` (active conditions and detector windows). Writes are atomic: a
temporary file in the same directory, ``fsync``, ``os.replace``, then ``fsync`` of the directory,
so a crash (or ``kill -9``) leaves either the old file or the new one, never half of one. A
``kill -9`` in the middle of a save leaves its temporary file (``.state.json.<pid>.tmp``);
``remove_stale_temporaries`` removes those at the next start.

A missing file is a first start. A file that cannot be parsed (bad JSON, nested deeper than the
parser allows, larger than ``MAX_STATE_BYTES``, not an ibmon state file) is moved aside
(``state.json.corrupt``) for inspection, reported, and replaced by the next save: never fatal,
because losing history is better than not monitoring at all. Only a regular file is ever opened
for reading, and without blocking: a FIFO or a device at the path is reported, never read (a
FIFO would block startup until a writer came, deaf to SIGTERM), and never replaced by a save.
A symlink is followed for reading; a save replaces it only while it leads to a regular file or
to nothing: one that leads to ``/dev/null``, a FIFO or a directory is reported at start like the
thing it leads to, and every save is refused for as long as it is there.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

__all__ = ["MAX_STATE_BYTES", "STATE_FILE_VERSION", "LoadResult", "StateFile"]

STATE_FILE_VERSION: Final = 1
#: A state file larger than this is corrupt. A port costs about 2 kB (sysfs ports with driver
#: hw_counters about 5 kB), so this holds well over 100,000 ports, while json.loads of a file
#: this size needs about ten times as much memory: anything bigger is not ours.
MAX_STATE_BYTES: Final = 256 * 1024 * 1024
#: A temporary file this old belongs to no running save, whatever its pid now names.
STALE_TEMP_SECONDS: Final = 3600.0

_KIND = {
    stat.S_IFDIR: "directory",
    stat.S_IFIFO: "FIFO",
    stat.S_IFSOCK: "socket",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
}


def _kind(mode: int) -> str:
    return _KIND.get(stat.S_IFMT(mode), "special file")


@dataclass(frozen=True, slots=True)
class LoadResult:
    """``sources`` maps a source label to its saved parts; ``problem`` says why there are none.

    ``problem`` is None on success, ``"missing"`` on a first start, ``"corrupt"`` (moved aside
    to ``aside``, or left in place if even that failed), ``"unreadable"`` (permissions, I/O) or
    ``"not_a_file"`` (a FIFO, directory or device at the path), with ``detail`` for the log.
    """

    sources: dict[str, dict[str, Any]]
    saved_at: float | None = None
    problem: str | None = None
    detail: str = ""
    aside: Path | None = None


class StateFile:
    """Load and atomically save the daemon's persisted state at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # Saves run in worker threads; a caller that stopped waiting for one (the daemon's
        # save-before-next-poll has a deadline) must not start a second on the same temporary.
        self._lock = threading.Lock()

    # -- loading -------------------------------------------------------------------------------

    def load(self) -> LoadResult:
        try:
            raw = self._read()
        except FileNotFoundError:
            return LoadResult({}, problem="missing", detail=str(self.path))
        except _NotAFileError as exc:
            return LoadResult({}, problem="not_a_file", detail=f"{self.path}: {exc}")
        except _TooLargeError as exc:
            return self._corrupt(str(exc))
        except OSError as exc:
            return LoadResult(
                {}, problem="unreadable", detail=f"{self.path}: {exc.strerror or exc}"
            )
        try:
            data = json.loads(raw)
            if not isinstance(data, dict) or data.get("version") != STATE_FILE_VERSION:
                raise ValueError(f"not an ibmon state file of version {STATE_FILE_VERSION}")
            sources = data.get("sources")
            if not isinstance(sources, dict) or not all(
                isinstance(k, str) and isinstance(v, dict) for k, v in sources.items()
            ):
                raise ValueError("'sources' must map source names to objects")
            saved_at = data.get("saved_at")
            saved = float(saved_at) if isinstance(saved_at, int | float) else None
        except RecursionError:
            return self._corrupt("nested deeper than the JSON parser allows")
        except (ValueError, UnicodeDecodeError) as exc:
            return self._corrupt(str(exc))
        return LoadResult(sources, saved_at=saved)

    def _read(self) -> bytes:
        """The file's bytes; only a regular file is read, and opening never blocks."""
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise _NotAFileError(f"is a {_kind(st.st_mode)}, not a regular file")
            if st.st_size > MAX_STATE_BYTES:
                raise _TooLargeError(f"{st.st_size} bytes, more than the {MAX_STATE_BYTES} allowed")
            chunks: list[bytes] = []
            size = 0
            while chunk := os.read(fd, 1 << 20):
                size += len(chunk)
                if size > MAX_STATE_BYTES:  # grew while being read
                    raise _TooLargeError(f"more than the {MAX_STATE_BYTES} bytes allowed")
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def _corrupt(self, why: str) -> LoadResult:
        aside = self.quarantine()
        return LoadResult({}, problem="corrupt", detail=f"{self.path}: {why}"[:500], aside=aside)

    def quarantine(self) -> Path | None:
        """Move a bad file aside so the next save does not destroy the evidence."""
        aside = self.path.with_name(self.path.name + ".corrupt")
        try:
            os.replace(self.path, aside)
        except OSError:
            return None
        return aside

    # -- temporaries ---------------------------------------------------------------------------

    def _temp_for(self, pid: int) -> Path:
        return self.path.parent / f".{self.path.name}.{pid}.tmp"

    def remove_stale_temporaries(self) -> list[Path]:
        """Remove the temporary files of saves that a crash or ``kill -9`` interrupted.

        A temporary is stale when the process named by its pid is gone, is this process (a
        restarted container's pid 1, say, before its first save), or it is older than any save
        could take; a live daemon's save in progress is left alone. Returns what was removed.
        """
        pattern = re.compile(rf"^\.{re.escape(self.path.name)}\.(\d+)\.tmp$")
        removed: list[Path] = []
        try:
            names = os.listdir(self.path.parent)
        except OSError:
            return removed
        now = time.time()
        for name in names:
            m = pattern.match(name)
            if m is None:
                continue
            tmp = self.path.parent / name
            pid = int(m.group(1))
            try:
                st = os.lstat(tmp)
            except OSError:
                continue
            if not (
                pid == os.getpid()
                or not pid_alive(pid)
                or now - st.st_mtime > STALE_TEMP_SECONDS
            ):
                continue
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
                removed.append(tmp)
        return removed

    # -- saving --------------------------------------------------------------------------------

    def save(self, sources: dict[str, dict[str, Any]], *, fabric: str = "") -> int:
        """Write atomically; returns the size in bytes. Raises OSError (callers log it)."""
        with self._lock:
            return self._save(sources, fabric)

    def _save(self, sources: dict[str, dict[str, Any]], fabric: str) -> int:
        doc = {
            "version": STATE_FILE_VERSION,
            "saved_at": time.time(),
            "fabric": fabric,
            "sources": sources,
        }
        data = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode("utf-8")
        directory = self.path.parent
        directory.mkdir(parents=True, exist_ok=True)
        self._refuse_special()
        tmp = self._temp_for(os.getpid())
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()  # an earlier save of ours that was interrupted
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o600)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        os.close(fd)
        try:
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        with contextlib.suppress(OSError):  # not every filesystem lets a directory be fsynced
            dfd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        return len(data)

    def _refuse_special(self) -> None:
        """Never rename over a FIFO, device or directory someone put at the path, nor over a
        symlink that leads to one (``state.json -> /dev/null``): the load refused what it
        leads to, so the save must refuse it too, not quietly swap the link for a file. A
        symlink to a regular file, or a dangling one, is replaced like a file."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            try:
                target = os.stat(self.path)
            except (FileNotFoundError, NotADirectoryError):
                return  # dangling: nothing is behind it to protect
            except OSError as exc:
                raise OSError(
                    errno.EEXIST,
                    f"{self.path} is a symlink whose target cannot be checked "
                    f"({exc.strerror or exc}); not replacing it",
                ) from None
            if not stat.S_ISREG(target.st_mode):
                raise OSError(
                    errno.EEXIST,
                    f"{self.path} is a symlink to a {_kind(target.st_mode)}, not a regular file;"
                    " not replacing it",
                )
            return
        if not stat.S_ISREG(st.st_mode):
            raise OSError(
                errno.EEXIST,
                f"{self.path} is a {_kind(st.st_mode)}, not a regular file; not replacing it",
            )


class _NotAFileError(OSError):
    """Something other than a regular file is at the state path."""


class _TooLargeError(OSError):
    """The file is larger than any state file ibmon writes."""


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a zombie does; one of another user counts too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True
