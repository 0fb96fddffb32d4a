"""Sample values of a block of ports as text, the numbers formatted in C (orjson).

Why: at fabric scale the renderer's lines that change every poll are a
counter or a ratio a port, and spelling the number was most of each line's cost. Python's
``repr`` of a float (shortest round-trip digits) takes 400-550 ns, ``str`` of an int about
60 ns; orjson writes a whole column of either in one call, the float digits by the same
shortest round-trip rule (measured on this project's machine, lines of 8,192 ports: a float
line 241 ns against 794, a counter line 74 ns against 127).

The text must be exactly what ``repr``/``str`` give, because the exposition (and its goldens)
are: orjson spells integers and floats of magnitude 1e-4 and above as Python does (checked
against ``repr`` on random doubles of every magnitude in ``tests/unit/test_value_text.py``),
writes smaller ones positionally or with a one-digit exponent (``0.00001``, ``2.5e-7``, where
Python writes ``1e-05``, ``2.5e-07``): those are respelled in the text. A non-finite value
(orjson writes ``null``), a value that is not exactly a ``float`` (an int would lose its
``.0``) and a column shorter than a fabric-sized poll (``ibmon.runtime.sizes``) take the
Python way: a node-local daemon never loads orjson, and tests that make every poll
fabric-sized run this path on their small fabrics.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from functools import partial
from math import isfinite
from operator import is_not
from typing import Any

from ibmon.runtime.sizes import fabric_sized
from ibmon.track.rowview import columns_numpy

__all__ = ["NO_TEXT", "array_json", "array_texts", "float_texts", "int_texts"]

#: The text of a port without a value (None): no line.
NO_TEXT = "null"
_NOT_NONE = partial(is_not, None)
_INF = float("inf")
_PLAIN = frozenset((float, type(None)))


def float_texts(values: Sequence[float | None]) -> list[str] | None:
    """``repr`` of each value (``NO_TEXT`` for None), or None when the column must be
    spelled the Python way: few values, one that is not a finite ``float``."""
    if not fabric_sized(len(values)) or not set(map(type, values)) <= _PLAIN:
        return None
    if not all(map(isfinite, filter(_NOT_NONE, values))):  # type: ignore[arg-type]
        return None
    import orjson

    raw = orjson.dumps(values)
    texts = raw[1:-1].decode("ascii").split(",")
    if b"e-" in raw or b"0.0000" in raw:  # some value below 1e-4 (or a 0.0000 inside one)
        np = columns_numpy()  # set once the tracker's column store is in use
        if np is None:
            return [_small(t) if t.startswith(_E05) or t.endswith(_ONE_DIGIT_EXPONENT) else t
                    for t in texts]
        _respell(texts, np.array(values, dtype=np.float64))
    return texts


def array_texts(column: Any) -> list[str] | None:
    """``float_texts`` of a float64 numpy array whose NaN stand for None (``NO_TEXT``): the
    tracker's ratio columns, spelled without a float object a value. None for a column with an
    infinity, or too short to gain."""
    raw = array_json(column)
    if raw is None:
        return None
    texts = raw[1:-1].decode("ascii").split(",")
    if b"e-" in raw or b"0.0000" in raw:
        _respell(texts, column)
    return texts


def array_json(column: Any) -> bytes | None:
    """orjson's text of a float64 numpy array whose NaN stand for None: a JSON list of the
    values spelled as ``float_texts`` spells them before it respells those below 1e-4, and
    ``null`` for NaN. None for a column with an infinity, or too short to gain. Read with the
    array's own operations: no numpy module is needed here."""
    if not fabric_sized(len(column)) or (abs(column) == _INF).any():
        return None
    import orjson

    # orjson spells a float64 of an array as it does a float, and NaN as null (NO_TEXT)
    return orjson.dumps(column, option=orjson.OPT_SERIALIZE_NUMPY)


