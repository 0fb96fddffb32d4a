"""``perfquery`` text: extended (``-x``) and plain blocks, one per port, possibly concatenated;
the detail blocks of ``perfquery -E`` (PortRcvErrorDetails) and ``-D``
(PortXmitDiscardDetails), one port per run; and ``perfquery -c`` (PortSamplesControl), read for
its Tick (``parse_perfquery_tick``).

What perfquery itself trusts is what ibmon trusts: the capability masks in each block header
decide which printed fields are real (see ``counters_from_blocks``).

The reading is strict (see ``ibmon.sources.parse.errors``): every non-blank line is a block
header or a field of the current block; a field must be one perfquery prints in that kind of
block (and, in an extended block, on its side of ``CounterSelect2``), appear once, hold a value
that fits the field's width, and every block must be complete. Anything else raises
``ParseError`` for the whole text. The fields perfquery prints come from libibmad's dump
tables (``mad_dump_perfcounters``, ``mad_dump_perfcounters_ext``): the unicast/multicast
group only with CapMask bit 9, the 64-bit error group (after ``CounterSelect2``) only with
CapMask2 bit 1 in current rdma-core and always in older releases, so those groups are
all-or-nothing rather than required. A detail block (``mad_dump_perfcounters_rcv_err``,
``mad_dump_perfcounters_xmt_disc``) has no capability masks in its header and every one of its
fields is required; a counter parse refuses it, and a detail parse refuses anything else.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from ibmon.infiniband.counters import BY_PMA, DETAIL_ATTRIBUTES
from ibmon.sources.parse.errors import ParseError, require_whole_lines
from ibmon.sources.parse.pma import (
    CPI_CAP2_ADDL_EXT,
    CPI_CAP_XMIT_WAIT,
    EXT_CASTS,
    EXT_DATA,
    EXT_ERRORS,
    PortCounterValues,
    merge_counters,
)

__all__ = [
    "PerfBlock",
    "counters_from_blocks",
    "expect_blocks",
    "parse_perfquery",
    "parse_perfquery_blocks",
    "parse_perfquery_details",
    "parse_perfquery_tick",
]

_PQ_HEADER = re.compile(
    r"^#\s*(?P<title>[^:]*?)\s*:\s*(?:Lid\s+(?P<lid>\d{1,5})|(?P<addr>\S.*?))\s+port\s+"
    r"(?P<port>\d{1,3})"
    r"(?:\s*\(CapMask:\s*0x(?P<cm>[0-9a-fA-F]{1,4})"
    r"(?:\s+CapMask2:\s*0x(?P<cm2>[0-9a-fA-F]{1,8}))?\))?$"
)
_PQ_FIELD = re.compile(r"^(?P<name>[A-Za-z0-9_]+):\.*(?P<value>0x[0-9a-fA-F]{1,16}|\d{1,20})$")

#: Every block starts with these (8 and 16 bits).
_SELECTS = {"PortSelect": 8, "CounterSelect": 16}
#: PortCounters as perfquery prints it: field -> width in bits. Required unless optional below.
_NARROW = {
    **_SELECTS,
    **{spec.pma: spec.bits for spec in BY_PMA.values() if spec.bits < 64 and not spec.attribute},
    "CounterSelect2": 8,
}
_NARROW_OPTIONAL = frozenset({"CounterSelect2", "QP1Dropped", "PortXmitWait"})
_NARROW_REQUIRED = frozenset(_NARROW) - _NARROW_OPTIONAL
#: PortCountersExtended before CounterSelect2 (64-bit fields) and after it (the error copies).
_EXT_HEAD = {**_SELECTS, **dict.fromkeys(EXT_DATA + EXT_CASTS, 64), "CounterSelect2": 32}
_EXT_TAIL = dict.fromkeys(EXT_ERRORS, 64)
_EXT_TAIL_OPTIONAL = frozenset({"PortXmitWait", "QP1Dropped"})
_EXT_REQUIRED = frozenset({*_SELECTS, *EXT_DATA})
#: Detail blocks, by kind (the attribute name, which is also the header's title): every field.
_DETAIL = {
    attr: {**_SELECTS, **{spec.pma: spec.bits for spec in specs}}
    for attr, specs in DETAIL_ATTRIBUTES.items()
}
_TITLES = {
    "port extended counters": "extended",
    "port counters": "counters",
    **{f"{attr.lower()} counters": attr for attr in _DETAIL},
}


@dataclass(frozen=True, slots=True)
class PerfBlock:
    """One ``# ...: Lid L port P (CapMask ...)`` block of perfquery output."""

    kind: str  # extended | counters | PortRcvErrorDetails | PortXmitDiscardDetails
    title: str
    lid: int | None
    port: int
    cap_mask: int | None
    cap_mask2: int | None
    fields: dict[str, int]
    #: fields printed after CounterSelect2 in an extended block (the 64-bit error copies)
    ext_errors: frozenset[str] = frozenset()
    #: 1-based line of the header, for messages
    line: int = 0


