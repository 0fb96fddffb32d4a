"""What detectors remember per port is declared once, and forgotten, saved and restored by the
base class (``ibmon.detect.portstate.PerPortState``) for every one of them.

What a user relies on: a restart restores every detector's windows as they were (no condition
re-announced or lost), a port that left the fabric leaves nothing behind, and a bad state file
is refused with the detector's name. The attack: a fabric with every kind of fault played
through the pipeline, then each detector's state saved, restored into a new detector and saved
again, and every port forgotten.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from ibmon.detect.base import IncreaseWindow, PortDetector
from ibmon.detect.cause import DetailWindow
from ibmon.detect.engine import DETECTORS
from ibmon.detect.portstate import PerPortState
from ibmon.detect.source import SourceFailed, SourceFailedSettings, health_json, load_health
from ibmon.runtime.pipeline import Pipeline
from ibmon.runtime.selfmetrics import SelfMetrics
from ibmon.sources.mock import MockSource, MockSourceConfig
from mocks.scenario import ManualClock, load_scenario


def _played(name: str, until: float) -> Pipeline:
    """A pipeline after ``until`` simulated seconds of scenario ``name`` at 5 s polls."""
    clock = ManualClock()
    source = MockSource.from_scenario(name, clock=clock)
    source.epoch = 1.7e9
    pipeline = Pipeline(MockSourceConfig(name="mock", interval=5.0), metrics=SelfMetrics(),
                        fabric="test")

    async def run() -> None:
        t = 0.0
        while t <= until:
            clock.t = t
            await pipeline.poll(source)
            t += 5.0

    asyncio.run(run())
    return pipeline


def _canonical(saved: Any) -> str:
    """JSON with a set's keys (saved in no particular order) sorted."""
    if isinstance(saved, list) and all(isinstance(r, list) and len(r) == 2 for r in saved):
        saved = sorted(saved)
    return json.dumps(saved, sort_keys=True)


def _held(state: PerPortState) -> int:
    """How many port entries ``state`` keeps, windows included."""
    n = 0
    for name in state.per_port:
        held = getattr(state, name)
        n += _held(held) if isinstance(held, PerPortState) else len(held)
    return n


@pytest.mark.parametrize("cls", [*DETECTORS.values(), IncreaseWindow, DetailWindow],
                         ids=lambda c: c.__name__)
def test_state_is_declared_and_handled_by_the_base_class_alone(cls: type) -> None:
    for method in ("forget", "dump", "load"):
        assert method not in vars(cls), f"{cls.__name__}.{method}: the base class's"
    assert set(cls.saved) <= set(cls.per_port)
    if issubclass(cls, PortDetector):
        det = cls(cls.settings_model())
        for name in det.per_port:  # each a dict or set keyed by port, or a window
            assert isinstance(getattr(det, name), dict | set | PerPortState), name


def test_saved_state_restores_as_it_was_and_a_forgotten_port_leaves_nothing() -> None:
    sc = load_scenario("demo")
    pipeline = _played("demo", min(sc.duration, 900.0))
    engine = pipeline.engine
    offset = engine._offset
    assert offset is not None
    kept = 0
    for det in engine.detectors:
        saved = json.loads(json.dumps(det.dump(offset)))  # as written to the state file
        again = type(det)(det.settings)
        again.load(saved, offset)
        assert _canonical(again.dump(offset)) == _canonical(saved), det.type
        kept += bool(_held(det))
    assert kept >= 5  # the attack is real: most detectors remember something

    for det in engine.detectors:
        for key in pipeline.views:
            det.forget(key)
        assert _held(det) == 0, det.type
        memo = getattr(det, "memo", None)
        assert memo is None or memo.redo([], []) is None  # every answer computed again


@pytest.mark.parametrize("cls", [c for c in DETECTORS.values() if c.saved],
                         ids=lambda c: c.type)
def test_a_bad_state_file_is_refused_naming_the_detector(cls: type[PortDetector]) -> None:
    det = cls(cls.settings_model())
    before = _canonical(det.dump(0.0))
    for bad in ("nonsense", [[1, 2, 3]], {"last": 5, "hist": []}):
        with pytest.raises(ValueError, match=f"^{cls.type}: "):
            det.load(bad, 0.0)
        assert _canonical(det.dump(0.0)) == before  # nothing changed


def test_a_state_written_without_one_of_its_parts_loads_the_others() -> None:
    """A window saved by an ibmon that kept one part less (or a hand-edited file without it)
    restores what it has; the missing part starts empty instead of costing the whole state."""
    window = IncreaseWindow(600.0)
    window.observe(("0x0002c90300000001", "1"), 0.0, 5)
    window.observe(("0x0002c90300000001", "1"), 10.0, 8)
    saved = json.loads(json.dumps(window.dump(0.0)))
    again = IncreaseWindow(600.0)
    again.load({"last": saved["last"]}, 0.0)
    assert again.dump(0.0) == {"last": saved["last"], "hist": []}
    assert again.observe(("0x0002c90300000001", "1"), 20.0, 9) == 1  # from 8, history lost


def test_source_failed_counts_failures_in_a_row_and_bounds_what_it_quotes() -> None:
    failed = SourceFailed(SourceFailedSettings(after=2), "fabric")
    assert failed.observe(False, "timeout", "no answer") is None
    assert failed.observe(True) is None  # a good poll starts the count again
    assert failed.observe(False, "timeout", "no answer") is None
    edge = failed.observe(False, "tool_failed", "x" * 10_000)
    assert edge is not None and edge[0] == "firing"
    finding = edge[1]
    assert len(finding.message) <= 500 and len(finding.details["error"]) == 300
    assert load_health(json.loads(json.dumps(failed.dump())))[0] == 2
    for bad in ({"failures": "many", "active": None}, {"failures": -1, "active": None},
                {"failures": 1, "active": {**health_json(1, finding)["active"],
                                           "severity": "fatal"}}):
        with pytest.raises(ValueError, match="engine state: bad source health"):
            load_health(bad)
