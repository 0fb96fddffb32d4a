"""Flood: every port of a 20,000-port fabric congested at once.

Edge triggering keeps it to one event per port when it starts and one when it ends; the bus
hands them to a consumer that never reads, whose bounded queue drops and counts the overflow;
nothing (detector state, history, queues) grows with the number of polls.
"""

from __future__ import annotations

import asyncio
import gc
import time
import tracemalloc

from ibmon.detect.engine import Engine
from ibmon.detect.events import EventBus
from ibmon.infiniband.model import LinkInfo, PortIdentity, PortKey, PortView

PORTS = 20_000


def fabric_views(ratio: float, idents: list[PortIdentity], link: LinkInfo) -> dict[
        PortKey, PortView]:
    return {
        i.key: PortView(i, 4, 5, 12.5e9, "4X", "EDR", link, {"transmit_wait": 1}, {},
                        xmit_wait_ratio=ratio, utilization_tx=0.9)
        for i in idents
    }


async def test_flood_of_congestion_is_bounded_and_never_blocks() -> None:
    idents = [PortIdentity(guid=f"0x0002c902{n // 36:07x}0", port=str(n % 36 + 1),
                           node_type="switch", node_desc=f"leaf{n // 36:04d}")
              for n in range(PORTS)]
    link = LinkInfo(remote_guid="0x0002c90300000001", remote_port="1", max_width="4X",
                    max_speed="EDR", active_width="4X", active_speed="EDR")
    engine = Engine(source="fabric")
    dropped: dict[str, int] = {}
    bus = EventBus(history=1000,
                   on_drop=lambda name: dropped.__setitem__(name, dropped.get(name, 0) + 1))
    stuck = bus.subscribe("stuck", maxsize=10_000)  # a consumer that never reads

    # A heartbeat proves the loop keeps running between polls (nothing awaits a consumer).
    beats = 0

    async def heartbeat() -> None:
        nonlocal beats
        while True:
            beats += 1
            await asyncio.sleep(0.01)

    hb = asyncio.create_task(heartbeat())
    durations: list[float] = []
    fired = resolved = 0
    growth = 0
    try:
        for poll in range(14):
            if poll == 6:
                gc.collect()
                tracemalloc.start()  # counts only what is allocated from here on and kept
            ratio = 0.8 if poll < 10 else 0.0
            views = fabric_views(ratio, idents, link)
            started = time.perf_counter()
            events = engine.process(views, monotonic=float(poll), wall=1e9 + poll)
            bus.publish_many(events)
            durations.append(time.perf_counter() - started)
            fired += sum(e.status == "firing" for e in events)
            resolved += sum(e.status == "resolved" for e in events)
            del views, events
            before = beats
            await asyncio.sleep(0.05)
            assert beats > before  # the loop was free between polls
            if poll == 6:  # per-port values are replaced each poll: compare two later polls
                gc.collect()
                growth = -tracemalloc.get_traced_memory()[0]
            if poll == 9:
                gc.collect()
                growth += tracemalloc.get_traced_memory()[0]
                tracemalloc.stop()
    finally:
        tracemalloc.stop()
        hb.cancel()

    assert fired == PORTS and resolved == PORTS  # one edge each way per port, never per poll
    assert stuck.queue.qsize() == 10_000
    assert dropped == {"stuck": 2 * PORTS - 10_000} == bus.dropped
    assert len(bus.history) == 1000
    # While the flood holds (polls 6..9), memory does not grow with the number of polls.
    assert growth < 1_000_000, f"memory grew {growth} bytes over 3 congested polls"
    quiet = max(durations[3:5])
    flood = max(durations[2], durations[12])
    print(f"\nflood: {PORTS} ports; poll with {PORTS} events {flood:.2f}s, "
          f"steady congested poll {quiet:.2f}s, memory growth {growth} B")
    assert flood < 5.0