@dataclass(slots=True)
class _OpenBlock:
    """A block being read: its header, the fields so far, and whether CounterSelect2 passed."""

    header: PerfBlock
    fields: dict[str, int] = field(default_factory=dict)
    after_cs2: bool = False
    ext_errors: set[str] = field(default_factory=set)

    def add(self, name: str, value: int, lineno: int, raw: str) -> None:
        kind = self.header.kind
        tail = self.after_cs2
        if kind == "extended":
            table = _EXT_TAIL if tail else _EXT_HEAD
        else:
            table = _DETAIL.get(kind, _NARROW)
        bits = table.get(name)
        if bits is None:
            side = " after CounterSelect2" if self.after_cs2 else ""
            raise ParseError(f"field {name} does not belong in a {kind} block{side}",
                             line=lineno, text=raw)
        if name in self.fields:
            raise ParseError(f"field {name} repeated in one block", line=lineno, text=raw)
        if value >= 1 << bits:
            raise ParseError(f"{name} does not fit in {bits} bits", line=lineno, text=raw)
        self.fields[name] = value
        if kind == "extended":
            if name == "CounterSelect2":
                self.after_cs2 = True
            elif self.after_cs2:
                self.ext_errors.add(name)

    def close(self) -> PerfBlock:
        h = self.header
        have = set(self.fields)
        if h.kind == "extended":
            missing = _EXT_REQUIRED - have
            casts = have & set(EXT_CASTS)
            if casts and casts != set(EXT_CASTS):
                missing |= set(EXT_CASTS) - casts
            if self.after_cs2:
                missing |= set(EXT_ERRORS) - _EXT_TAIL_OPTIONAL - have
        elif h.kind in _DETAIL:
            missing = frozenset(_DETAIL[h.kind]) - have
        else:
            missing = _NARROW_REQUIRED - have
        if missing:
            raise ParseError(
                f"block for port {h.port} is incomplete (no {', '.join(sorted(missing))})",
                line=h.line,
            )
        if self.fields["PortSelect"] != h.port:
            raise ParseError(
                f"block for port {h.port} says PortSelect {self.fields['PortSelect']}",
                line=h.line,
            )
        return PerfBlock(
            kind=h.kind,
            title=h.title,
            lid=h.lid,
            port=h.port,
            cap_mask=h.cap_mask,
            cap_mask2=h.cap_mask2,
            fields=self.fields,
            ext_errors=frozenset(self.ext_errors),
            line=h.line,
        )


def _value(text: str) -> int:
    return int(text, 16) if text.startswith("0x") else int(text)


def _header(m: re.Match[str], lineno: int, raw: str) -> PerfBlock:
    """The block a header line opens (no fields yet); a kind ibmon does not read is refused."""
    title = m.group("title")
    kind = _TITLES.get(title.lower())
    if kind is None:
        raise ParseError(f"a {title!r} block is not one ibmon asks for", line=lineno, text=raw)
    if kind in _DETAIL and m.group("cm"):
        raise ParseError(f"a {kind} header with capability masks (perfquery prints none)",
                         line=lineno, text=raw)
    return PerfBlock(
        kind=kind,
        title=title,
        lid=int(m.group("lid")) if m.group("lid") else None,
        port=int(m.group("port")),
        cap_mask=int(m.group("cm"), 16) if m.group("cm") else None,
        cap_mask2=int(m.group("cm2"), 16) if m.group("cm2") else None,
        fields={},
        line=lineno,
    )


