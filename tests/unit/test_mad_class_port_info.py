"""ClassPortInfo in the ``mad`` source: the discovery asks it for every LID it will poll (while
it builds the view), and a LID that did not answer then costs its ports' counters on the first
poll, exactly as if that poll had asked it: one attempt per poll, never two in a row."""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence

from ibmon.sources.libibmad import ATTR_CLASS_PORT_INFO, MadRequest, MadResult
from ibmon.sources.mad import MadSource, _kinds
from ibmon.sources.parse import (
    CPI_CAP2_ADDL_EXT,
    CPI_CAP_EXT_WIDTH,
    CPI_CAP_EXT_WIDTH_NOIETF,
    ClassPortInfo,
)


class CpiSource(MadSource):
    """Answers ClassPortInfo Gets here: LIDs in ``dead`` time out, the others answer."""

    def __init__(self) -> None:
        super().__init__()
        self.dead: set[int] = set()
        self.asked: list[int] = []

    def _results(self, reqs: Sequence[MadRequest], *, keep: bool = True) -> Iterator[MadResult]:
        out = []
        for r in reqs:
            assert r.attr_id == ATTR_CLASS_PORT_INFO
            self.asked.append(r.lid)
            data = bytearray(192)
            struct.pack_into(">H", data, 2, 0x1200)
            out.append(MadResult(None, "timeout") if r.lid in self.dead else MadResult(bytes(data)))
        return iter(out)


BY_LID = {2: [("0x0000000000000002", "1")], 3: [("0x0000000000000003", "1"),
                                              ("0x0000000000000003", "2")]}


def test_a_lid_the_discovery_asked_in_vain_is_the_first_polls_failure_not_asked_twice() -> None:
    src = CpiSource()
    src._cpi_failed = {3: "timeout"}  # what a discovery leaves when LID 3 did not answer
    src._cpi = {}
    errors, mads = src._learn_class_port_info(BY_LID)
    assert src.asked == [2] and mads == 1
    assert [(e.reason, e.key) for e in errors] == [
        ("timeout", ("0x0000000000000003", "1")), ("timeout", ("0x0000000000000003", "2"))
    ]
    assert set(src._cpi) == {2}
    # the next poll asks it again
    src.asked.clear()
    errors, mads = src._learn_class_port_info(BY_LID)
    assert src.asked == [3] and mads == 1 and errors == []
    assert set(src._cpi) == {2, 3}


def test_a_lid_that_does_not_answer_the_poll_is_asked_again_by_the_next() -> None:
    src = CpiSource()
    src.dead = {2}
    errors, _ = src._learn_class_port_info(BY_LID)
    assert sorted(src.asked) == [2, 3]
    assert [(e.reason, e.key) for e in errors] == [("timeout", ("0x0000000000000002", "1"))]
    src.asked.clear()
    src.dead = set()
    errors, _ = src._learn_class_port_info(BY_LID)
    assert src.asked == [2] and errors == []


def test_a_malformed_answer_costs_that_lids_counters_not_the_poll() -> None:
    src = CpiSource()

    def short(reqs: Sequence[MadRequest], *, keep: bool = True) -> Iterator[MadResult]:
        return iter([MadResult(b"\0" * 4) for _ in reqs])

    src._results = short  # type: ignore[method-assign]
    errors, _ = src._learn_class_port_info({2: BY_LID[2]})
    assert [(e.reason, e.key) for e in errors] == [("parse_error", ("0x0000000000000002", "1"))]
    assert src._cpi == {}


def test_the_masks_decide_which_counter_attributes_a_port_is_read_with() -> None:
    """PortCountersExtended when either extended-width bit is set (with or without the
    unicast/multicast fields), PortCounters beside it unless CapMask2 says the error counters
    have 64-bit copies, PortCounters alone without an extended set."""
    assert _kinds(ClassPortInfo(0, 0)) == ("narrow",)
    assert _kinds(ClassPortInfo(0, CPI_CAP2_ADDL_EXT)) == ("narrow",)
    assert _kinds(ClassPortInfo(CPI_CAP_EXT_WIDTH, 0)) == ("ext", "narrow")
    assert _kinds(ClassPortInfo(CPI_CAP_EXT_WIDTH_NOIETF, 0)) == ("ext", "narrow")
    assert _kinds(ClassPortInfo(CPI_CAP_EXT_WIDTH_NOIETF, CPI_CAP2_ADDL_EXT)) == ("ext",)
