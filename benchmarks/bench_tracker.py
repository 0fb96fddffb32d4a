"""Tracker.update on a large fabric: is the counter hot path fast enough for 1 s polling?

Builds 20,000-port snapshots carrying all 22 catalogue counters (data and packet counters read
as 64-bit, error counters narrow, as on a modern switch), primes the tracker with a baseline
snapshot, then times steady-state updates in three load shapes:

- ``all-moving``: every counter of every port changes every poll (the worst case);
- ``traffic``: the 8 data/packet counters and PortXmitWait move, error counters stand still
  (a healthy busy fabric);
- ``idle``: nothing moves.

The baseline printed beside each is the floor any tracker pays, measured in the same run: copying
each port's counter dict once. Dump/load (state persistence) of the whole fabric is timed too.

Run: .venv/bin/python benchmarks/bench_tracker.py [ports] [rounds]
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from ibmon.infiniband.counters import CATALOGUE
from ibmon.infiniband.model import PortIdentity, PortSample, Snapshot
from ibmon.track.tracker import Tracker

WIDE = frozenset(c.name for c in CATALOGUE if c.sysfs_ext or c.bits == 64)
TRAFFIC = WIDE | {"transmit_wait"}


def build(n_ports: int, step: int, t: float, moving: frozenset[str]) -> Snapshot:
    ports = {}
    for i in range(n_ports):
        ident = PortIdentity(guid=f"0x{0x2c90300000000 + i // 36:016x}", port=str(i % 36 + 1))
        # No counter resets or saturates here: the common case the hot path is built for.
        counters = {
            c.name: (i * 1000 if c.name in WIDE else i % (c.max_value // 4))
            + (step * (123_457 if c.name in WIDE else 1) if c.name in moving else 0)
            for c in CATALOGUE
        }
        ports[ident.key] = PortSample(
            identity=ident, state=4, phys_state=5, rate_bps=100e9, active_width="4X",
            active_speed="EDR", counters=counters, wide=WIDE,
        )
    return Snapshot(source="bench", monotonic=t, wall=1.7e9 + t, ports=ports)


def run(n_ports: int, rounds: int, label: str, moving: frozenset[str]) -> Tracker:
    snaps = [build(n_ports, step, float(step), moving) for step in range(rounds + 1)]
    tracker = Tracker()
    t0 = time.perf_counter()
    tracker.update(snaps[0])
    first = time.perf_counter() - t0
    times, cpu, floor = [], [], []
    for snap in snaps[1:]:
        c0, t0 = time.process_time(), time.perf_counter()
        views = tracker.update(snap)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        t0 = time.perf_counter()
        _ = {k: dict(s.counters) for k, s in snap.ports.items()}
        floor.append(time.perf_counter() - t0)
    assert len(views) == n_ports
    assert len(next(iter(views.values())).rates) == len(CATALOGUE)
    med, base = statistics.median(times), statistics.median(floor)
    print(f"{label:>10}: median {med * 1e3:6.1f} ms  min {min(times) * 1e3:6.1f} ms  "
          f"max {max(times) * 1e3:6.1f} ms  cpu median {statistics.median(cpu) * 1e3:6.1f} ms  "
          f"({med / n_ports * 1e6:5.2f} us/port; floor {base * 1e3:.1f} ms, "
          f"ratio {med / base:.1f}x; first update {first * 1e3:.0f} ms)")
    return tracker


def main() -> None:
    n_ports = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 9
    print(f"ports={n_ports} counters/port={len(CATALOGUE)} rounds={rounds} "
          f"python={sys.version.split()[0]}")
    run(n_ports, rounds, "idle", frozenset())
    run(n_ports, rounds, "traffic", frozenset(TRAFFIC))
    tracker = run(n_ports, rounds, "all-moving", frozenset(c.name for c in CATALOGUE))
    t0 = time.perf_counter()
    state = tracker.dump()
    dumped_only = time.perf_counter() - t0
    text = json.dumps(state)
    dumped = time.perf_counter() - t0
    t0 = time.perf_counter()
    Tracker().load(json.loads(text))
    loaded = time.perf_counter() - t0
    print(f"state: dump {dumped_only * 1e3:.0f} ms, dump+json {dumped * 1e3:.0f} ms, "
          f"json+load {loaded * 1e3:.0f} ms, "
          f"{len(text) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
