"""ibmon's own metric types: ``Counter``, ``Gauge`` and ``Histogram`` in a ``Registry``.

ibmon used prometheus_client for its ~20 self-metric families. That cost a node daemon more
than the types are worth: the package is ~2 MB of RSS, and its ``exposition`` module imports
``ssl``, ``http.server`` and ``urllib.request`` unconditionally, which keeps OpenSSL mapped in
every compute node's daemon. ibmon already wrote the text format
itself (the port series in ``exporters.render``, the self metrics with a caching renderer), so
what is left is this small module: the few operations ibmon uses, with prometheus_client's
semantics, and nothing else (no exemplars, no multiprocess mode, no ``_created`` series, no
OpenMetrics, no UTF-8 names).

The rendered text is byte-identical to ``prometheus_client.generate_latest`` on the same metrics
with ``disable_created_metrics()``: families in registration order, series in creation order,
labels sorted by name, counters named ``<name>_total``, histograms as cumulative
``_bucket{le=...}`` series ending in ``+Inf`` then ``_count`` and ``_sum``, values spelled as
Go does (``floatToGoString``). A property test holds the two together, prometheus_client being
the oracle (it stays a test dependency).

Rendering runs on every scrape of a node daemon, so each series builds its
``name{labels} `` prefix once, when it is created, and a scrape only formats values.

Thread safety: tracking and detection of large fabrics run in a worker thread that observes
stage timings while the event loop renders. Each series has its own lock for its
read-modify-write updates (``inc``, ``observe``; a histogram's buckets, count and sum move
together); a family's lock guards its series table. Reading a counter or gauge is a single
attribute load, so rendering takes only the families' locks (to copy the series list) and each
histogram's lock (for a consistent bucket snapshot).
"""

from __future__ import annotations

import math
import re
import threading
from bisect import bisect_left
from collections.abc import Collection, Iterable, Iterator, Sequence
from typing import Any, ClassVar, Final, Generic, NamedTuple, TypeVar

__all__ = ["Counter", "Family", "Gauge", "Histogram", "Registry", "Sample", "go_float"]

_NAME: Final = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL: Final = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_INF: Final = math.inf
_NON_FINITE: Final = {"inf": "+Inf", "-inf": "-Inf", "nan": "NaN"}


def go_float(value: float) -> str:
    """``value`` as Prometheus' Go code spells it (prometheus_client's ``floatToGoString``).

    ``+Inf``/``-Inf``/``NaN``, Python's shortest repr otherwise, except that Go switches to an
    exponent from 1e7 up: ``1234567.0`` but ``1.2345678e+07``. (Written around ``repr``, which
    has a dot unless the value is non-finite or already in exponent form: one call per value on
    the common path, as this runs for every line of every scrape.)
    """
    s = repr(float(value))
    dot = s.find(".")
    if dot < 0:
        return _NON_FINITE.get(s, s)
    if dot > 6 and s[0] != "-":
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s


def _escape_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def _prefix(name: str, labels: Iterable[tuple[str, str]]) -> str:
    """``name{a="x",b="y"} `` with labels sorted by name, as generate_latest writes them."""
    inner = ",".join(f'{k}="{_escape_value(v)}"' for k, v in sorted(labels))
    return f"{name}{{{inner}}} " if inner else f"{name} "


class Sample(NamedTuple):
    """One exposed series: what ``get_sample_value`` looks up and tests read."""

    name: str
    labels: dict[str, str]
    value: float


