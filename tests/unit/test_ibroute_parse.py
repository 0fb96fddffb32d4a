"""``ibroute -n`` parsing on output recorded from ibsim + opensm (infiniband-diags 1.x /
rdma-core), and the ways a cut or foreign output is refused whole."""

from __future__ import annotations

import pytest

from ibmon.sources.parse.errors import ParseError
from ibmon.sources.parse.ibroute import parse_ibroute

# ``ibroute -n 5`` on a 4-leaf, 3-spine radix-8 tree (mocks.topology.fat_tree) after opensm:
# leaf02's hosts on ports 1-2, uplinks 3-8. Lines end in a space, as ibroute prints them.
LEAF02 = (
    "Unicast lids [0x0-0xf] of switch Lid 5 guid 0x0002c90100000010 (leaf02):\n"
    "  Lid  Out   Destination\n"
    "       Port     Info \n"
    "0x0001 003 \n0x0002 005 \n0x0003 007 \n0x0004 003 \n0x0005 000 \n0x0006 003 \n"
    "0x0007 003 \n0x0008 003 \n0x0009 004 \n0x000a 001 \n0x000b 002 \n0x000c 005 \n"
    "0x000d 006 \n0x000e 007 \n0x000f 008 \n"
    "15 valid lids dumped \n"
)


def test_a_recorded_table() -> None:
    got = parse_ibroute(LEAF02, lid=5, num_ports=8)
    assert got.guid == "0x0002c90100000010"
    assert got.top == 15
    assert list(got.table) == [0xFF, 3, 5, 7, 3, 0, 3, 3, 3, 4, 1, 2, 5, 6, 7, 8]


def test_lids_not_printed_have_no_route() -> None:
    text = LEAF02.replace("0x0009 004 \n", "").replace("15 valid", "14 valid")
    assert parse_ibroute(text).table[9] == 0xFF


def test_a_description_with_odd_characters_is_only_a_description() -> None:
    text = LEAF02.replace("(leaf02):", "(leaf (02)):\n0x0001 009 ):")
    assert parse_ibroute(text, lid=5).table[1] == 3


@pytest.mark.parametrize(
    ("text", "why"),
    [
        # SubnGet failed mid-table: ibroute exits 0 without the trailer
        (LEAF02.rsplit("15 valid", 1)[0], "lids dumped"),
        (LEAF02.replace("15 valid", "16 valid"), "announced"),
        (LEAF02.replace("0x0003 007 \n", "0x0003 007 : (Switch portguid 0x1: 'x')\n"), "entry"),
        (LEAF02.replace("0x0004 003 \n", "0x0002 003 \n"), "order"),
        (LEAF02.replace("0x0004 003 \n", "0x0003 003 \n"), "order"),  # a LID twice
        (LEAF02.replace("[0x0-0xf]", "[0x1-0xf]"), "0..LinearFDBTop"),
        (LEAF02.replace("[0x0-0xf]", "[0x0-0xc000]"), "0..LinearFDBTop"),  # multicast LIDs
        (LEAF02.replace("0x000f 008 \n", "0x0010 008 \n"), "top"),
        (LEAF02.replace("0x000e 007 \n", "0x000e 009 \n"), "ports"),
        (LEAF02.replace("Lid 5 ", "Lid 6 "), "another switch"),
        (LEAF02.replace("Unicast", "Multicast"), "header"),
        (LEAF02[:-1], "cut short"),
        ("ibroute: iberror: failed: dump tables: node info failed: valid addr?\n", "header"),
        ("", "header"),
    ],
)
def test_junk_is_refused_whole(text: str, why: str) -> None:
    with pytest.raises(ParseError, match=why):
        parse_ibroute(text, lid=5, num_ports=8)


def test_without_the_port_count_a_port_past_254_is_refused() -> None:
    """Port 255 is "no route" in the table itself: ibroute never prints it as an egress."""
    with pytest.raises(ParseError, match="254 ports"):
        parse_ibroute(LEAF02.replace("0x000e 007 \n", "0x000e 255 \n"))
