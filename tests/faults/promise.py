"""The promises every fault test checks on every scrape, not once at the end.

``TotalsWatch`` scrapes a daemon's ``/metrics`` (plain text, parsed by prometheus_client's
parser, the same rules Prometheus applies) and fails the moment any counter sample of any series
is lower than the highest value it had in an earlier scrape, across daemon restarts too (keep one
watch for the whole test). ``blind`` answers the other promise: a source that cannot see its
fabric reports ``ibmon_source_up 0``.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Scrape", "TotalsWatch", "parse_exposition", "scrape"]

SeriesKey = tuple[str, tuple[tuple[str, str], ...]]


@dataclass(frozen=True, slots=True)
class Scrape:
    """One parsed exposition: every sample by (name, sorted labels), and the counter samples."""

    samples: dict[SeriesKey, float]
    counters: frozenset[SeriesKey]

    def value(self, name: str, **labels: str) -> float | None:
        """The one sample of ``name`` whose labels include ``labels`` (None if absent)."""
        hits = [v for (n, lbl), v in self.samples.items()
                if n == name and labels.items() <= dict(lbl).items()]
        if len(hits) > 1:
            raise AssertionError(f"{name}{labels} matches {len(hits)} series")
        return hits[0] if hits else None

    def series(self, name: str) -> dict[tuple[tuple[str, str], ...], float]:
        return {lbl: v for (n, lbl), v in self.samples.items() if n == name}


def parse_exposition(text: str) -> Scrape:
    samples: dict[SeriesKey, float] = {}
    counters: set[SeriesKey] = set()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            if key in samples:
                raise AssertionError(f"duplicate series in one exposition: {key}")
            samples[key] = s.value
            # Histogram buckets/counts/sums only grow too, within one process; across a restart
            # they start again, so only true counters (and their _total samples) are promised.
            if family.type == "counter":
                counters.add(key)
    return Scrape(samples, frozenset(counters))


def scrape(url: str, *, timeout: float = 10.0) -> Scrape:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return parse_exposition(resp.read().decode("utf-8"))


#: The watches made during the running test, checked at its teardown.
LIVE: list[TotalsWatch] = []


@dataclass
class TotalsWatch:
    """Fails on the first scrape where a port total went down (``only`` narrows the names).

    ``ignore`` names counter families that may restart with the process (ibmon's own
    ``ibmon_source_poll_errors_total`` and friends are per-process by design); the port totals,
    whose promise is "never decrease, across restarts", are never ignored.
    """

    only: str = "ibmon_port_"
    ignore: Iterable[str] = ()
    high: dict[SeriesKey, float] = field(default_factory=dict)
    scrapes: int = 0
    #: False only for a watch a test makes without a daemon to scrape; every other watch must
    #: have checked at least one scrape by the test's end (tests/faults/conftest.py), or the
    #: promise was never checked and the test passed for nothing.
    expect_scrapes: bool = True

    def __post_init__(self) -> None:
        LIVE.append(self)

    def check(self, result: Scrape) -> Scrape:
        ignored = set(self.ignore)
        self.scrapes += 1
        for key in result.counters:
            name = key[0]
            if not name.startswith(self.only) or name in ignored:
                continue
            value = result.samples[key]
            before = self.high.get(key)
            if before is not None and value < before:
                raise AssertionError(
                    f"scrape {self.scrapes}: {name}{dict(key[1])} went down: {before} -> {value}"
                )
            self.high[key] = value if before is None else max(before, value)
        return result

    def scrape(self, url: str, *, timeout: float = 10.0) -> Scrape:
        """Scrape ``url`` and check it; connection errors propagate (the caller decides)."""
        return self.check(scrape(url, timeout=timeout))
