"""The exporter's gzip body is re-rendered only where values changed, and still reads exactly
like a full render (CPU per poll at fabric scale)."""

from __future__ import annotations

import random
import zlib
from array import array
from dataclasses import replace

import pytest

import exporters.render as render
from exporters.http import Deflated
from exporters.render import PortRenderer
from ibmon.infiniband.counters import CATALOGUE
from ibmon.infiniband.model import LinkInfo, PortIdentity, PortView
from ibmon.track.totals import Totals

ERRORS = ("symbol_errors", "receive_errors", "link_downed")


def _inflate(body: Deflated) -> bytes:
    data = b"".join(body.parts)
    text = zlib.decompressobj(-zlib.MAX_WBITS).decompress(data)
    assert zlib.crc32(text) == body.crc and len(text) == body.size
    return text


def _full_render(views: list[PortView]) -> bytes:
    """What a fresh renderer makes of ``views``, uncompressed and without a cache."""
    renderer = PortRenderer()
    renderer.prepare(views)
    return b"".join(renderer.series_chunks(views))


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


@pytest.mark.parametrize("slice_lines", [render.SLICE_LINES, 3])
@pytest.mark.parametrize("seed", range(6))
def test_cached_segments_inflate_to_a_full_render(
    seed: int, slice_lines: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also with a block's lines compressed a few at a time (``SLICE_LINES``): non-finite
    floats and escaped labels read the same across the slices' seams."""
    monkeypatch.setattr(render, "SEGMENT_PORTS", 4)
    monkeypatch.setattr(render, "SLICE_LINES", slice_lines)
    rng = random.Random(seed)
    views = [_view(i, rng, rng.choice(("leaf01", '"}\\x'))) for i in range(23)]
    cached = PortRenderer(keep_descriptive=False)
    for poll in range(8):
        if poll == 5:  # ports come and go: the blocks move
            views = views[:7] + views[9:] + [_view(99, rng, "new")]
        cached.prepare(views)
        body = cached.series_deflated(views, 1)
        assert _inflate(body) == _full_render(views), poll
        views = _change(views, rng)


def _packed(totals: dict[str, int], index: dict[str, int]) -> Totals:
    values = [totals[name] for name in index]
    try:
        return Totals(index, array("Q", values))
    except OverflowError:  # as the tracker keeps a total past 64 bits
        return Totals(index, values)


@pytest.mark.parametrize("seed", range(4))
def test_packed_plain_and_partial_totals_read_the_same(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks whose ports all hold packed totals on one index are read column by column; a
    block with a plain mapping, another index, a total past 64 bits or a port that lacks a
    counter takes a general path. Every one must read like a render of plain dicts."""
    monkeypatch.setattr(render, "SEGMENT_PORTS", 5)
    rng = random.Random(seed)
    names = [c.name for c in CATALOGUE]
    whole = {n: i for i, n in enumerate(names)}
    shuffled = names[:]
    rng.shuffle(shuffled)
    other = {n: i for i, n in enumerate(shuffled)}  # another counter order: another index
    plain = [_view(i, rng, "node") for i in range(23)]
    for i, view in enumerate(plain):
        if i not in (6, 13):  # blocks 1 and 2 hold a port with fewer counters
            top = 1 << (66 if i == 21 else 60)  # block 4 holds a total past 64 bits
            # ERRORS start at zero on every port (shared zero columns), and move later
            plain[i] = replace(view, totals={n: 0 if n in ERRORS else rng.randrange(top)
                                             for n in names})
    renderer = PortRenderer(keep_descriptive=False)
    for poll in range(4):
        views = []
        for i, view in enumerate(plain):
            index = other if i == 17 else whole  # 17: block 3
            if i in (6, 13):  # its own counters, its own index
                index = {n: k for k, n in enumerate(view.totals)}
            packed = replace(view, totals=_packed(dict(view.totals), index))
            views.append(view if i == 8 else packed)  # 8: a plain dict in block 1
        renderer.prepare(views)
        body = renderer.series_deflated(views, 1)
        assert _inflate(body) == _full_render(plain), poll
        plain = _change(plain, rng)


def test_a_block_whose_values_did_not_change_is_not_rendered_again(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(render, "SEGMENT_PORTS", 2)
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


def test_a_node_s_ports_are_rendered_in_cached_blocks_too() -> None:
    """One way to render at every size: a node's 16 HCAs are one cached block a family, read
    as a full render does, and a poll that moved only the data counters renders and
    compresses again only the families those are in."""
    rng = random.Random(7)
    views = [_view(i, rng, "node") for i in range(16)]
    renderer = PortRenderer(keep_descriptive=False)
    renderer.prepare(views)
    first = renderer.series_deflated(views, 1)
    assert _inflate(first) == _full_render(views)
    moved = [replace(v, totals={**v.totals, "transmit_data": v.totals["transmit_data"] + 1})
             for v in views]
    renderer.prepare(moved)
    second = renderer.series_deflated(moved, 1)
    assert _inflate(second) == _full_render(moved)
    reused = set(map(id, first.parts)) & set(map(id, second.parts))
    assert reused  # the families without transmit_data kept their compressed blocks


def _linked(i: int, width: str, node_desc: str = "host") -> PortView:
    link = None if i % 5 == 4 else LinkInfo(
        remote_guid=f"0x{1000 + i:016x}", remote_port="1", remote_node_desc='sw"\\1',
        active_width="4X", active_speed="HDR", max_width="4X", max_speed="HDR")
    return PortView(identity=PortIdentity(guid=f"0x{i:016x}", port="1", node_desc=node_desc),
                    link=link, active_width=width, active_speed="HDR")


def _descriptive(views: list[PortView]) -> bytes:
    renderer = PortRenderer()
    renderer.prepare(views)
    return b"".join(renderer.descriptive_chunks())


@pytest.mark.parametrize("slice_lines", [render.SLICE_LINES, 3])
def test_descriptive_segments_inflate_to_a_full_render(
    slice_lines: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Link widths change, a port is renamed, a link goes, two ports swap places, ports come
    and go: the cached ``_info`` blocks always read like a render from scratch."""
    monkeypatch.setattr(render, "SEGMENT_PORTS", 4)
    monkeypatch.setattr(render, "SLICE_LINES", slice_lines)
    views = [_linked(i, "4X") for i in range(17)]
    renderer = PortRenderer(keep_descriptive=False)
    steps = [
        lambda v: v,
        lambda v: [*v[:6], replace(v[6], active_width="1X"), *v[7:]],  # a degraded link
        lambda v: [*v[:6], replace(v[6], active_width="4X"), *v[7:]],  # and back
        lambda v: [*v[:9], _linked(9, "4X", "renamed"), *v[10:]],  # a port's identity
        lambda v: [*v[:2], replace(v[2], link=None), *v[3:]],  # a link goes away
        lambda v: [*v[:5], v[13], *v[6:13], v[5], *v[14:]],  # two ports swap places
        lambda v: [*v[:3], *v[5:], _linked(40, "2X")],  # ports come and go
        lambda v: [*v[:-1], replace(v[-1], active_width="4X"), _linked(41, "4X")],
    ]
    for n, step in enumerate(steps):
        views = step(views)
        renderer.prepare(views)
        assert _inflate(renderer.descriptive_deflated(1)) == _descriptive(views), n


def _device(i: int, fw: str = "20.35.2000") -> PortView:
    """Port ``i % 2 + 1`` of a two-port HCA, ``mlx5_<i // 2>``, with its firmware."""
    return PortView(identity=PortIdentity(
        guid=f"0x{i // 2:016x}", port=str(i % 2 + 1), device=f"mlx5_{i // 2}", fw_ver=fw,
        hca_type="MT4123", board_id='MT_"1', source="mock"))


def test_device_info_is_one_series_a_device_and_follows_the_devices(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(render, "SEGMENT_PORTS", 4)
    views = [*map(_device, range(10)), _linked(20, "4X")]  # five HCAs and a port without one
    renderer = PortRenderer(keep_descriptive=False)
    renderer.prepare(views)
    first = renderer.descriptive_deflated(1)
    text = _inflate(first)
    assert text == _descriptive(views)
    lines = [ln for ln in text.decode().splitlines() if ln.startswith("ibmon_device_info")]
    assert len(lines) == 5
    assert lines[0] == ('ibmon_device_info{board_id="MT_\\"1",device="mlx5_0",'
                        'fw_ver="20.35.2000",guid="0x0000000000000000",hca_type="MT4123",'
                        'source="mock"} 1.0')
    # a link that changes width leaves the device block as it was
    views[10] = replace(views[10], active_width="1X")
    assert renderer.prepare(views)
    assert renderer.descriptive_deflated(1).parts[0] is first.parts[0]
    # a firmware upgrade shows, the same ports still there
    views = [*(_device(i, "20.36.1000") for i in range(2)), *views[2:]]
    renderer.prepare(views)
    text = _inflate(renderer.descriptive_deflated(1))
    assert text == _descriptive(views)
    assert b'device="mlx5_0",fw_ver="20.36.1000"' in text
    assert b'device="mlx5_0",fw_ver="20.35.2000"' not in text
    # a device whose ports left leaves no series
    views = views[:8]
    renderer.prepare(views)
    text = _inflate(renderer.descriptive_deflated(1))
    assert text == _descriptive(views)
    assert b'device="mlx5_4"' not in text


def test_a_changed_link_costs_its_block_of_the_link_family(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(render, "SEGMENT_PORTS", 4)
    views = [_linked(i, "4X") for i in range(12)]
    renderer = PortRenderer(keep_descriptive=False)
    renderer.prepare(views)
    first = renderer.descriptive_deflated(1)
    views[5] = replace(views[5], active_width="1X")
    assert renderer.prepare(views)  # the descriptive families changed
    second = renderer.descriptive_deflated(1)
    new = [p for p in second.parts if all(p is not q for q in first.parts)]
    assert len(new) == 1  # ports 4-7 of the link family; the info family is untouched
    assert b'active_width="1X"' in zlib.decompressobj(-zlib.MAX_WBITS).decompress(new[0])
    assert _inflate(second) == _descriptive(views)


def test_what_the_cache_keeps_is_not_a_copy_of_every_value(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between polls the cache keeps a fingerprint of each block's values, not the values: a
    block of one repeated value (no conditions, state active) or a moving counter column
    would otherwise cost 8 bytes a port a family (19 MB at 118,400 ports). Only a block whose
    ports differ (one port with a condition) keeps its values, and the answer is right when
    they move (a uniform block turns mixed and back, a column moves and returns)."""
    monkeypatch.setattr(render, "SEGMENT_PORTS", 64)
    # the shared zero columns of this test's block length only (earlier tests' lengths fill
    # the small cache, which then starts afresh between two of this test's polls)
    monkeypatch.setattr(render, "_ZEROS", {})
    names = [c.name for c in CATALOGUE]
    index = {n: i for i, n in enumerate(names)}

    def views(data: int, flagged: int | None) -> list[PortView]:
        return [PortView(
            identity=PortIdentity(guid=f"0x{i:016x}", port="1"), state=4, phys_state=5,
            totals=Totals(index, array("Q", [data + i if n == "transmit_data" else 0
                                              for n in names])),
            conditions=frozenset({"high_ber"}) if i == flagged else frozenset(),
        ) for i in range(128)]

    renderer = PortRenderer(keep_descriptive=False)
    for data, flagged in ((10, None), (20, 3), (10, None), (10, None)):
        polled = views(data, flagged)
        renderer.prepare(polled)
        assert _inflate(renderer.series_deflated(polled, 1)) == _full_render(polled)
        kept = [fp for fp, _ in renderer._segs.values()]
        per_port = [fp for fp in kept if isinstance(fp, list | array) and len(fp) == 64
                    and fp is not render._ZEROS.get(64)]
        # the conditions block of port 3 (the only block whose ports differ), when flagged
        assert len(per_port) == (flagged is not None), (data, flagged)
