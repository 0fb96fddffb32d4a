"""Process-wide settings of a running daemon, in one place and made when it starts.

Importing any ibmon module leaves the interpreter as it found it (a library user, a test or
``ibmon scan`` gets CPython's and glibc's defaults); ``ibmon run`` and ``ibmon demo`` call
``tune_process`` once before their first poll. Each setting says what it is for:

- ``OPENBLAS_NUM_THREADS=1``: numpy (the tracker's column store) does no linear algebra here;
  without it OpenBLAS starts an idle thread per CPU when numpy loads. Set only if unset.
- glibc's mmap threshold fixed at 128 KiB (``MALLOC_MMAP_THRESHOLD_``, as the systemd unit sets
  it, wins if present): a fabric poll's vector temporaries are several MB; by default glibc
  raises its threshold to the first such block freed and then serves them from the heap between
  long-lived objects, so the heap cannot shrink (about 25 MB of RSS a poll for five polls at
  36,720 ports).
- ``freeze_long_lived`` after a source's first poll: the topology, the tracker's state and the
  label caches live as long as the daemon; frozen, the cyclic GC's full collections stop walking
  them (0.5-0.8 s of every thread stopped at 36,720 ports). Reference counting still frees them.
- ``release_free_memory`` after a big publish: ``malloc_trim(0)`` hands the free pages the
  publish's texts left back to the OS, so RSS follows live memory.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
from collections.abc import Callable
from typing import Final

__all__ = ["freeze_long_lived", "release_free_memory", "tune_process"]

_M_MMAP_THRESHOLD: Final = -3  # glibc's mallopt parameter
_MMAP_THRESHOLD: Final = 128 << 10


def tune_process(*, fabric_scale: bool) -> None:
    """The daemon's process-wide settings (module docstring); call once, before the first
    poll (numpy reads ``OPENBLAS_NUM_THREADS`` when it loads). ``fabric_scale``: some source
    polls a fabric (thousands of ports); a node's daemon needs no allocator setting, nor the
    0.4 MB of ctypes it would take to make one."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    if fabric_scale and "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        import ctypes

        with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to do
            ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)


def freeze_long_lived() -> None:
    """Exclude every object that exists now from the cyclic GC's full collections."""
    gc.freeze()


@functools.cache
def _malloc_trim() -> Callable[[int], object] | None:
    """glibc's ``malloc_trim`` among the symbols already loaded, or None (musl, macOS).
    Looked up on the first big publish: a node's daemon never makes one."""
    import ctypes

    try:
        trim: Callable[[int], object] | None = getattr(ctypes.CDLL(None), "malloc_trim", None)
    except OSError:
        return None
    return trim


def release_free_memory() -> None:
    """Hand free heap pages back to the OS (``malloc_trim(0)``); nothing where there is none."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
