"""Every parser reads its input exactly or refuses all of it (issue 14 item 4), property-tested.

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
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ibmon.model import normalize_guid
from ibmon.sources.parse import (
    DiscoveredPort,
    ParseError,
    PerfBlock,
    decode_port_counters,
    decode_port_counters_ext,
    parse_ibnd_cache,
    parse_ibnetdiscover_ports,
    parse_node_name_map,
    parse_perfquery_blocks,
    parse_topology_file,
)
from ibmon.sources.parse.sysfs_values import parse_counter, parse_lid_value
from tests.ibnd_cache import cache_from_ports

FIXTURES = Path(__file__).resolve().parents[2] / ".." / "shared" / "real-fixtures"
IBX = FIXTURES / "infiniband_exporter" / "collectors" / "fixtures"
TOPO = FIXTURES / "ibtopotool" / "tests"
SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def _need(path: Path) -> Path:
    if not path.exists():
        if os.environ.get("CI"):
            pytest.fail(f"real captures missing: {path}")
        pytest.skip(f"real captures not present: {path}")
    return path


def _captures(folder: str, pattern: str) -> list[str]:
    base = _need(IBX) / folder if folder != "topo" else _need(TOPO)
    texts = [p.read_text() for p in sorted(base.glob(pattern))]
    return [t for t in texts if t.strip()]


# --------------------------------------------------------------------------- mutations

#: A line of anything but a newline, and not only whitespace.
JUNK_LINES = st.text(st.characters(codec="utf-8", exclude_characters="\n\r"), min_size=1,
                     max_size=60).filter(lambda t: bool(t.strip()))


@st.composite
def mutations(draw: st.DrawFn, text: str) -> tuple[str, str]:
    """(kind, mutated text). Kinds: junk, copy, delete, swap, cut, value, tail."""
    lines = text.splitlines(keepends=True)
    full = [i for i, ln in enumerate(lines) if ln.strip()]
    kind = draw(st.sampled_from(["junk", "copy", "delete", "swap", "cut", "value", "tail"]))
    at = draw(st.integers(0, len(lines)))
    spots = list(re.finditer(r"(?<=[.:x ])\d+(?=\s*$)", text, re.M))
    if kind == "value" and not spots:
        kind = "junk"
    if kind == "junk":
        junk = draw(JUNK_LINES)
        out = [*lines[:at], junk + "\n", *lines[at:]]
    elif kind == "copy":
        src = lines[draw(st.sampled_from(full))]
        out = [*lines[:at], src, *lines[at:]]
    elif kind == "delete":
        i = draw(st.sampled_from(full))
        out = lines[:i] + lines[i + 1 :]
    elif kind == "swap":
        i, j = draw(st.sampled_from(full)), draw(st.sampled_from(full))
        out = list(lines)
        out[i], out[j] = out[j], out[i]
    elif kind == "cut":
        cut = draw(st.integers(1, len(text) - 1))
        return kind, text[:cut]
    elif kind == "value":
        m = draw(st.sampled_from(spots))
        value = draw(st.one_of(st.integers(0, 2**64 - 1), st.integers(2**64, 2**70)))
        return kind, text[: m.start()] + str(value) + text[m.end() :]
    else:  # tail: counter-shaped junk after the end, the case
        name = draw(st.sampled_from(["PortXmitData", "PortRcvData", "SymbolErrorCounter"]))
        return kind, text + f"{name}:....................{draw(st.integers(0, 2**40))}\n"
    return kind, "".join(out)


def _must_refuse(kind: str, original: str, mutated: str) -> bool:
    """Mutations that can only be junk, whatever line they hit."""
    if kind in ("copy", "tail"):
        return True
    if kind == "cut":
        return not mutated.endswith("\n")
    return False


# --------------------------------------------------------------------------- perfquery

_HDR = re.compile(r"^#\s*(.*?)\s*:\s*Lid\s+(\d+)\s+port\s+(\d+)")
_CM = re.compile(r"CapMask:\s*0x([0-9a-fA-F]+)")
_CM2 = re.compile(r"CapMask2:\s*0x([0-9a-fA-F]+)")


def perfquery_reference(text: str) -> list[tuple[Any, ...]]:
    """What each non-blank line says, read without any validation."""
    out: list[tuple[Any, ...]] = []
    for line in text.splitlines():
        s = line.strip()
        if not s:
            continue
        if s.startswith("#"):
            m = _HDR.match(s)
            assert m, s
            cm, cm2 = _CM.search(s), _CM2.search(s)
            out.append(("H", m.group(1), int(m.group(2)), int(m.group(3)),
                        int(cm.group(1), 16) if cm else None,
                        int(cm2.group(1), 16) if cm2 else None))
        else:
            name, _, value = s.partition(":")
            value = value.lstrip(".")
            out.append(("F", name, int(value, 16) if value.startswith("0x") else int(value)))
    return out


def perfquery_tokens(blocks: list[PerfBlock]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for b in blocks:
        out.append(("H", b.title, b.lid, b.port, b.cap_mask, b.cap_mask2))
        out.extend(("F", k, v) for k, v in b.fields.items())
    return out


def check_perfquery(kind: str, original: str, mutated: str) -> None:
    try:
        blocks = parse_perfquery_blocks(mutated)
    except ParseError:
        return
    assert not _must_refuse(kind, original, mutated), (kind, mutated[-300:])
    assert perfquery_tokens(blocks) == perfquery_reference(mutated)


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


# --------------------------------------------------------------------------- ibnetdiscover -p

_ADDR = r"(CA|SW|RT)\s+(\d+)\s+(\d+)\s+(0x[0-9a-fA-F]+)"
_REF_LINE = re.compile(rf"^{_ADDR}\s+(\d+)x\s+(\S+)(.*)$")
_REF_REMOTE = re.compile(rf"^\s*-\s+{_ADDR}\s+\(\s*'(.*)'\s*\)\s*$")


def ibnd_reference(text: str) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for line in text.splitlines():
        s = line.strip()
        if not s:
            continue
        m = _REF_LINE.match(s)
        assert m, s
        t, lid, port, guid, w, speed, rest = m.groups()
        rm = _REF_REMOTE.match(rest)
        if rm:
            far: tuple[Any, ...] = (rm.group(1), int(rm.group(2)), int(rm.group(3)),
                                    normalize_guid(rm.group(4)), rm.group(5))
        else:
            solo = rest.strip()
            far = (solo[1:-1] if solo.startswith("'") else solo,)
        out.append((t, int(lid), int(port), normalize_guid(guid), f"{int(w)}X",
                    "" if "?" in speed else speed.upper(), *far))
    return out


_TYPES = {"ca": "CA", "switch": "SW", "router": "RT"}


def ibnd_tokens(ports: list[DiscoveredPort]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for p in ports:
        head = (_TYPES[p.node_type], p.lid, p.port, p.guid, p.width, p.speed)
        if p.remote_guid is None:
            out.append((*head, p.desc))
        else:
            assert p.remote_type is not None
            out.append((*head, _TYPES[p.remote_type], p.remote_lid, p.remote_port,
                        p.remote_guid, f"{p.desc}' - '{p.remote_desc}"))
    return out


def check_ibnd(kind: str, original: str, mutated: str) -> None:
    try:
        ports = parse_ibnetdiscover_ports(mutated)
    except ParseError:
        return
    assert not _must_refuse(kind, original, mutated), (kind, mutated[-300:])
    assert ibnd_tokens(ports) == ibnd_reference(mutated)


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
    for decode in (
        lambda d, p: decode_port_counters(d, 0x1000, port=p),
        lambda d, p: decode_port_counters_ext(d, 0x200, 2, port=p),
    ):
        if payload[1] == port:
            assert decode(payload, port)
        else:
            with pytest.raises(ParseError, match=f"for port {payload[1]} where port {port}"):
                decode(payload, port)
    with pytest.raises(ParseError, match="too short"):
        decode_port_counters_ext(payload[:100], 0x200, 2)


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
