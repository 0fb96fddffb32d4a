"""The ``mad`` source's table reads: SwitchInfo.LinearFDBTop decoding, the block plan and how
the answers become ``Topology.forwarding`` (ibsim's tables are checked end to end in
tests/integration/test_forwarding_ibsim.py)."""

from __future__ import annotations

from ibmon.sources.libibmad import ATTR_LINEAR_FWD_TBL, CLASS_SMI, MadResult
from ibmon.sources.mad import MadSource, SweepResult, _fdb_top, _Node
from ibmon.sources.parse import NodeInfo, PortInfo


def _switch(guid: str, ports: int, lid: int, top: int | None) -> _Node:
    info = NodeInfo("switch", ports, guid, guid, guid, 0, 0, 0)
    port0 = PortInfo(lid, 1, 0, 0, 0, 0, 0, 0, 4, 5, 0, 0, 0, 0, 0, 0, 0)
    return _Node(info=info, path=(1,), desc="sw", ports={0: port0}, fdb_top=top)


def _sweep() -> SweepResult:
    res = SweepResult()
    res.nodes["0x01"] = _switch("0x01", 8, 3, 70)  # two blocks
    res.nodes["0x02"] = _switch("0x02", 8, 4, 10)  # one block
    res.nodes["0x03"] = _switch("0x03", 8, 5, None)  # SwitchInfo lost: no blocks
    return res


def test_linear_fdb_top_is_bits_48_to_63() -> None:
    data = bytes([0xC0, 0x00, 0, 0, 0, 0, 0x01, 0x2C]) + bytes(56)  # LinearFdbCap 49152
    assert _fdb_top(data) == 300


def test_blocks_up_to_the_top_of_each_switch_with_switch_info() -> None:
    sweep = _sweep()
    plan = MadSource(forwarding_tables=True)._table_plan(sweep)
    assert [(g, r.attr_mod, r.lid) for g, r in plan] == [("0x01", 0, 3), ("0x01", 1, 3),
                                                          ("0x02", 0, 4)]
    assert all(r.mgmt_class == CLASS_SMI and r.attr_id == ATTR_LINEAR_FWD_TBL and r.path is None
               for _g, r in plan)


def test_tables_cut_at_the_top_and_ports_past_the_switch_are_no_route() -> None:
    sweep = _sweep()
    plan = MadSource(forwarding_tables=True)._table_plan(sweep)
    block0 = bytes([0xFF, 0, 1, 2, 9, 200] + [3] * 58)
    block1 = bytes([4] * 64)
    got = MadSource._read_tables(sweep, plan, iter([
        MadResult(block0), MadResult(block1), MadResult(None, "timeout")]))
    assert set(got) == {"0x01"}  # 0x02's block was lost: left out
    table = got["0x01"]
    assert len(table) == 71
    assert list(table[:6]) == [0xFF, 0, 1, 2, 0xFF, 0xFF]
    assert table[64:] == bytes([4] * 7)
    assert [(e.reason, e.detail) for e in sweep.errors] == [
        ("timeout", "0x02: LinearForwardingTable block 0")]


def test_a_top_past_the_unicast_lids_is_refused_not_read() -> None:
    """LinearFDBTop above 0xBFFF (the last unicast LID) is a bad value: no blocks are asked for
    it, and the switch's table is left out with an error; 0xBFFF itself is read."""
    sweep = SweepResult()
    sweep.nodes["0x01"] = _switch("0x01", 8, 3, 0xC000)
    sweep.nodes["0x02"] = _switch("0x02", 8, 4, 0xBFFF)
    plan = MadSource(forwarding_tables=True)._table_plan(sweep)
    assert {g for g, _r in plan} == {"0x02"} and len(plan) == 0xBFFF // 64 + 1
    assert [(e.reason, e.detail) for e in sweep.errors] == [
        ("bad_value", "0x01: SwitchInfo.LinearFDBTop 49152 past the unicast LIDs")]
