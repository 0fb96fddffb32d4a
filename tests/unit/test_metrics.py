"""``ibmon.runtime.metrics`` behaves and renders exactly as prometheus_client does, and counts
exactly under threads.

The self metrics are scraped by Prometheus and read by ibmon's alert rules and dashboards, which
were written against prometheus_client's output; ibmon dropped the dependency from its runtime
(a node daemon's memory) but not the promise. prometheus_client stays the oracle
(``tests/metrics_oracle.py``): random families and random operations (label values that need
escaping, NaN, infinities, huge and negative values, cleared families) are applied to both, and
the rendered bytes must be equal after every operation.
"""

from __future__ import annotations

import math
import sys
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.utils import floatToGoString

from ibmon.runtime.metrics import Counter, Gauge, Histogram, Registry, go_float
from tests.metrics_oracle import Oracle

#: Label names out of alphabetical order, one sorting on each side of a histogram's ``le``.
LABELNAMES = ("lz", "a")
LABEL_VALUES = st.text(alphabet=st.sampled_from('ab\\"\n{}=,é€ \t'), max_size=6) | st.text(
    max_size=4)
VALUES = (
    st.floats(allow_nan=True, allow_infinity=True)
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([0, 1, -0.0, 0.1, 1e20, 1234567.0, 12345678.0, 1.7e9, 1e-7, 2.5e-300])
)
BUCKETS = st.lists(
    st.floats(min_value=-1e12, max_value=1e12, allow_nan=False), min_size=1, max_size=4,
    unique=True,
).map(sorted) | st.sampled_from([[0.005, 0.1, 1.0, 2.5, 60.0], [1.0, math.inf], [0.0001, 1e7]])
OPS = {"counter": ("inc", "labels", "clear"), "gauge": ("set", "inc", "dec", "labels", "clear"),
       "histogram": ("observe", "labels", "clear")}


@st.composite
def families(draw: st.DrawFn) -> list[tuple[str, str, int, str, list[float]]]:
    out = []
    for i in range(draw(st.integers(min_value=1, max_value=4))):
        kind = draw(st.sampled_from(sorted(OPS)))
        suffix = draw(st.sampled_from(["", "_total"])) if kind == "counter" else ""
        out.append((kind, f"ibmon_t{i}{suffix}", draw(st.integers(min_value=0, max_value=2)),
                    draw(st.text(max_size=12)), draw(BUCKETS)))
    return out


def _build(specs: list[tuple[str, str, int, str, list[float]]]) -> tuple[Oracle, list[str]]:
    ours = Registry()
    names = []
    for kind, name, nlabels, doc, buckets in specs:
        labelnames = LABELNAMES[:nlabels]
        family: Any
        if kind == "counter":
            family = Counter(name, doc, labelnames, registry=ours)
        elif kind == "gauge":
            family = Gauge(name, doc, labelnames, registry=ours)
        else:
            family = Histogram(name, doc, labelnames, buckets=buckets, registry=ours)
        names.append(family.name)
    return Oracle(ours), names


@settings(max_examples=300, deadline=None)
@given(
    specs=families(),
    ops=st.lists(
        st.tuples(st.integers(min_value=0, max_value=3), st.integers(min_value=0, max_value=4),
                  st.tuples(LABEL_VALUES, LABEL_VALUES), st.booleans(), VALUES),
        max_size=25,
    ),
)
def test_random_operations_render_like_generate_latest(
    specs: list[tuple[str, str, int, str, list[float]]],
    ops: list[tuple[int, int, tuple[str, str], bool, float]],
) -> None:
    oracle, names = _build(specs)
    oracle.assert_same()  # families without series: their HELP and TYPE lines only
    for which, op_index, values, by_keyword, value in ops:
        kind, _, nlabels, _, _ = specs[which % len(specs)]
        op = OPS[kind][op_index % len(OPS[kind])]
        labels: tuple[str, ...] | dict[str, str] = values[:nlabels]
        if by_keyword:
            labels = dict(zip(LABELNAMES[:nlabels], values[:nlabels], strict=True))
        if op in ("labels", "clear") and not nlabels:
            op = OPS[kind][0]  # neither exists on an unlabelled family (in both libraries)
        args = () if op in ("labels", "clear") else (value,)
        try:
            oracle.apply(names[which % len(specs)], labels, op, *args)
        except ValueError:
            assert op == "inc" and kind == "counter" and value < 0  # both refused it
        oracle.assert_same()


