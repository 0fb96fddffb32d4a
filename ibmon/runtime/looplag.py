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
one timer and one ``observe`` per period. The timer is the expensive part: waking the loop
costs 0.15-0.2 ms of CPU on a VM (epoll and scheduler, not Python), so at 0.1 s it was 2 ms a
second, a fifth of a compute-node daemon's CPU per poll. The daemon
therefore probes every ``PERIOD`` only while it holds enough ports for work to stall the loop
(a fabric-sized daemon: ``ibmon.runtime.sizes``, where tracking moves to a worker thread) and every
``IDLE_PERIOD`` otherwise:
a node daemon's long stalls are still seen whole, its short ones sampled ten times less.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from ibmon.runtime import sizes
from ibmon.runtime.metrics import Histogram, Registry
from ibmon.runtime.sizes import fabric_sized

__all__ = ["BUCKETS", "IDLE_PERIOD", "PERIOD", "LoopLagProbe", "period_for"]

#: Seconds between two wake-ups of the probe on a fabric-sized daemon (``ibmon.runtime.sizes``).
PERIOD = 0.1
#: ... and below that (a compute node's HCAs): one wake-up a second, as often as it polls.
IDLE_PERIOD = 1.0
#: Sub-millisecond is an idle loop; 0.05 is the loop's budget; above 1 s a scrape times out.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def period_for(ports: int) -> float:
    """The probe period for a daemon publishing ``ports`` ports."""
    return PERIOD if fabric_sized(ports) else IDLE_PERIOD


class LoopLagProbe:
    """The ``ibmon_event_loop_lag_seconds`` histogram and the task that feeds it."""

    def __init__(
        self,
        registry: Registry,
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
            f"How much later than due the event loop ran a timer set every {PERIOD:g} s"
            f" ({IDLE_PERIOD:g} s below {sizes.OFFLOAD_PORTS} ports): how long the loop was"
            " blocked, which every scrape, API request and poll waited out. Stalls shorter than the"
            " period are sampled, longer ones always seen.",
            buckets=BUCKETS,
            registry=registry,
        )

    async def run(self) -> None:
        """Measure until cancelled; ``period`` may be changed while it runs (next wake-up)."""
        clock, observe = self._clock, self.histogram.observe
        while True:
            period = self.period
            due = clock() + period
            await asyncio.sleep(period)
            observe(max(0.0, clock() - due))
