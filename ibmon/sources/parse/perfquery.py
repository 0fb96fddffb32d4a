"""``perfquery`` text: extended (``-x``) and plain blocks, one per port, possibly concatenated.

What perfquery itself trusts is what ibmon trusts: the capability masks in each block header
decide which printed fields are real (see ``parse_perfquery``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ibmon.counters import BY_PMA
from ibmon.sources.parse.pma import (
    CPI_CAP2_ADDL_EXT,
    CPI_CAP_XMIT_WAIT,
    EXT_CASTS,
    EXT_DATA,
    PortCounterValues,
    merge_counters,
)

__all__ = ["PerfBlock", "parse_perfquery", "parse_perfquery_blocks"]

_PQ_HEADER = re.compile(
    r"^#\s*(?P<title>[^:]*?)\s*:\s*(?:Lid\s+(?P<lid>\d+)|(?P<addr>.*?))\s+port\s+(?P<port>\d+)"
    r"(?:\s*\(CapMask:\s*0x(?P<cm>[0-9a-fA-F]+)(?:\s+CapMask2:\s*0x(?P<cm2>[0-9a-fA-F]+))?\))?"
)
_PQ_FIELD = re.compile(r"^(?P<name>[A-Za-z0-9_]+):\.*(?P<value>\S+)\s*$")


@dataclass(frozen=True, slots=True)
class PerfBlock:
    """One ``# ...: Lid L port P (CapMask ...)`` block of perfquery output."""

    kind: str  # extended | counters | other
    title: str
    lid: int | None
    port: int
    cap_mask: int | None
    cap_mask2: int | None
    fields: dict[str, int]
    #: fields printed after CounterSelect2 in an extended block (the 64-bit error copies)
    ext_errors: frozenset[str] = frozenset()


@dataclass(slots=True)
class _OpenBlock:
    """A block being read: its header, the fields so far, and whether CounterSelect2 passed."""

    header: PerfBlock
    fields: dict[str, int] = field(default_factory=dict)
    after_cs2: bool = False
    ext_errors: set[str] = field(default_factory=set)

    def add(self, name: str, value: int) -> None:
        self.fields[name] = value
        if name == "CounterSelect2":
            self.after_cs2 = True
        elif self.after_cs2 and self.header.kind == "extended":
            self.ext_errors.add(name)

    def close(self) -> PerfBlock:
        h = self.header
        return PerfBlock(
            kind=h.kind,
            title=h.title,
            lid=h.lid,
            port=h.port,
            cap_mask=h.cap_mask,
            cap_mask2=h.cap_mask2,
            fields=self.fields,
            ext_errors=frozenset(self.ext_errors),
        )


def _int(text: str) -> int | None:
    try:
        return int(text, 16) if text.lower().startswith("0x") else int(text)
    except ValueError:
        return None


def _header(m: re.Match[str]) -> PerfBlock:
    """The block a header line opens (no fields yet)."""
    title = m.group("title")
    low = title.lower()
    kind = "other"
    if "extended counters" in low:
        kind = "extended"
    elif low == "port counters":
        kind = "counters"
    return PerfBlock(
        kind=kind,
        title=title,
        lid=int(m.group("lid")) if m.group("lid") else None,
        port=int(m.group("port")),
        cap_mask=int(m.group("cm"), 16) if m.group("cm") else None,
        cap_mask2=int(m.group("cm2"), 16) if m.group("cm2") else None,
        fields={},
    )


def parse_perfquery_blocks(text: str) -> tuple[list[PerfBlock], list[str]]:
    """Every block in perfquery output, plus the lines that were neither header nor field.

    Stray lines (``ibwarn: ...`` on a merged stream, truncated output) are returned rather than
    raised, so one bad line never costs the rest of a node.
    """
    blocks: list[PerfBlock] = []
    stray: list[str] = []
    cur: _OpenBlock | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        m = _PQ_HEADER.match(line)
        if m:
            if cur is not None:
                blocks.append(cur.close())
            cur = _OpenBlock(_header(m))
            continue
        f = _PQ_FIELD.match(line)
        value = _int(f.group("value")) if f else None
        if f is None or cur is None or value is None:
            stray.append(raw)
            continue
        cur.add(f.group("name"), value)
    if cur is not None:
        blocks.append(cur.close())
    return blocks, stray


def parse_perfquery(text: str) -> tuple[dict[int, PortCounterValues], list[str]]:
    """perfquery output (``-x``, plain, ``-l`` loops, or both concatenated) -> port -> counters.

    Rules mirror what perfquery itself trusts: extended data fields are 64-bit; unicast and
    multicast are printed only with CapMask bit 9; error fields after ``CounterSelect2`` in an
    extended block are the 64-bit copies, trusted only with CapMask2 bit 1 (or no CapMask2 in
    the header): without it they are reserved bytes, and the narrow block must supply the error
    counters. A narrow block's PortXmitWait is kept only with CapMask bit 12. A 64-bit value
    always wins over the narrow one.
    """
    blocks, stray = parse_perfquery_blocks(text)
    narrow: dict[int, tuple[dict[str, int], int | None]] = {}
    wide: dict[int, tuple[dict[str, int], int | None]] = {}
    for b in blocks:
        if b.kind == "counters":
            # libibmad (rdma-core 44) decodes PortCounters.QP1Dropped from VL15Dropped's bits,
            # so perfquery's narrow QP1Dropped is VL15Dropped again: never trust it.
            vals = {k: v for k, v in b.fields.items() if k in BY_PMA and k != "QP1Dropped"}
            if b.cap_mask is not None and not b.cap_mask & CPI_CAP_XMIT_WAIT:
                vals.pop("PortXmitWait", None)
            narrow[b.port] = (vals, b.cap_mask)
        elif b.kind == "extended":
            errs_ok = b.cap_mask2 is None or bool(b.cap_mask2 & CPI_CAP2_ADDL_EXT)
            wide_errs = b.ext_errors & BY_PMA.keys() if errs_ok else frozenset()
            vals = {
                k: v
                for k, v in b.fields.items()
                if k in EXT_DATA or k in EXT_CASTS or k in wide_errs
            }
            wide[b.port] = (vals, b.cap_mask)
    out: dict[int, PortCounterValues] = {}
    for port in sorted(set(narrow) | set(wide)):
        n = narrow.get(port)
        w = wide.get(port)
        cap = w[1] if w and w[1] is not None else (n[1] if n else None)
        out[port] = merge_counters(n[0] if n else None, w[0] if w else None, cap)
    return out, stray
