"""``decode_counters`` (the ``mad`` source's one-pass decode) against the field-by-field way:
``merge_counters`` of each attribute read at its offsets (``tests/pma_reference.py``).

Both must agree on every value, the key order (rendering and the golden exposition follow it),
which counters are 64-bit, and which payloads they refuse, for every combination of capability
mask bits the decoders look at and of the attributes read.
"""

from __future__ import annotations

import itertools
import random

import pytest

from ibmon.sources.parse import ParseError, decode_counters
from ibmon.sources.parse.pma import (
    CPI_CAP2_ADDL_EXT,
    CPI_CAP_EXT_WIDTH,
    CPI_CAP_EXT_WIDTH_NOIETF,
    CPI_CAP_XMIT_WAIT,
)
from tests.pma_reference import counters as _reference

#: Every subset of the CapabilityMask bits the decoders read (plus an unrelated bit), and None.
CAP_MASKS: list[int | None] = [None] + [
    sum(bits)
    for n in range(5)
    for bits in itertools.combinations(
        (CPI_CAP_EXT_WIDTH, CPI_CAP_EXT_WIDTH_NOIETF, CPI_CAP_XMIT_WAIT, 1 << 8), n
    )
]
CAP_MASKS2: list[int | None] = [None, 0, CPI_CAP2_ADDL_EXT, CPI_CAP2_ADDL_EXT | 1]


def _payload(rng: random.Random, style: str) -> bytes:
    if style == "zero":
        return bytes(192)
    if style == "max":
        return b"\xff" * 192
    return rng.randbytes(192)


@pytest.mark.parametrize("cap", CAP_MASKS)
@pytest.mark.parametrize("cap2", CAP_MASKS2)
def test_same_values_order_and_width_as_the_field_by_field_merge(
    cap: int | None, cap2: int | None
) -> None:
    rng = random.Random(f"{cap}/{cap2}")
    for reads, style in itertools.product(
        ((True, True), (True, False), (False, True), (False, False)), ("random", "zero", "max")
    ):
        for _ in range(8 if style == "random" else 1):
            narrow = _payload(rng, style) if reads[0] else None
            ext = _payload(rng, style) if reads[1] else None
            want = _reference(narrow, ext, cap, cap2)
            got = decode_counters(narrow, ext, cap, cap2)
            assert list(got.counters.items()) == list(want.counters.items())
            assert got.wide == want.wide


def test_a_port_counts_only_the_fields_its_masks_allow() -> None:
    """Not only agreement: the masks decide (a reference bug would be copied otherwise)."""
    data = bytes(range(192))
    full = decode_counters(data, data, CPI_CAP_EXT_WIDTH | CPI_CAP_XMIT_WAIT, CPI_CAP2_ADDL_EXT)
    bare = decode_counters(data, data, 0, 0)
    assert "transmit_wait" in full.counters and "transmit_wait" not in bare.counters
    # no extended support claimed: the 64-bit data fields are not trusted, the 32-bit ones are
    assert bare.counters["transmit_data"] == int.from_bytes(data[24:28], "big")
    assert full.counters["transmit_data"] == int.from_bytes(data[8:16], "big")
    assert "transmit_data" in full.wide and "transmit_data" not in bare.wide
    assert full.counters["symbol_errors"] == int.from_bytes(data[72:80], "big")
    assert bare.counters["symbol_errors"] == int.from_bytes(data[4:6], "big")
    assert decode_counters(None, None, 0, 0).counters == {}


@pytest.mark.parametrize(
    ("narrow", "ext", "cap2", "message"),
    [
        (bytes(43), None, 0, "PortCounters payload shorter than 44 bytes"),
        (None, bytes(71), 0, "PortCountersExtended payload shorter than 72 bytes"),
        (None, bytes(183), CPI_CAP2_ADDL_EXT, "too short for its 64-bit error copies"),
    ],
)
def test_short_payloads_are_refused_like_the_decoders_refuse_them(
    narrow: bytes | None, ext: bytes | None, cap2: int, message: str
) -> None:
    with pytest.raises(ParseError, match=message):
        _reference(narrow, ext, CPI_CAP_EXT_WIDTH, cap2)
    with pytest.raises(ParseError, match=message):
        decode_counters(narrow, ext, CPI_CAP_EXT_WIDTH, cap2)


@pytest.mark.parametrize(("narrow", "ext"), [(True, False), (False, True), (True, True)])
def test_a_reply_for_another_port_is_refused_like_the_decoders_refuse_it(
    narrow: bool, ext: bool
) -> None:
    """Each attribute echoes the PortSelect it answers (byte 1): a reply naming another port
    is refused whole, by either way of decoding, and one naming the port asked is read."""
    rng = random.Random(7)
    own = bytearray(rng.randbytes(184))
    own[1] = 3
    other = bytearray(own)
    other[1] = 4
    for payload, ok in ((bytes(own), True), (bytes(other), False)):
        args = (payload if narrow else None, payload if ext else None,
                CPI_CAP_EXT_WIDTH, CPI_CAP2_ADDL_EXT)
        if ok:
            assert decode_counters(*args, port=3) == _reference(*args, port=3)
        else:
            with pytest.raises(ParseError, match="for port 4 where port 3 was asked"):
                _reference(*args, port=3)
            with pytest.raises(ParseError, match="for port 4 where port 3 was asked"):
                decode_counters(*args, port=3)
        assert decode_counters(*args) == _reference(*args)  # no port: nothing to compare
