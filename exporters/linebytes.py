"""A block's lines of the families that move every poll, as encoded text made in C.

Why: put together in Python, each line of a fabric's traffic counters and
ratios is five strings joined and encoded, its value a str split out of orjson's text: about
15 ms a family a publish at 118,400 ports, 60 ms for utilization and transmit wait, 0.2 s a
publish in all. ``exporters._lines`` (``_lines.c``) writes the same bytes from the labels and
the values with no object a line. It is optional: where it was not built (no C compiler at
install time) ``lines`` returns None and the renderer takes the Python way, which the tests
hold it byte-identical to.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["BACKEND", "Encoded", "lines"]

try:
    from exporters import _lines
except ImportError:  # built without a C compiler
    _lines = None  # type: ignore[assignment]

#: "c" when blocks are put together by ``exporters._lines``; tests set "python" to run the
#: renderer's own way.
BACKEND: str = "python" if _lines is None else "c"

#: Lines a chunk of the result (at most): a chunk stays in the CPU's cache while it is
#: compressed, and under glibc's mmap threshold (``exporters.render.SLICE_LINES``).
PER_CHUNK = 512


class Encoded(list[bytes]):
    """Encoded text of up to ``PER_CHUNK`` lines an item, where a family's lines are otherwise
    text (``exporters.render``)."""


def lines(labels: Sequence[str], columns: tuple[tuple[bytes, bytes, Any], ...]) -> Encoded | None:
    """For each port, for each column (``head``, ``mid``, ``values``): ``head`` + its label
    + ``mid`` + its value + newline, encoded; no line where a float value is null. ``values``
    is an ``array('Q')`` of the ports' totals, or orjson's text of a float column (``str`` of
    an int, ``repr`` of a float: ``exporters.valuetext``). None when the module is not there
    or ``labels`` is not a list: the caller's Python way."""
    if BACKEND != "c" or type(labels) is not list:
        return None
    return Encoded(_lines.lines(labels, columns, max(1, PER_CHUNK // len(columns))))
