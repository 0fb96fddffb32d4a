"""CPU of each pipeline stage of a large simulated fabric, in-process, poll after poll.

    .venv/bin/python benchmarks/bench_stages.py [--hosts 20000] [--scenario scale]
        [--polls 8] [--skip 2] [--step 100] [--idle 0]

Track + detect + publish must stay within 1.0 s of CPU a poll at 100,000+ ports (0.4 s from
36,720), measured with the daemon's own code and none of its process: a ``mock`` source,
``Pipeline.poll`` (tracking and detection in a worker thread with the cyclic GC paused, as in
``ibmon run``) and the Prometheus exporter's render (``publish_now``, GC paused as its worker
thread does). The pipeline's clock is ``time.thread_time``, so ``ibmon_pipeline_stage_seconds``
holds the CPU of the thread that ran each stage, not wall time; ``publish`` is build_state +
render. Each poll advances the simulated fabric by ``--step`` seconds (``bench_scale.py``'s
daemon: a 10 s interval at speed 10).

Why a second benchmark beside ``bench_scale.py``: there the stages are wall time in a daemon
that sleeps between polls, beside the simulator in the same process, and only the daemon's
whole CPU is read. Here each stage's CPU is its own, and ``faults`` / ``sys`` (the process's
minor page faults and system time a poll, sampling included) show what a poll's fresh memory
costs. ``--idle`` sleeps between polls as the daemon does: memory freed by a poll is then handed
back (to the kernel, and on a VM with virtio-balloon free page reporting to the hypervisor,
``reported_mb``, absent where the kernel has none) before the next one faults it in again.
Compare runs with the same arguments, alternated, one at a time: the same code varies by 10 %
from run to run on a shared VM.

Prints the stages' means and minimums as JSON, and the target's verdict at 36,720 ports and
more (0.4 s) and at 100,000 and more (1.0 s); exits 1 when it is not met.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from exporters.prometheus import PrometheusExporter  # noqa: E402
from ibmon.runtime.gcpause import paused_gc  # noqa: E402
from ibmon.runtime.pipeline import Pipeline, build_state  # noqa: E402
from ibmon.runtime.selfmetrics import SelfMetrics  # noqa: E402
from ibmon.sources.mock import MockSource, MockSourceConfig  # noqa: E402
from mocks.scenario import ManualClock  # noqa: E402

#: The limit on track + detect + publish: (ports from, seconds of CPU a poll), largest first.
TARGETS = ((100_000, 1.0), (36_720, 0.4))
REPORTED = Path("/sys/module/page_reporting/parameters/reported_kib")


def _reported_kib() -> int | None:
    try:
        return int(REPORTED.read_text())
    except (OSError, ValueError):
        return None


def _stage(metrics: SelfMetrics, stage: str) -> float:
    value = metrics.registry.get_sample_value(
        "ibmon_pipeline_stage_seconds_sum", {"source": "mock", "stage": stage})
    return value or 0.0


async def run(args: argparse.Namespace) -> dict[str, float]:
    clock = ManualClock(0.0)
    cfg = MockSourceConfig(type="mock", name="mock", scenario=args.scenario, hosts=args.hosts,
                           interval=10)
    source = MockSource.from_scenario(args.scenario, hosts=args.hosts, clock=clock)
    metrics = SelfMetrics()
    pipeline = Pipeline(cfg, metrics=metrics, clock=time.thread_time)
    exporter = PrometheusExporter(listen="127.0.0.1:0", self_metrics=metrics)
    per: dict[str, list[float]] = {k: [] for k in ("track", "detect", "publish", "faults",
                                                   "sys")}
    reported0 = _reported_kib()
    for n in range(args.skip + args.polls):
        clock.t += args.step
        before = {s: _stage(metrics, s) for s in ("track", "detect")}
        usage0 = resource.getrusage(resource.RUSAGE_SELF)
        await pipeline.poll(source)
        started = time.thread_time()
        with paused_gc():
            exporter.publish_now(build_state([pipeline]))
        publish = time.thread_time() - started
        pipeline.observe_publish(publish)
        usage1 = resource.getrusage(resource.RUSAGE_SELF)
        if n >= args.skip:  # the first polls have no rates, then a first window
            for s in ("track", "detect"):
                per[s].append(_stage(metrics, s) - before[s])
            per["publish"].append(publish)
            per["faults"].append(usage1.ru_minflt - usage0.ru_minflt)
            per["sys"].append(usage1.ru_stime - usage0.ru_stime)
        if args.idle:
            await asyncio.sleep(args.idle)
    res = {"ports": float(len(pipeline.views)), "polls": float(args.polls)}
    for key, values in per.items():
        res[f"{key}_mean"] = statistics.mean(values)
        res[f"{key}_min"] = min(values)
    res["tdp_mean"] = res["track_mean"] + res["detect_mean"] + res["publish_mean"]
    reported1 = _reported_kib()
    if reported0 is not None and reported1 is not None:
        res["reported_mb"] = (reported1 - reported0) / 1024
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--hosts", type=int, default=20_000)
    ap.add_argument("--scenario", default="scale")
    ap.add_argument("--polls", type=int, default=8)
    ap.add_argument("--skip", type=int, default=2, help="polls run before measuring")
    ap.add_argument("--step", type=float, default=100.0, help="simulated seconds a poll")
    ap.add_argument("--idle", type=float, default=0.0, help="seconds slept between polls")
    args = ap.parse_args()
    if args.polls < 1 or args.skip < 0:
        ap.error("--polls must be at least 1 and --skip at least 0")
    res = asyncio.run(run(args))
    print(f"hosts={args.hosts} scenario={args.scenario} idle={args.idle}")
    print(json.dumps({k: round(v, 4) for k, v in res.items()}))
    limit = next((s for ports, s in TARGETS if res["ports"] >= ports), None)
    if limit is None:
        return 0
    met = res["tdp_mean"] <= limit
    print(f"track + detect + publish {res['tdp_mean']:.3f} s of CPU a poll at "
          f"{res['ports']:.0f} ports: target <= {limit} s, {'met' if met else 'NOT met'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
