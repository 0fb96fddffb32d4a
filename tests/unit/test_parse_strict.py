"""Every parser reads its input exactly or refuses all of it, property-tested.

Real captures (``../shared/real-fixtures``) are mutated by hypothesis: a junk line, a copy of a
line, a deleted or swapped line, a cut at any byte, a changed value, counter-shaped junk at the
end. For each mutated input the parser must either raise ``ParseError`` (and nothing else) or
return exactly what the input says: every line read once, in order, with its exact values,
checked against a reference reading that validates nothing. Mutations that can only be junk (a
repeated line, junk after the end, a cut inside a line) must be refused. The same properties
run on ibsim's own output in ``tests/faults/test_tools.py``.
"""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from ibmon.sources.parse import (
    DiscoveredPort,
    ParseError,
    decode_counters,
    parse_ibnd_cache,
    parse_ibnetdiscover_ports,
    parse_node_name_map,
    parse_perfquery_blocks,
    parse_topology_file,
)
from ibmon.sources.parse.sysfs_values import parse_counter, parse_lid_value
from tests.ibnd_cache import CacheNodeSpec, CachePortSpec, cache_bytes, cache_from_ports
from tests.parse_properties import (
    JUNK_LINES,
    SETTINGS,
    check_ibnd,
    check_perfquery,
    ibnd_reference,
    ibnd_tokens,
    mutations,
    perfquery_reference,
    perfquery_tokens,
)

FIXTURES = Path(__file__).resolve().parents[2] / ".." / "shared" / "real-fixtures"
IBX = FIXTURES / "infiniband_exporter" / "collectors" / "fixtures"
TOPO = FIXTURES / "ibtopotool" / "tests"


def _need(path: Path) -> Path:
    if not path.exists():
        if os.environ.get("CI"):
            pytest.fail(f"real captures missing: {path}")
        pytest.skip(f"real captures not present: {path}")
    return path


def _captures(folder: str, pattern: str) -> list[str]:
    base = _need(IBX) / folder if folder != "topo" else _need(TOPO)
    texts = [t for p in sorted(base.glob(pattern)) if (t := p.read_text()).strip()]
    if not texts:  # an empty folder would make every property below pass without a check
        pytest.fail(f"no captures matching {pattern} in {base}")
    return texts


def perfquery_texts() -> list[str]:
    return _captures("perfquery", "*.out")


@SETTINGS
@given(st.data())
def test_perfquery_captures_parse_exactly_or_not_at_all(data: st.DataObject) -> None:
    for original in perfquery_texts():
        assert perfquery_tokens(parse_perfquery_blocks(original)) == \
            perfquery_reference(original)
        kind, mutated = data.draw(mutations(original))
        check_perfquery(kind, original, mutated)


def ibnd_texts() -> list[str]:
    # test2.out contradicts itself (refused whole, see test_parse.py): its consistent part
    texts = _captures("ibnetdiscover", "*.out")
    return [t if "0x946dae030053ec1a" not in t else "".join(t.splitlines(True)[:4])
            for t in texts]


@SETTINGS
@given(st.data())
def test_ibnetdiscover_captures_parse_exactly_or_not_at_all(data: st.DataObject) -> None:
    for original in ibnd_texts():
        assert ibnd_tokens(parse_ibnetdiscover_ports(original)) == ibnd_reference(original)
        kind, mutated = data.draw(mutations(original))
        check_ibnd(kind, original, mutated)


# --------------------------------------------------------------------------- topology file


@SETTINGS
@given(st.data())
def test_topology_files_are_refused_whole_on_junk(data: st.DataObject) -> None:
    for original in _captures("topo", "[124].topo"):
        expected = parse_topology_file(original)
        kind, mutated = data.draw(mutations(original))
        try:
            got = parse_topology_file(mutated)
        except ParseError:
            continue
        assert kind != "tail" and mutated.endswith("\n"), kind  # junk after it, a cut line
        if kind == "junk":  # only a comment line can be added unseen
            added = set(mutated.splitlines()) - set(original.splitlines())
            assert all(a.strip().startswith("#") for a in added), added
            assert got == expected


# --------------------------------------------------------------------------- ibnd cache


def _fabric_ports() -> list[DiscoveredPort]:
    text = "".join(
        f"SW     1 {p:2d} 0x0000000000200000 4x EDR - CA {p + 1:5d}  1 0x{0x100000 + p:016x} "
        f"( 'sw' - 'h{p}' )\n" for p in range(1, 4)
    ) + "".join(
        f"CA {p + 1:5d}  1 0x{0x100000 + p:016x} 4x EDR - SW     1 {p:2d} 0x0000000000200000 "
        f"( 'h{p}' - 'sw' )\n" for p in range(1, 4)
    )
    return parse_ibnetdiscover_ports(text)


def test_cache_round_trip() -> None:
    ports = _fabric_ports()
    fab = parse_ibnd_cache(cache_from_ports(ports))
    assert set(fab.nodes) == {p.guid for p in ports}
    assert {k for k in fab.ports if k[1]} == {(p.guid, p.port) for p in ports}
    assert fab.remote[("0x0000000000200000", 2)] == ("0x0000000000100002", 1)
    assert fab.ports[("0x0000000000100001", 1)].state == 4


