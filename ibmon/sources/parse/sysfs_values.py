"""Single values read from sysfs files: a counter, a LID. Exactly the number, or nothing.

The kernel prints a counter as decimal digits and a newline, a LID as ``0x`` and hex digits.
Anything else (a second number, a sign, an underscore Python's ``int`` would take, a value no
64-bit counter or 16-bit LID can hold) is refused: that one value is lost for that poll,
never read as something else.
"""

from __future__ import annotations

import re

__all__ = ["MAX_COUNTER", "parse_counter", "parse_lid_value"]

MAX_COUNTER = (1 << 64) - 1
_LID = re.compile(r"(?:0x([0-9a-f]{1,4})|([0-9]{1,5}))")


def parse_counter(raw: bytes) -> int | None:
    """A counter file's value (surrounding whitespace allowed), or None.

    ``bytes.isdigit`` is true exactly for ASCII digits (no signs, underscores or other
    scripts' digits), so this is ``[0-9]{1,20}`` without a regex: it runs for every value of
    every poll.
    """
    s = raw.strip()
    if not s.isdigit() or len(s) > 20:
        return None
    value = int(s)
    return value if value <= MAX_COUNTER else None


def parse_lid_value(text: str) -> int | None:
    """A LID as the kernel prints it (``0x12``; bare digits are taken as decimal), or None."""
    m = _LID.fullmatch(text.strip().lower())
    if m is None:
        return None
    value = int(m.group(1), 16) if m.group(1) is not None else int(m.group(2))
    return value if value <= 0xFFFF else None
