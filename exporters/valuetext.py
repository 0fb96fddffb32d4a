"""Sample values of a block of ports as text, the numbers formatted in C (orjson).

Why (issue 12, target 4): at fabric scale the renderer's lines that change every poll are a
counter or a ratio a port, and spelling the number was most of each line's cost. Python's
``repr`` of a float (shortest round-trip digits) takes 400-550 ns, ``str`` of an int about
60 ns; orjson writes a whole column of either in one call, the float digits by the same
shortest round-trip rule (measured on this project's machine, lines of 8,192 ports: a float
line 241 ns against 794, a counter line 74 ns against 127).

The text must be exactly what ``repr``/``str`` give, because the exposition (and its goldens)
are: orjson spells integers and floats of magnitude 1e-4 and above as Python does (checked
against ``repr`` on random doubles of every magnitude in ``tests/unit/test_value_text.py``),
writes smaller ones positionally or with a one-digit exponent (``0.00001``, ``2.5e-7``, where
Python writes ``1e-05``, ``2.5e-07``): those few are spelled by ``repr``. A non-finite value
(orjson writes ``null``), a value that is not exactly a ``float`` (an int would lose its
``.0``) and blocks too small to gain take the Python way. Imported only by the renderer's
blocks of ``MIN_VALUES`` or more: a node-local daemon never loads orjson.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from functools import partial
from math import isfinite
from operator import is_not

__all__ = ["MIN_VALUES", "NO_TEXT", "float_texts", "int_texts"]

#: Below this many values a column is spelled by Python: the call and the split cost more.
MIN_VALUES = 64
#: The text of a port without a value (None): no line.
NO_TEXT = "null"
#: Python spells floats below this magnitude with an exponent (``repr``).
_EXPONENT_BELOW = 1e-4
_NOT_NONE = partial(is_not, None)
_PLAIN = frozenset((float, type(None)))


def float_texts(values: Sequence[float | None]) -> list[str] | None:
    """``repr`` of each value (``NO_TEXT`` for None), or None when the column must be
    spelled the Python way: few values, one that is not a finite ``float``."""
    if len(values) < MIN_VALUES or not set(map(type, values)) <= _PLAIN:
        return None
    if not all(map(isfinite, filter(_NOT_NONE, values))):  # type: ignore[arg-type]
        return None
    import orjson

    raw = orjson.dumps(values)
    texts = raw[1:-1].decode("ascii").split(",")
    if b"e-" in raw or b"0.0000" in raw:  # some value below 1e-4: orjson spells it its way
        texts = [repr(x) if x is not None and -_EXPONENT_BELOW < x < _EXPONENT_BELOW
                 else t for x, t in zip(values, texts, strict=True)]
    return texts


def int_texts(values: Sequence[int | None]) -> list[str] | None:
    """``str`` of each value of a column of unsigned 64-bit totals (``array('Q')``), or None
    for any other column (the Python way)."""
    if type(values) is not array or values.typecode != "Q" or len(values) < MIN_VALUES:
        return None
    import orjson

    np = sys.modules.get("numpy")  # loaded by the tracker's column store at fabric scale
    if np is not None:
        # A view of the column only while orjson reads it.
        raw = orjson.dumps(np.frombuffer(values, dtype=np.uint64),
                           option=orjson.OPT_SERIALIZE_NUMPY)
    else:
        raw = orjson.dumps(values.tolist())
    return raw[1:-1].decode("ascii").split(",")
