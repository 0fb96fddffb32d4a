"""Play a scenario on the simulated clock through the one poll pipeline (tests only)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ibmon.detect.events import Event
from ibmon.runtime.pipeline import Pipeline
from ibmon.runtime.selfmetrics import SelfMetrics
from ibmon.sources.mock import MockSource, MockSourceConfig
from mocks.scenario import ManualClock, Scenario, load_scenario, resolve_port


@dataclass(frozen=True)
class Seen:
    t: float
    event: Event


def play(
    name: str,
    *,
    until: float | None = None,
    tables: Mapping[str, Any] | None = None,
    interval: float | None = None,
    coarse_after: float | None = None,
    coarse_interval: float = 30.0,
    hosts: int | None = None,
) -> tuple[Scenario, MockSource, list[Seen]]:
    """Poll every ``interval`` (default: the scenario's) simulated seconds from t=0; after
    ``coarse_after`` poll every ``coarse_interval`` instead (hours of quiet fabric, fast).
    ``hosts``: on the bigger tree ``ibmon demo --hosts`` builds instead of the scenario's own.

    Each poll is ``Pipeline.poll``, exactly as in the daemon, ``scan`` and ``top``."""
    sc = load_scenario(name)
    clock = ManualClock()
    source = MockSource.from_scenario(name, clock=clock, hosts=hosts)
    step = interval or sc.poll_interval
    pipeline = Pipeline(MockSourceConfig(name="mock", interval=step), metrics=SelfMetrics(),
                        tables=tables, fabric="test")
    seen: list[Seen] = []
    end = sc.duration if until is None else until
    times: list[float] = []
    t = 0.0
    while t <= end + 1e-9:
        times.append(t)
        fine = coarse_after is None or t < coarse_after
        t = round(t + (step if fine else coarse_interval), 6)

    async def run() -> None:
        for t in times:
            clock.t = t
            events = await pipeline.poll(source)
            assert pipeline.error is None, pipeline.error
            assert pipeline.sampled_at is not None
            seen.extend(Seen(pipeline.sampled_at, ev) for ev in events)

    asyncio.run(run())
    return sc, source, seen


def mismatches(sc: Scenario, source: MockSource, seen: list[Seen]) -> list[str]:
    """Every expected event matched by exactly one seen event, and nothing else seen."""
    fabric = source.model.fabric
    left = list(seen)
    problems: list[str] = []
    for exp in sc.expect:
        guid, port = resolve_port(fabric, exp.port)
        hits = [
            s for s in left
            if s.event.type == exp.type and s.event.status == exp.status
            and s.event.port is not None and s.event.port.guid == guid
            and s.event.port.port == str(port)
            and (exp.severity is None or s.event.severity == exp.severity)
            and all(s.event.details.get(k) == v for k, v in exp.details.items())
        ]
        inside = [s for s in hits if exp.window[0] <= s.t <= exp.window[1]]
        if len(inside) != 1:
            times = [(s.t, s.event.severity, s.event.details.get("kind")) for s in hits]
            problems.append(f"expected {exp.type} {exp.status} {exp.severity or ''} on "
                            f"{exp.port} in {list(exp.window)}: got {len(inside)} inside; "
                            f"candidates at {times}")
            continue
        left.remove(inside[0])
    for s in left:
        e = s.event
        problems.append(f"unexpected {e.type} {e.status} {e.severity} at t={s.t} on "
                        f"{e.port.node_desc if e.port else None}[{e.port.port if e.port else ''}]"
                        f": {e.message}")
    return problems
