"""Sample values formatted in C (``exporters.valuetext``) read exactly as Python spells them:
the exposition's text, goldens included, must not change with who formats it (CPU per poll)."""

from __future__ import annotations

import math
import random
import struct
import zlib
from array import array
from dataclasses import replace

import pytest
from prometheus_client.parser import text_string_to_metric_families

import exporters.render as render
import exporters.valuetext as valuetext
from exporters.render import PortRenderer
from exporters.valuetext import NO_TEXT, array_texts, float_texts, int_texts
from ibmon.infiniband.counters import CATALOGUE
from ibmon.infiniband.model import PortView
from ibmon.runtime import sizes
from ibmon.track import rowview
from ibmon.track.totals import Totals
from tests.detect_views import store_views
from tests.unit.test_prometheus_render import _load_bench

#: The fabric size these tests set: a column at least this long is spelled in C.
MIN_VALUES = 64


@pytest.fixture(autouse=True)
def _column_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a fabric daemon, whose tracker's column store put numpy in use: the arrays these
    tests hand the renderer stand for the store's; a column shorter than a fabric-sized poll
    stays Python's."""
    _numpy_in_use(True, monkeypatch)
    monkeypatch.setattr(sizes, "OFFLOAD_PORTS", MIN_VALUES)


def _doubles(rng: random.Random, n: int) -> list[float]:
    """Finite doubles of every magnitude: random bit patterns (most are huge or tiny), a
    log-uniform spread around the ratios a fabric has, and the edges of Python's notation."""
    out: list[float] = []
    while len(out) < n // 2:
        x = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        if math.isfinite(x):
            out.append(x)
    out += [rng.choice((1, -1)) * 10 ** rng.uniform(-12, 18) for _ in range(n // 2)]
    edges = [0.0, -0.0, 1e-4, math.nextafter(1e-4, 0), math.nextafter(1e-4, 1), 1e16,
             math.nextafter(1e16, 0), 5e-324, 1.7976931348623157e308, 0.1 + 0.2, 1.0, 1 / 3,
             2.5e-7, 1e-5, 9.999999999999999e-05,
             10.00001, 100.000025, 1230.0000456]  # a point and four zeros after a 0 digit
    return out + edges + [-x for x in edges]


def _numpy_in_use(yes: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process whose tracker made a column store (numpy in use), or one that never did (a
    node-local daemon): what ``ibmon.track.rowview.columns_numpy`` answers."""
    import ibmon.track.columns  # noqa: F401 - hands numpy over as it loads, before the patch

    if not yes:
        monkeypatch.setattr(rowview, "_numpy", None)


@pytest.mark.parametrize("with_numpy", [True, False])
def test_float_texts_spell_every_magnitude_as_repr(with_numpy: bool,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The small values are found with numpy where the tracker's column store uses it (a
    fabric daemon), by their text where not: both respell exactly those orjson writes its
    way."""
    _numpy_in_use(with_numpy, monkeypatch)
    rng = random.Random(12)
    values: list[float | None] = list(_doubles(rng, 40_000))
    for i in range(0, len(values), 7):  # ports without the value
        values[i] = None
    rng.shuffle(values)
    assert float_texts(values) == [NO_TEXT if x is None else repr(x) for x in values]
    # a block of ratios with no tiny value: orjson's text as it is
    ratios: list[float | None] = [rng.random() for _ in range(MIN_VALUES)]
    assert float_texts(ratios) == [repr(x) for x in ratios]
    # tiny ratios orjson writes without an exponent ("0.00001"), alone in their column
    for tiny in (1e-5, 9.999999999999999e-05, 1.5e-4 / 3):
        ratios[5] = tiny
        assert float_texts(ratios) == [repr(x) for x in ratios], tiny


@pytest.mark.parametrize("odd", [math.nan, math.inf, -math.inf, 1, True, "0.5"])
def test_float_texts_leave_what_orjson_would_misspell_to_python(odd: object) -> None:
    """orjson writes ``null`` for a value that is not finite, ``1`` for an int that a float
    family spells ``1.0``: such a column is the Python way's (None)."""
    values: list[object] = [0.5] * MIN_VALUES
    assert float_texts(values) is not None  # type: ignore[arg-type]
    values[MIN_VALUES // 2] = odd
    assert float_texts(values) is None  # type: ignore[arg-type]
    np = pytest.importorskip("numpy", reason="numpy is a runtime dependency")
    assert float_texts([np.float64(0.5)] * MIN_VALUES) is None  # a subclass of float
    assert float_texts([0.5] * (MIN_VALUES - 1)) is None  # shorter than a fabric-sized poll


def test_array_texts_spell_a_float64_array_as_repr_and_nan_as_no_value() -> None:
    """The tracker's ratio arrays (NaN: no value) spelled straight from the array: the texts
    ``float_texts`` gives the same values as floats (every magnitude, the small ones
    respelled); an infinity or a short array is the Python way's (None)."""
    np = pytest.importorskip("numpy", reason="numpy is a runtime dependency")
    rng = random.Random(5)
    values: list[float | None] = list(_doubles(rng, 40_000))
    for i in range(0, len(values), 5):
        values[i] = None
    rng.shuffle(values)
    column = np.array(values, dtype=np.float64)
    want = [NO_TEXT if x is None else repr(x) for x in values]
    assert array_texts(column) == want == float_texts(values)
    column[17] = math.inf
    assert array_texts(column) is None
    assert array_texts(np.full(MIN_VALUES - 1, 0.5)) is None


def test_values_orjson_writes_positionally_are_respelled_without_a_smaller_one() -> None:
    """From 1e-5 to 1e-4 orjson writes no exponent (``0.000025``): a column with no value
    below that, so no ``e-`` in its text, still has them as ``repr`` spells them (``2.5e-05``)."""
    np = pytest.importorskip("numpy", reason="numpy is a runtime dependency")
    values = [0.5] * MIN_VALUES + [2.5e-5, 1e-5, 9.999999999999999e-05, -3e-5, 0.0]
    want = [repr(x) for x in values]
    assert array_texts(np.array(values, dtype=np.float64)) == want == float_texts(values)


def test_small_positive_ratios_are_respelled_in_bulk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Transmit-wait ratios below 1e-4 (half of a busy fabric's) are respelled by passes over
    their joined texts, not one ``_small`` call each: the texts are still ``repr``'s, for both
    of orjson's spellings (positional from 1e-5, an exponent below) and their boundaries."""
    np = pytest.importorskip("numpy", reason="numpy is a runtime dependency")
    rng = random.Random(9)
    values = [10 ** rng.uniform(-9, -3.5) for _ in range(20_000)]
    values += [1e-5, 9.999999999999999e-05, 1e-4 / 3, 9.99999999999e-06, 1e-6, 5e-9, 1e-10,
               2.5e-5, 1.0000000000000002e-05, 0.0001, 0.0, 1e-300, 5e-324]
    rng.shuffle(values)
    column = np.array(values, dtype=np.float64)

    def one_by_one(text: str) -> str:
        raise AssertionError(f"respelled one by one: {text}")

    monkeypatch.setattr(valuetext, "_small", one_by_one)
    assert array_texts(column) == [repr(x) for x in values]


@pytest.mark.parametrize("with_numpy", [True, False])
def test_int_texts_spell_64_bit_totals_as_str(with_numpy: bool,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _numpy_in_use(with_numpy, monkeypatch)
    rng = random.Random(7)
    values = array("Q", [0, 1, (1 << 53) + 1, (1 << 64) - 1, 10**19])
    values.extend(rng.randrange(1 << rng.randrange(1, 65)) for _ in range(5_000))
    assert int_texts(values) == [str(x) for x in values]
    assert int_texts(values[:MIN_VALUES - 1]) is None  # shorter than a fabric-sized poll
    assert int_texts(list(values)) is None  # a column with room for None: Python's way
    assert int_texts(array("q", range(MIN_VALUES * 2))) is None  # not unsigned 64-bit totals


def _fabric(n: int) -> list[PortView]:
    """The exposition benchmark's fabric, with what orjson cannot spell among its values: a
    tiny ratio, one that is not finite, an int, ports without one ratio or without either
    utilization direction."""
    views: list[PortView] = _load_bench().build_views(n)
    for i in range(0, n, 37):
        views[i] = replace(views[i], utilization_tx=3e-6 * (i + 1), xmit_wait_ratio=None,
                           symbol_error_ber=None)
    for i in range(5, n, 101):
        views[i] = replace(views[i], utilization_rx=None, symbol_error_ber=2.5e-7)
    for i in range(9, n, 211):  # a port without either direction
        views[i] = replace(views[i], utilization_tx=None, utilization_rx=None)
    views[11] = replace(views[11], rate_bytes_per_second=100)  # an int: "100.0" in text
    views[13] = replace(views[13], xmit_wait_ratio=math.nan)
    return views


@pytest.mark.parametrize("store", [False, True])
def test_a_publish_with_c_text_equals_the_python_way(
        store: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every family of a fabric large enough for the exporter's cached blocks, as a publish
    renders it (``series_deflated``, its segment cache kept from one poll to the next) and as
    an uncached render without ``exporters.valuetext`` spells it: byte for byte the same, on
    the first poll and on the next one where values moved (``store``: totals as rows of
    64-bit arrays, as the tracker's)."""
    views = _fabric(1_324)
    if store:
        index = {spec.name: k for k, spec in enumerate(CATALOGUE)}
        views = [replace(v, totals=Totals(index, array("Q", [v.totals[n] for n in index])))
                 for v in views]
    publisher = PortRenderer()

    def both(views: list[PortView]) -> tuple[bytes, bytes]:
        publisher.prepare(views)
        body = publisher.series_deflated(views, 1)
        fast = zlib.decompressobj(-zlib.MAX_WBITS).decompress(b"".join(body.parts))
        python = PortRenderer()
        with monkeypatch.context() as m:
            m.setattr(render, "float_texts", lambda values: None)
            m.setattr(render, "int_texts", lambda values: None)
            m.setattr(render, "array_texts", lambda column: None)
            python.prepare(views)
            slow = b"".join(python.series_chunks(views))
        return fast, slow

    fast, slow = both(views)
    assert fast == slow
    assert b" 3e-06\n" in fast and b"} 100.0\n" in fast and b"} NaN\n" in fast
    assert _ratios(fast) == _ratios_of(views)  # and what both say is what the views hold
    moved = [replace(v, utilization_tx=(v.utilization_tx or 0) / 3,
                     totals={**v.totals, "transmit_data": v.totals["transmit_data"] * 3})
             for v in views]
    fast, slow = both(moved)
    assert fast == slow
    assert _ratios(fast) == _ratios_of(moved)


def test_a_publish_of_the_trackers_views_equals_the_python_way(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The tracker's views (rows of its store): their ratios are spelled from its arrays
    (``ratio_arrays``, then ``array_texts``), byte for byte what Python spells from each
    view."""
    views = store_views()
    spelled: list[bool] = []
    name = "array_texts"
    spelling = getattr(render, name)

    def spy(column: object) -> object:
        texts = spelling(column)
        spelled.append(texts is not None)
        return texts

    monkeypatch.setattr(render, name, spy)
    publisher = PortRenderer()
    publisher.prepare(views)
    body = publisher.series_deflated(views, 1)
    fast = zlib.decompressobj(-zlib.MAX_WBITS).decompress(b"".join(body.parts))
    assert spelled and all(spelled)  # every ratio column of the poll, from the arrays
    python = PortRenderer()
    with monkeypatch.context() as m:
        for name in ("float_texts", "int_texts", "array_texts"):
            m.setattr(render, name, lambda values: None)
        python.prepare(views)
        slow = b"".join(python.series_chunks(views))
    assert fast == slow
    assert _ratios(fast) == _ratios_of(views)


def _ratios(body: bytes) -> dict[tuple[str, str, str], str]:
    """The ratio and BER samples a parser reads from ``body``: (guid, port, family or
    direction) to the value's repr."""
    return {
        (s.labels["guid"], s.labels["port"], s.labels.get("direction", fam.name)):
            "nan" if math.isnan(s.value) else repr(s.value)
        for fam in text_string_to_metric_families(body.decode())
        if fam.name in ("ibmon_port_utilization_ratio", "ibmon_port_transmit_wait_ratio",
                        "ibmon_port_symbol_error_ber")
        for s in fam.samples
    }


def _ratios_of(views: list[PortView]) -> dict[tuple[str, str, str], str]:
    out = {}
    for v in views:
        key = (v.identity.guid, v.identity.port)
        for name, x in (("transmit", v.utilization_tx), ("receive", v.utilization_rx),
                        ("ibmon_port_transmit_wait_ratio", v.xmit_wait_ratio),
                        ("ibmon_port_symbol_error_ber", v.symbol_error_ber)):
            if x is not None:
                out[(*key, name)] = "nan" if math.isnan(x) else repr(float(x))
    return out