@settings(max_examples=2000)
@given(st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**80), 2**80))
def test_values_are_spelled_as_go_does(value: float) -> None:
    assert go_float(value) == floatToGoString(value)  # type: ignore[no-untyped-call]


def test_series_appear_in_creation_order_and_clear_forgets_them() -> None:
    oracle, _ = _build([("gauge", "ibmon_g", 1, "h", [])])
    for value in ("b", "a", "c"):
        oracle.apply("ibmon_g", (value,), "set", 1)
    oracle.apply("ibmon_g", {"lz": "a"}, "set", 2)  # by keyword: the same series
    oracle.assert_same()
    assert oracle.ours.render().decode().splitlines()[2:] == [
        'ibmon_g{lz="b"} 1.0', 'ibmon_g{lz="a"} 2.0', 'ibmon_g{lz="c"} 1.0']
    oracle.apply("ibmon_g", (), "clear")
    oracle.apply("ibmon_g", ("z",), "labels")
    oracle.assert_same()
    assert oracle.ours.render().decode().splitlines()[2:] == ['ibmon_g{lz="z"} 0.0']


def test_histogram_lines_nan_and_negative_buckets() -> None:
    oracle, _ = _build([("histogram", "ibmon_h", 2, "h", [-1.0, 0.0, 1.0]),
                        ("histogram", "ibmon_p", 0, "p", [0.5, 1.0])])
    for value in (-5.0, 0.0, 0.5, math.nan, math.inf, -math.inf, 1e300):
        oracle.apply("ibmon_h", ("x", "y"), "observe", value)
        oracle.apply("ibmon_p", (), "observe", value)
    oracle.assert_same()
    text = oracle.ours.render().decode()
    assert "ibmon_h_sum" not in text  # a bucket below zero: no _sum, as in prometheus_client
    assert 'ibmon_h_bucket{a="y",le="+Inf",lz="x"} 6.0' in text  # NaN is in no bucket
    assert "ibmon_p_sum NaN" in text


def test_duplicate_and_invalid_definitions_are_refused() -> None:
    r = Registry()
    Counter("ibmon_requests", "h", registry=r)
    with pytest.raises(ValueError, match="duplicated"):
        Gauge("ibmon_requests_total", "h", registry=r)
    with pytest.raises(ValueError, match="duplicated"):
        Counter("ibmon_requests_total", "h", registry=r)  # the same family: _total is dropped
    Histogram("ibmon_h", "h", buckets=[1.0], registry=r)
    with pytest.raises(ValueError, match="duplicated"):
        Gauge("ibmon_h_bucket", "h", registry=r)
    with pytest.raises(ValueError, match="invalid metric name"):
        Gauge("ibmon-dash", "h", registry=r)
    with pytest.raises(ValueError, match="invalid label name"):
        Histogram("ibmon_h2", "h", ["le"], buckets=[1.0], registry=r)
    with pytest.raises(ValueError, match="invalid label name"):
        Gauge("ibmon_g2", "h", ["__reserved"], registry=r)
    with pytest.raises(ValueError, match="sorted"):
        Histogram("ibmon_h3", "h", buckets=[2.0, 1.0], registry=r)
    with pytest.raises(ValueError, match="duplicate label names"):
        Gauge("ibmon_g3", "h", ["source", "source"], registry=r)
    assert [f.name for f in r.families()] == ["ibmon_requests", "ibmon_h"]


def test_labels_are_used_as_declared() -> None:
    r = Registry()
    labelled = Counter("ibmon_c", "h", ["a", "b"], registry=r)
    plain = Gauge("ibmon_g", "h", registry=r)
    with pytest.raises(ValueError, match="has labels"):
        labelled.inc()
    with pytest.raises(ValueError, match="no labels"):
        plain.labels("x")
    with pytest.raises(ValueError, match="label count"):
        labelled.labels("x")
    with pytest.raises(ValueError, match="label names"):
        labelled.labels(a="x", c="y")
    with pytest.raises(ValueError, match="not both"):
        labelled.labels("x", b="y")
    with pytest.raises(ValueError, match="non-negative"):
        labelled.labels("x", "y").inc(-1)
    assert labelled.labels(1, None) is labelled.labels(a="1", b="None")  # values as str()