def _respell(texts: list[str], column: Any) -> None:
    """Respell (``_small``) the texts of ``column``'s values below 1e-4, in place.

    Only the values below 1e-4 (not 0.0, not None: NaN) can be spelled otherwise. The
    positive ones are respelled a class at a time, each text by one expression of a list
    comprehension (``_positional``, ``_exponent``) once the class's joined text shows it is
    spelled as the class must be: a call of ``_small`` a text cost 700 ns, 41 ms a publish at
    118,400 ports, where half of the simulated fabric's transmit-wait ratios are that small.
    Anything else (a negative value, a text not as expected) is respelled one by one.
    """
    for mask, spell in (((column >= _POSITIONAL_FROM) & (column < _EXPONENT_BELOW), _positional),
                        ((column > 0) & (column < _POSITIONAL_FROM), _exponent),
                        ((column < 0) & (column > -_EXPONENT_BELOW), _one_by_one)):
        at = mask.nonzero()[0].tolist()
        if at:
            for i, text in zip(at, spell(list(map(texts.__getitem__, at))), strict=True):
                texts[i] = text


def _positional(texts: list[str]) -> list[str]:
    """``_small`` of texts that orjson wrote positionally (``0.0000`` and digits, the first
    not 0: 1e-5 <= value < 1e-4): ``0.000025`` is ``2.5e-05``, ``0.00001`` is ``1e-05``."""
    joined = "," + ",".join(texts)
    if joined.count(",0.0000") != len(texts) or "e" in joined or "-" in joined:
        return _one_by_one(texts)
    return [f"{t[6]}.{t[7:]}e-05" if len(t) > 7 else f"{t[6]}e-05" for t in texts]


def _exponent(texts: list[str]) -> list[str]:
    """``_small`` of texts that orjson wrote with an exponent (below 1e-5): a one-digit
    exponent gets a 0 before its digit (``2.5e-7`` is ``2.5e-07``), others stay."""
    if ",".join(texts).count("e-") != len(texts):
        return _one_by_one(texts)
    return [f"{t[:-1]}0{t[-1]}" if t[-2] == "-" else t for t in texts]


def _one_by_one(texts: list[str]) -> list[str]:
    return list(map(_small, texts))


# Below 1e-4 Python writes an exponent of at least two digits (``1e-05``, ``2.5e-07``); orjson
# writes 1e-5 to 1e-4 positionally (``0.00001``, ``0.000025``) and smaller ones with the
# exponent's own digits (``2.5e-7``); both with the same shortest digits. Those texts are
# respelled (``_respell``; half of a fabric's transmit-wait ratios are that small): a pass over
# the block's whole text per spelling (``bytes.replace``; a regular expression's replacement
# template is a Python call a match in this Python) cost as much as ``repr``.
_EXPONENT_BELOW = 1e-4
_POSITIONAL_FROM = 1e-5
_E05 = ("0.0000", "-0.0000")
_ONE_DIGIT_EXPONENT = tuple(f"e-{d}" for d in range(1, 10))


def _small(text: str) -> str:
    """orjson's spelling of a float below 1e-4 as ``repr`` has it: ``0.000025`` is
    ``2.5e-05``, ``2.5e-7`` is ``2.5e-07``, ``1e-15`` stays."""
    if text.endswith(_ONE_DIGIT_EXPONENT):
        return f"{text[:-1]}0{text[-1]}"
    if not text.startswith(_E05):  # an exponent of two or more digits: Python's spelling
        return text
    sign = "-" if text[0] == "-" else ""
    digits = text[len(sign) + 6 :]  # the first is not 0: the value is at least 1e-5
    return f"{sign}{digits[0]}.{digits[1:]}e-05" if len(digits) > 1 else f"{sign}{digits}e-05"


def int_texts(values: Sequence[int | None]) -> list[str] | None:
    """``str`` of each value of a column of unsigned 64-bit totals (``array('Q')``), or None
    for any other column (the Python way)."""
    if type(values) is not array or values.typecode != "Q" or not fabric_sized(len(values)):
        return None
    import orjson

    np = columns_numpy()  # set once the tracker's column store is in use
    if np is not None:
        # A view of the column only while orjson reads it.
        raw = orjson.dumps(np.frombuffer(values, dtype=np.uint64),
                           option=orjson.OPT_SERIALIZE_NUMPY)
    else:
        raw = orjson.dumps(values.tolist())
    return raw[1:-1].decode("ascii").split(",")

