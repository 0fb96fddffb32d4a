"""Event ids: deterministic across the daemons of an HA pair, unique within one daemon.

An id counts the condition's firing episodes on its port instead of reading a clock, so two
daemons agree whatever moment of its interval each polls at, as long as both saw the same
episodes (tests/faults/test_ha_event_ids.py runs the pair for real on ibsim).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pytest
from detect_views import view

from ibmon.detect.engine import Engine
from ibmon.detect.events import Event, event_id

T0 = 1_800_000_000.0


def poll(engine: Engine, t: float, *, wall: float, **fields: object) -> list[Event]:
    v = view(**fields)  # type: ignore[arg-type]
    return engine.process({v.key: v}, monotonic=t, wall=wall)


def flap(engine: Engine, walls: list[float], start: int = 0) -> list[Event]:
    """Up, down, up, down... one poll per wall time."""
    out: list[Event] = []
    for i, wall in enumerate(walls, start):
        out += poll(engine, float(i), wall=wall, state=4 if i % 2 == 0 else 1)
    return out


def congestion(engine: Engine, ratios: list[float]) -> list[Event]:
    out: list[Event] = []
    for t, r in enumerate(ratios):
        out += poll(engine, float(t), wall=T0 + t + 0.37 * (id(engine) % 3),
                    xmit_wait_ratio=r, utilization_tx=0.9)
    return out


def test_twins_polling_at_any_moment_agree() -> None:
    a = Engine(fabric="main", source="fabric")
    b = Engine(fabric="main", source="fabric")
    ev_a = flap(a, [T0 + 10 * i + 0.2 for i in range(5)])
    ev_b = flap(b, [T0 + 10 * i + 9.7 for i in range(5)])  # another window every time
    assert [(e.type, e.status) for e in ev_a] == [("port_down", "firing"),
                                                  ("port_down", "resolved")] * 2
    assert [e.id for e in ev_a] == [e.id for e in ev_b]
    assert len({e.id for e in ev_a}) == 4
    # nothing depends on the clock: the same episodes a day later have the same ids
    assert [e.id for e in flap(Engine(source="fabric"), [T0 + 86_400 + i for i in range(5)])] \
        == [e.id for e in ev_a]


def test_an_escalation_and_its_resolved_share_the_episode_seen_either_way() -> None:
    """One twin sees warning then critical, the other (polling later) critical at once: the
    critical firing and the resolved event have one id in both."""
    stepwise = congestion(Engine(), [0.2] * 3 + [0.6] * 3 + [0.0] * 3)
    at_once = congestion(Engine(), [0.8] * 3 + [0.0] * 3)
    assert [(e.status, e.severity) for e in stepwise] == [
        ("firing", "warning"), ("firing", "critical"), ("resolved", "critical")]
    assert [(e.status, e.severity) for e in at_once] == [
        ("firing", "critical"), ("resolved", "critical")]
    assert [e.id for e in stepwise[1:]] == [e.id for e in at_once]
    assert len({e.id for e in stepwise}) == 3


def test_other_fabrics_sources_shards_and_episodes_give_other_ids() -> None:
    def ids(*, fabric: str, source: str, shard: str = "") -> list[str]:
        engine = Engine(fabric=fabric, source=source, shard=shard)
        return [e.id for e in flap(engine, [T0 + i for i in range(5)])]

    base = ids(fabric="main", source="fabric")
    assert ids(fabric="main", source="fabric") == base
    others = [ids(fabric="west", source="fabric"), ids(fabric="main", source="mad-b"),
              ids(fabric="main", source="fabric", shard="1/2")]
    assert len({i for got in [base, *others] for i in got}) == 4 * len(base)


def test_one_engine_never_repeats_an_id() -> None:
    engine = Engine(fabric="main", source="fabric")
    events = flap(engine, [T0 + i * 0.001 for i in range(41)])  # 20 episodes in 40 ms
    assert [e.status for e in events] == ["firing", "resolved"] * 20
    assert len({e.id for e in events}) == 40


def test_a_condition_firing_again_after_its_port_was_forgotten_has_a_new_id() -> None:
    """A port forgotten with a condition open (it left the fabric) and back with the same
    condition fires again in the same episode: the repeat keeps the two ids apart."""
    engine = Engine(fabric="main", source="fabric")
    first = congestion(engine, [0.8] * 3)
    engine.forget(first[0].summary()[1:3])  # type: ignore[arg-type]
    again = [e for e in congestion(engine, [0.8] * 3) if e.type == "congestion"]
    assert [(e.status, e.severity) for e in first + again] == [("firing", "critical")] * 2
    assert first[0].id != again[0].id


def test_episodes_survive_a_restart_through_the_saved_state() -> None:
    """A daemon restarted from its state file goes on counting, so its ids go on matching
    its twin's (which never stopped) and never repeat its own earlier ones."""
    twin = Engine(source="fabric")
    ids_twin = [e.id for e in flap(twin, [T0 + i for i in range(9)])]
    first = Engine(source="fabric")
    ids = [e.id for e in flap(first, [T0 + 0.5 + i for i in range(5)])]
    saved = first.dump()
    assert saved["episodes"]
    restarted = Engine(source="fabric")
    restarted.load(saved)
    ids += [e.id for e in flap(restarted, [T0 + 0.5 + i for i in range(5, 9)], start=5)]
    assert ids == ids_twin
    assert len(set(ids)) == len(ids) == 8


def test_a_twin_that_missed_an_episode_counts_one_fewer_for_that_port() -> None:
    """The documented limit: ids match while both daemons saw the same episodes."""
    always = Engine(source="fabric")
    late = Engine(source="fabric")
    ids_always = [e.id for e in flap(always, [T0 + i for i in range(9)])]
    ids_late = [e.id for e in flap(late, [T0 + i for i in range(4, 9)], start=4)]
    assert ids_late[:2] != ids_always[4:6]  # its first episode is the other's third


def test_instants_are_episodes_of_their_own() -> None:
    engine = Engine(source="fabric")
    events: list[Event] = []
    for t, value in enumerate([100, 5, 200, 5]):
        v = view(resets={"symbol_error": (t + 1) // 2}, totals={"symbol_error": value})
        events += [e for e in engine.process({v.key: v}, monotonic=t, wall=T0 + t)
                   if e.type == "counter_reset"]
    assert len(events) == 2 and events[0].id != events[1].id


def test_source_failed_has_a_deterministic_id_too() -> None:
    ids = []
    for offset in (0.1, 0.9):
        engine = Engine(fabric="main", source="fabric")
        (e,) = engine.source_poll(False, wall=T0 + 3 + offset, reason="poll_timeout", error="x")
        ids.append(e.id)
        assert e.type == "source_failed" and e.port is None
    assert ids[0] == ids[1]


def test_a_bad_episode_list_is_refused_whole() -> None:
    engine = Engine(source="fabric")
    flap(engine, [T0, T0 + 1])
    good = engine.dump()
    for bad in ([["port_down", "0x1", "1", -1, True, []]], [["port_down"]], "x",
                [["port_down", "0x1", "1", 1, "yes", []]]):
        with pytest.raises(ValueError, match="episodes"):
            Engine().load({**good, "episodes": bad})


def test_id_shape() -> None:
    i = event_id(fabric="main", source="s", kind="port_down", guid="0x1", port="1",
                 status="firing", severity="critical", episode=1)
    assert len(i) == 32 and int(i, 16) >= 0  # like the uuid4 hex ids before
    assert i != event_id(fabric="main", source="s", kind="port_down", guid="0x1", port="1",
                         status="firing", severity="critical", episode=2)