def test_get_sample_value_answers_like_prometheus_client() -> None:
    oracle, _ = _build([("counter", "ibmon_c", 1, "h", []), ("histogram", "ibmon_h", 0, "h",
                                                              [1.0, 2.0])])
    oracle.apply("ibmon_c", ("x",), "inc", 3)
    oracle.apply("ibmon_h", (), "observe", 1.5)
    oracle.assert_same()  # every series, through both registries' get_sample_value
    ours = oracle.ours
    assert ours.get_sample_value("ibmon_c_total", {"lz": "x"}) == 3.0
    assert ours.get_sample_value("ibmon_c_total", {"lz": "y"}) is None
    assert ours.get_sample_value("ibmon_c", {"lz": "x"}) is None  # the exposed name only
    assert ours.get_sample_value("ibmon_h_bucket", {"le": "2.0"}) == 1.0
    assert ours.get_sample_value("ibmon_h_count") == 1.0


def _in_threads(n: int, work: Any) -> None:
    """``work()`` in ``n`` threads at once, switching between them as often as the interpreter
    can, so that an unlocked read-modify-write would lose updates."""
    start = threading.Barrier(n)
    errors: list[BaseException] = []

    def run() -> None:
        start.wait()
        try:
            work()
        except BaseException as exc:  # reported by the test, not lost in the thread
            errors.append(exc)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=run) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert not errors, errors


def test_threads_lose_no_increment_or_observation() -> None:
    """Exact totals from N threads. (CPython 3.11 does not switch threads inside a lone
    ``self._value += amount``, so this guards interpreters that do, such as free-threaded
    builds; ``test_a_scrape_sees_each_histogram_whole`` fails here without the locks.)"""
    r = Registry()
    counter = Counter("ibmon_c", "h", ["stage"], registry=r)
    gauge = Gauge("ibmon_g", "h", registry=r)
    hist = Histogram("ibmon_h", "h", ["stage"], buckets=[0.25, 1.0], registry=r)
    threads, rounds = 8, 20_000

    def work() -> None:
        child, observe = counter.labels("track"), hist.labels("track").observe
        for _ in range(rounds):
            child.inc()
            gauge.inc(2)
            observe(0.5)

    _in_threads(threads, work)
    total = float(threads * rounds)
    assert r.get_sample_value("ibmon_c_total", {"stage": "track"}) == total
    assert r.get_sample_value("ibmon_g") == 2 * total
    assert r.get_sample_value("ibmon_h_count", {"stage": "track"}) == total
    assert r.get_sample_value("ibmon_h_bucket", {"stage": "track", "le": "1.0"}) == total
    assert r.get_sample_value("ibmon_h_sum", {"stage": "track"}) == total / 2


def test_rendering_while_threads_add_series() -> None:
    """A scrape on the event loop while a worker thread creates series: no error, and every
    series it created is in the final output."""
    r = Registry()
    gauge = Gauge("ibmon_g", "h", ["n"], registry=r)
    hist = Histogram("ibmon_h", "h", ["n"], buckets=[1.0], registry=r)
    per_thread = 2_000

    def work() -> None:
        name = threading.current_thread().name
        for i in range(per_thread):
            gauge.labels(f"{name}-{i}").set(i)
            hist.labels(f"{name}-{i}").observe(i)
            if i % 100 == 0:
                r.render()

    _in_threads(4, work)
    text = r.render().decode()
    assert text.count("\nibmon_g{") == 4 * per_thread
    assert text.count("ibmon_h_count{") == 4 * per_thread


def test_a_scrape_sees_each_histogram_whole() -> None:
    """Observations made by worker threads while the loop renders: every rendered histogram
    is one consistent moment (its count, its buckets and its sum agree), never half an
    observation."""
    r = Registry()
    hist = Histogram("ibmon_h", "h", buckets=[0.25, 1.0], registry=r)
    stop = threading.Event()
    seen: list[tuple[float, float, float]] = []

    def observe() -> None:
        while not stop.is_set():
            hist.observe(0.5)

    def scrape() -> None:
        for _ in range(3_000):
            lines = dict(line.rsplit(" ", 1) for line in r.render().decode().splitlines()
                         if not line.startswith("#"))
            seen.append((float(lines['ibmon_h_bucket{le="1.0"}']),
                         float(lines["ibmon_h_count"]), float(lines["ibmon_h_sum"])))
        stop.set()

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=observe) for _ in range(3)]
        threads.append(threading.Thread(target=scrape))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert seen[-1][1] > 0
    torn = [s for s in seen if not s[0] == s[1] == 2 * s[2]]
    assert not torn, f"{len(torn)} of {len(seen)} scrapes saw half an observation: {torn[:3]}"
