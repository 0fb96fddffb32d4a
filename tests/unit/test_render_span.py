"""The renderer reads a poll's rows where the pipeline says they are (``ibmon.track.rowview.Span``)
instead of finding them view by view: the same bytes, every poll of every
fault scenario, in the source's order or in port order (the exporter's), and only for the very
views, in the very order, the span was made for."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

import exporters.render as render
from exporters.render import PortRenderer
from ibmon.infiniband.model import PortView
from ibmon.runtime.pipeline import Pipeline, build_state
from ibmon.runtime.selfmetrics import SelfMetrics
from ibmon.sources.mock import MockSource, MockSourceConfig
from ibmon.state import PortSorter
from ibmon.track.rowview import Span, as_run
from mocks.scenario import ManualClock


def _body(renderer: PortRenderer, views: list[PortView], span: Span | None,
          order: Sequence[int] | None = None) -> bytes:
    renderer.prepare(views)
    body = renderer.series_deflated(views, 1, span, order)
    return zlib.decompressobj(-zlib.MAX_WBITS).decompress(b"".join(body.parts))


def _counting(monkeypatch: pytest.MonkeyPatch, calls: list[str], name: str) -> None:
    real: Callable[..., Any] = getattr(render, name)

    def spy(*args: Any) -> Any:
        calls.append(name)
        return real(*args)

    monkeypatch.setattr(render, name, spy)


@pytest.mark.parametrize("segment", [render.SEGMENT_PORTS, 64])
@pytest.mark.parametrize("sort", [True, False])
@pytest.mark.parametrize("scenario", ["flap", "counter-reset", "degraded", "link-errors"])
def test_a_publish_through_the_span_equals_one_that_reads_every_view(
        scenario: str, sort: bool, segment: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``sort``: in port order, as the exporter lists them (the simulator, like a real
    fabric's discovery, reports them in another order); else in the source's order. Blocks
    of 64 ports: some of port order's are consecutive rows, some not (both ways of reading)."""
    monkeypatch.setattr(render, "SEGMENT_PORTS", segment)
    clock = ManualClock()
    sorter = PortSorter()
    source = MockSource.from_scenario(scenario, hosts=300, clock=clock)
    pipeline = Pipeline(MockSourceConfig(name="mock", interval=1.0), metrics=SelfMetrics())
    through_span, view_by_view = PortRenderer(), PortRenderer()
    walked: list[str] = []
    _counting(monkeypatch, walked, "_packed_columns")
    _counting(monkeypatch, walked, "ratio_arrays")
    spans = 0
    polls = 30
    for n in range(polls):
        clock.t = n * 9.0  # across the scenario's faults: links down and back, resets, errors
        asyncio.run(pipeline.poll(source))
        state = build_state([pipeline])
        views, order = sorter.ordered(state.ports) if sort else (list(state.ports.values()), None)
        assert (order is not None) == sort  # the simulator's order is not port order
        walked.clear()
        fast = _body(through_span, views, state.span, order)
        if state.span is not None and state.span.positions(views, order) is not None:
            spans += 1
            assert not walked  # no view was read for its rows
        slow = _body(view_by_view, views, None)
        assert walked or n == 0  # and here they were (after the first poll: no rates yet)
        assert fast == slow, f"poll {n}"
    assert spans >= polls - 3  # every poll of the same ports after the first ones


def test_a_span_holds_only_its_own_views_in_its_order() -> None:
    clock = ManualClock()
    source = MockSource.from_scenario("flap", hosts=300, clock=clock)
    pipeline = Pipeline(MockSourceConfig(name="mock", interval=1.0), metrics=SelfMetrics())
    for n in range(3):
        clock.t = float(n)
        asyncio.run(pipeline.poll(source))
    state = build_state([pipeline])
    span = state.span
    assert span is not None
    views = list(state.ports.values())
    assert span.holds(views)
    assert span.positions(views, None) == range(len(views))
    assert not span.holds(views[::-1])  # another order
    assert not span.holds(views[1:])
    assert not span.holds([*views[:-1], PortView(identity=views[-1].identity)])
    ordered, order = PortSorter().ordered(state.ports)
    assert order is not None
    assert list(span.positions(ordered, order)) == list(order)
    assert span.positions(ordered, None) is None  # the order must be said
    assert span.positions(views, order) is None  # and be the views' order
    assert span.positions(ordered[1:], order[1:]) is None
    assert span.positions(ordered, [len(views)] * len(views)) is None  # not a position in it
    assert span.positions(ordered, [i - len(views) for i in order]) is None  # nor from its end
    clock.t = 3.0
    asyncio.run(pipeline.poll(source))
    newer = build_state([pipeline])
    assert newer.span is not None and newer.span is not span
    assert not span.holds(list(newer.ports.values()))  # a span of the last poll's views
    # A failed poll keeps the views, marked stale: other objects, no span.
    pipeline.fail("timeout", "no answer")
    assert pipeline.span is None and build_state([pipeline]).span is None
    # Two sources' views merged: no span.
    assert build_state([pipeline, pipeline]).span is None


def test_positions_that_follow_each_other_are_a_run() -> None:
    assert as_run(range(3, 7)) == range(3, 7)
    assert as_run(np.arange(5, 9, dtype=np.intp)) == range(5, 9)
    for not_a_run in ([5, 6, 8], [3, 2, 1, 0], [0, 2, 1, 3], []):
        assert as_run(np.array(not_a_run, dtype=np.intp)) is None, not_a_run
