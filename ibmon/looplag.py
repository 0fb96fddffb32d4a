"""How long the event loop was blocked: ``ibmon_event_loop_lag_seconds``.

Every scrape of ``/metrics``, every API request and every poll's timer runs on the daemon's one
event loop, so whatever holds the loop (tracking a large fabric, a full garbage collection, a
slow exporter) is latency that every client sees. The probe measures it the cheapest way there
is: a task sleeps ``PERIOD`` and records how much later than asked it woke up. A stall that
covers the probe's wake-up is recorded whole (a 1 s stall reads about 1 s); a stall shorter
than the period is caught with probability stall / period, so the histogram samples short
stalls and never misses long ones.

It is a histogram rather than a max gauge: a gauge would have to be reset when read (wrong
with two Prometheus servers, or ``ibmon top`` beside one) or would keep one bad moment
forever, while ``_bucket{le="0.05"}`` against ``_count`` says directly how often the loop was
held longer than 50 ms, and ``histogram_quantile`` gives the usual percentiles. The cost is
one timer and one ``observe`` per period: about 10 µs of CPU every 0.1 s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Histogram

__all__ = ["BUCKETS", "PERIOD", "LoopLagProbe"]

#: Seconds between two wake-ups of the probe.
PERIOD = 0.1
#: Sub-millisecond is an idle loop; 0.05 is issue 12's limit; above 1 s a scrape times out.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class LoopLagProbe:
    """The ``ibmon_event_loop_lag_seconds`` histogram and the task that feeds it."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        period: float = PERIOD,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not period > 0:
            raise ValueError("period must be > 0")
        self.period = period
        self._clock = clock
        self.histogram = Histogram(
            "ibmon_event_loop_lag_seconds",
            f"How much later than due the event loop ran a timer set every {period:g} s: how"
            " long the loop was blocked, which every scrape, API request and poll waited out."
            " Stalls shorter than the period are sampled, longer ones always seen.",
            buckets=BUCKETS,
            registry=registry,
        )

    async def run(self) -> None:
        """Measure until cancelled."""
        clock, period, observe = self._clock, self.period, self.histogram.observe
        while True:
            due = clock() + period
            await asyncio.sleep(period)
            observe(max(0.0, clock() - due))
