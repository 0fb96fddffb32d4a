"""A fabric-wide incident: does publishing 10,000 events to MQTT delay the poll loop?

Starts a real Mosquitto on a free loopback port, connects the MqttPublisher (QoS 1, the default)
and runs a ticker task that wakes every TICK seconds and records how late it woke: that lateness
is exactly the delay a poll loop sleeping on the same event loop would see. The baseline is the
same ticker with the publisher connected but idle, measured in the same run. Then:

1. burst: 10,000 events go through the EventBus into the publisher in one go (what a detector
   sweep emitting an event per port does); the ticker keeps running until the broker has
   acknowledged every event, and ``mosquitto_sub`` in a separate process confirms it received
   all of them.
2. state: the first retained-state publish of a 10,000-port fabric (one message per port).

Run: .venv/bin/python benchmarks/bench_mqtt.py [events] [ports]
"""

from __future__ import annotations

import asyncio
import gc
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import MappingProxyType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exporters.mqtt import MqttPublisher
from ibmon.config import MqttConfig
from ibmon.detect.events import Event, EventBus, PortRef
from ibmon.infiniband.model import PortIdentity, PortView
from ibmon.runtime.selfmetrics import SelfMetrics
from ibmon.state import FabricState
from tests.mqtt_broker import Mosquitto

TICK = 0.01  # the ticker's period; lateness beyond it is event-loop lag
POLL_INTERVAL = 1.0  # the sysfs source's default interval: the budget we must stay under


GC_PAUSES: list[float] = []
_GC_STARTED = [0.0]


def _gc_timer(phase: str, info: dict[str, int]) -> None:
    """Time full (generation 2) collections: they, not MQTT, cause the largest lag spikes."""
    if info["generation"] != 2:
        return
    if phase == "start":
        _GC_STARTED[0] = time.perf_counter()
    else:
        GC_PAUSES.append(time.perf_counter() - _GC_STARTED[0])


async def measure(work: Callable[[], Awaitable[None]]) -> tuple[list[float], float]:
    """Run ``work`` while a ticker records its lateness; return (lags, wall seconds)."""
    lags: list[float] = []
    done = asyncio.Event()
    GC_PAUSES.clear()

    async def ticker() -> None:
        while not done.is_set():
            expected = time.perf_counter() + TICK
            await asyncio.sleep(TICK)
            lags.append(max(0.0, time.perf_counter() - expected))

    tick_task = asyncio.create_task(ticker())
    started = time.perf_counter()
    await work()
    wall = time.perf_counter() - started
    done.set()
    await tick_task
    return lags, wall


def summary(name: str, lags: list[float], wall: float) -> str:
    q = statistics.quantiles(lags, n=100) if len(lags) >= 2 else [0.0] * 99
    return (f"{name:<28} wall {wall * 1000:8.1f} ms  ticks {len(lags):5d}  "
            f"lag p50 {q[49] * 1000:6.2f} ms  p99 {q[98] * 1000:6.2f} ms  "
            f"max {max(lags) * 1000:6.2f} ms  full GCs {len(GC_PAUSES)}"
            f" (longest {max(GC_PAUSES, default=0.0) * 1000:.0f} ms)")


def make_events(n: int) -> list[Event]:
    now = time.time()
    return [
        Event(time=Event.at(now), fabric="main", type="congestion", status="firing",
              severity="warning",
              port=PortRef(guid=f"0x{0x2c90300000000 + i // 36:016x}", port=str(i % 36 + 1),
                           node_desc=f"switch{i // 36:04d} L1", device="", lid=i + 1),
              value=0.42, threshold=0.1, details={"kind": "hotspot"},
              message="transmit wait 42% of the interval")
        for i in range(n)
    ]


def make_state(n: int) -> FabricState:
    views = {}
    for i in range(n):
        ident = PortIdentity(guid=f"0x{0x2c90300000000 + i // 36:016x}", port=str(i % 36 + 1),
                             node_desc=f"switch{i // 36:04d} L1", node_type="switch", lid=i + 1)
        views[ident.key] = PortView(identity=ident, state=4, phys_state=5,
                                    rate_bytes_per_second=12.5e9, active_width="4X",
                                    active_speed="EDR")
    return FabricState(generated=time.time(), ports=MappingProxyType(views))


