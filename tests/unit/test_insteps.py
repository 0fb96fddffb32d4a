"""Passes in C cut into steps (``ibmon.insteps``, issue 12, target 5): each answers exactly
what the one-call builtin answers, at every length around a step's, and ``every`` stops at the
first false item as ``all`` does (the tracker's checks rely on it to give up early)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
import pytest

import ibmon.insteps as insteps


@pytest.fixture(autouse=True)
def _small_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(insteps, "STEP", 4)


LENGTHS = [0, 1, 3, 4, 5, 8, 9, 17]


@pytest.mark.parametrize("n", LENGTHS)
def test_every_answers_what_all_answers(n: int) -> None:
    for false_at in [None, *range(n)]:
        items = [i != false_at for i in range(n)]
        assert insteps.every(items) is all(items)
        assert insteps.every(iter(items)) is all(items)


def test_every_stops_at_the_first_false_item() -> None:
    taken: list[int] = []

    def items() -> Iterator[bool]:
        for i in itertools.count():
            taken.append(i)
            yield i != 5

    assert insteps.every(items()) is False  # an endless iterator: only a stop ends it
    assert len(taken) <= 5 + insteps.STEP  # at most the rest of the false item's step


@pytest.mark.parametrize("n", [n for n in LENGTHS if n])
def test_least_and_most_answer_what_min_and_max_answer(n: int) -> None:
    for values in ([(i * 7919) % 13 - 6 for i in range(n)], list(range(n)),
                   list(range(n, 0, -1))):
        assert insteps.least(values) == min(values)
        assert insteps.most(values) == max(values)
    with pytest.raises(ValueError, match="empty"):
        insteps.least([])


@pytest.mark.parametrize("n", LENGTHS)
def test_arrays_and_lists_convert_as_numpy_does(n: int) -> None:
    values = [i * 3 - 5 for i in range(n)]
    made = insteps.array_of(np, values, np.intp)
    assert made.dtype == np.intp
    assert made.tolist() == np.array(values, dtype=np.intp).tolist()
    floats = np.arange(n, dtype=np.float64) / 3
    assert insteps.list_of(floats) == floats.tolist()
    assert all(type(x) is float for x in insteps.list_of(floats))
