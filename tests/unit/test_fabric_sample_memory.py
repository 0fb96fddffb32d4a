"""A fabric source's poll holds little per port: its samples' counters are
packed and their sets of 64-bit names shared, and they read exactly as the decoded values.

Read from real hardware's perfquery text (``../shared/real-fixtures``), through the ``diags``
path's parser and the ``make_sample`` both fabric sources share.
"""

from __future__ import annotations

import tracemalloc

from ibmon.infiniband.model import PortIdentity
from ibmon.sources.fabric import FabricPort, make_sample
from ibmon.sources.parse import merge_counters, parse_perfquery
from ibmon.track.totals import Totals, packed_counters
from tests.fixtures import real_fixtures

#: Real perfquery output (a ConnectX HCA and switch ports), as the ``diags`` path reads it.
PERFQUERY = "infiniband_exporter/collectors/fixtures/perfquery/*.out"


def _port(i: int) -> FabricPort:
    return FabricPort(PortIdentity(f"0x{i + 1:016x}", "1"), lid=i + 1, state=4,
                      active_width="4X", active_speed="NDR")


def _decoded() -> list[tuple[dict[str, int], frozenset[str]]]:
    out = []
    for path in real_fixtures(PERFQUERY):
        for values in parse_perfquery(path.read_text()).values():
            out.append((dict(values.counters), values.wide))
    assert out, "no ports in the perfquery captures"
    return out


def test_samples_read_as_the_decoded_counters_and_share_their_names() -> None:
    decoded = _decoded()
    again = {path: parse_perfquery(path.read_text()) for path in
             real_fixtures(PERFQUERY)}
    samples = [make_sample(_port(i), v) for i, per_file in enumerate(again.values())
               for v in per_file.values()]
    assert len(samples) == len(decoded)
    for sample, (counters, wide) in zip(samples, decoded, strict=True):
        assert type(sample.counters) is Totals
        assert dict(sample.counters.items()) == counters
        assert list(sample.counters) == list(counters)  # the decoder's order
        assert sample.wide == wide
    # one index and one set of 64-bit names per kind of port, not one per port
    indexes: dict[tuple[str, ...], object] = {}
    wides: dict[frozenset[str], frozenset[str]] = {}
    for s in samples:
        index = s.counters.index  # type: ignore[attr-defined]
        assert indexes.setdefault(tuple(s.counters), index) is index
        assert wides.setdefault(s.wide, s.wide) is s.wide
    assert len(wides) < len(samples) and len(indexes) < len(samples)


def test_ports_with_the_same_64_bit_counters_share_one_set() -> None:
    ext = {"PortXmitData": 1, "PortRcvData": 2}
    a = merge_counters({"SymbolErrorCounter": 0}, dict(ext), 0x200)
    b = merge_counters({"SymbolErrorCounter": 3}, dict(ext), 0x200)
    assert a.wide == {"transmit_data", "receive_data"}
    assert a.wide is b.wide


def test_a_value_that_does_not_fit_64_bits_keeps_the_dict() -> None:
    """The tracker's per-port rules decide what such a value means (``test_tracker.py``); a
    value that is no int at all is theirs too, not an exception that costs the poll."""
    for odd in ({"transmit_data": 2**64, "symbol_errors": 1}, {"symbol_errors": -1},
                {"transmit_data": 1.5, "symbol_errors": 1}):
        assert packed_counters(odd) is odd
    fitting = {"transmit_data": 2**64 - 1, "symbol_errors": 0}
    assert type(packed_counters(fitting)) is Totals
    assert dict(packed_counters(fitting).items()) == fitting
    # every way of reading a Mapping gives the values, not their positions
    packed = packed_counters(fitting)
    assert list(packed.values()) == list(fitting.values()) and list(packed) == list(fitting)
    assert packed == fitting
    assert make_sample(_port(0), None).counters == {}


def test_a_poll_of_fabric_samples_holds_under_700_bytes_a_port() -> None:
    """The samples a fabric source hands on (alive while the tracker works): with a dict and a
    set per port they were about 2.1 KB a port of real hardware's counters, 210 MB at
    100,000 ports (``benchmarks/bench_sample_memory.py`` prints the figures)."""
    texts = [p.read_text() for p in
             real_fixtures(PERFQUERY)]
    texts = [t for t in texts if parse_perfquery(t)]
    n = 3000
    fps = [_port(i) for i in range(n)]
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        samples = [make_sample(fp, next(iter(parse_perfquery(texts[i % len(texts)]).values())))
                   for i, fp in enumerate(fps)]
        held = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert len(samples) == n
    assert held / n < 700, f"{held / n:.0f} bytes a port"
