"""Every shipped scenario, played on the simulated clock, yields exactly its answer key.

Tracker and detection engine run with their defaults (docs/infiniband.md §4) over MockSource
snapshots taken every ``poll_interval`` simulated seconds, as the key assumes. Each expected event
must appear exactly once inside its window (type, port, status, severity and details when the key
states them) and nothing else may appear; the healthy scenario therefore yields zero events.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from detect_harness import mismatches, play

from mocks.scenario import list_scenarios

SCENARIOS = list_scenarios()
# Hours of quiet fabric: the first 10 minutes at the key's 1 s polls (noise at the finest
# resolution, a full BER window), then 30 s polls so four simulated hours take seconds.
COARSE_AFTER = {"healthy": 600.0}


def test_every_shipped_scenario_is_covered() -> None:
    assert {"healthy", "congestion", "flap", "link-errors"} <= set(SCENARIOS)


@pytest.mark.parametrize("name", SCENARIOS)
def test_scenario_yields_exactly_its_expected_events(name: str) -> None:
    sc, source, seen = play(name, coarse_after=COARSE_AFTER.get(name))
    problems = mismatches(sc, source, seen)
    assert not problems, "\n".join(problems)
    assert len(seen) == len(sc.expect)
    if name == "healthy":  # hours of every port, switches and hosts, and not a single event
        assert sc.duration >= 3 * 3600
        assert len(source.model.keys) > 200
        assert seen == []