def parse_perfquery_blocks(text: str) -> list[PerfBlock]:
    """Every block in perfquery output, read strictly (see the module docstring).

    Raises ParseError for the whole text on the first problem: a line that is neither a
    header nor a field, an unknown or repeated field, a value too wide for its field, an
    incomplete block, a port printed twice in blocks of one kind, or output that stops in the
    middle of a line (perfquery ends every line with a newline; a missing one means the output
    was cut).
    """
    require_whole_lines(text)
    blocks: list[PerfBlock] = []
    seen: set[tuple[str, int]] = set()
    cur: _OpenBlock | None = None
    for lineno, raw in enumerate(text.split("\n")[:-1] if text else [], start=1):
        line = raw.strip()
        if not line:
            continue
        m = _PQ_HEADER.match(line)
        if m:
            if cur is not None:
                blocks.append(cur.close())
            header = _header(m, lineno, raw)
            if (header.kind, header.port) in seen:
                raise ParseError(f"port {header.port} printed twice", line=lineno, text=raw)
            seen.add((header.kind, header.port))
            cur = _OpenBlock(header)
            continue
        f = _PQ_FIELD.match(line)
        if f is None:
            raise ParseError("not a perfquery line", line=lineno, text=raw)
        if cur is None:
            raise ParseError("a field before any block header", line=lineno, text=raw)
        cur.add(f.group("name"), _value(f.group("value")), lineno, raw)
    if cur is not None:
        blocks.append(cur.close())
    return blocks


def expect_blocks(
    blocks: Iterable[PerfBlock], *, kind: str, lid: int | None, ports: Collection[int]
) -> None:
    """Refuse output that answers a different question than the one asked.

    One block of ``kind`` per port in ``ports``, each for ``lid`` (when the header names a LID),
    and nothing else. perfquery answers ``-l <lid> <ports>`` with exactly that; a missing,
    extra or foreign block means the output is not the answer to this command.
    """
    got: list[int] = []
    for b in blocks:
        if b.kind != kind:
            raise ParseError(f"{b.kind} block for port {b.port} where {kind} blocks were asked for",
                             line=b.line)
        if lid is not None and b.lid is not None and b.lid != lid:
            raise ParseError(f"a block for lid {b.lid} in the answer for lid {lid}", line=b.line)
        got.append(b.port)
    if sorted(got) != sorted(set(ports)):
        missing = sorted(set(ports) - set(got))
        extra = sorted(set(got) - set(ports))
        raise ParseError(f"ports asked {sorted(set(ports))}, answered {sorted(got)} "
                         f"(missing {missing}, not asked {extra})")


def counters_from_blocks(blocks: Iterable[PerfBlock]) -> dict[int, PortCounterValues]:
    """Blocks -> port -> counters, under the capability rules perfquery itself applies.

    Extended data fields are 64-bit; unicast and multicast are printed only with CapMask bit
    9; error fields after ``CounterSelect2`` in an extended block are the 64-bit copies, trusted
    only with CapMask2 bit 1 (or no CapMask2 in the header): without it they are reserved bytes,
    and the narrow block must supply the error counters. A narrow block's PortXmitWait is kept
    only with CapMask bit 12. A 64-bit value always wins over the narrow one.
    """
    narrow: dict[int, tuple[dict[str, int], int | None]] = {}
    wide: dict[int, tuple[dict[str, int], int | None]] = {}
    for b in blocks:
        if b.kind in _DETAIL:
            raise ParseError(f"a {b.kind} block where port counters were expected", line=b.line)
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
    return out


def parse_perfquery(text: str) -> dict[int, PortCounterValues]:
    """perfquery output (``-x``, plain, ``-l`` loops, or both concatenated) -> port -> counters.

    Strict (ParseError for the whole text, see ``parse_perfquery_blocks``); the capability
    rules are ``counters_from_blocks``'s.
    """
    return counters_from_blocks(parse_perfquery_blocks(text))


