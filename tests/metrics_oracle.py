"""prometheus_client as the oracle for ``ibmon.runtime.metrics``: the same families, the same
operations.

ibmon renders its self metrics with its own types (``ibmon.runtime.metrics``) and promises the exact
bytes ``prometheus_client.generate_latest`` writes for the same metrics (with ``_created`` series
disabled). ``Oracle`` holds a prometheus_client registry beside an ibmon registry: it copies the
family definitions (type, name, help, label names, buckets) and the series that already exist,
then ``apply`` performs each operation on both, so a test compares ``ours.render()`` with
``oracle.expected()``.
"""

from __future__ import annotations

import math
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, generate_latest

from ibmon.runtime import metrics

# ibmon never writes ``_created`` series; the oracle must not either.
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

_TYPES: dict[str, Any] = {
    "counter": prometheus_client.Counter,
    "gauge": prometheus_client.Gauge,
    "histogram": prometheus_client.Histogram,
}


class Oracle:
    """A prometheus_client twin of an ``ibmon.runtime.metrics.Registry``."""

    def __init__(self, ours: metrics.Registry) -> None:
        self.ours = ours
        self.theirs = CollectorRegistry(auto_describe=True)
        self._twins: dict[str, Any] = {}
        for family in ours.families():
            self.add(family)

    def add(self, family: metrics.Family[Any]) -> None:
        """Define ``family`` in the twin, with copies of the series it already has."""
        kwargs: dict[str, Any] = {"registry": self.theirs}
        if isinstance(family, metrics.Histogram):
            kwargs["buckets"] = family.buckets
        twin = _TYPES[family.type](family.name, family.documentation, family.labelnames, **kwargs)
        self._twins[family.name] = twin
        for sample in family.samples():
            labels = {k: v for k, v in sample.labels.items() if k != "le"}
            child = twin.labels(**labels) if labels else twin
            if family.type == "counter":
                child.inc(sample.value)
            elif family.type == "gauge":
                child.set(sample.value)
            elif sample.name.endswith("_count"):
                # Observations cannot be copied exactly (only their sum is known): a test
                # makes its observations through ``apply``.
                assert sample.value == 0, f"{family.name} was observed before the oracle saw it"

    def apply(self, name: str, labels: tuple[str, ...] | dict[str, str], op: str,
              *args: float) -> None:
        """``family.labels(...).op(*args)`` on both registries; ``op`` may be ``labels`` (only
        create the series) or ``clear``. A ValueError (a negative counter increment, wrong
        labels) must come from both or neither; it is raised again."""
        errors: list[ValueError | None] = []
        for family in (self._ours(name), self._twins[name]):
            try:
                self._one(family, labels, op, args)
            except ValueError as exc:
                errors.append(exc)
            else:
                errors.append(None)
        ours, theirs = errors
        assert (ours is None) == (theirs is None), f"{op} {name}: {ours!r} vs {theirs!r}"
        if ours is not None:
            raise ours

    @staticmethod
    def _one(family: Any, labels: tuple[str, ...] | dict[str, str], op: str,
             args: tuple[float, ...]) -> None:
        if op == "clear":
            family.clear()
            return
        if isinstance(labels, dict):
            child = family.labels(**labels) if labels else family
        else:
            child = family.labels(*labels) if labels else family
        if op != "labels":
            getattr(child, op)(*args)

    def _ours(self, name: str) -> metrics.Family[Any]:
        for family in self.ours.families():
            if family.name == name:
                return family
        raise KeyError(name)

    def expected(self) -> bytes:
        return generate_latest(self.theirs)

    def assert_same(self) -> None:
        """Same bytes, and the same ``get_sample_value`` answer for every series."""
        assert self.ours.render() == self.expected()
        for sample in self.ours.samples():
            want = self.theirs.get_sample_value(sample.name, sample.labels)
            got = self.ours.get_sample_value(sample.name, sample.labels)
            assert want is not None and got is not None, sample
            assert got == want or (math.isnan(got) and math.isnan(want)), sample
