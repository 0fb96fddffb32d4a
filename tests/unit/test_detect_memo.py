"""Detectors keep last poll's ``needs`` answers and compute again only what changed.

``columns.Memo`` reuses a port's answer when its inputs (its error totals, state, identity,
link) compare equal to the previous poll's and its answer was "no" (a port picked last poll
may have been changed by ``check``). The attack: scenarios played through two pipelines on the
same clock, one with the memos and one whose memos never reuse anything, compared on every
poll: each detector must pick exactly the same ports. A memo that kept a stale answer picks a
port too many (slower, and, the other way round, a fault missed); one that reused the answer
of a port ``check`` changed keeps picking a port that went quiet.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ibmon.detect import columns
from ibmon.detect.base import Pairs
from ibmon.detect.columns import Fresh, Memo, PortOrder, with_keep
from ibmon.infiniband.model import PortIdentity, PortKey, PortView
from ibmon.runtime import sizes
from ibmon.runtime.pipeline import Pipeline
from ibmon.runtime.selfmetrics import SelfMetrics
from ibmon.sources.mock import MockSource, MockSourceConfig
from mocks.scenario import ManualClock, load_scenario


class _Afresh(Memo):
    """A memo that never reuses an answer: every poll computes all of them."""

    __slots__ = ()

    def redo(self, fresh: Any, *inputs: Any) -> None:
        return None


def _memos(pipeline: Pipeline) -> list[tuple[Any, Memo]]:
    found = []
    for det in pipeline.engine.detectors:
        for owner in (det, getattr(det, "_window", None)):
            memo = getattr(owner, "memo", None)
            if isinstance(memo, Memo):
                found.append((owner, memo))
    return found


def _recording(pipeline: Pipeline, picked: dict[str, list[PortKey]]) -> None:
    for det in pipeline.engine.detectors:
        def needs(fresh: Pairs, now: float, active: Any, det: Any = det,
                  inner: Any = det.needs) -> Pairs:
            out: Pairs = inner(fresh, now, active)
            picked[det.type] = [key for key, _ in out]
            return out
        det.needs = needs  # type: ignore[method-assign]


@pytest.mark.parametrize("name", ["demo", "flap", "link-errors", "degraded"])
def test_memoized_answers_equal_answers_computed_afresh(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sizes, "OFFLOAD_PORTS", 1)  # as on a fabric: the column store,
    sc = load_scenario(name)
    clock = ManualClock()
    sources = [MockSource.from_scenario(name, clock=clock) for _ in range(2)]
    sources[1].epoch = sources[0].epoch
    pipelines = [Pipeline(MockSourceConfig(name="mock", interval=2.0), metrics=SelfMetrics(),
                          fabric="test") for _ in range(2)]
    memos = _memos(pipelines[0])
    assert len(memos) >= 7  # every detector whose needs looks ports up
    for owner, _ in _memos(pipelines[1]):
        owner.memo = _Afresh()
    picked: list[dict[str, list[PortKey]]] = [{}, {}]
    for pipeline, record in zip(pipelines, picked, strict=True):
        _recording(pipeline, record)
    reused = 0

    async def run() -> None:
        nonlocal reused
        t = 0.0
        while t <= sc.duration:
            clock.t = t
            got = [e.model_dump() for e in await pipelines[0].poll(sources[0])]
            want = [e.model_dump() for e in await pipelines[1].poll(sources[1])]
            assert picked[0] == picked[1], f"t={t}"
            assert got == want, f"t={t}"
            reused += sum(bool(memo._answers) for _, memo in memos)
            t = round(t + (2.0 if t < 900 else 30.0), 6)

    asyncio.run(run())
    assert reused > 0  # the memos were used, not recomputed every poll


def _fresh(keys: list[PortKey], previous: PortOrder | None = None) -> Fresh:
    fresh = Fresh(previous)
    fresh.extend((key, PortView(identity=PortIdentity(guid=key[0], port=key[1])))
                 for key in keys)
    return fresh


def test_a_memo_computes_again_what_changed_or_was_picked_and_nothing_else() -> None:
    """Nobody tells a memo what ``check`` changed: it computes again the ports whose inputs
    changed and those it picked last poll (the only ones ``check`` may have changed), and
    reuses every other answer, at any number of ports."""
    keys = [(f"0x{i:04x}", "1") for i in range(6)]
    memo = Memo()
    fresh = _fresh(keys)
    assert memo.redo(fresh, [0] * 6) is None  # first sight: everything
    memo.keep(bytearray([0, 0, 0, 0, 1, 0]))
    fresh = _fresh(keys, fresh.known_order)
    assert fresh.order() is not None and fresh.known_order is not None
    values = [0, 0, 7, 0, 0, 0]
    reuse = memo.redo(fresh, values)
    assert reuse is not None
    answers, redo = reuse
    assert (answers, sorted(redo)) == (bytearray([0, 0, 0, 0, 1, 0]), [2, 4])
    answers[2], answers[4] = True, False
    memo.keep(answers)
    fresh = _fresh(keys, fresh.known_order)
    assert memo.redo(fresh, list(values)) == (bytearray([0, 0, 1, 0, 0, 0]), [2])
    memo.keep(bytearray(6))
    fresh = _fresh(keys, fresh.known_order)
    assert memo.redo(fresh, list(values)) == (bytearray(6), [])
    memo.keep(answers)
    # another order of ports, a cleared memo, a different number of inputs: everything
    assert memo.redo(_fresh(keys[::-1], fresh.known_order), values) is None
    memo.keep(answers)
    fresh = _fresh(keys[::-1], fresh.known_order)
    memo.clear()
    assert memo.redo(fresh, values) is None
    memo.keep(answers)
    assert memo.redo(_fresh(keys[::-1], fresh.known_order), values, values) is None
    # a plain list of pairs (not the engine's ``Fresh``): nothing is kept
    memo = Memo()
    few = list(_fresh(keys[:3]))
    assert memo.redo(few, [0] * 3) is None
    memo.keep(bytearray(3))
    assert memo.redo(few, [0] * 3) is None


@pytest.mark.parametrize("ordered", [True, False])
def test_kept_conditions_are_picked_with_or_without_an_order(ordered: bool) -> None:
    keys = [(f"0x{i:04x}", "1") for i in range(5)]
    fresh = _fresh(keys)
    if ordered:
        Memo().redo(fresh, [0] * 5)  # a memo asks for the order
    active = {keys[1]: object(), ("0xgone", "1"): object()}
    answers = bytearray([0, 0, 0, 1, 0])
    assert list(map(bool, with_keep(fresh, answers, active))) == [False, True, False, True, False]
    assert answers == bytearray([0, 0, 0, 1, 0])  # the memo's copy is not changed


@pytest.mark.parametrize("asked", [3, 40])
def test_an_order_finds_positions_one_by_one_or_in_one_pass(asked: int) -> None:
    """A few keys are searched for and remembered with the order; many at once (every port
    touched on a fabric's first polls) take one pass and are not kept (no index of every
    port)."""
    keys = [(f"0x{i:04x}", "1") for i in range(100)]
    order = PortOrder(keys)
    wanted = [keys[i] for i in range(99, 99 - asked, -1)] + [("0xgone", "1")]
    assert sorted(order.positions(wanted)) == list(range(100 - asked, 100))
    assert sorted(order.positions(set(wanted))) == list(range(100 - asked, 100))
    assert len(order._found) == (0 if asked > 8 else asked + 1)


def test_an_order_keeps_no_more_keys_than_it_has_however_many_absent_ones_are_asked() -> None:
    """Conditions held on ports that left the poll are asked about poll after poll, and new
    ones keep coming on a churning fabric: what the order remembers stays bounded by its
    own keys, and its answers stay right."""
    keys = [(f"0x{i:04x}", "1") for i in range(10)]
    order = PortOrder(keys)
    for n in range(200):
        assert order.positions([(f"0xgone{n}", "1"), keys[n % 10]]) == [n % 10]
        assert len(order._found) <= len(keys)


@pytest.mark.parametrize("changed", [[], [0], [columns.DIFF_STRETCH - 1, columns.DIFF_STRETCH],
                                     [5, 700, 701, 1299], list(range(1300))])
def test_differences_are_found_stretch_by_stretch_as_pair_by_pair(changed: list[int]) -> None:
    """``differences`` skips stretches that compare equal in C: it must still find every
    changed position (on a stretch's edges too) and nothing else. A NaN that is the same
    object is unchanged (as in a list comparison); an equal value in a new object is too."""
    nan = float("nan")
    prev: list[object] = [i % 7 if i % 5 else None for i in range(1300)]
    prev[3] = nan
    new = list(prev)
    new[4] = int(str(prev[4]))  # an equal int, another object: unchanged
    for i in changed:
        new[i] = float("nan") if i % 3 == 0 else (-1 if prev[i] is not None else 0)
    expected = [i for i, (a, b) in enumerate(zip(new, prev, strict=True))
                if a is not b and a != b]
    assert columns.differences(new, prev) == expected
    assert expected == changed  # the attack is real: each change is one
