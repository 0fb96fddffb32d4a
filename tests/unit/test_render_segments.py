"""The exporter's gzip body is re-rendered only where values changed, and still reads exactly
like a full render (issue 12: CPU per poll at fabric scale)."""

from __future__ import annotations

import random
import zlib
from dataclasses import replace

import pytest

import exporters.render as render
from exporters.http import Deflated
from exporters.render import PortRenderer
from ibmon.counters import CATALOGUE
from ibmon.model import PortIdentity, PortView

ERRORS = ("symbol_errors", "receive_errors", "link_downed")


def _inflate(body: Deflated) -> bytes:
    data = b"".join(body.parts)
    text = zlib.decompressobj(-zlib.MAX_WBITS).decompress(data)
    assert zlib.crc32(text) == body.crc and len(text) == body.size
    return text


def _view(i: int, rng: random.Random, hostile: str) -> PortView:
    totals = {"transmit_data": rng.randrange(1 << 70), "receive_data": rng.randrange(1 << 40)}
    for name in ERRORS:
        if rng.random() < 0.8:
            totals[name] = rng.choice((0, 0, 0, 1, 7))
    return PortView(
        identity=PortIdentity(guid=f"0x{i:016x}", port=str(1 + i % 3), node_desc=hostile),
        state=rng.choice((1, 4, 4, 4)), phys_state=5, rate_bytes_per_second=25e9,
        totals=totals,
        utilization_tx=rng.choice((None, 0.5, float("inf"))),
        xmit_wait_ratio=rng.choice((None, 0.0, 0.25)),
        symbol_error_ber=rng.choice((None, None, 1e-12, float("nan"))),
        conditions=rng.choice((frozenset(), frozenset({"high_ber", "link_down"}))),
        causes=rng.choice(({}, {"high_ber": "physical"})),
        saturated=rng.choice((frozenset(), frozenset({"symbol_errors"}))),
        resets=rng.choice(({}, {"receive_errors": 2})),
        hw_totals=rng.choice(({}, {'np"cnp\n': 3})),
        stale=rng.random() < 0.1,
    )


def _change(views: list[PortView], rng: random.Random) -> list[PortView]:
    """A next poll: data counters move everywhere, anything else on a few ports."""
    out = []
    for i, old in enumerate(views):
        totals = dict(old.totals)
        totals["transmit_data"] += rng.randrange(1000)
        if rng.random() < 0.1:
            totals[rng.choice(ERRORS)] = rng.randrange(5)
        new = replace(old, totals=totals)
        if rng.random() < 0.1:
            new = replace(_view(i, rng, old.identity.node_desc), identity=old.identity,
                          totals=totals)
        out.append(new)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_cached_segments_inflate_to_a_full_render(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(render, "SEGMENT_PORTS", 4)
    monkeypatch.setattr(render, "CACHE_MIN_PORTS", 0)
    rng = random.Random(seed)
    views = [_view(i, rng, rng.choice(("leaf01", '"}\\x'))) for i in range(23)]
    cached = PortRenderer(keep_descriptive=False)
    for poll in range(8):
        if poll == 5:  # ports come and go: the blocks move
            views = views[:7] + views[9:] + [_view(99, rng, "new")]
        cached.prepare(views)
        body = cached.series_deflated(views, 1)
        plain = PortRenderer()
        plain.prepare(views)
        assert _inflate(body) == b"".join(plain.series_chunks(views)), poll
        views = _change(views, rng)


@pytest.mark.parametrize("seed", range(3))
def test_ports_counting_every_counter_or_fewer_read_the_same(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks whose ports all count the whole catalogue are read in one pass per port; a block
    with one port that lacks a counter takes the general path. Both must read like a render."""
    monkeypatch.setattr(render, "SEGMENT_PORTS", 5)
    monkeypatch.setattr(render, "CACHE_MIN_PORTS", 0)
    rng = random.Random(seed)
    views = []
    for i in range(17):
        view = _view(i, rng, "node")
        if i not in (6, 13):  # blocks 0 and 3 are whole; 1 and 2 hold a partial port
            view = replace(view, totals={c.name: rng.randrange(1 << 66) for c in CATALOGUE})
        views.append(view)
    renderer = PortRenderer(keep_descriptive=False)
    for poll in range(3):
        renderer.prepare(views)
        body = renderer.series_deflated(views, 1)
        plain = PortRenderer()
        plain.prepare(views)
        assert _inflate(body) == b"".join(plain.series_chunks(views)), poll
        views = _change(views, rng)


def test_a_block_whose_values_did_not_change_is_not_rendered_again(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(render, "SEGMENT_PORTS", 2)
    monkeypatch.setattr(render, "CACHE_MIN_PORTS", 0)
    views = [
        PortView(identity=PortIdentity(guid=f"0x{i:016x}", port="1"),
                 totals={"transmit_data": i, "symbol_errors": 0})
        for i in range(4)
    ]
    renderer = PortRenderer(keep_descriptive=False)
    renderer.prepare(views)
    first = renderer.series_deflated(views, 1)
    # Only port 3's data counter moves: every symbol_errors block and the transmit_data block
    # of ports 0-1 are the very segments of the first render.
    views[3] = replace(views[3], totals={"transmit_data": 40, "symbol_errors": 0})
    renderer.prepare(views)
    second = renderer.series_deflated(views, 1)
    reused = {id(p) for p in first.parts} & {id(p) for p in second.parts}
    assert len(second.parts) - len(reused) == 2  # the changed block and the final block
    assert b'port="1"} 40\n' in _inflate(second)


def test_a_small_fabric_is_compressed_whole_and_reads_the_same() -> None:
    rng = random.Random(7)
    views = [_view(i, rng, "node") for i in range(render.CACHE_MIN_PORTS - 1)]
    renderer = PortRenderer(keep_descriptive=False)
    renderer.prepare(views)
    body = renderer.series_deflated(views, 1)
    assert len(body.parts) == 1
    plain = PortRenderer()
    plain.prepare(views)
    assert _inflate(body) == b"".join(plain.series_chunks(views))
