"""Detection flood: what 20,000 events in one poll cost, validated against model_construct.

The engine builds every event with full pydantic validation so that a detector whose type or
severity the Event model does not know fails where the event is made. This benchmark shows what
that costs, measured in the same run:

- ``events``: building 20,000 ``Event``s (with their ``PortRef``) the way the engine does, once
  validated (``Event(...)``, ``PortRef(...)``) and once unvalidated (``model_construct``);
- ``flood``: ``Engine.process`` on a 20,000-port fabric where every port becomes congested at
  once (20,000 ``firing`` events), where it clears (20,000 ``resolved``), and a steady congested
  poll in between (no events) as the floor; each run is repeated with the engine switched to
  ``model_construct`` (the way it built events before) as the baseline.

Run: .venv/bin/python benchmarks/bench_events.py [ports] [rounds]
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
from collections.abc import Callable, Iterator

from ibmon.detect import engine as engine_mod
from ibmon.detect import events as events_mod
from ibmon.detect.engine import Engine
from ibmon.detect.events import Event, PortRef, new_event_id
from ibmon.infiniband.model import LinkInfo, PortIdentity, PortKey, PortView

LINK = LinkInfo(remote_guid="0x0002c90300000001", remote_port="1", max_width="4X",
                max_speed="EDR", active_width="4X", active_speed="EDR")


def identities(n: int) -> list[PortIdentity]:
    return [PortIdentity(guid=f"0x0002c902{i // 36:07x}0", port=str(i % 36 + 1),
                         node_type="switch", node_desc=f"leaf{i // 36:04d}", lid=i // 36 + 1)
            for i in range(n)]


def views(idents: list[PortIdentity], ratio: float) -> dict[PortKey, PortView]:
    return {i.key: PortView(i, 4, 5, 12.5e9, "4X", "EDR", LINK, {"transmit_wait": 1}, {},
                            xmit_wait_ratio=ratio, utilization_tx=0.9) for i in idents}


def build_events(idents: list[PortIdentity], *, validated: bool) -> float:
    """Seconds to build one event per identity, as ``Engine._event`` does."""
    ref = PortRef if validated else PortRef.model_construct
    make = Event if validated else Event.model_construct
    peer = ref(guid=LINK.remote_guid, port=LINK.remote_port, node_desc="spine01")
    started = time.perf_counter()
    for i in idents:
        make(id=new_event_id(), time=Event.at(1.7e9), fabric="main", type="congestion",
             status="firing", severity="warning",
             port=ref(guid=i.guid, port=i.port, node_desc=i.node_desc, device=i.device,
                      lid=i.lid),
             peer=peer, value=0.8, threshold=0.1,
             details={"kind": "hotspot", "source": "fabric"}, message="congested")
    return time.perf_counter() - started


class _Unvalidated:
    """Stands in for a model class: calling it is ``model_construct`` (the old engine's way)."""

    def __init__(self, model: type[Event] | type[PortRef]) -> None:
        self._model = model

    def __call__(self, **kw: object) -> object:
        return self._model.model_construct(**kw)

    def __getattr__(self, name: str) -> object:
        return getattr(self._model, name)


@contextlib.contextmanager
def unvalidated() -> Iterator[None]:
    """Make the engine build events and port refs with ``model_construct`` for a while."""
    saved = engine_mod.Event, events_mod.PortRef
    engine_mod.Event = _Unvalidated(Event)  # type: ignore[misc,assignment]
    events_mod.PortRef = _Unvalidated(PortRef)  # type: ignore[misc,assignment]
    try:
        yield
    finally:
        engine_mod.Event, events_mod.PortRef = saved  # type: ignore[misc]


def flood(idents: list[PortIdentity]) -> dict[str, float]:
    """One engine through congestion and back: seconds of the polls that matter."""
    engine = Engine(source="fabric")
    out: dict[str, float] = {}
    for poll in range(8):
        v = views(idents, 0.8 if poll < 5 else 0.0)
        started = time.perf_counter()
        events = engine.process(v, monotonic=float(poll), wall=1.7e9 + poll)
        took = time.perf_counter() - started
        if poll == 2:
            assert len(events) == len(idents)
            out["fire"] = took
        elif poll == 3:
            assert not events
            out["steady"] = took
        elif poll == 7:
            assert len(events) == len(idents)
            out["resolve"] = took
    return out


def median(rounds: int, f: Callable[[], float]) -> float:
    return statistics.median(f() for _ in range(rounds))


def main(argv: list[str]) -> None:
    ports = int(argv[0]) if argv else 20_000
    rounds = int(argv[1]) if len(argv) > 1 else 5
    idents = identities(ports)
    checked = median(rounds, lambda: build_events(idents, validated=True))
    unchecked = median(rounds, lambda: build_events(idents, validated=False))
    print(f"events: {ports} built validated {checked * 1e3:.0f} ms "
          f"({checked / ports * 1e6:.1f} us each), model_construct {unchecked * 1e3:.0f} ms "
          f"({unchecked / ports * 1e6:.1f} us each); validated/construct "
          f"{checked / unchecked:.2f}x")
    runs: list[dict[str, float]] = []
    base: list[dict[str, float]] = []
    for _ in range(rounds):  # interleaved, so load on the machine hits both alike
        runs.append(flood(idents))
        with unvalidated():
            base.append(flood(idents))
    for phase in ("fire", "steady", "resolve"):
        ours = statistics.median(r[phase] for r in runs)
        theirs = statistics.median(r[phase] for r in base)
        print(f"flood {phase}: validated {ours:.2f} s, model_construct {theirs:.2f} s "
              f"({ours / theirs:.2f}x)")


if __name__ == "__main__":
    main(sys.argv[1:])
