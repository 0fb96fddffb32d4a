"""``ibroute -n <lid>``: a switch's unicast LinearForwardingTable as infiniband-diags prints it.

The format (rdma-core ``infiniband-diags/ibroute.c``, ``dump_unicast_tables``; ``-n`` leaves
the destination column empty; every line but the first two ends in a space, shown here
as ``~``)::

    Unicast lids [0x0-0xf] of switch Lid 5 guid 0x0002c90100000010 (leaf02):
      Lid  Out   Destination
           Port     Info~
    0x0001 003~
    0x0005 000~
    ...
    15 valid lids dumped~

The header's end LID is the switch's SwitchInfo.LinearFDBTop (ibroute reads blocks up to it).
Only entries whose port is at most the switch's port count are printed ("valid"): every LID not
printed has no route (``0xff`` in the table built here). A block read that fails makes ibroute
print "SubnGet() failed" on stderr and stop *with exit status 0* and no "lids dumped" line, so
that line is required: an output without it is refused whole, like any line out of format.

One quirk of ibroute is kept as it is: it reads blocks ``[start/64, ALIGN(top, 64)/64)``, so
when LinearFDBTop is a non-zero multiple of 64 the block holding the top LID itself is never
read and that LID shows no route here (the ``mad`` source reads it).
"""

from __future__ import annotations

import re
from typing import NamedTuple

from ibmon.sources.parse.errors import ParseError, require_whole_lines

__all__ = ["MAX_UNICAST_LID", "UnicastTable", "parse_ibroute"]

#: IB_MAX_UCAST_LID: the last unicast LID (0xc000 and up are multicast).
MAX_UNICAST_LID = 0xBFFF
NO_ROUTE = 0xFF

_HEADER = re.compile(
    r"Unicast lids \[0x(?P<start>[0-9a-f]+)-0x(?P<end>[0-9a-f]+)\] of switch "
    r"Lid (?P<lid>\d+) "
    r"guid (?P<guid>0x[0-9a-f]{16}) \((?P<desc>.*)\):",
    re.DOTALL,
)
_COLUMNS = "\n  Lid  Out   Destination\n       Port     Info \n"
_ENTRY = re.compile(r"0x(?P<lid>[0-9a-f]{4,}) (?P<port>\d{3}) ")
_TRAILER = re.compile(r"(?P<n>\d+) valid lids dumped ")


class UnicastTable(NamedTuple):
    """One switch's table: its node GUID, LinearFDBTop (the header's end LID) and the
    egress port per LID ``0..top`` (``0xff``: no route)."""

    guid: str
    top: int
    table: bytes


def parse_ibroute(
    text: str, *, lid: int | None = None, num_ports: int | None = None
) -> UnicastTable:
    """The table in ``ibroute -n <lid>`` output; ParseError for anything else.

    ``lid``: the LID ibroute was asked, which the header must name. ``num_ports``: the
    switch's port count, when known: a port above it is out of format (ibroute prints only
    entries up to it).
    """
    require_whole_lines(text)
    cut = text.find(_COLUMNS)
    if cut < 0:
        first = text.split("\n", 1)[0]
        raise ParseError("no ibroute unicast table header", line=1, text=first)
    head = _HEADER.fullmatch(text[:cut])
    if head is None:
        raise ParseError("not an ibroute unicast table header", line=1, text=text[:cut])
    if lid is not None and int(head["lid"]) != lid:
        raise ParseError(f"table of another switch than LID {lid}", line=1, text=text[:cut])
    start, top = int(head["start"], 16), int(head["end"], 16)
    if start != 0 or top > MAX_UNICAST_LID:
        raise ParseError("table range is not 0..LinearFDBTop", line=1, text=text[:cut])
    base = text.count("\n", 0, cut) + 3  # the line number of the last column-header line
    lines = text[cut + len(_COLUMNS):].split("\n")
    assert lines[-1] == ""  # whole lines: the text ends in a newline
    lines.pop()
    if not lines:
        raise ParseError("no 'lids dumped' line (ibroute stopped early)", line=base)
    trailer = _TRAILER.fullmatch(lines[-1])
    if trailer is None:
        raise ParseError("no 'lids dumped' line (ibroute stopped early)",
                         line=base + len(lines), text=lines[-1])
    limit = 254 if num_ports is None else num_ports
    table = bytearray([NO_ROUTE]) * (top + 1)
    last = -1
    for i, line in enumerate(lines[:-1]):
        m = _ENTRY.fullmatch(line)
        lineno = base + 1 + i
        if m is None:
            raise ParseError("not an 'ibroute -n' entry", line=lineno, text=line)
        dlid, port = int(m["lid"], 16), int(m["port"])
        if dlid <= last or dlid > top:
            raise ParseError("LID out of order or past the table's top", line=lineno, text=line)
        if port > limit:
            raise ParseError(f"port past the switch's {limit} ports", line=lineno, text=line)
        table[dlid] = port
        last = dlid
    if int(trailer["n"]) != len(lines) - 1:
        raise ParseError(f"{trailer['n']} lids announced, {len(lines) - 1} listed",
                         line=base + len(lines), text=lines[-1])
    return UnicastTable(head["guid"], top, bytes(table))
