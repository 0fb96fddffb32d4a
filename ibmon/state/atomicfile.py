"""Replace a file so that readers see the old content or the new, never a mix or nothing.

``ibmon scan --output FILE`` writes for node_exporter's textfile collector, which reads every
``*.prom`` file in its directory on each scrape: a file written in place could be scraped half
written (a truncated exposition is a scrape error, or worse, silently fewer series). So the
content goes to a temporary file in the same directory (``rename`` is atomic only within one
filesystem), named ``.<name>.<random>.tmp`` so the collector never picks it up, is flushed to disk,
given its final mode, and renamed over the target; then the directory is synced so the rename
itself survives a crash.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["DEFAULT_MODE", "write_atomic"]

#: Readable by everyone: node_exporter runs as its own user and must read the file.
DEFAULT_MODE = 0o644


def write_atomic(path: Path, data: bytes, *, mode: int = DEFAULT_MODE) -> None:
    """Write ``data`` to ``path`` atomically, with permissions exactly ``mode``.

    The mode is set with ``fchmod``, so the process umask (systemd's ``UMask=0077``) does not
    narrow it. On any error the temporary file is removed and the target is left as it was;
    the OSError propagates (its ``filename`` is the path that failed).
    """
    directory = path.parent
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # not every filesystem lets a directory be synced
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