async def main(n_events: int, n_ports: int) -> None:
    binary = shutil.which("mosquitto")
    sub_bin = shutil.which("mosquitto_sub")
    if binary is None or sub_bin is None:
        sys.exit("needs mosquitto and mosquitto_sub (apt: mosquitto, mosquitto-clients)")
    failures: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        # The receiver must not lose messages while it catches up (default queue is 1000).
        broker = Mosquitto(binary, Path(tmp), extra=["max_queued_messages 0"])
        broker.start()
        metrics = SelfMetrics()
        pub = MqttPublisher(MqttConfig(port=broker.port, queue_size=max(10_000, n_events)),
                            fabric="main", metrics=metrics)
        bus = EventBus()
        try:
            await pub.start()
            pub.attach(bus)
            while not pub.connected:  # noqa: ASYNC110 - polling a metric, as a scraper would
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)
            events = make_events(n_events)

            lags, wall = await measure(lambda: asyncio.sleep(1.0))
            print(summary("baseline (idle, 1 s)", lags, wall))

            received = Path(tmp) / "received.jsonl"
            with received.open("wb") as out:  # a file, not a pipe nobody reads yet
                receiver = subprocess.Popen(  # noqa: ASYNC220 - returns at once
                    [sub_bin, "-h", "127.0.0.1", "-p", str(broker.port), "-q", "1",
                     "-t", "ibmon/main/events/#", "-C", str(n_events), "-W", "60"],
                    stdout=out, stderr=subprocess.DEVNULL,
                )
            await asyncio.sleep(0.3)  # let the subscription settle before the burst

            def published() -> float:
                return metrics.registry.get_sample_value("ibmon_mqtt_published_total") or 0.0

            base = published()
            submit_time = 0.0

            async def burst() -> None:
                nonlocal submit_time
                t0 = time.perf_counter()
                bus.publish_many(events)
                submit_time = time.perf_counter() - t0
                while published() - base < n_events:  # noqa: ASYNC110 - polling a metric, as a scraper would
                    await asyncio.sleep(0.005)

            lags, wall = await measure(burst)
            burst_max = max(lags)
            print(summary(f"burst of {n_events} events", lags, wall))
            print(f"{'':<28} bus.publish_many took {submit_time * 1000:.1f} ms; "
                  f"{n_events / wall:,.0f} events/s acknowledged (QoS 1)")
            await asyncio.to_thread(receiver.wait, 70)
            lines = received.read_bytes().splitlines()
            print(f"{'':<28} mosquitto_sub received {len(lines)} of {n_events}")
            if burst_max > POLL_INTERVAL:
                failures.append(f"burst delayed the loop by {burst_max:.3f} s > one poll interval")
            if len(lines) != n_events:
                failures.append(f"receiver got {len(lines)} of {n_events} events")

            state = make_state(n_ports)
            base = published()

            async def first_state() -> None:
                pub.publish_state(state)
                while published() - base < n_ports:  # noqa: ASYNC110 - polling a metric, as a scraper would
                    await asyncio.sleep(0.005)

            lags, wall = await measure(first_state)
            print(summary(f"state of {n_ports} ports", lags, wall))

            same_again = make_state(n_ports)

            async def unchanged_state() -> None:
                pub.publish_state(same_again)
                await asyncio.sleep(0.5)

            lags, wall = await measure(unchanged_state)
            print(summary("unchanged state (diff only)", lags, wall))
            print(f"dropped {metrics.registry.get_sample_value('ibmon_mqtt_dropped_total'):.0f}; "
                  f"budget: one poll interval = {POLL_INTERVAL * 1000:.0f} ms")
        finally:
            await pub.stop()
            broker.stop()
    if failures:
        sys.exit("FAIL: " + "; ".join(failures))
    print("OK: the burst stayed within one poll interval and every event arrived")


if __name__ == "__main__":
    n_events = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    n_ports = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000
    gc.callbacks.append(_gc_timer)
    asyncio.run(main(n_events, n_ports))
