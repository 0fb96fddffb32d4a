"""Scenario conformance through real ibsim + opensm and the ``mad`` source.

The same scenarios, FabricModel and ScenarioPlayer as test_scenario_conformance.py, but the
monitor sees them only through ibsim: the driver (mocks/ibsim_driver.py) pushes the model into
ibsim with PerformanceSet / Unlink / ReLink, the ``mad`` source (libibmad in a child process
under libumad2sim) reads them back, and the tracker and detection engine run exactly as in
tests/detect_harness.py. The clock is simulated and stepped by the test: advance the model, push,
sample, and stamp the snapshot with the simulated time, so rates and windows do not depend on how
fast ibsim answers.

What ibsim can express, and so what is checked here: everything counter-driven (link errors,
counter resets, saturation of a 32-bit counter) and link state (flap, link down). Not here:
``degraded`` (ibsim has no console command that retrains a live link at a lower width or speed),
``congestion`` (ibsim's PMA has only the 32-bit PortXmitWait, no 64-bit copy: counted in bytes
as the hardware does, leaf03's 35 % stall at 4X EDR and 8 bytes a count fills it in about 8 s
and host010's 80 % in 4, so minutes of congestion read as a saturated counter; the stall
fraction of each device family through ibsim is checked over seconds in
test_xmitwait_sim_ibsim.py), ``healthy`` (hours of simulated time; the in-process conformance
test covers it) and ``demo`` (a loop of the others).

Two adjustments to the answer keys, both about what a *fabric-wide* monitor can see:

- the HCA end of a host link that is down is unreachable (its only link is the one that is down),
  so a fabric source cannot observe that port's state. Link faults are raised on the switch end
  of a host link anyway (once per link), so the key has no events of that port to adjust; the
  code below still would (a ``link_flapping`` of it fires once the link is back, 5 s later).
- the same port vanishes from the fabric while it is unreachable, and appears again when the link
  returns: a ``topology_changed`` pair per outage that only a fabric-wide source raises.
- to keep the run within about two minutes, only the nodes an event is about are polled (the
  ``include`` filter of the source; each is polled whole, every port driven from the model), and
  the clock moves by the key's ``poll_interval`` (1 s) around every scripted transition and
  expected window edge, and by 10 s through long quiet stretches (as detect_harness's coarse mode).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ibmon.detect.engine import Engine
from ibmon.track.tracker import Tracker
from mocks.ibsim_driver import IbSimDriver, MadSourceProcess
from mocks.scenario import Expected, Flap, Integrity, Scenario, load_scenario, resolve_port
from mocks.topology import Fabric
from tests.detect_harness import Seen, mismatches
from tests.ibsim_fixtures import require_ibsim

pytestmark = pytest.mark.system

EPOCH = 1_700_000_000.0
FINE_BEFORE, FINE_AFTER, COARSE = 1.0, 2.0, 10.0


def unreachable_ca_ports(sc: Scenario, fabric: Fabric) -> set[tuple[str, int]]:
    """CA ports whose only link a link fault of the scenario takes down."""
    out: set[tuple[str, int]] = set()
    for entry in sc.timeline:
        if entry.fault not in ("flap", "link_down"):
            continue
        key = resolve_port(fabric, entry.port)
        for end in (key, fabric.peer(*key)):
            if end is not None and fabric.nodes[end[0]].kind == "ca":
                out.add(end)
    return out


def fabric_key(sc: Scenario, fabric: Fabric) -> list[Expected]:
    """The scenario's key as a fabric-wide monitor sees it (see module docstring)."""
    hidden = unreachable_ca_ports(sc, fabric)
    flaps = [e for e in sc.timeline if isinstance(e, Flap)]
    out: list[Expected] = []
    for exp in sc.expect:
        if resolve_port(fabric, exp.port) not in hidden:
            out.append(exp)
        elif exp.type == "link_flapping" and exp.status == "firing":
            down_for = max(f.down_for for f in flaps)
            lo, hi = exp.window
            out.append(exp.model_copy(update={"window": (lo + down_for, hi + down_for)}))
        elif exp.type == "link_flapping":
            out.append(exp)
        # port_down of an unreachable HCA port: not observable from the fabric
    # ... but its absence is: after absent_polls (3) polls without it the port "vanished", and
    # it "appeared" again at the first poll after the link is back (a fabric-only view).
    poll = sc.poll_interval
    for entry in sc.timeline:
        if entry.fault not in ("flap", "link_down"):
            continue
        end = resolve_port(fabric, entry.port)
        ca = end if end in hidden else fabric.peer(*end)
        if ca not in hidden:
            continue
        assert ca is not None
        if isinstance(entry, Flap):
            downs = [(entry.at + k * entry.every, entry.down_for) for k in range(entry.count)]
        else:
            assert entry.duration is not None
            downs = [(entry.at, float(entry.duration))]
        name = f"{fabric.nodes[ca[0]].desc}[{ca[1]}]"
        for at, length in downs:
            for lo in (at + 2 * poll, at + length):
                out.append(Expected(type="topology_changed", port=name, status="firing",
                                    window=(lo, lo + poll), severity="info"))
    return out


