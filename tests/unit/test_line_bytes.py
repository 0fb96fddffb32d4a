"""Lines put together in C (``exporters._lines`` through ``exporters.linebytes``) are byte for
byte the lines Python writes (``str`` of an int, ``repr`` of a float, no line for None), and
input that is not what the renderer hands it is refused with an error, never read past.

The module is optional (built where a C compiler is at install time); ``.ci/run`` installs one,
so under CI a missing module fails the run (a skip fails it: ``tests/conftest.py``)."""

from __future__ import annotations

import math
import random
from array import array

import numpy as np
import pytest

import exporters.linebytes as linebytes
from exporters.valuetext import MIN_VALUES, array_json
from tests.unit.test_value_text import _doubles

_lines = linebytes._lines

LABELS = ['guid="0x0002c90300a1b2c3",port="1"', 'guid="0x0002c90300a1b2c4",port="36"',
          'guid="0x1",port="\\"odd\\\\ port\\n"', 'guid="0x2",port="ümlaut ✓"']


@pytest.fixture
def c_lines() -> None:
    if _lines is None:
        pytest.skip("exporters._lines was not built (no C compiler when ibmon was installed)")


def _labels(n: int, rng: random.Random) -> list[str]:
    return [rng.choice(LABELS) + "," * rng.randrange(3) for _ in range(n)]


def _join(chunks: list[bytes] | None) -> str:
    assert chunks is not None
    return b"".join(chunks).decode("utf-8")


@pytest.mark.usefixtures("c_lines")
def test_float_lines_are_pythons_repr_of_every_magnitude() -> None:
    """Floats of every magnitude (the small ones orjson spells otherwise than ``repr``:
    ``0.000025``, ``2.5e-7``), NaN for None: each line ``head + label + mid + repr + \\n``,
    none for NaN."""
    rng = random.Random(12)
    values = _doubles(rng, 4000)
    values[::7] = [math.nan] * len(values[::7])
    labels = _labels(len(values), rng)
    column = np.array(values, dtype=np.float64)
    raw = array_json(column)
    assert raw is not None
    got = _join(linebytes.lines(labels, ((b"m{", b"} ", raw),)))
    want = "".join(f"m{{{lb}}} {x!r}\n" for lb, x in zip(labels, values, strict=True)
                   if not math.isnan(x))
    assert got == want
    assert "e-05\n" in got and "e-07\n" in got  # both respellings were needed


@pytest.mark.usefixtures("c_lines")
def test_uint64_lines_are_str_of_every_total() -> None:
    rng = random.Random(13)
    values = array("Q", [0, 1, 9, 10, 2**32, 2**63, 2**64 - 1])
    values.extend(rng.getrandbits(rng.randrange(1, 65)) for _ in range(3000))
    labels = _labels(len(values), rng)
    got = _join(linebytes.lines(labels, ((b"ibmon_x_total{", b"} ", values),)))
    assert got == "".join(f"ibmon_x_total{{{lb}}} {x}\n"
                          for lb, x in zip(labels, values, strict=True))
    # numpy's view of the same column, as the renderer's columns may be
    assert _join(linebytes.lines(labels, ((b"ibmon_x_total{", b"} ",
                                           np.frombuffer(values, dtype=np.uint64)),))) == got


@pytest.mark.usefixtures("c_lines")
@pytest.mark.parametrize("per_chunk", [1, 3, 512, 5000])
def test_columns_of_a_port_follow_each_other_in_chunks(per_chunk: int,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Utilization's two columns: a port's transmit line, then its receive line, either left
    out where its value is None; the chunks hold at most ``PER_CHUNK`` lines each and are
    cut between ports."""
    monkeypatch.setattr(linebytes, "PER_CHUNK", per_chunk)
    rng = random.Random(per_chunk)
    n = 1000
    tx = [rng.choice((math.nan, rng.random(), rng.random() * 1e-6)) for _ in range(n)]
    rx = [rng.choice((math.nan, rng.random(), 0.0)) for _ in range(n)]
    labels = _labels(n, rng)
    raw_tx, raw_rx = (array_json(np.array(c)) for c in (tx, rx))
    chunks = linebytes.lines(labels, ((b"u{", b',d="t"} ', raw_tx), (b"u{", b',d="r"} ', raw_rx)))
    assert chunks is not None
    want = []
    for lb, t, r in zip(labels, tx, rx, strict=True):
        want += [f'u{{{lb},d="t"}} {t!r}\n'] if not math.isnan(t) else []
        want += [f'u{{{lb},d="r"}} {r!r}\n'] if not math.isnan(r) else []
    assert _join(chunks) == "".join(want)
    ports = max(1, per_chunk // 2)
    assert len(chunks) == -(-n // ports)
    assert all(chunk.count(b"\n") <= 2 * ports for chunk in chunks)


@pytest.mark.usefixtures("c_lines")
def test_input_that_is_not_one_value_a_label_is_refused() -> None:
    """What the renderer never hands it is an error, not a read past the input or a line
    short: fewer or more values than labels, text that is not a JSON list, a column that is
    not unsigned 64-bit, a label that is not text, no column or too many."""
    assert _lines is not None
    labels = ["a", "b", "c"]
    ok = (b"h{", b"} ", b"[1.0,null,2.5]")
    assert _lines.lines(labels, (ok,), 2) == [b"h{a} 1.0\n", b"h{c} 2.5\n"]
    assert _lines.lines([], ((b"h{", b"} ", b"[]"),), 2) == []
    refused: list[tuple[object, ...]] = [
        (labels, ((b"h{", b"} ", b"[1.0,2.0]"),), 2),  # a value short
        (labels, ((b"h{", b"} ", b"[1.0,2.0,3.0,4.0]"),), 2),  # a value more
        (labels, ((b"h{", b"} ", b"[1.0,2.0,3.0,4.0]"),), 5),  # the same in one chunk
        ([], ((b"h{", b"} ", b"[1.0]"),), 2),
        (labels, ((b"h{", b"} ", b"1.0,2.0,3.0"),), 2),  # not a list
        (labels, ((b"h{", b"} ", b"["),), 2),
        (labels, ((b"h{", b"} ", array("Q", [1, 2])),), 2),  # a total short
        (labels, ((b"h{", b"} ", array("q", [1, 2, 3])),), 2),  # signed
        (labels, ((b"h{", b"} ", array("d", [1, 2, 3])),), 2),  # not ints
        (labels, ((b"h{", b"} ", np.arange(3, dtype=">u8")),), 2),  # big-endian
        (labels, ((b"h{", b"} ", "[1.0,2.0,3.0]"),), 2),  # text, not bytes
        (["a", b"b", "c"], (ok,), 2),  # a label of bytes
        (labels, (), 2),
        (labels, (ok,) * 5, 2),
        (labels, ((b"h{", b"} "),), 2),
        (labels, (ok,), 0),
    ]
    for args in refused:
        with pytest.raises((ValueError, TypeError)):
            _lines.lines(*args)  # type: ignore[arg-type]


def test_the_python_way_is_taken_without_the_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the module was not built, or the labels are not a list, the caller's own way."""
    raw = array_json(np.full(MIN_VALUES, 0.5))
    monkeypatch.setattr(linebytes, "BACKEND", "python")
    assert linebytes.lines(["a"] * MIN_VALUES, ((b"h{", b"} ", raw),)) is None
    monkeypatch.setattr(linebytes, "BACKEND", "c")
    assert linebytes.lines(("a",) * MIN_VALUES, ((b"h{", b"} ", raw),)) is None
