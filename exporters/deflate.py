"""Raw deflate compressors: ISA-L's when python-isal is installed, zlib's otherwise.

Every poll compresses the exposition it publishes (so a gzip scrape only splices), which made
compression the largest single cost of a compute node's poll: 100 KB of text for 16 HCAs, about
0.8 ms of CPU with cold caches, once a second. ISA-L's level 1 does the
same work about 4x faster than zlib's level 1 (0.056 vs 0.23 ms on that body, warm) at the same
size (8.7 KB), and releases the GIL as zlib does, so the fabric's large bodies compress off the
event loop as before. Both write standard raw deflate (RFC 1951): sync-flushed segments of
either splice into one stream (``exporters.http.concat``) and every client decompresses them
alike. python-isal ships wheels for Linux on x86-64 and ARM64, where it is a dependency;
elsewhere it is not installed and zlib does the work. The tests run both.
"""

from __future__ import annotations

import zlib
from typing import Final, Protocol

__all__ = ["BACKEND", "Compressor", "compressobj"]

try:
    from isal import isal_zlib as _isal
except ImportError:  # no wheel for this platform
    _isal = None  # type: ignore[assignment]

#: Which compressor ``compressobj`` returns; tests set it to "zlib" to run the fallback.
BACKEND: str = "isal" if _isal is not None else "zlib"
_RAW: Final = -zlib.MAX_WBITS  # raw deflate: no zlib header (the gzip framing is ours)


class Compressor(Protocol):
    def compress(self, data: bytes, /) -> bytes: ...

    def flush(self, mode: int = ..., /) -> bytes: ...


def compressobj(level: int) -> Compressor:
    """A raw-deflate compressor at ``level`` (ibmon uses 1; ISA-L's levels stop at 3)."""
    if BACKEND == "isal" and _isal is not None:
        return _isal.compressobj(min(level, 3), _isal.DEFLATED, _RAW)
    return zlib.compressobj(level, zlib.DEFLATED, _RAW)
