"""Fabric-wide collection on a simulated fat tree (ibsim + opensm), side by side in one run.

    .venv/bin/python benchmarks/bench_fabric.py [--ports 2200] [--loop-sample 40]

Measures: the ``mad`` source (discovery sweep and counter sweep, in a child process with the
simulator's LD_PRELOAD), ``ibqueryerrors --data --counters`` (rdma-core's C tool: its own
discovery plus PortCounters for every port), the ``diags`` source, and a naive
perfquery-per-port loop (sampled on ``--loop-sample`` ports and extrapolated; said so).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mocks.ibsim import IbSim
from mocks.topology import fabric_for_ports, to_ibsim_netfile
from tests.ibsim_fixtures import run_diags, run_mad


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ports", type=int, default=2200)
    ap.add_argument("--loop-sample", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    fab = fabric_for_ports(args.ports)
    with IbSim(to_ibsim_netfile(fab)) as sim:
        env, cwd = sim.tool_env(), sim.workdir
        steps = ["discover"] + ["sample"] * args.repeat
        m = run_mad(sim, steps)
        n_ports = len(m["topologies"][0]["ports"])
        mad_discover = m["discover_s"][0]
        mad_sample = min(m["sample_s"])
        # the same sweep without the per-poll PortInfo state refresh (one SMP per port)
        m_nostate = run_mad(sim, steps, state_interval=1e9)
        mad_sample_nostate = min(m_nostate["sample_s"])

        iqe = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            subprocess.run(
                ["ibqueryerrors", "--data", "--counters"],
                env=env,
                cwd=cwd,
                capture_output=True,
                check=False,
            )
            iqe.append(time.perf_counter() - t)
        iqe_s = min(iqe)

        t = time.perf_counter()
        d = asyncio.run(run_diags(sim, ["discover", "sample"]))
        diags_s = time.perf_counter() - t
        diags_ports = len(d["snapshots"][0]["ports"])
        diags_errors = sorted({e[0] for e in d["snapshots"][0]["errors"]})

        ports = [(p["lid"], k.split("/")[1]) for k, p in m["topologies"][0]["ports"].items()]
        sample = random.Random(1).sample(ports, min(args.loop_sample, len(ports)))
        t = time.perf_counter()
        for lid, port in sample:
            subprocess.run(
                ["perfquery", "-x", str(lid), port],
                env=env,
                cwd=cwd,
                capture_output=True,
                check=False,
            )
            subprocess.run(
                ["perfquery", str(lid), port], env=env, cwd=cwd, capture_output=True, check=False
            )
        loop_s = (time.perf_counter() - t) / len(sample) * len(ports)

    mad_full = mad_discover + mad_sample
    print(f"fabric: {n_ports} ports ({len(fab.nodes)} nodes), 2-core machine")
    print(f"mad discover (DR sweep)            {mad_discover:8.3f} s")
    print(f"mad counter sweep                  {mad_sample:8.3f} s")
    print(
        f"mad counter sweep, no state refresh {mad_sample_nostate:7.3f} s   "
        f"(state refresh costs {mad_sample - mad_sample_nostate:+.3f} s per poll)"
    )
    print(f"mad discover + counters            {mad_full:8.3f} s")
    print(
        f"ibqueryerrors --data --counters    {iqe_s:8.3f} s   "
        f"(mad full / ibqueryerrors = {mad_full / iqe_s:.2f}x)"
    )
    print(
        f"diags source discover + sample     {diags_s:8.3f} s   "
        f"({diags_ports}/{n_ports} ports, errors: {diags_errors or 'none'})"
    )
    print(
        f"perfquery per port (-x + plain)    {loop_s:8.3f} s   "
        f"(extrapolated from {len(sample)} ports; mad counters {loop_s / mad_sample:.0f}x "
        f"faster)"
    )


if __name__ == "__main__":
    main()
