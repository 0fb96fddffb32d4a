"""Memory a fabric source's poll holds per port: counters read from real hardware's text.

    .venv/bin/python benchmarks/bench_sample_memory.py [--ports 20000]

The ``mad`` and ``diags`` sources decode each port's counters into a ``PortCounterValues``
(``merge_counters``) and make its ``PortSample`` from it (``ibmon.sources.fabric.make_sample``);
a poll's values and samples are all alive until the snapshot is handed on, so their bytes per
port times the fabric's ports is what a poll adds to the daemon's peak.
The ports' counters are the real perfquery captures in ``../shared/real-fixtures`` (a
ConnectX HCA and switch ports with CapMask2 0x2: 22 counters read from 64-bit fields), parsed
by the ``diags`` path, cycled over ``--ports`` ports. Measured with ``tracemalloc`` (the
Python allocations themselves; the process's RSS follows them). Prints bytes per port of the
decoded values, of the source's peak (values and samples), and of the poll it hands on
(samples: alive while the tracker works, the daemon's peak).
"""

from __future__ import annotations

import argparse
import sys
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ibmon.infiniband.model import PortIdentity
from ibmon.sources.fabric import FabricPort, make_sample
from ibmon.sources.parse import PortCounterValues, parse_perfquery
from tests.fixtures import REAL_FIXTURES

FIXTURES = REAL_FIXTURES / "infiniband_exporter" / "collectors" / "fixtures" / "perfquery"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ports", type=int, default=20000)
    args = ap.parse_args()
    # the captures with ports in them, each a text the diags path parses per poll
    texts = [t for p in sorted(FIXTURES.glob("*.out")) if parse_perfquery(t := p.read_text())]
    if not texts:
        print(f"no perfquery captures under {FIXTURES}", file=sys.stderr)
        return 2
    fps = [FabricPort(PortIdentity(f"0x{i + 1:016x}", "1"), lid=i + 1, state=4,
                      active_width="4X", active_speed="NDR") for i in range(args.ports)]
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    values: list[PortCounterValues] = []
    for i in range(args.ports):
        parsed = parse_perfquery(texts[i % len(texts)])
        values.append(next(iter(parsed.values())))
        del parsed
    after_values = tracemalloc.get_traced_memory()[0]
    samples = [make_sample(fp, v) for fp, v in zip(fps, values, strict=True)]
    after_samples = tracemalloc.get_traced_memory()[0]
    del values
    after_drop = tracemalloc.get_traced_memory()[0]
    n = args.ports
    wide = sorted({len(s.wide) for s in samples})
    print(f"ports={n} captures={len(texts)} counters={len(samples[0].counters)} wide={wide}")
    held = after_samples - start
    print(f"decoded values: {(after_values - start) / n:.0f} B/port; the source's peak (values "
          f"and samples): {held / n:.0f} B/port ({held * 100_000 / n / 2**20:.0f} MB at "
          f"100,000 ports); the poll handed to the tracker (samples): "
          f"{(after_drop - start) / n:.0f} B/port")
    return 0


if __name__ == "__main__":
    sys.exit(main())
