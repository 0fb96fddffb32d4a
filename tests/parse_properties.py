"""The parse properties, shared by the parser tests on real captures
(``tests/unit/test_parse_strict.py``) and on ibsim's own output (``tests/faults/test_tools.py``).

``mutations`` changes a text the ways junk gets into tool output; ``check_*`` then demands that
the parser either refuses it (``ParseError``, nothing else) or returns exactly what it says,
compared with a reference reading that validates nothing; mutations that can only be junk must
be refused.
"""

from __future__ import annotations

import re
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from ibmon.infiniband.model import normalize_guid
from ibmon.sources.parse import (
    DiscoveredPort,
    ParseError,
    PerfBlock,
    parse_ibnetdiscover_ports,
    parse_perfquery_blocks,
)

__all__ = [
    "JUNK_LINES",
    "SETTINGS",
    "check_ibnd",
    "check_perfquery",
    "ibnd_reference",
    "ibnd_tokens",
    "mutations",
    "perfquery_reference",
    "perfquery_tokens",
]

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


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
    else:  # tail: counter-shaped junk after the end, as a broken tool printed it
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