class _Child:
    """One series of a family (one label set). Subclasses hold the value and its lock."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()


C = TypeVar("C", bound=_Child)


class Family(Generic[C]):
    """A metric family: name, help, label names and its series by label values."""

    #: The Prometheus ``# TYPE`` of the family.
    type: ClassVar[str]
    #: Label names a family of this type may not use (a histogram's ``le``).
    _reserved: ClassVar[frozenset[str]] = frozenset()

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], registry: Registry
    ) -> None:
        if not _NAME.match(name):
            raise ValueError(f"invalid metric name {name!r}")
        labelnames = tuple(labelnames)
        for label in labelnames:
            if not _LABEL.match(label) or label.startswith("__") or label in self._reserved:
                raise ValueError(f"invalid label name {label!r} for {name}")
        if len(set(labelnames)) != len(labelnames):
            raise ValueError(f"duplicate label names for {name}: {labelnames}")
        self.name = name
        self.documentation = documentation
        self.labelnames: tuple[str, ...] = labelnames
        self._lock = threading.Lock()
        self._children: dict[tuple[str, ...], C] = {}
        exposed = self._exposed_name()
        doc = documentation.replace("\\", r"\\").replace("\n", r"\n")
        self._head = f"# HELP {exposed} {doc}\n# TYPE {exposed} {self.type}\n"
        #: The one series of a family without labels; None for a labelled family.
        self._only: C | None = None if labelnames else self._new_child(())
        registry.register(self)

    # -- what a subclass provides -----------------------------------------------------------
    def _exposed_name(self) -> str:
        return self.name

    def sample_names(self) -> tuple[str, ...]:
        """The names this family's series are exposed under (duplicates are refused)."""
        return (self.name,)

    def _new_child(self, values: tuple[str, ...]) -> C:
        raise NotImplementedError

    def _render_child(self, child: C, out: list[str]) -> None:
        raise NotImplementedError

    def _child_samples(self, child: C, labels: dict[str, str]) -> Iterator[Sample]:
        raise NotImplementedError

    # -- series -----------------------------------------------------------------------------
    def labels(self, *values: object, **kwargs: object) -> C:
        """The series for these label values (created on first use), as prometheus_client's
        ``labels``: positional in label-name order, or every label by keyword; values are
        turned into strings."""
        if not self.labelnames:
            raise ValueError(f"{self.name} has no labels")
        if values and kwargs:
            raise ValueError("label values by position or by keyword, not both")
        if kwargs:
            if sorted(kwargs) != sorted(self.labelnames):
                raise ValueError(f"incorrect label names for {self.name}: {sorted(kwargs)}")
            key = tuple(str(kwargs[k]) for k in self.labelnames)
        else:
            if len(values) != len(self.labelnames):
                raise ValueError(f"incorrect label count for {self.name}")
            key = tuple(str(v) for v in values)
        child = self._children.get(key)
        if child is None:
            with self._lock:
                child = self._children.get(key)
                if child is None:
                    child = self._children[key] = self._new_child(key)
        return child

    def remove(self, *values: object) -> None:
        """Drop the series of these label values, if there is one (prometheus_client's
        ``remove``)."""
        key = tuple(str(v) for v in values)
        with self._lock:
            self._children.pop(key, None)

    def clear(self) -> None:
        """Drop every labelled series (a family without labels keeps its one series, as in
        prometheus_client)."""
        with self._lock:
            self._children = {}

    def _series(self) -> list[C]:
        if self._only is not None:
            return [self._only]
        with self._lock:
            return list(self._children.values())

    def _single(self) -> C:
        if self._only is None:
            raise ValueError(f"{self.name} has labels: use .labels(...) first")
        return self._only

    def _render(self, out: list[str]) -> None:
        out.append(self._head)
        for child in self._series():
            self._render_child(child, out)

    def samples(self) -> Iterator[Sample]:
        """Every exposed series with its value, in rendering order."""
        if self._only is not None:
            yield from self._child_samples(self._only, {})
            return
        with self._lock:
            items = list(self._children.items())
        for key, child in items:
            yield from self._child_samples(child, dict(zip(self.labelnames, key, strict=True)))


class CounterChild(_Child):
    """One counter series: only goes up."""

    __slots__ = ("_prefix", "_value")

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self._prefix = prefix
        self._value = 0.0

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("counters can only be incremented by non-negative amounts")
        with self._lock:
            self._value += amount


class Counter(Family[CounterChild]):
    """A counter family; exposed as ``<name>_total`` (a trailing ``_total`` in ``name`` is
    dropped, as prometheus_client does)."""

    type = "counter"

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str] = (), *,
        registry: Registry,
    ) -> None:
        super().__init__(name.removesuffix("_total"), documentation, labelnames, registry)

    def _exposed_name(self) -> str:
        return self.name + "_total"

    def sample_names(self) -> tuple[str, ...]:
        return (self.name, self.name + "_total", self.name + "_created")

    def _new_child(self, values: tuple[str, ...]) -> CounterChild:
        return CounterChild(_prefix(self.name + "_total", zip(self.labelnames, values,
                                                               strict=True)))

    def _render_child(self, child: CounterChild, out: list[str]) -> None:
        out.append(f"{child._prefix}{go_float(child._value)}\n")

    def _child_samples(self, child: CounterChild, labels: dict[str, str]) -> Iterator[Sample]:
        yield Sample(self.name + "_total", labels, child._value)

    def inc(self, amount: float = 1) -> None:
        self._single().inc(amount)


class GaugeChild(_Child):
    """One gauge series."""

    __slots__ = ("_prefix", "_value")

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self._prefix = prefix
        self._value = 0.0

    def set(self, value: float) -> None:
        self._value = float(value)

    def inc(self, amount: float = 1) -> None:
        with self._lock:
            self._value += amount

    def dec(self, amount: float = 1) -> None:
        with self._lock:
            self._value -= amount


class Gauge(Family[GaugeChild]):
    """A gauge family."""

    type = "gauge"

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str] = (), *,
        registry: Registry,
    ) -> None:
        super().__init__(name, documentation, labelnames, registry)

    def _new_child(self, values: tuple[str, ...]) -> GaugeChild:
        return GaugeChild(_prefix(self.name, zip(self.labelnames, values, strict=True)))

    def _render_child(self, child: GaugeChild, out: list[str]) -> None:
        out.append(f"{child._prefix}{go_float(child._value)}\n")

    def _child_samples(self, child: GaugeChild, labels: dict[str, str]) -> Iterator[Sample]:
        yield Sample(self.name, labels, child._value)

    def set(self, value: float) -> None:
        self._single().set(value)

    def inc(self, amount: float = 1) -> None:
        self._single().inc(amount)

    def dec(self, amount: float = 1) -> None:
        self._single().dec(amount)