@SETTINGS
@given(st.data())
def test_cache_mutations_parse_or_are_refused(data: st.DataObject) -> None:
    good = cache_from_ports(_fabric_ports())
    kind = data.draw(st.sampled_from(["cut", "append", "flip", "count"]))
    if kind == "cut":
        bad = good[: data.draw(st.integers(0, len(good) - 1))]
    elif kind == "append":
        bad = good + data.draw(st.binary(min_size=1, max_size=200))
    elif kind == "count":  # the header's node or port count
        off = data.draw(st.sampled_from([8, 12]))
        n = struct.unpack_from("<I", good, off)[0]
        bad = good[:off] + struct.pack("<I", n + data.draw(st.sampled_from([-1, 1, 1000])))
        bad += good[off + 4 :]
    else:
        i = data.draw(st.integers(0, len(good) - 1))
        bad = good[:i] + bytes([good[i] ^ data.draw(st.integers(1, 255))]) + good[i + 1 :]
    try:
        parse_ibnd_cache(bad)
    except ParseError:
        return
    # only a flipped byte inside a payload (PortInfo, NodeInfo, a description) can still parse
    assert kind == "flip"


def test_cache_refuses_duplicates_and_strangers() -> None:
    ports = _fabric_ports()
    twice = [*ports, ports[0]]
    with pytest.raises(ParseError, match=r"recorded twice|lists a port twice"):
        parse_ibnd_cache(cache_from_ports(twice))
    good = cache_from_ports(ports)
    with pytest.raises(ParseError, match="bytes after the last record"):
        parse_ibnd_cache(good + b"\0")
    with pytest.raises(ParseError, match="not recorded"):
        parse_ibnd_cache(good[:16] + struct.pack("<Q", 0xDEAD) + good[24:])


def test_cache_refuses_a_port_past_its_nodes_count_and_a_record_written_twice() -> None:
    """A port numbered past what its NodeInfo says the node has, a port's or a node's record
    written twice, are a corrupt cache (each refused by its own check, not by the luck of a
    later one); the node's last port is no such thing."""
    def cache(last: int) -> bytes:
        node = CacheNodeSpec(0x200000, "switch", 4, "sw", [
            CachePortSpec(0x200000, n, 1) for n in (1, last)])
        return cache_bytes([node])

    assert set(parse_ibnd_cache(cache(4)).ports) == {("0x0000000000200000", n) for n in (1, 4)}
    with pytest.raises(ParseError, match="port 5 of 0x0000000000200000, which has 4 ports"):
        parse_ibnd_cache(cache(5))
    good = cache(4)  # a port's record twice, its node listing it once: still refused
    record = 13 + 64 + 18
    first = good[-2 * record : -record]
    again = good[:12] + struct.pack("<I", 3) + good[16:] + first
    with pytest.raises(ParseError, match="recorded twice"):
        parse_ibnd_cache(again)
    header, node = 28, 2 + 1 + 1 + 64 + 10 + 64 + 64 + 1 + 2 * 9  # the node record twice
    twice = (good[:8] + struct.pack("<I", 2) + good[12:header] + good[header : header + node]
             + good[header:])
    with pytest.raises(ParseError, match="node 0x0000000000200000 recorded twice"):
        parse_ibnd_cache(twice)


# --------------------------------------------------------------------------- node-name map


@SETTINGS
@given(JUNK_LINES)
def test_node_name_map_refuses_any_unreadable_line(junk: str) -> None:
    text = '# map\n0x0002c90300a1b2c3 "leaf 01"\n'
    stripped = junk.strip()
    assume(not stripped.startswith("#"))
    assume(not re.match(r'^(?:0x)?[0-9a-fA-F]{1,16}\s+".*"$', stripped))
    with pytest.raises(ParseError):
        parse_node_name_map(text + junk + "\n")


# --------------------------------------------------------------------------- PMA payloads


@SETTINGS
@given(st.binary(min_size=192, max_size=192), st.integers(0, 255))
def test_a_counter_reply_for_another_port_is_refused(payload: bytes, port: int) -> None:
    for narrow, ext in ((payload, None), (None, payload), (payload, payload)):
        if payload[1] == port:
            assert decode_counters(narrow, ext, 0x1200, 2, port=port).counters
        else:
            with pytest.raises(ParseError, match=f"for port {payload[1]} where port {port}"):
                decode_counters(narrow, ext, 0x1200, 2, port=port)
    with pytest.raises(ParseError, match="too short"):
        decode_counters(None, payload[:100], 0x200, 2)


# --------------------------------------------------------------------------- sysfs values


@SETTINGS
@given(st.one_of(
    st.binary(max_size=30),
    st.integers(0, 2**70).map(lambda n: f"{n}\n".encode()),
    st.sampled_from([b"12 34\n", b"1_000\n", b"+5\n", b"-1\n", b"\xd9\xa4\n", b"0x10\n",
                     b"N/A (no PMA)\n", b"  42  \n", b"18446744073709551615\n",
                     b"18446744073709551616\n"]),
))
def test_a_sysfs_counter_is_exactly_its_digits(raw: bytes) -> None:
    value = parse_counter(raw)
    digits = raw.strip()
    plain = digits.isascii() and digits.isdigit() and len(digits) <= 20
    if value is None:
        assert not plain or int(digits) >= 2**64
    else:
        assert plain and value == int(digits) < 2**64


@pytest.mark.parametrize(
    ("text", "lid"),
    [("0x12\n", 18), ("0xffff", 0xFFFF), ("17", 17), ("0x10000", None), ("0x-1", None),
     ("1_0", None), ("+5", None), ("", None), ("0x", None), ("99999", None)],
)
def test_a_sysfs_lid_is_exactly_its_digits(text: str, lid: int | None) -> None:
    assert parse_lid_value(text) == lid