def parse_perfquery_details(
    text: str, *, attribute: str, lid: int | None, port: int
) -> dict[str, int]:
    """``perfquery -E`` (PortRcvErrorDetails) or ``-D`` (PortXmitDiscardDetails) output for
    one port -> catalogue name -> value.

    Strict: exactly one block, of ``attribute``, for ``lid`` and ``port``, with every field
    once and 16 bits wide; anything else raises ParseError for the whole text.
    """
    if attribute not in _DETAIL:
        raise ParseError(f"{attribute} is not a detail attribute")
    blocks = parse_perfquery_blocks(text)
    expect_blocks(blocks, kind=attribute, lid=lid, ports=[port])
    fields = blocks[0].fields
    return {spec.name: fields[spec.pma] for spec in DETAIL_ATTRIBUTES[attribute]}


#: PortSamplesControl as libibmad dumps it (``mad_dump_portsamples_control``, fields.c): field ->
#: width in bits. Which fields are printed depends on the libibmad release (the table grew),
#: so only the first three are required; any field must still be one of these, once.
_SAMPLES_CONTROL = {
    "OpCode": 8, "PortSelect": 8, "Tick": 8, "CounterWidth": 3, "CounterMask0": 3,
    "CounterMasks1to9": 27, "CounterMasks10to14": 15, "SampleMechanisms": 8, "SampleStatus": 2,
    "OptionMask": 64, "VendorMask": 64, "SampleStart": 32, "SampleInterval": 32, "Tag": 16,
    **{f"CounterSelect{i}": 16 for i in range(15)},
    "SamplesOnlyOptionMask": 64,
}
_SAMPLES_CONTROL_REQUIRED = ("OpCode", "PortSelect", "Tick")


def parse_perfquery_tick(text: str, *, lid: int | None, port: int) -> int:
    """``perfquery -c <lid> <port>`` output -> PortSamplesControl.Tick, what one PortXmitWait
    count of the port stands for (``ibmon.infiniband.xmitwait.unit_for``).

    Strict, like every parser here: one ``# PortSamplesControl: Lid L port P`` header for the
    LID and port asked, then only PortSamplesControl fields, each once and fitting its width,
    with PortSelect equal to the port; anything else raises ParseError for the whole text.
    """
    require_whole_lines(text)
    header: re.Match[str] | None = None
    fields: dict[str, int] = {}
    for lineno, raw in enumerate(text.split("\n")[:-1] if text else [], start=1):
        line = raw.strip()
        if not line:
            continue
        m = _PQ_HEADER.match(line)
        if m is not None:
            if header is not None:
                raise ParseError("a second block header", line=lineno, text=raw)
            if m.group("title").lower() != "portsamplescontrol" or m.group("cm"):
                raise ParseError("not a PortSamplesControl header", line=lineno, text=raw)
            if int(m.group("port")) != port or (
                lid is not None and m.group("lid") and int(m.group("lid")) != lid
            ):
                raise ParseError(f"not the answer for lid {lid} port {port}", line=lineno,
                                 text=raw)
            header = m
            continue
        f = _PQ_FIELD.match(line)
        if f is None:
            raise ParseError("not a perfquery line", line=lineno, text=raw)
        if header is None:
            raise ParseError("a field before the block header", line=lineno, text=raw)
        name, value = f.group("name"), _value(f.group("value"))
        bits = _SAMPLES_CONTROL.get(name)
        if bits is None:
            raise ParseError(f"field {name} does not belong in PortSamplesControl",
                             line=lineno, text=raw)
        if name in fields:
            raise ParseError(f"field {name} repeated", line=lineno, text=raw)
        if value >= 1 << bits:
            raise ParseError(f"{name} does not fit in {bits} bits", line=lineno, text=raw)
        fields[name] = value
    if header is None:
        raise ParseError("no PortSamplesControl block")
    missing = [n for n in _SAMPLES_CONTROL_REQUIRED if n not in fields]
    if missing:
        raise ParseError(f"PortSamplesControl block is incomplete (no {', '.join(missing)})")
    if fields["PortSelect"] != port:
        raise ParseError(f"PortSamplesControl for port {port} says PortSelect "
                         f"{fields['PortSelect']}")
    return fields["Tick"]
