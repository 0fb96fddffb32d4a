"""Helpers for tests that run the real tools against ibsim + opensm.

The ``mad`` source talks to ibsim only through ``LD_PRELOAD=libumad2sim.so``, which cannot be
applied to the running pytest process, so ``run_mad`` runs it in a child Python with the
simulator's environment and reads back JSON. ``run_diags`` runs the ``diags`` source in-process
with a runner whose children get that environment.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from mocks.ibsim import IbSim
from tests.syspkg import require_binary

__all__ = [
    "REPO",
    "require_ibsim",
    "run_child",
    "run_diags",
    "run_mad",
    "sim_for",
    "snapshot_json",
    "topology_json",
]

REPO = Path(__file__).resolve().parents[1]

_CHILD = r"""
import asyncio, json, sys, time
from dataclasses import asdict
from ibmon.sources.mad import MadSource

def topo(t):
    return {"ports": {f"{g}/{p}": asdict(v) for (g, p), v in t.ports.items()},
            "links": {f"{g}/{p}": asdict(v) for (g, p), v in t.links.items()}}

def snap(s):
    return {"ports": {f"{g}/{p}": {**asdict(v), "counters": dict(v.counters.items()),
                                   "wide": sorted(v.wide)} for (g, p), v in s.ports.items()},
            "errors": [[e.reason, e.detail, list(e.key) if e.key else None] for e in s.errors]}

async def main(opts):
    src = MadSource(**opts["source"])
    out = {"topologies": [], "snapshots": [], "discover_s": [], "sample_s": [], "mads": [],
           "detail_mads": [], "discover_mads": []}
    try:
        for step in opts["steps"]:
            if step == "discover":
                t = time.perf_counter(); tp = await src.discover()
                out["discover_s"].append(time.perf_counter() - t)
                out["topologies"].append(topo(tp)); out["discover_mads"].append(src.last_sweep_mads)
            elif step == "sample":
                t = time.perf_counter(); sn = await src.sample()
                out["sample_s"].append(time.perf_counter() - t); out["snapshots"].append(snap(sn))
                out["mads"].append(src.last_sweep_mads)
                out["detail_mads"].append(src.last_detail_mads)
            elif step == "wait":
                sys.stdout.write("READY\n"); sys.stdout.flush(); sys.stdin.readline()
    finally:
        await src.close()
    return out

print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))))
"""


def require_ibsim() -> None:
    for tool in ("ibsim", "opensm", "perfquery", "ibnetdiscover"):
        require_binary(tool)


def sim_for(netfile: str) -> Iterator[IbSim]:
    """Body of a module-scoped fixture: one simulator for a whole test module."""
    require_ibsim()
    with IbSim(netfile) as sim:
        yield sim


def run_mad(
    sim: IbSim,
    steps: list[str],
    child_timeout: float = 120.0,
    on_wait: Callable[[], None] | None = None,
    extra_env: dict[str, str] | None = None,
    **source: Any,
) -> dict[str, Any]:
    """Run MadSource steps ("discover", "sample", "wait") in a child with the simulator's env
    (plus ``extra_env``: a benchmark runs another tree's ibmon with ``PYTHONPATH``).

    At a "wait" step the child pauses and ``on_wait`` runs here (e.g. to inject a fault between
    discovery and sampling).
    """
    opts = {"source": source, "steps": steps}
    with subprocess.Popen(
        [sys.executable, "-c", _CHILD, json.dumps(opts)],
        env={**sim.tool_env(), **(extra_env or {})},
        cwd=sim.workdir,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            for _ in range(steps.count("wait")):
                line = proc.stdout.readline()
                while line and line.strip() != "READY":  # a log line the source printed
                    line = proc.stdout.readline()
                if not line:
                    break
                if on_wait is not None:
                    on_wait()
                proc.stdin.write("\n")
                proc.stdin.flush()
            stdout, stderr = proc.communicate(timeout=child_timeout)
        except BaseException:
            proc.kill()
            proc.communicate()
            raise
    if proc.returncode != 0:
        pytest.fail(f"mad child failed ({proc.returncode}): {stderr[-3000:]}")
    out: dict[str, Any] = json.loads(stdout.splitlines()[-1])
    return out


def run_child(sim: IbSim, code: str, *args: str, timeout: float = 120.0) -> Any:
    """Run ``code`` (``python -c``, with ``args``) in a child with the simulator's environment;
    its last line of output, parsed as JSON. A child that fails fails the test with its stderr."""
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        env=sim.tool_env(),
        cwd=sim.workdir,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def topology_json(t: Any) -> dict[str, Any]:
    return {
        "ports": {f"{g}/{p}": asdict(v) for (g, p), v in t.ports.items()},
        "links": {f"{g}/{p}": asdict(v) for (g, p), v in t.links.items()},
    }


def snapshot_json(s: Any) -> dict[str, Any]:
    return {
        "ports": {
            # counters: a packed mapping (``ibmon.track.totals.packed_counters``), as a dict
            f"{g}/{p}": {**asdict(v), "counters": dict(v.counters.items()),
                         "wide": sorted(v.wide)} for (g, p), v in s.ports.items()
        },
        "errors": [[e.reason, e.detail, list(e.key) if e.key else None] for e in s.errors],
    }


async def run_diags(sim: IbSim, steps: list[str], **source: Any) -> dict[str, Any]:
    """Run DiagsSource steps in-process; the same JSON shape as ``run_mad``."""
    from ibmon.sources.diags import DiagsSource, SubprocessRunner

    runner = SubprocessRunner(
        concurrency=source.pop("concurrency", 8), env=sim.tool_env(), cwd=sim.workdir
    )
    src = DiagsSource(runner=runner, **source)
    out: dict[str, Any] = {"topologies": [], "snapshots": []}
    try:
        for step in steps:
            if step == "discover":
                out["topologies"].append(topology_json(await src.discover()))
            else:
                out["snapshots"].append(snapshot_json(await src.sample()))
    finally:
        await src.close()
    return out
