"""What ibmon's tables print: untrusted text made safe (``printable``), and rates, bit error
rates and times, each spelled one way in every table.

Node descriptions are set by whoever administers a node (``/sys/class/infiniband/*/node_desc``
on any host of the fabric) and reach ``ibmon top`` and ``ibmon scan --format table`` as they
are. An ESC in one is a terminal escape sequence: it can recolour or clear the screen, retitle
the window, move the cursor to overwrite other rows, or on some terminals answer back. So every
control character is shown as its escape (``\\x1b``, ``\\x00``, ``\\u202e``) instead of being
sent: the operator sees that the name is strange, and nothing else changes. Covered: C0 and C1
controls and DEL (C1 ``\\x9b`` is CSI on 8-bit terminals), the bidirectional overrides and
isolates (which make text display in a different order than it is stored), and the Unicode line
and paragraph separators. Everything else, non-ASCII names included, is left as it is.

Descriptions get this form once, at ingest (``PortIdentity`` and ``LinkInfo`` in
``ibmon.infiniband.model``), so /metrics label values, JSON, MQTT and logs all show the same
text; the tables apply it again to whatever else they print.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

__all__ = ["ber_text", "printable", "rate_text", "time_text"]

_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: object) -> str:
    """``text`` as a string with every terminal control character replaced by its escape."""
    s = str(text)
    return s if s.isprintable() else _UNSAFE.sub(_escape, s)


def rate_text(bps: float | None) -> str:
    """A rate in bytes per second with three significant digits and a decimal unit (``"-"`` for
    none). The unit is chosen after rounding, so 999.96 B/s prints as ``1 kB/s``, never as
    ``1e+03 B/s`` or ``1000.0 B/s``."""
    if bps is None:
        return "-"
    value = float(bps)
    for unit in ("B/s", "kB/s", "MB/s", "GB/s"):
        if abs(float(f"{value:.3g}")) < 1000:
            return f"{value:.3g} {unit}"
        value /= 1000
    return f"{value:.3g} TB/s"


def ber_text(ber: Any) -> str:
    """A bit error rate: ``-`` before it is known, ``0`` for none, else ``1.2e-11``."""
    return "-" if ber is None else ("0" if not ber else f"{float(ber):.1e}")


def time_text(t: Any) -> str:
    """A Unix time or an RFC 3339 one (an event's ``time``) as ``2026-12-06 22:37:42 UTC``
    (``?`` for one that is not a time)."""
    try:
        when = (datetime.fromisoformat(t) if isinstance(t, str) and "T" in t
                else datetime.fromtimestamp(float(t), tz=UTC))
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (TypeError, ValueError, OverflowError, OSError):
        return "?"
