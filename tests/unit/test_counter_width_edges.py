"""Counter widths at their edges: a 64-bit read equal to a narrow maximum, and a counter whose
width changes between polls (a source that read PortCounters, then PortCountersExtended).

A narrow field pinned at its maximum loses increments and gets no rate; a 64-bit field at the
same number is just a number. Mistaking one for the other either hides a stuck counter or
silences the rate and the BER of a healthy port.
"""

from __future__ import annotations

import pytest

from ibmon.infiniband.counters import CATALOGUE, CounterSpec
from ibmon.infiniband.model import PortIdentity, PortSample, PortView, Snapshot
from ibmon.runtime import sizes
from ibmon.track.tracker import Tracker

NARROW = [c for c in CATALOGUE if c.bits < 64]
GUID = "0x0002c90300a1b2c3"


@pytest.fixture(autouse=True, params=["per-port", "columns"])
def _accounting(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
                _fabric_paths: None) -> None:
    """Both ways of accounting a poll: a node's (port by port) and a fabric's (the column
    store), chosen by the one size threshold (``ibmon.runtime.sizes``)."""
    monkeypatch.setattr(sizes, "OFFLOAD_PORTS", 1 if request.param == "columns" else 1 << 62)


def sample(counters: dict[str, int], *, wide: frozenset[str]) -> PortSample:
    return PortSample(identity=PortIdentity(guid=GUID, port="1", device="mlx5_0"), state=4,
                      phys_state=5, rate_bps=100e9, counters=dict(counters), wide=wide)


def one(tracker: Tracker, t: float, s: PortSample) -> PortView:
    views = tracker.update(Snapshot(source="test", monotonic=t, wall=1.7e9 + t,
                                    ports={s.key: s}))
    return views[s.key]


@pytest.mark.parametrize("spec", NARROW, ids=lambda c: c.name)
def test_a_64bit_read_at_the_narrow_maximum_is_not_saturated(spec: CounterSpec) -> None:
    top = spec.max_value
    t = Tracker()
    wide = frozenset({spec.name})
    v = one(t, 0.0, sample({spec.name: top}, wide=wide))
    assert v.saturated == frozenset()
    one(t, 1.0, sample({spec.name: top - 3}, wide=wide))  # a reset, then at the maximum again
    v = one(t, 2.0, sample({spec.name: top}, wide=wide))
    assert v.saturated == frozenset()
    assert spec.name in v.rates


@pytest.mark.parametrize("spec", NARROW, ids=lambda c: c.name)
def test_pinned_while_narrow_then_read_64bit_counts_on(spec: CounterSpec) -> None:
    top = spec.max_value
    mult = spec.multiplier
    t = Tracker()
    v = one(t, 0.0, sample({spec.name: top - 1}, wide=frozenset()))
    base = v.totals[spec.name]
    v = one(t, 1.0, sample({spec.name: top}, wide=frozenset()))
    assert v.saturated == frozenset({spec.name})
    pinned_total = v.totals[spec.name]
    assert pinned_total == base + mult
    # the source now reads the 64-bit field: past the old maximum, not pinned, counting on
    v = one(t, 2.0, sample({spec.name: top + 10}, wide=frozenset({spec.name})))
    assert v.saturated == frozenset()
    assert v.totals[spec.name] == pinned_total + 10 * mult
    assert v.resets == {}
    v = one(t, 3.0, sample({spec.name: top + 15}, wide=frozenset({spec.name})))
    assert v.saturated == frozenset()
    assert v.rates[spec.name] == pytest.approx(5.0 * mult)
