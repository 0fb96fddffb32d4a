"""The engine: edge triggering, state round trip without re-announcing, config, source health."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import get_args

import pytest
from pydantic import ValidationError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from detect_views import view

from ibmon.config import ConfigError, load_settings
from ibmon.detect.base import Finding, IncreaseWindow, PortDetector, Verdict
from ibmon.detect.engine import DETECTORS, Engine
from ibmon.detect.events import EVENT_TYPES, SEVERITIES, Event, severity_rank
from ibmon.detect.source import SourceFailed
from ibmon.infiniband.model import PortKey, PortView


def step(engine: Engine, t: float, *, boot: float = 1e9, **fields: object) -> list[Event]:
    """One poll at monotonic ``t``; ``boot`` is the wall time at monotonic zero."""
    v = view(**fields)  # type: ignore[arg-type]
    return engine.process({v.key: v}, monotonic=t, wall=boot + t)


def test_restored_engine_neither_reannounces_nor_forgets() -> None:
    first = Engine()
    fired = []
    for t in range(5):
        fired += step(first, t, xmit_wait_ratio=0.3, utilization_tx=0.9,
                      totals={"link_downed": 1 + t})
    assert sorted(e.type for e in fired) == ["congestion", "link_flapping"]
    saved = json.loads(json.dumps(first.dump()))  # survives JSON

    # Restarted after a reboot: the monotonic clock starts again at zero, 10 s of wall later.
    second = Engine()
    second.load(saved)
    boot = 1e9 + 10
    assert {a.type for a in second.active()} == {"congestion", "link_flapping"}
    again = step(second, 0, boot=boot, xmit_wait_ratio=0.3, utilization_tx=0.9,
                 totals={"link_downed": 5})
    assert again == []
    later = []
    for t in range(1, 4):
        later += step(second, t, boot=boot, xmit_wait_ratio=0.0, totals={"link_downed": 5})
    assert [(e.type, e.status) for e in later] == [("congestion", "resolved")]
    # Downs at wall 1e9+1..4 are monotonic -9..-6 now: two leave the window at 592.
    assert step(second, 591, boot=boot, totals={"link_downed": 5}) == []
    (done,) = step(second, 592, boot=boot, totals={"link_downed": 5})
    assert (done.type, done.status) == ("link_flapping", "resolved")


def test_dump_before_any_poll_keeps_loaded_state() -> None:
    first = Engine()
    for t in range(3):
        step(first, t, xmit_wait_ratio=0.3)
    second = Engine()
    second.load(first.dump())
    third = Engine()
    third.load(second.dump())
    assert [a.type for a in third.active()] == ["congestion"]


@pytest.mark.parametrize("bad", [
    {"version": 99},
    {"version": 1, "active": [{"type": "congestion"}]},
    {"version": 1, "active": [], "detectors": {"congestion": [["0x1", "1", [1]]]}},
    {"version": 1, "active": [], "detectors": {"high_ber": "nonsense"}},
    {"version": 1, "active": [], "source": {"failures": -1, "active": None}},
    {"version": 1, "active": [], "source": {"failures": 2, "active": {"severity": "dire",
                                                                     "message": "x"}}},
    {"version": 1, "active": [], "source": {"failures": 2, "active": {"severity": "critical"}}},
])
def test_bad_state_is_rejected_without_change(bad: dict[str, object]) -> None:
    engine = Engine()
    for t in range(3):
        step(engine, t, xmit_wait_ratio=0.3)
    with pytest.raises(ValueError, match=r"state|congestion|high_ber|source health"):
        engine.load(bad)
    assert [a.type for a in engine.active()] == ["congestion"]


def test_disabled_detector_never_fires() -> None:
    engine = Engine({"port_down": {"enabled": False}})
    step(engine, 0, state=4)
    assert step(engine, 1, state=1) == []


def test_a_detector_disabled_since_resolves_what_it_held_once() -> None:
    first = Engine()
    (fired,) = [e for t in range(3) for e in step(first, t, xmit_wait_ratio=0.3)]
    off = {"congestion": {"enabled": False}}
    second = Engine(off)
    second.load(json.loads(json.dumps(first.dump())))
    assert second.active() == []
    # reloaded again before any poll: the condition is still owed its end
    third = Engine(off)
    third.load(second.dump())
    (done,) = step(third, 0, boot=1e9 + 60, xmit_wait_ratio=0.3)
    assert (done.type, done.status, done.severity) == ("congestion", "resolved", "warning")
    assert done.port == fired.port
    assert done.id != fired.id
    assert done.details["resolution"] == "detector_disabled"
    assert done.details["active_seconds"] == pytest.approx(58.0)
    assert done.message.startswith("congestion no longer watched after ")
    assert done.message.endswith(fired.message)
    assert step(third, 1, boot=1e9 + 60, xmit_wait_ratio=0.3) == []
    assert "congestion" not in [a["type"] for a in third.dump()["active"]]
    # switched back on before a poll: the condition was never dropped
    again = Engine()
    again.load(second.dump())
    assert [a.type for a in again.active()] == ["congestion"]
    assert step(again, 0, xmit_wait_ratio=0.3) == []


def test_detect_tables_are_validated_at_config_load(tmp_path: Path) -> None:
    cfg = tmp_path / "ibmon.toml"
    cfg.write_text("[detect.congestion]\nwarning = 0.3\ncritical = 0.6\n")
    engine = Engine(load_settings(cfg).detect.tables())
    assert [step(engine, t, xmit_wait_ratio=0.25) for t in range(5)] == [[]] * 5
    cfg.write_text("[detect.congestion]\nwarning = 'high'\n")
    with pytest.raises(ConfigError, match=r"detect.*congestion\.warning"):
        load_settings(cfg)
    cfg.write_text("[detect.congeston]\n")
    with pytest.raises(ConfigError, match="unknown detector 'congeston'"):
        load_settings(cfg)


def test_source_failed_fires_once_and_resolves() -> None:
    engine = Engine({"source_failed": {"after": 2}}, source="fabric")
    assert engine.source_poll(False, wall=1, reason="poll_timeout", error="slow") == []
    (ev,) = engine.source_poll(False, wall=2, reason="poll_timeout", error="slow")
    assert (ev.type, ev.status, ev.port) == ("source_failed", "firing", None)
    assert ev.details["source"] == "fabric"
    assert engine.source_poll(False, wall=3, reason="poll_timeout") == []
    (ok,) = engine.source_poll(True, wall=4)
    assert ok.status == "resolved"
    assert engine.source_poll(True, wall=5) == []


def test_an_outage_is_neither_announced_again_nor_left_open_after_a_restart() -> None:
    first = Engine(source="fabric")
    (fired,) = first.source_poll(False, wall=1, reason="poll_failed", error="no PMA")
    saved = json.loads(json.dumps(first.dump()))
    still = Engine(source="fabric")
    still.load(saved)
    assert still.source_poll(False, wall=2, reason="poll_failed", error="no PMA") == []
    (done,) = still.source_poll(True, wall=3)
    assert (done.type, done.status, done.severity) == ("source_failed", "resolved", "critical")
    assert done.message == "source fabric recovered"
    assert done.id != fired.id
    back = Engine(source="fabric")  # recovered by the first poll after the restart
    back.load(saved)
    (again,) = back.source_poll(True, wall=3)
    assert again.id == done.id  # the same edge of the same outage
    # switched off meanwhile: the outage ends with the next poll, whatever its outcome
    off = Engine({"source_failed": {"enabled": False}}, source="fabric")
    off.load(saved)
    off_again = Engine({"source_failed": {"enabled": False}}, source="fabric")
    off_again.load(off.dump())
    (gone,) = off_again.source_poll(False, wall=4, reason="poll_failed")
    assert (gone.status, gone.details["resolution"]) == ("resolved", "detector_disabled")
    assert gone.details["reason"] == "poll_failed"  # why it had failed, as its firing said
    assert gone.message == "source fabric no longer watched (the detector is disabled)"
    assert off_again.source_poll(True, wall=5) == []


def test_release_ends_every_condition_and_the_outage_once_and_keeps_the_windows() -> None:
    engine = Engine(source="fabric")
    fired = [e for t in range(5)
             for e in step(engine, t, xmit_wait_ratio=0.3, totals={"link_downed": 1 + t})]
    assert sorted(e.type for e in fired) == ["congestion", "link_flapping"]
    engine.source_poll(False, wall=1e9 + 5, reason="poll_failed", error="no PMA")
    ended = engine.release(1e9 + 6)
    assert sorted((e.type, e.status, e.details["resolution"]) for e in ended) == [
        ("congestion", "resolved", "source_removed"),
        ("link_flapping", "resolved", "source_removed"),
        ("source_failed", "resolved", "source_removed")]
    assert all("no longer watched" in e.message for e in ended)
    assert "the source was removed from the config" in ended[0].message
    assert engine.active() == [] and engine.release(1e9 + 7) == []
    assert engine.source_poll(True, wall=1e9 + 7) == []  # nothing left to recover from
    # back in the config: the flapping window remembered the downs, so it holds at once
    again = step(engine, 7, totals={"link_downed": 6})
    assert [(e.type, e.status) for e in again] == [("link_flapping", "firing")]


def test_every_detector_has_a_config_table_with_enabled() -> None:
    for name, cls in DETECTORS.items():
        assert cls.type == name
        assert cls.settings_model().enabled is True


def test_event_json_follows_the_contract() -> None:
    engine = Engine(fabric="prod")
    for t in range(3):
        evs = step(engine, t, xmit_wait_ratio=0.3, utilization_tx=0.9)
    (ev,) = evs
    data = json.loads(ev.model_dump_json())
    assert set(data) == {"id", "time", "fabric", "type", "status", "severity", "port", "peer",
                         "value", "threshold", "details", "message"}
    assert data["time"] == "2001-09-09T01:46:42Z"
    assert data["fabric"] == "prod"
    assert data["port"] == {"guid": "0x0002c90300a1b2c3", "port": "1",
                            "node_desc": "host042 mlx5_0", "device": "mlx5_0", "lid": 7}


def test_event_types_are_the_detectors_plus_source_failed() -> None:
    """One list of event types: every detector's, plus the one the engine raises itself."""
    assert len(set(EVENT_TYPES)) == len(EVENT_TYPES)
    assert set(EVENT_TYPES) == set(DETECTORS) | {SourceFailed.type}
    assert SourceFailed.type not in DETECTORS


