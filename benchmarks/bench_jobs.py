"""What job and route attribution adds to a large fabric's poll.

    .venv/bin/python benchmarks/bench_jobs.py [--hosts 20000] [--jobs 10000] [--interval 10]
        [--polls 6] [--rounds 2]

Each round runs the scale scenario in one ``ibmon run`` (``bench_scale.daemon``: the mock
source as ``ibmon demo`` configures it) twice: without any job (the scenario's own jobs
removed, so no job watcher runs: the baseline), then with ``--jobs`` synthetic running jobs
of one to four hosts each, read through the same ``squeue --json`` parser a Slurm cluster's
are. Each run measures a steady window of ``--polls`` intervals (``bench_scale.window``):
track + detect + publish per poll (attribution runs in the publish stage) and the median RSS
between polls. Rounds alternate the two, and the medians over rounds are compared.

Targets (exit 1 when one is missed): attribution adds at most 10 % to track + detect +
publish, and at most 50 MB of RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_scale import daemon, window

SCALE = Path(__file__).resolve().parents[1] / "mocks" / "scenarios" / "scale.yaml"


def _without_jobs() -> str:
    """The scale scenario without its ``jobs:`` block, as a file (the baseline)."""
    text = re.sub(r"(?m)^jobs:\n(?:  .*\n)+", "", SCALE.read_text())
    path = Path(tempfile.mkdtemp(prefix="bench-jobs-")) / "scale-nojobs.yaml"
    path.write_text(text)
    return str(path)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=20000)
    ap.add_argument("--jobs", type=int, default=10000)
    ap.add_argument("--interval", type=float, default=10.0)
    ap.add_argument("--polls", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    print(f"hosts={args.hosts} jobs={args.jobs} interval={args.interval:g} "
          f"load={os.getloadavg()}", flush=True)
    baseline = _without_jobs()
    runs: dict[str, list[dict[str, float]]] = {"none": [], "jobs": []}
    for _ in range(args.rounds):
        for name, scenario, jobs in (("none", baseline, 0), ("jobs", str(SCALE), args.jobs)):
            with daemon(args.hosts, scenario, args.interval, jobs=jobs) as d:
                res = window(d, args.polls, args.interval, None)
            print(name, json.dumps(res), flush=True)
            runs[name].append(res)

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    tdp0, tdp1 = med("none", "track_detect_publish_s"), med("jobs", "track_detect_publish_s")
    rss0, rss1 = med("none", "rss_mb"), med("jobs", "rss_mb")
    ratio, extra = tdp1 / tdp0, rss1 - rss0
    print(f"track+detect+publish: {tdp0:.3f} s without jobs, {tdp1:.3f} s with {args.jobs} "
          f"jobs: {ratio:.3f}x (target <= 1.10x){'' if ratio <= 1.10 else '  MISSED'}")
    print(f"publish stage: {med('none', 'publish_s'):.3f} s -> {med('jobs', 'publish_s'):.3f} s")
    print(f"RSS between polls: {rss0:.0f} MB -> {rss1:.0f} MB: +{extra:.0f} MB "
          f"(target <= 50 MB){'' if extra <= 50 else '  MISSED'}")
    print(f"load={os.getloadavg()}")
    return 0 if ratio <= 1.10 and extra <= 50 else 1


if __name__ == "__main__":
    sys.exit(main())
