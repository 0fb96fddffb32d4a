"""Fabric-wide collection on a simulated fat tree (ibsim + opensm), side by side in one run.

    .venv/bin/python benchmarks/bench_fabric.py [--ports 2200] [--loop-sample 40] [--repeat 5]
    .venv/bin/python benchmarks/bench_fabric.py --only details [--erroring 0.05]
    .venv/bin/python benchmarks/bench_fabric.py --only cold [--repeat 9] [--before DIR]

Measures, on one simulator:

- the ``mad`` source in a child process with the simulator's LD_PRELOAD: discovery (DR sweep)
  plus the first poll (whose counters the discovery's last batch reads), which is what a cold
  start (or ``ibmon scan``) pays and the like-for-like comparison with ``ibqueryerrors``, and
  the steady-state counter sweep the daemon runs every poll (with and without the per-poll
  PortInfo state refresh);
- ``ibqueryerrors --data --counters`` (rdma-core's C tool: its own discovery, ClassPortInfo per
  node and PortCountersExtended for every port, on every run: 7,847 MADs here; ``--counters``
  prints data counters only, so it reads no PortCounters, where ``mad`` reads both);
- the ``diags`` source (discover + one sample);
- a naive perfquery-per-port loop (timed on ``--loop-sample`` ports, median extrapolated to the
  fabric; said so).

- ``--only cold``: just ``ibqueryerrors`` against ``mad`` cold and every poll, with the MADs
  of each phase, the machine's load average, every run, and ``ibqueryerrors``
  once more with ibsim pinned to one CPU and the tool on that CPU or the other one: under ibsim
  a tool is 3-4x faster when it shares ibsim's CPU (no cross-CPU wake-up per MAD), and which
  one the scheduler picks decides a best-of-N ``ibqueryerrors`` figure.

- the cost of the error and discard details: the steady ``mad`` poll with detail
  reads on and off, on the healthy fabric, and with ``--erroring`` of the ports' PortRcvErrors
  moving before every poll (their PortLocalPhysicalErrors with them, as a real PMA does).

Every figure is the best of ``--repeat`` runs, measured interleaved so that load from other jobs
on the machine hits ``mad`` and ``ibqueryerrors`` alike. Exits 1 when the steady-state sweep is
over 1.5x ``ibqueryerrors``, ``mad`` is not at least 20x faster than perfquery per port, a
healthy poll with details sends any MAD more than one without, or an erroring poll sends more
than one MAD more per erroring port.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mocks.ibsim import IbSim
from mocks.topology import Fabric, fabric_for_ports, to_ibsim_netfile
from tests.ibsim_fixtures import run_diags, run_mad

SWEEP_RATIO_MAX = 1.5
PERFQUERY_RATIO_MIN = 20.0


def _ibqueryerrors(sim: IbSim, cpu: int | None = None) -> float:
    pin = ["taskset", "-c", str(cpu)] if cpu is not None else []
    t = time.perf_counter()
    subprocess.run(
        [*pin, "ibqueryerrors", "--data", "--counters"],
        env=sim.tool_env(),
        cwd=sim.workdir,
        capture_output=True,
        check=False,
        timeout=120,
    )
    return time.perf_counter() - t


def _runs(xs: list[float]) -> str:
    return " ".join(f"{x:.3f}" for x in xs)


def _spread(xs: list[float]) -> str:
    return f"best {min(xs):.3f}, median {statistics.median(xs):.3f}, worst {max(xs):.3f}"


def cold_start(sim: IbSim, repeat: int, before: str | None = None) -> bool:
    """``mad`` discovery + first sweep (a cold start), and the per-poll sweep, against
    ``ibqueryerrors``, interleaved; then ``ibqueryerrors`` with ibsim pinned (see the module
    docstring). ``before``: a directory holding another tree's ``ibmon`` (e.g. ``git archive
    main``), run interleaved the same way. Returns whether the per-poll sweep is within 1.0x."""
    load0 = os.getloadavg()
    iqe: list[float] = []
    disc: list[float] = []
    first: list[float] = []
    coldr: list[float] = []
    steady: list[float] = []
    mads: set[tuple[int, ...]] = set()
    old_cold: list[float] = []
    old_steady: list[float] = []
    for _ in range(repeat):
        iqe.append(_ibqueryerrors(sim))
        if before is not None:
            m = run_mad(sim, ["discover", "sample", "sample", "sample"],
                        extra_env={"PYTHONPATH": before})
            old_cold.append(m["discover_s"][0] + m["sample_s"][0])
            old_steady.append(min(m["sample_s"][1:]))
        m = run_mad(sim, ["discover", "sample", "sample", "sample"])
        disc.append(m["discover_s"][0])
        first.append(m["sample_s"][0])
        coldr.append(m["discover_s"][0] + m["sample_s"][0])
        steady.append(min(m["sample_s"][1:]))
        mads.add((m["discover_mads"][0], *m["mads"]))
    load1 = os.getloadavg()
    pinned: dict[str, list[float]] = {"same": [], "other": []}
    ibsim_pid: int = sim._ibsim.pid  # type: ignore[union-attr]
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= 2:
        affinity = os.sched_getaffinity(ibsim_pid)
        os.sched_setaffinity(ibsim_pid, {cpus[0]})
        try:
            for _ in range(3):
                pinned["same"].append(_ibqueryerrors(sim, cpus[0]))
                pinned["other"].append(_ibqueryerrors(sim, cpus[1]))
        finally:
            os.sched_setaffinity(ibsim_pid, affinity)
    iqe_s, cold_s, steady_s = min(iqe), min(coldr), min(steady)
    print(f"load average {load0[0]:.2f} before, {load1[0]:.2f} after; best of {repeat}, "
          "interleaved")
    for m_ in sorted(mads):
        print(f"MADs: discovery {m_[0]}, first poll {m_[1]}, later polls {list(m_[2:])}")
    print(f"ibqueryerrors --data --counters      {iqe_s:7.3f} s   ({_spread(iqe)})")
    print(f"mad discovery (+ first PMA reads)    {min(disc):7.3f} s   ({_spread(disc)})")
    print(f"mad first poll                       {min(first):7.3f} s   ({_spread(first)})")
    medians = statistics.median(coldr) / statistics.median(iqe)
    print(f"mad discovery + first sweep          {cold_s:7.3f} s   = {cold_s / iqe_s:.2f}x "
          f"ibqueryerrors ({_spread(coldr)}; medians {medians:.2f}x)")
    print(f"mad every poll                       {steady_s:7.3f} s   = {steady_s / iqe_s:.2f}x "
          f"ibqueryerrors ({_spread(steady)})")
    if pinned["same"]:
        print(f"ibqueryerrors on ibsim's CPU         {min(pinned['same']):7.3f} s   "
              f"(runs {_runs(pinned['same'])}): mad cold = {cold_s / min(pinned['same']):.2f}x")
        print(f"ibqueryerrors on the other CPU       {min(pinned['other']):7.3f} s   "
              f"(runs {_runs(pinned['other'])}): mad cold = {cold_s / min(pinned['other']):.2f}x")
    if old_cold:
        print(f"before ({before}): cold {min(old_cold):.3f} s (median "
              f"{statistics.median(old_cold):.3f}), every poll {min(old_steady):.3f} s (median "
              f"{statistics.median(old_steady):.3f})")
        print("              before cold   " + _runs(old_cold))
    print("all runs (s): ibqueryerrors " + _runs(iqe))
    print("              mad cold      " + _runs(coldr))
    print("              mad steady    " + _runs(steady))
    return steady_s <= iqe_s


def _node_id(fab: Fabric, guid: str) -> str:
    return ("S-" if fab.nodes[guid].kind == "switch" else "H-") + guid[2:]


def details(fab: Fabric, sim: IbSim, repeat: int, erroring: float) -> bool:
    """The detail reads' cost: healthy polls with details on and off, then polls with a share
    of the ports erroring. Returns whether the MAD counts keep the rule."""
    polls = 4
    on: list[float] = []
    off: list[float] = []
    err: list[float] = []
    mads_on: set[int] = set()
    mads_off: set[int] = set()
    mads_err: set[int] = set()
    n_err = 0
    keys = fab.ports()
    bad = random.Random(5).sample(keys, max(1, round(erroring * len(keys))))
    step = [0]

    def move() -> None:
        step[0] += 1
        sim.console([
            f'PerformanceSet "{_node_id(fab, g)}"[{p}] PortCounters.PortRcvErrors={step[0]}'
            for g, p in bad
        ] + [
            f'PerformanceSet "{_node_id(fab, g)}"[{p}] '
            f"PortRcvErrorDetails.PortLocalPhysicalErrors={step[0]}"
            for g, p in bad
        ])

    for _ in range(repeat):
        # all baselines in the first poll, so every later poll is a steady one
        m = run_mad(sim, ["discover", *["sample"] * (polls + 1)], detail_baselines_per_poll=10**6)
        on.append(min(m["sample_s"][1:]))
        mads_on.update(m["mads"][1:])
        assert not any(m["detail_mads"][1:]), m["detail_mads"]
        m = run_mad(sim, ["discover", *["sample"] * (polls + 1)], details=False)
        off.append(min(m["sample_s"][1:]))
        mads_off.update(m["mads"][1:])
        m = run_mad(sim, ["discover", "sample", *["wait", "sample"] * polls], on_wait=move,
                    detail_baselines_per_poll=10**6)
        err.append(min(m["sample_s"][1:]))
        mads_err.update(m["mads"][1:])
        n_err = len(bad)
        assert set(m["detail_mads"][1:]) == {n_err}, m["detail_mads"]
    on_s, off_s, err_s = min(on), min(off), min(err)
    print(f"details: {len(keys)} connected ports, {n_err} erroring ({erroring:.0%}), "
          f"best of {repeat} x {polls} polls")
    print(f"mad poll, details off                {off_s:7.3f} s   MADs {sorted(mads_off)}")
    print(f"mad poll, details on, healthy        {on_s:7.3f} s   MADs {sorted(mads_on)} "
          f"= {on_s / off_s:.2f}x off")
    print(f"mad poll, details on, {n_err} erroring   {err_s:7.3f} s   MADs {sorted(mads_err)} "
          f"(+{err_s - off_s:.3f} s vs off)")
    print("all runs (s): off     " + " ".join(f"{x:.3f}" for x in off))
    print("              on      " + " ".join(f"{x:.3f}" for x in on))
    print("              erroring " + " ".join(f"{x:.3f}" for x in err))
    return mads_on == mads_off and max(mads_err) <= max(mads_off) + n_err


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ports", type=int, default=2200)
    ap.add_argument("--loop-sample", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--only", choices=["details", "cold"], default=None,
                    help="run only this part (details: the detail reads' cost; cold: mad's cold "
                         "start and sweep against ibqueryerrors)")
    ap.add_argument("--before", default=None,
                    help="with --only cold: also run the ibmon found in this directory")
    ap.add_argument("--erroring", type=float, default=0.05,
                    help="share of ports whose receive errors move before every poll")
    args = ap.parse_args()
    fab = fabric_for_ports(args.ports)
    if args.only == "details":
        with IbSim(to_ibsim_netfile(fab)) as sim:
            sys.exit(0 if details(fab, sim, args.repeat, args.erroring) else 1)
    if args.only == "cold":
        with IbSim(to_ibsim_netfile(fab)) as sim:
            sys.exit(0 if cold_start(sim, args.repeat, args.before) else 1)
    cold: list[float] = []
    disc: list[float] = []
    steady: list[float] = []
    steady_nostate: list[float] = []
    iqe: list[float] = []
    with IbSim(to_ibsim_netfile(fab)) as sim:
        env, cwd = sim.tool_env(), sim.workdir
        n_ports = 0
        ports: list[tuple[int, str]] = []
        for _ in range(args.repeat):
            iqe.append(_ibqueryerrors(sim))
            # a fresh process each time: discovery + first sweep is a cold start
            m = run_mad(sim, ["discover", "sample", "sample", "sample"])
            disc.append(m["discover_s"][0])
            cold.append(m["discover_s"][0] + m["sample_s"][0])
            steady.append(min(m["sample_s"][1:]))
            iqe.append(_ibqueryerrors(sim))
            # the same poll without the per-poll PortInfo state refresh (one SMP per port)
            m2 = run_mad(sim, ["discover", "sample", "sample"], state_interval=1e9)
            steady_nostate.append(min(m2["sample_s"][1:]))
            if not ports:
                n_ports = len(m["topologies"][0]["ports"])
                ports = [
                    (p["lid"], k.split("/")[1]) for k, p in m["topologies"][0]["ports"].items()
                ]
                assert not m["snapshots"][-1]["errors"], m["snapshots"][-1]["errors"][:3]
                assert len(m["snapshots"][-1]["ports"]) == n_ports

        sim.reap_clients()  # slots of killed tools would make every perfquery wait
        sample = random.Random(1).sample(ports, min(args.loop_sample, len(ports)))
        per_port: list[float] = []
        for lid, port in sample:
            t = time.perf_counter()
            for extra in (["-x"], []):
                subprocess.run(
                    ["perfquery", *extra, str(lid), port],
                    env=env,
                    cwd=cwd,
                    capture_output=True,
                    check=False,
                    timeout=60,
                )
            per_port.append(time.perf_counter() - t)
        # the median: one perfquery stalled by the loaded machine, multiplied by the fabric
        # size, would flatter mad; the mean is printed beside it
        loop_s = statistics.median(per_port) * len(ports)
        loop_mean_s = statistics.fmean(per_port) * len(ports)

        sim.reap_clients()
        t = time.perf_counter()
        d = asyncio.run(run_diags(sim, ["discover", "sample"]))
        diags_s = time.perf_counter() - t
        diags_ports = len(d["snapshots"][0]["ports"])
        diags_errors = sorted({e[0] for e in d["snapshots"][0]["errors"]})
        sim.reap_clients()
        details_ok = details(fab, sim, args.repeat, args.erroring)

    iqe_s, cold_s, steady_s = min(iqe), min(cold), min(steady)
    nostate_s = min(steady_nostate)
    print(f"fabric: {n_ports} ports ({len(fab.nodes)} nodes), best of {args.repeat}")
    print(f"ibqueryerrors --data --counters      {iqe_s:7.3f} s   (discovers on every run)")
    print(f"mad discovery (+ first PMA reads)    {min(disc):7.3f} s")
    print(
        f"mad discovery + first counter sweep  {cold_s:7.3f} s   "
        f"= {cold_s / iqe_s:.2f}x ibqueryerrors"
    )
    print(
        f"mad counter sweep, every poll        {steady_s:7.3f} s   "
        f"= {steady_s / iqe_s:.2f}x ibqueryerrors (limit {SWEEP_RATIO_MAX}x)"
    )
    print(
        f"  same without state refresh         {nostate_s:7.3f} s   "
        f"(state refresh costs {steady_s - nostate_s:+.3f} s per poll)"
    )
    print(
        f"diags source discover + sample       {diags_s:7.3f} s   "
        f"({diags_ports}/{n_ports} ports, errors: {diags_errors or 'none'})"
    )
    print(
        f"perfquery per port (-x + plain)      {loop_s:7.3f} s   "
        f"(median of {len(sample)} ports x {n_ports}; mean gives {loop_mean_s:.1f} s; "
        f"mad sweep {loop_s / steady_s:.0f}x faster, limit {PERFQUERY_RATIO_MIN:.0f}x)"
    )
    print("all runs (s): ibqueryerrors " + " ".join(f"{x:.3f}" for x in iqe))
    print("              mad cold      " + " ".join(f"{x:.3f}" for x in cold))
    print("              mad steady    " + " ".join(f"{x:.3f}" for x in steady))
    ok = steady_s <= SWEEP_RATIO_MAX * iqe_s and loop_s >= PERFQUERY_RATIO_MIN * steady_s
    ok = ok and details_ok
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
