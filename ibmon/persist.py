"""The state file: what a restart needs to count every increment once and announce nothing twice.

One JSON document per daemon: per source, the tracker's ``dump`` (baselines, totals, resets) and
the detection engine's ``dump`` (active conditions and detector windows). Writes are atomic: a
temporary file in the same directory, ``fsync``, ``os.replace``, then ``fsync`` of the directory,
so a crash (or ``kill -9``) leaves either the old file or the new one, never half of one.

A missing file is a first start. A file that cannot be read or parsed is moved aside
(``state.json.corrupt``) for inspection, reported, and replaced by the next save: never fatal,
because losing history is better than not monitoring at all.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

__all__ = ["STATE_FILE_VERSION", "LoadResult", "StateFile"]

STATE_FILE_VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class LoadResult:
    """``sources`` maps a source label to its saved parts; ``problem`` says why there are none.

    ``problem`` is None on success, ``"missing"`` on a first start, else ``"corrupt"`` or
    ``"unreadable"`` with ``detail`` for the log.
    """

    sources: dict[str, dict[str, Any]]
    saved_at: float | None = None
    problem: str | None = None
    detail: str = ""


class StateFile:
    """Load and atomically save the daemon's persisted state at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> LoadResult:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return LoadResult({}, problem="missing", detail=str(self.path))
        except OSError as exc:
            return LoadResult({}, problem="unreadable", detail=f"{self.path}: {exc.strerror}")
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
        except (ValueError, UnicodeDecodeError) as exc:
            self.quarantine()
            return LoadResult({}, problem="corrupt", detail=f"{self.path}: {exc}"[:500])
        return LoadResult(sources, saved_at=saved)

    def quarantine(self) -> Path | None:
        """Move a bad file aside so the next save does not destroy the evidence."""
        aside = self.path.with_name(self.path.name + ".corrupt")
        try:
            os.replace(self.path, aside)
        except OSError:
            return None
        return aside

    def save(self, sources: dict[str, dict[str, Any]], *, fabric: str = "") -> int:
        """Write atomically; returns the size in bytes. Raises OSError (callers log it)."""
        doc = {
            "version": STATE_FILE_VERSION,
            "saved_at": time.time(),
            "fabric": fabric,
            "sources": sources,
        }
        data = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode("utf-8")
        directory = self.path.parent
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".{self.path.name}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
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
        os.replace(tmp, self.path)
        with contextlib.suppress(OSError):  # not every filesystem lets a directory be fsynced
            dfd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        return len(data)