class HistogramChild(_Child):
    """One histogram series: a count per bucket (not cumulative; rendering adds them up), the
    sum, and the exposed prefix of every line."""

    __slots__ = ("_bounds", "_counts", "_prefixes", "_sum")

    def __init__(self, bounds: tuple[float, ...], prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self._bounds = bounds
        self._counts = [0.0] * len(bounds)
        self._sum = 0.0
        #: one per bucket, then ``_count``, then ``_sum``
        self._prefixes = prefixes

    def observe(self, amount: float) -> None:
        """Count ``amount`` in the first bucket whose bound is >= it (NaN in none: it only
        reaches the sum, as in prometheus_client)."""
        i = bisect_left(self._bounds, amount)
        with self._lock:
            self._sum += amount
            if i < len(self._counts) and not math.isnan(amount):
                self._counts[i] += 1.0

    def _snapshot(self) -> tuple[list[float], float]:
        with self._lock:
            return list(self._counts), self._sum


class Histogram(Family[HistogramChild]):
    """A histogram family with fixed bucket bounds (sorted; ``+Inf`` is appended if missing)."""

    type = "histogram"
    _reserved = frozenset({"le"})

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str] = (), *,
        buckets: Sequence[float], registry: Registry,
    ) -> None:
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds):
            raise ValueError("histogram buckets must be in sorted order")
        if bounds and bounds[-1] != _INF:
            bounds.append(_INF)
        if len(bounds) < 2:
            raise ValueError("a histogram needs at least two buckets")
        self.buckets: tuple[float, ...] = tuple(bounds)
        self._les = tuple(go_float(b) for b in bounds)
        super().__init__(name, documentation, labelnames, registry)

    def sample_names(self) -> tuple[str, ...]:
        n = self.name
        return (n, n + "_bucket", n + "_count", n + "_sum", n + "_created")

    def _new_child(self, values: tuple[str, ...]) -> HistogramChild:
        labels = list(zip(self.labelnames, values, strict=True))
        prefixes = [_prefix(self.name + "_bucket", [*labels, ("le", le)]) for le in self._les]
        prefixes.append(_prefix(self.name + "_count", labels))
        prefixes.append(_prefix(self.name + "_sum", labels))
        return HistogramChild(self.buckets, tuple(prefixes))

    def _render_child(self, child: HistogramChild, out: list[str]) -> None:
        counts, total = child._snapshot()
        prefixes = child._prefixes
        acc = 0.0
        for i, n in enumerate(counts):
            acc += n
            out.append(f"{prefixes[i]}{go_float(acc)}\n")
        out.append(f"{prefixes[-2]}{go_float(acc)}\n")
        if self.buckets[0] >= 0:  # a sum of negative observations is no counter
            out.append(f"{prefixes[-1]}{go_float(total)}\n")

    def _child_samples(self, child: HistogramChild, labels: dict[str, str]) -> Iterator[Sample]:
        counts, total = child._snapshot()
        acc = 0.0
        for le, n in zip(self._les, counts, strict=True):
            acc += n
            yield Sample(self.name + "_bucket", {**labels, "le": le}, acc)
        yield Sample(self.name + "_count", labels, acc)
        if self.buckets[0] >= 0:
            yield Sample(self.name + "_sum", labels, total)

    def observe(self, amount: float) -> None:
        self._single().observe(amount)


class Registry:
    """Metric families in registration order (the order they are rendered in)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, Family[Any]] = {}
        self._names: set[str] = set()

    def register(self, family: Family[C]) -> None:
        """Add ``family``; refused if any name it exposes is already taken."""
        names = family.sample_names()
        with self._lock:
            taken = self._names.intersection(names)
            if taken:
                raise ValueError(f"duplicated metric names in registry: {sorted(taken)}")
            self._names.update(names)
            self._families[family.name] = family

    def families(self) -> list[Family[Any]]:
        """The registered families, in registration order."""
        return self._snapshot(None)

    def _snapshot(self, only: Collection[str] | None) -> list[Family[Any]]:
        with self._lock:
            families = list(self._families.values())
        if only is not None:
            families = [f for f in families if f.name in only]
        return families

    def render(self, only: Collection[str] | None = None) -> bytes:
        """The Prometheus text format (version 0.0.4), ``generate_latest``'s bytes; ``only``
        keeps the families with these names (counters by their name without ``_total``),
        still in registration order."""
        out: list[str] = []
        for family in self._snapshot(only):
            family._render(out)
        return "".join(out).encode("utf-8")

    def samples(self) -> Iterator[Sample]:
        """Every exposed series with its value, in rendering order."""
        for family in self._snapshot(None):
            yield from family.samples()

    def get_sample_value(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        """The value of the series ``name{labels}``, or None if there is none (for tests and
        diagnostics: it walks every series)."""
        want = labels or {}
        for sample in self.samples():
            if sample.name == name and sample.labels == want:
                return sample.value
        return None