def test_conditions_are_the_design_contract() -> None:
    """``ibmon_port_condition{condition}`` values: the rules and dashboards select on these."""
    conditions = [cls.condition for cls in DETECTORS.values() if cls.condition is not None]
    assert sorted(conditions) == sorted([
        "down", "degraded", "flapping", "high_ber", "link_integrity", "receive_errors",
        "discards", "congestion"])


def test_a_detector_with_an_unknown_type_fails_at_engine_construction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Bogus(PortDetector):
        type = "port_gone"  # type: ignore[assignment]

    monkeypatch.setitem(DETECTORS, "port_gone", Bogus)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="unknown event type 'port_gone'"):
        Engine()


def test_engine_events_are_validated_so_a_bad_finding_fails_where_it_is_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A severity the Event model does not know is an error at the engine, not in a consumer."""
    original = DETECTORS["congestion"].check

    def fatal(self: PortDetector, key: PortKey, view: PortView, now: float,
              active: Finding | None) -> Verdict:
        verdict = original(self, key, view, now, active)
        return Finding("fatal", 1.0) if isinstance(verdict, Finding) else verdict  # type: ignore[arg-type]

    engine = Engine()
    for t in range(2):
        step(engine, t, xmit_wait_ratio=0.3, utilization_tx=0.9)
    monkeypatch.setattr(DETECTORS["congestion"], "check", fatal)
    with pytest.raises(ValidationError, match="severity"):
        step(engine, 2, xmit_wait_ratio=0.3, utilization_tx=0.9)


def test_severities_are_one_ordered_list() -> None:
    assert SEVERITIES == ("info", "warning", "critical")
    assert [severity_rank(s) for s in SEVERITIES] == [0, 1, 2]
    assert set(SEVERITIES) == set(get_args(Event.model_fields["severity"].annotation))
    with pytest.raises(KeyError):
        severity_rank("fatal")


def test_a_window_over_a_counter_that_rises_every_poll_holds_a_bounded_history() -> None:
    """Increases closer together than the grain are merged (the BER window's symbol errors
    may rise every poll): memory per port is at most window / grain entries, and the sum
    within the window is off by at most what one grain holds."""
    window = IncreaseWindow(600.0, grain=2.0)
    key = ("0x0002c90a00000007", "1")
    for t in range(3000):  # one more every second, for fifty minutes
        total = window.observe(key, float(t), t)
    assert 598 <= total <= 600
    ((_, _, history),) = window.dump(0.0)["hist"]  # as the state file holds it
    assert len(history) <= 301


def test_a_port_that_does_not_answer_keeps_its_condition_until_it_answers() -> None:
    """Stale views count as present but are not judged: a flapping port that stops answering
    (its switch is hung) stays flapping for as long as it is silent, even past the window that
    would have cleared it; once it answers, the window decides again."""
    engine = Engine()
    fired = []
    for t in range(5):
        fired += step(engine, t, totals={"link_downed": 1 + t})
    assert [(e.type, e.status) for e in fired] == [("link_flapping", "firing")]
    for t in range(10, 1000, 10):
        assert step(engine, t, stale=True, totals={"link_downed": 5}) == []
    assert [a.type for a in engine.active()] == ["link_flapping"]
    (done,) = step(engine, 1000, totals={"link_downed": 5})
    assert (done.type, done.status) == ("link_flapping", "resolved")


def test_a_condition_that_holds_shows_todays_value_with_the_words_it_fired_with() -> None:
    """The API and ``ibmon explain`` read an active condition's value: it follows the port
    each poll, while the severity, message and cause stay as announced (no new event)."""
    engine = Engine()
    fired = [e for t in range(3) for e in step(engine, t, xmit_wait_ratio=0.3)]
    assert [(e.type, e.severity) for e in fired] == [("congestion", "warning")]
    assert step(engine, 3, xmit_wait_ratio=0.42) == []
    (now,) = engine.active()
    assert now.finding.value == pytest.approx(0.42)
    assert (now.finding.severity, now.finding.message) == ("warning", fired[0].message)
