"""Event ids: deterministic across the daemons of an HA pair, unique within one daemon."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from detect_views import view

from ibmon.detect.engine import Engine
from ibmon.events import Event, event_id, poll_bucket

T0 = 1_800_000_000.0  # a whole number of 10 s intervals


def poll(engine: Engine, t: float, *, wall: float, **fields: object) -> list[Event]:
    v = view(**fields)  # type: ignore[arg-type]
    return engine.process({v.key: v}, monotonic=t, wall=wall)


def flap(engine: Engine, walls: list[float]) -> list[Event]:
    """Up, down, up, down... one poll per wall time."""
    out: list[Event] = []
    for i, wall in enumerate(walls):
        out += poll(engine, float(i), wall=wall, state=4 if i % 2 == 0 else 1)
    return out


def test_twins_polling_at_different_moments_of_each_interval_agree() -> None:
    a = Engine(fabric="main", source="fabric", interval=10.0)
    b = Engine(fabric="main", source="fabric", interval=10.0)
    ev_a = flap(a, [T0 + 10 * i + 0.2 for i in range(5)])
    ev_b = flap(b, [T0 + 10 * i + 9.7 for i in range(5)])
    assert [(e.type, e.status) for e in ev_a] == [("port_down", "firing"),
                                                  ("port_down", "resolved")] * 2
    assert [e.id for e in ev_a] == [e.id for e in ev_b]
    assert len({e.id for e in ev_a}) == 4


def test_other_windows_fabrics_sources_and_intervals_give_other_ids() -> None:
    def first_id(*, wall: float, fabric: str = "main", source: str = "fabric",
                 interval: float = 10.0) -> str:
        (e, *_) = flap(Engine(fabric=fabric, source=source, interval=interval),
                       [wall, wall + interval])
        return e.id

    base = first_id(wall=T0 + 5)
    assert first_id(wall=T0 + 9.99) == base
    assert len({base, first_id(wall=T0 + 10), first_id(wall=T0 + 5, fabric="west"),
                first_id(wall=T0 + 5, source="mad-b"), first_id(wall=T0 + 5, interval=60.0)}) == 5


def test_one_engine_never_repeats_an_id_even_within_one_window() -> None:
    """Polls faster than the interval (a config reload, a scan with --interval 0) can put the
    same edge twice in one window: the second one still gets its own id."""
    engine = Engine(fabric="main", source="fabric", interval=3600.0)
    events = flap(engine, [T0 + i for i in range(7)])  # all in one hour
    assert [e.status for e in events] == ["firing", "resolved"] * 3
    assert len({e.id for e in events}) == 6


def test_source_failed_has_a_deterministic_id_too() -> None:
    ids = []
    for offset in (0.1, 0.9):
        engine = Engine(fabric="main", source="fabric", interval=1.0)
        (e,) = engine.source_poll(False, wall=T0 + 3 + offset, reason="poll_timeout", error="x")
        ids.append(e.id)
        assert e.type == "source_failed" and e.port is None
    assert ids[0] == ids[1]


def test_id_shape_and_bucket() -> None:
    i = event_id(fabric="main", source="s", kind="port_down", guid="0x1", port="1",
                 status="firing", severity="critical", bucket=poll_bucket(T0 + 19.9, 10.0))
    assert len(i) == 32 and int(i, 16) >= 0  # like the uuid4 hex ids before
    assert poll_bucket(T0 + 19.9, 10.0) == poll_bucket(T0 + 10.0, 10.0) != poll_bucket(T0, 10.0)
    assert poll_bucket(T0 + 0.0015, 0.0) != poll_bucket(T0 + 0.0025, 0.0)  # no interval: ms