def transitions(sc: Scenario, key: list[Expected]) -> list[float]:
    times: list[float] = []
    for entry in sc.timeline:
        times.append(entry.at)
        if isinstance(entry, Flap):
            for k in range(entry.count):
                times += [entry.at + k * entry.every, entry.at + k * entry.every + entry.down_for]
        elif isinstance(entry, Integrity):
            times += [entry.at + k * entry.every for k in range(entry.count)]
        elif entry.duration is not None:
            times.append(entry.at + entry.duration)
    for exp in key:
        times += list(exp.window)
    return sorted(times)


def poll_times(sc: Scenario, key: list[Expected]) -> list[float]:
    """Every ``poll_interval`` from FINE_BEFORE s before a transition or window edge to
    FINE_AFTER s after it, every COARSE s elsewhere (never past the start of such a stretch):
    the counters are totals, so the quiet stretches lose nothing to the coarse steps, and every
    window edge of the key is polled at ``poll_interval``."""
    fine = [(m - FINE_BEFORE, m + FINE_AFTER) for m in sorted(transitions(sc, key))]
    out: list[float] = []
    t = 0.0
    while t <= sc.duration + 1e-9:
        out.append(t)
        if any(lo <= t < hi for lo, hi in fine):
            t = round(t + sc.poll_interval, 6)
        else:
            t = round(min([t + COARSE] + [lo for lo, _ in fine if lo > t]), 6)
    return out


def watched_nodes(sc: Scenario, fabric: Fabric, key: list[Expected]) -> list[str]:
    guids = {resolve_port(fabric, e.port)[0] for e in key}
    guids |= {resolve_port(fabric, e.port)[0] for e in sc.timeline}
    return sorted(guids)


class _Model:
    """What ``detect_harness.mismatches`` needs of a source: the model (for port names)."""

    def __init__(self, drv: IbSimDriver) -> None:
        self.model = drv.model


def play_through_ibsim(name: str) -> tuple[Scenario, _Model, list[Seen], dict[str, Any]]:
    sc = load_scenario(name)
    fabric = sc.topology.build()
    key = fabric_key(sc, fabric)
    sc = sc.model_copy(update={"expect": key})
    nodes = watched_nodes(sc, fabric, key)
    ports = [k for k in fabric.ports() if k[0] in nodes]
    times = poll_times(sc, key)
    seen: list[Seen] = []
    stats: dict[str, Any] = {"polls": len(times), "ports": 0, "watched": len(ports), "errors": 0,
                             "lines": 0}
    with IbSimDriver.start(sc, fabric=fabric, ports=ports) as drv:

        async def run() -> None:
            src = MadSourceProcess(drv.sim, include=nodes, timeout=0.25, retries=1)
            tracker = Tracker()
            engine = Engine(None, fabric="test", source="mad")
            try:
                topo = await src.discover()
                stats["ports"] = len(topo.ports)
                for t in times:
                    stats["lines"] += drv.step_to(t).lines
                    snap = await src.sample()
                    stats["errors"] += len(snap.errors)
                    snap.monotonic, snap.wall = t, EPOCH + t
                    views = tracker.update(snap)
                    for ev in engine.process(views, monotonic=t, wall=EPOCH + t):
                        seen.append(Seen(t, ev))
            finally:
                await src.close()

        asyncio.run(run())
    return sc, _Model(drv), seen, stats


@pytest.fixture(autouse=True)
def _binaries() -> None:
    require_ibsim()


@pytest.mark.parametrize(
    "name", ["flap", "counter-reset", "link-errors", "saturation"]
)
def test_ibsim_scenario_yields_its_expected_events_through_mad(name: str) -> None:
    sc, src, seen, stats = play_through_ibsim(name)
    problems = mismatches(sc, src, seen)  # type: ignore[arg-type]
    assert not problems, "\n".join(problems) + f"\n{stats}"
    assert len(seen) == len(sc.expect) > 0
    # every port of the watched nodes (whole switches, not just the faulty ports) was polled
    assert stats["ports"] == stats["watched"] > 0
