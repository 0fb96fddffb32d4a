"""The cyclic GC paused around a large poll's work in worker threads (``ibmon.runtime.gcpause``): no
collection while any window is open, the windows' objects kept out of later collections, and
what that hides from the GC (a reference cycle already garbage) freed by the next sweep."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from ibmon.runtime import gcpause
from ibmon.runtime.gcpause import SWEEP_SECONDS, paused_gc


@pytest.fixture(autouse=True)
def _gc_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield  # (tests/conftest.py unfreezes what a test froze)
    if not was:
        gc.disable()


class _Node:
    """A container object the GC tracks."""

    def __init__(self) -> None:
        self.ref: Any = None


def test_no_collection_while_a_window_is_open_and_its_objects_out_of_later_ones() -> None:
    started: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(info["generation"])

    gc.callbacks.append(seen)
    try:
        with paused_gc():
            assert not gc.isenabled()
            made = [_Node() for _ in range(20 * gc.get_threshold()[0])]  # young collections' worth
        assert started == []
    finally:
        gc.callbacks.remove(seen)
    assert gc.isenabled()
    tracked = {id(o) for o in gc.get_objects()}  # what collections traverse (not the frozen)
    assert not any(id(node) in tracked for node in made)
    assert gc.get_freeze_count() >= len(made)


def test_nested_windows_restore_collection_when_the_last_one_closes() -> None:
    with paused_gc():
        assert not gc.isenabled()
        with paused_gc():  # a second source's sweep overlapping the first
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer window is still open
    assert gc.isenabled()


def test_windows_of_two_threads() -> None:
    inside, release = threading.Event(), threading.Event()

    def work() -> None:
        with paused_gc():
            inside.set()
            release.wait(5)

    t = threading.Thread(target=work)
    t.start()
    assert inside.wait(5)
    with paused_gc():
        release.set()
        t.join(5)
        assert not gc.isenabled()  # the other thread's window closed; this one is open
    assert gc.isenabled()


def test_collection_left_off_when_it_was_off_and_restored_after_an_error() -> None:
    gc.disable()
    with paused_gc():
        pass
    assert not gc.isenabled()  # the application turned it off; a window does not turn it on
    gc.enable()
    with pytest.raises(RuntimeError), paused_gc():
        raise RuntimeError("MAD port closed")
    assert gc.isenabled()


def test_a_cycle_frozen_with_a_window_is_freed_by_the_next_sweep(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with paused_gc():
        cycle = _Node()
        cycle.ref = cycle
        alive = weakref.ref(cycle)
        del cycle
    gc.collect()
    assert alive() is not None  # frozen with the window's objects: collections skip it
    monkeypatch.setattr(gcpause, "_next_sweep", time.monotonic() - 1.0)  # a sweep is due
    with paused_gc():
        pass
    assert alive() is None
    assert gcpause._next_sweep is not None
    assert gcpause._next_sweep >= time.monotonic() + SWEEP_SECONDS - 60  # the next one later
    with paused_gc():
        cycle = _Node()
        cycle.ref = cycle
        alive = weakref.ref(cycle)
        del cycle
    assert alive() is not None  # not due again: no sweep at every window
