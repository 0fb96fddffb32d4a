"""Parsers on real captures, hostile input, and the binary decoders against libibmad itself."""

from __future__ import annotations

import ctypes
import random
import re
import struct
from pathlib import Path

import pytest

from ibmon.infiniband.counters import DETAIL_ATTRIBUTES, DETAILS
from ibmon.infiniband.linkspeed import active_speed, effective_rate_bps, is_degraded, max_common
from ibmon.infiniband.model import Topology
from ibmon.sources.parse import (
    ParseError,
    PortInfo,
    clean_node_desc,
    decode_class_port_info,
    decode_details,
    decode_node_info,
    decode_port_info,
    has_mlnx_ext_port_info,
    may_be_fdr10,
    parse_ibnd_cache,
    parse_ibnetdiscover,
    parse_ibnetdiscover_ports,
    parse_node_name_map,
    parse_perfquery,
    parse_perfquery_details,
    parse_topology_file,
    topology_from_ports,
    with_mlnx_speeds,
)
from ibmon.sources.shard import assign_nodes, filter_topology, parse_shard
from mocks.topology import fat_tree
from tests.fixtures import real_fixture, real_fixtures
from tests.pma_reference import port_counters, port_counters_ext
from tests.syspkg import require_library

IBX = "infiniband_exporter/collectors/fixtures"
TOPO = "ibtopotool/tests"


def ibx(relative: str) -> Path:
    """A treydock/infiniband_exporter capture (skips locally when absent, fails in CI)."""
    return real_fixture(f"{IBX}/{relative}")


def topo_capture(name: str) -> Path:
    """A jabl/ibtopotool capture (skips locally when absent, fails in CI)."""
    return real_fixture(f"{TOPO}/{name}")


# ------------------------------------------------------------------ perfquery, real captures


def test_perfquery_switch_two_ports_capmask2() -> None:
    text = ibx("perfquery/0x7cfe9003009ce5b0.out").read_text()
    ports = parse_perfquery(text)
    assert sorted(ports) == [1, 2]
    p1, p2 = ports[1], ports[2]
    assert p1.counters["transmit_data"] == 36298026860928
    assert p1.counters["receive_data"] == 12279028775751
    assert p1.counters["multicast_receive_packets"] == 5584846741
    assert p1.counters["transmit_wait"] == 22730501
    assert p2.counters["receive_data"] == 39078804993378
    assert p2.counters["transmit_wait"] == 36510964
    # CapMask2 bit 1: the error counters are the 64-bit copies
    assert {"symbol_errors", "transmit_wait", "link_downed", "transmit_data"} <= p1.wide


def test_perfquery_capmask2_zero_error_fields_not_trusted() -> None:
    # CapMask2 0: the bytes after CounterSelect2 are reserved; only a narrow query gives errors.
    text = ibx("perfquery/0x7cfe9003003b4b96.out").read_text()
    ports = parse_perfquery(text)
    c = ports[1]
    assert c.counters["transmit_data"] == 37108676853855
    assert c.counters["unicast_transmit_packets"] == 96916572630
    assert "symbol_errors" not in c.counters
    assert "symbol_errors" not in c.wide


def test_perfquery_switch_errors_and_empty_file() -> None:
    ports = parse_perfquery(ibx("perfquery/0x506b4b03005c2740.out").read_text())
    assert ports[1].counters["transmit_discards"] == 20046
    assert ports[1].counters["receive_switch_relay_errors"] == 7
    assert ports[1].counters["link_downed"] == 1
    empty = parse_perfquery(ibx("perfquery/0x506b4b0300cc02a6.out").read_text())
    assert empty == {}


def test_perfquery_counters_refuse_a_details_block() -> None:
    # a PortRcvErrorDetails block where port counters were asked for is not the answer
    text = ibx("perfquery-rcv-error/0x7cfe9003009ce5b0-2.out").read_text()
    with pytest.raises(ParseError, match="a PortRcvErrorDetails block where port counters"):
        parse_perfquery(text)


SIM_CONNECT = 'ibwarn: [123] sim_connect: attached as client 1 at node "S-0002c90200000000"\n'
SIM_EXT = """# Port extended counters: Lid 3 port 4 (CapMask: 0x1300 CapMask2: 0x0000000)
PortSelect:......................4
CounterSelect:...................0x0000
PortXmitData:....................18446744073709551615
PortRcvData:.....................12
PortXmitPkts:....................13
PortRcvPkts:.....................14
PortUnicastXmitPkts:.............15
PortUnicastRcvPkts:..............16
PortMulticastXmitPkts:...........17
PortMulticastRcvPkts:............0
"""
SIM_NARROW = """# Port counters: Lid 3 port 4 (CapMask: 0x1300)
PortSelect:......................4
CounterSelect:...................0x0000
SymbolErrorCounter:..............100
LinkErrorRecoveryCounter:........101
LinkDownedCounter:...............102
PortRcvErrors:...................103
PortRcvRemotePhysicalErrors:.....104
PortRcvSwitchRelayErrors:........105
PortXmitDiscards:................106
PortXmitConstraintErrors:........107
PortRcvConstraintErrors:.........108
CounterSelect2:..................0x00
LocalLinkIntegrityErrors:........15
ExcessiveBufferOverrunErrors:....15
QP1Dropped:......................111
VL15Dropped:.....................111
PortXmitData:....................112
PortRcvData:.....................113
PortXmitPkts:....................114
PortRcvPkts:.....................115
PortXmitWait:....................116
"""


def test_perfquery_extended_plus_narrow_merge() -> None:
    ports = parse_perfquery(SIM_EXT + SIM_NARROW)
    c = ports[4]
    assert c.counters["transmit_data"] == 2**64 - 1  # the 64-bit copy wins over 112
    assert c.counters["receive_data"] == 12
    assert c.counters["symbol_errors"] == 100
    assert c.counters["transmit_wait"] == 116  # CapMask bit 12 set
    assert "transmit_data" in c.wide and "symbol_errors" not in c.wide
    # libibmad decodes the narrow QP1Dropped from VL15Dropped's bits: never taken from there
    assert c.counters["vl15_dropped"] == 111 and "qp1_dropped" not in c.counters


def test_perfquery_xmit_wait_dropped_without_capmask_bit12() -> None:
    ports = parse_perfquery(SIM_NARROW.replace("0x1300", "0x0300"))
    assert "transmit_wait" not in ports[4].counters


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (SIM_CONNECT + SIM_NARROW, "line 1: not a perfquery line: 'ibwarn"),
        (SIM_NARROW + "PortXmitData:....................banana\n", "not a perfquery line"),
        (SIM_NARROW + "%%%\n", "line 23: not a perfquery line: '%%%'"),
        # counter-shaped junk after the last block: a repeated field, never a new total
        (SIM_EXT + "PortXmitData:....................123456789\n", "PortXmitData repeated"),
        (SIM_EXT + SIM_EXT, "port 4 printed twice"),
        (SIM_EXT.replace("PortRcvPkts:.....................14\n", ""), "incomplete"),
        # perfquery prints the four unicast/multicast fields together or not at all
        (SIM_EXT.replace("PortMulticastRcvPkts:............0\n", ""),
         "incomplete (no PortMulticastRcvPkts)"),
        (SIM_EXT.replace("PortXmitPkts", "PortXmitPackets"), "PortXmitPackets does not belong"),
        # the 64-bit error copies after CounterSelect2 come all together too
        (SIM_EXT + "CounterSelect2:..................0x00000000\n"
                   "SymbolErrorCounter:..............1\n", "incomplete (no ExcessiveBuffer"),
        (SIM_NARROW.replace("LinkDownedCounter:...............102",
                            "LinkDownedCounter:...............256"), "does not fit in 8 bits"),
        (SIM_NARROW.replace("PortSelect:......................4",
                            "PortSelect:......................5"), "says PortSelect 5"),
        (SIM_NARROW[:-3], "ends in the middle of a line"),
        ("PortXmitData:....1\n", "a field before any block header"),
        # a block of another attribute (perfquery -c, -X): not one ibmon asked for
        ("# PortSamplesControl: Lid 2 port 1\nTick:....0x07\n",
         "a 'PortSamplesControl' block is not one ibmon asks for"),
    ],
)
def test_perfquery_refuses_the_whole_output(text: str, problem: str) -> None:
    with pytest.raises(ParseError, match=re.escape(problem)):
        parse_perfquery(text)


@pytest.mark.parametrize("name", [
    "0x506b4b03005c2740-1.out", "0x7cfe9003003b4b96-1.out", "0x7cfe9003003b4bde-1.out",
    "0x7cfe9003009ce5b0-1.out", "0x7cfe9003009ce5b0-2.out",
])
def test_perfquery_rcv_error_details_real_captures(name: str) -> None:
    text = ibx(f"perfquery-rcv-error/{name}").read_text()
    m = re.search(r"Lid (\d+) port (\d+)", text)
    assert m is not None
    got = parse_perfquery_details(text, attribute="PortRcvErrorDetails", lid=int(m[1]),
                                  port=int(m[2]))
    assert got == dict.fromkeys(DETAILS["receive_errors"], 0)


# What perfquery -E / -D print against ibsim (captured, values set with PerformanceSet).
SIM_RCV_DETAILS = """# PortRcvErrorDetails counters: Lid 1 port 3
PortSelect:......................3
CounterSelect:...................0x0000
PortLocalPhysicalErrors:.........7
PortMalformedPktErrors:..........1
PortBufferOverrunErrors:.........2
PortDLIDMappingErrors:...........3
PortVLMappingErrors:.............4
PortLoopingErrors:...............65535
"""
SIM_XMIT_DETAILS = """# PortXmitDiscardDetails counters: Lid 1 port 1
PortSelect:......................1
CounterSelect:...................0x0000
PortInactiveDiscards:............9
PortNeighborMTUDiscards:.........0
PortSwLifetimeLimitDiscards:.....0
PortSwHOQLifetimeLimitDiscards:..65535
"""


def test_perfquery_details_values_by_catalogue_name() -> None:
    rcv = parse_perfquery_details(SIM_RCV_DETAILS, attribute="PortRcvErrorDetails", lid=1,
                                  port=3)
    assert rcv == {
        "receive_local_physical_errors": 7, "receive_malformed_packet_errors": 1,
        "receive_buffer_overrun_errors": 2, "receive_dlid_mapping_errors": 3,
        "receive_vl_mapping_errors": 4, "receive_looping_errors": 65535,
    }
    xmit = parse_perfquery_details(SIM_XMIT_DETAILS, attribute="PortXmitDiscardDetails", lid=1,
                                   port=1)
    assert xmit == {
        "transmit_inactive_discards": 9, "transmit_neighbor_mtu_discards": 0,
        "transmit_sw_lifetime_limit_discards": 0, "transmit_sw_hoq_lifetime_limit_discards": 65535,
    }


@pytest.mark.parametrize(
    ("text", "attribute", "lid", "port", "problem"),
    [
        (SIM_RCV_DETAILS, "PortXmitDiscardDetails", 1, 3, "PortRcvErrorDetails block for port 3"),
        (SIM_RCV_DETAILS, "PortRcvErrorDetails", 2, 3, "a block for lid 1 in the answer for lid 2"),
        (SIM_RCV_DETAILS, "PortRcvErrorDetails", 1, 4, "missing [4], not asked [3]"),
        (SIM_RCV_DETAILS + SIM_XMIT_DETAILS, "PortRcvErrorDetails", 1, 3,
         "PortXmitDiscardDetails block for port 1"),
        (SIM_RCV_DETAILS + SIM_RCV_DETAILS, "PortRcvErrorDetails", 1, 3, "port 3 printed twice"),
        (SIM_RCV_DETAILS.replace("PortLoopingErrors:...............65535\n", ""),
         "PortRcvErrorDetails", 1, 3, "incomplete (no PortLoopingErrors)"),
        (SIM_RCV_DETAILS.replace("65535", "65536"), "PortRcvErrorDetails", 1, 3,
         "PortLoopingErrors does not fit in 16 bits"),
        (SIM_RCV_DETAILS + "PortLoopingErrors:...............1\n", "PortRcvErrorDetails", 1, 3,
         "PortLoopingErrors repeated"),
        (SIM_RCV_DETAILS.replace("Lid 1 port 3", "Lid 1 port 3 (CapMask: 0x1300)"),
         "PortRcvErrorDetails", 1, 3, "with capability masks"),
        (SIM_RCV_DETAILS.replace("PortMalformedPkt", "PortMalformedPacket"),
         "PortRcvErrorDetails", 1, 3, "PortMalformedPacketErrors does not belong"),
        (SIM_XMIT_DETAILS.replace("PortInactiveDiscards", "PortLocalPhysicalErrors"),
         "PortXmitDiscardDetails", 1, 1, "PortLocalPhysicalErrors does not belong"),
        (SIM_RCV_DETAILS.replace("PortSelect:......................3",
                                 "PortSelect:......................4"),
         "PortRcvErrorDetails", 1, 3, "says PortSelect 4"),
        (SIM_CONNECT + SIM_RCV_DETAILS, "PortRcvErrorDetails", 1, 3, "not a perfquery line"),
        ("perfquery: iberror: failed: cannot query PortRcvErrorDetails\n",
         "PortRcvErrorDetails", 1, 3, "not a perfquery line"),
        (SIM_RCV_DETAILS[:-4], "PortRcvErrorDetails", 1, 3, "ends in the middle of a line"),
        ("", "PortRcvErrorDetails", 1, 3, "answered []"),
        (SIM_EXT, "PortRcvErrorDetails", 3, 4, "extended block for port 4"),
        (SIM_RCV_DETAILS, "PortCounters", 1, 3, "not a detail attribute"),
    ],
)
def test_perfquery_details_refuse_the_whole_output(
    text: str, attribute: str, lid: int, port: int, problem: str
) -> None:
    with pytest.raises(ParseError, match=re.escape(problem)):
        parse_perfquery_details(text, attribute=attribute, lid=lid, port=port)


# ------------------------------------------------------------------ ibnetdiscover captures


def test_ibnetdiscover_ports_test_out() -> None:
    ports = parse_ibnetdiscover_ports(ibx("ibnetdiscover/test.out").read_text())
    assert len(ports) == 9
    first = ports[0]
    assert first.guid == "0x7cfe9003003b4bde" and first.port == 1 and first.node_type == "ca"
    assert (first.lid, first.width, first.speed) == (134, "4X", "EDR")
    assert (first.remote_guid, first.remote_port, first.remote_desc) == (
        "0x7cfe9003009ce5b0",
        10,
        "ib-i1l1s01",
    )
    assert first.desc == "o0001 HCA-1"
    unknown_rate = next(p for p in ports if p.port == 37)
    assert unknown_rate.speed == "" and unknown_rate.remote_guid is None
    assert unknown_rate.desc == "ib-i4l1s01"


def test_ibnetdiscover_ports_sharp_and_spaces() -> None:
    text = ibx("ibnetdiscover/test2.out").read_text()
    # The capture is an edited excerpt: its last link contradicts its first (one CA port,
    # two peers), so the whole of it is refused; its first lines are consistent.
    with pytest.raises(ParseError, match="disagree about their link"):
        parse_ibnetdiscover_ports(text)
    ports = parse_ibnetdiscover_ports("".join(text.splitlines(keepends=True)[:4]))
    sharp = ports[0]
    assert sharp.desc == "Mellanox Technologies Aggregation Node" and sharp.node_type == "ca"
    assert sharp.remote_desc == "5FB0405-leaf-IB01 "  # trailing space kept
    assert ports[3].desc == " 5FB0406-spine-IB02 "


def test_ibnetdiscover_ports_unquoted_desc() -> None:
    ports = parse_ibnetdiscover_ports(ibx("ibnetdiscover/test3.out").read_text())
    assert ports[0].desc == "Infiniscale-IV Mellanox Technologies"
    assert (ports[0].lid, ports[0].port, ports[0].speed) == (479, 22, "QDR")


def test_topology_files_from_ibtopotool() -> None:
    one = parse_topology_file(topo_capture("1.topo").read_text())
    assert len(one) == 14
    sw = next(p for p in one if p.guid == "0x0008f10400410015" and p.port == 1)
    assert (sw.remote_guid, sw.remote_port, sw.width, sw.speed) == (
        "0x005442ba00003080",
        10,
        "1X",
        "SDR",
    )  # the capture says 1xSDR
    assert sw.lid == 3 and sw.desc == "SW-6IB4 Voltaire"
    ca = next(p for p in one if p.guid == "0x0008f10403960558" and p.port == 2)
    assert ca.lid == 14 and ca.remote_lid == 6 and ca.node_type == "ca"
    text3 = topo_capture("3.topo").read_text()
    # its first line is a libibmad warning merged into the capture: refused whole...
    with pytest.raises(ParseError, match=r"line 1: not a topology-file line: 'src/query_smp\.c"):
        parse_ibnetdiscover(text3)
    # ...and read exactly without it
    three = parse_ibnetdiscover(text3.split("\n", 1)[1])
    fdr = next(p for p in three if p.guid == "0xe41d2d030003e470" and p.port == 3)
    assert fdr.speed == "FDR" and fdr.remote_desc == "MF0;switch-de779e:SX6012/U1"
    four = parse_ibnetdiscover(topo_capture("4.topo").read_text())
    assert {(p.guid, p.port) for p in four} == {
        ("0x0021283a8389a0a0", 23),
        ("0x0003ba000100e388", 2),
    }


def test_every_capture_parses_or_is_refused_whole() -> None:
    files = [*real_fixtures(f"{IBX}/ibnetdiscover/*"), *real_fixtures(f"{TOPO}/*.topo")]
    refused = set()
    for f in files:
        try:
            ports = parse_ibnetdiscover(f.read_text())
        except ParseError:
            refused.add(f.name)
            continue
        assert ports, f
        topo = topology_from_ports(ports, "diags")
        assert all(k[0].startswith("0x") and len(k[0]) == 18 for k in topo.ports)
    assert refused == {"test2.out", "3.topo"}  # see the two tests above


# ------------------------------------------------------------------ hostile descriptions


def test_hostile_descriptions_in_ports_format() -> None:
    text = (
        "SW     3  1 0x0000000000200001 4x EDR - CA     4  1 0x0000000000100004 "
        "( 'it's a - switch' - 'host ' - ' x\\y' )\n"
        "CA     4  1 0x0000000000100004 4x EDR - SW     3  1 0x0000000000200001 "
        "( 'host ' - ' x\\y' - 'it's a - switch' )\n"
        "SW     3  2 0x0000000000200001 4x EDR                                    "
        "'it's a - switch'\n"
    )
    with pytest.raises(ParseError, match="line 4: not an ibnetdiscover -p port line"):
        parse_ibnetdiscover_ports(text + "ibwarn: [1] mad_rpc: _do_madrpc failed; dport\n")
    ports = parse_ibnetdiscover_ports(text)
    sw = ports[0]
    assert sw.desc == "it's a - switch"
    assert sw.remote_desc == "host ' - ' x\\y"
    assert ports[1].desc == "host ' - ' x\\y" and ports[1].remote_desc == "it's a - switch"


_SW = "SW     3  1 0x0000000000200001 4x EDR - CA     4  1 0x0000000000100004 ( 'sw' - 'h' )\n"
_CA = "CA     4  1 0x0000000000100004 4x EDR - SW     3  1 0x0000000000200001 ( 'h' - 'sw' )\n"


@pytest.mark.parametrize(("text", "why"), [
    ("SW 65536  1 0x0000000000200001 4x EDR 'sw'\n", "LID 65536 out of range"),
    ("SW     3  0 0x0000000000200001 4x EDR 'sw'\n", "port 0 out of range"),
    ("SW     3 255 0x0000000000200001 4x EDR 'sw'\n", "port 255 out of range"),
    ("SW     3  1 0x0000000000200001 3x EDR 'sw'\n", "link width 3x does not exist"),
    ("SW     3  1 0x0000000000200001 4x EDR '\n", "unbalanced quotes"),
    (_SW + _SW, "printed twice"),
    (_SW + _SW.replace("  1 0x0000000000200001", "  2 0x0000000000200001", 1),
     "far end of two ports"),
    (_SW + "SW     5  2 0x0000000000200001 4x EDR 'sw'\n", "has LIDs 3 and 5"),
    (_SW.replace("CA     4", "CA     9") + _CA, "disagree about their link"),
])
def test_ibnetdiscover_output_that_cannot_be_a_fabric_is_refused_whole(text: str,
                                                                       why: str) -> None:
    """Values out of the protocol's range and lines that contradict each other are a broken
    or foreign output, never a topology: the whole output is refused, saying why."""
    with pytest.raises(ParseError, match=re.escape(why)):
        parse_ibnetdiscover_ports(text)
    assert len(parse_ibnetdiscover_ports(_SW + _CA)) == 2


def test_an_ambiguous_link_line_takes_the_descriptions_the_nodes_give_elsewhere() -> None:
    """``( 'x' - 'y' - 'z' )`` splits two ways. Only lines that cannot be misread vote: the
    nodes' own unlinked ports say ``x' - 'y`` and ``z``, and that split wins."""
    text = (
        "SW     3  1 0x0000000000200001 4x EDR - CA     4  1 0x0000000000100004 "
        "( 'x' - 'y' - 'z' )\n"
        "SW     3  2 0x0000000000200001 4x EDR 'x' - 'y'\n"
        "CA     4  2 0x0000000000100004 4x EDR 'z'\n"
    )
    link = parse_ibnetdiscover_ports(text)[0]
    assert (link.desc, link.remote_desc) == ("x' - 'y", "z")


_TOPO_SW = ('switchguid=0x0000000000200001(200001)\n'
            'Switch\t4 "S-0000000000200001"\t\t# "sw" base port 0 lid 3 lmc 0\n'
            '[1]\t"H-0000000000100004"[1](100004) \t\t# "h" lid 4 4xEDR\n\n')
_TOPO_CA = ('caguid=0x0000000000100004\n'
            'Ca\t1 "H-0000000000100004"\t\t# "h"\n'
            '[1](100004) \t"S-0000000000200001"[1]\t\t# lid 4 lmc 0 "sw" lid 3 4xEDR\n')


@pytest.mark.parametrize(("text", "why"), [
    (_TOPO_SW.replace("lid 3 lmc", "lid 70000 lmc"), "LID 70000 out of range"),
    (_TOPO_SW.replace("switchguid=0x0000000000200001(200001)\n", "").replace(
        '"S-0000000000200001"\t', '"sw-1"\t'), "a node record without a GUID"),
    (_TOPO_SW.replace("lmc 0\n", "lmc 0\njunk\n", 1), "not a topology-file line"),
    (_TOPO_SW.replace('"S-0000000000200001"\t\t#', '"S-0000000000200001" junk #'),
     "unreadable text after a node header"),
    (_TOPO_SW + _TOPO_SW, "recorded twice"),
    (_TOPO_SW.replace("[1](100004)", "[0](100004)"), "port number out of range"),
    (_TOPO_SW.replace("[1]\t", "[0]\t"), "port number out of range"),
    (_TOPO_SW.replace("(100004) \t\t#", "(100004) junk #"), "unreadable text after a port"),
    (_TOPO_SW + _TOPO_CA + _TOPO_CA.split("\n")[2] + "\n", "given twice"),
    (_TOPO_CA.replace("# lid 4 lmc", "# lid 70000 lmc"), "LID out of range"),
    (_TOPO_SW.replace("4xEDR", "3xEDR"), "link width 3x does not exist"),
    (_TOPO_SW.replace('"H-0000000000100004"[1]', '"nobody"[1]'), "neither a record nor a GUID"),
])
def test_a_topology_file_that_cannot_be_a_fabric_is_refused_whole(text: str, why: str) -> None:
    with pytest.raises(ParseError, match=re.escape(why)):
        parse_topology_file(text)


def test_a_topology_file_gives_each_record_its_own_guid_and_peers_their_type() -> None:
    """A ``switchguid=`` line names only the record after it; a peer that has no record of its
    own (an excerpt) is typed by its id (``S-`` a switch)."""
    both = parse_topology_file(_TOPO_SW + _TOPO_CA.replace("caguid=0x0000000000100004\n", ""))
    assert sorted((p.guid, p.node_type) for p in both) == [
        ("0x0000000000100004", "ca"), ("0x0000000000200001", "switch")]
    (ca,) = parse_topology_file(_TOPO_CA)
    assert (ca.remote_guid, ca.remote_type, ca.remote_lid) == ("0x0000000000200001", "switch", 3)


def test_clean_node_desc_like_infiniband_diags() -> None:
    assert clean_node_desc("leaf ü01".encode()) == "leaf   01"
    assert clean_node_desc(b"a\nb\tc\x7f" + b"\0garbage") == "a b c "
    assert clean_node_desc(b'q"uo\\te' + b"\0" * 57) == 'q"uo\\te'
    assert len(clean_node_desc(b"x" * 80)) == 64


def test_node_name_map() -> None:
    text = (
        '# comment\n\n0x0002c90300a1b2c3 "leaf 01 \\"a\\""\n'
        '7cfe9003009ce5b0   "spine"\n'
    )
    names = parse_node_name_map(text)
    assert names == {"0x0002c90300a1b2c3": 'leaf 01 \\"a\\"', "0x7cfe9003009ce5b0": "spine"}
    with pytest.raises(ParseError, match="line 5: not a node-name-map line"):
        parse_node_name_map(text + "not a line\n")
    with pytest.raises(ParseError, match="named twice"):
        parse_node_name_map(text + '0x7cfe9003009ce5b0 "leaf"\n')
    assert parse_node_name_map(text + '0x7cfe9003009ce5b0 "spine"\n') == names
    topo = topology_from_ports(
        parse_ibnetdiscover_ports("SW  1719  1 0x7cfe9003009ce5b0 4x EDR                 'x'\n"),
        "diags",
        names,
    )
    assert topo.ports[("0x7cfe9003009ce5b0", "1")].node_desc == "spine"


# ------------------------------------------------------------------ binary decoders vs libibmad


def _libibmad() -> ctypes.CDLL:
    lib = require_library("libibmad.so.5", "libibmad5")
    lib.mad_field_name.restype = ctypes.c_char_p
    lib.mad_decode_field.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    return lib


def _names(lib: ctypes.CDLL) -> list[str]:
    """Every field name up to IB_FIELD_LAST_ (the table ends with PortCounters QP1Dropped,
    right after the extended error block's empty terminator)."""
    out: list[str] = []
    for i in range(2000):
        name = (lib.mad_field_name(i) or b"").decode("ascii", "replace")
        out.append(name)
        if name == "QP1Dropped" and i > 0 and out[i - 1] == "":
            return out
    raise AssertionError("end of the libibmad field table not found")


def _field_ids(lib: ctypes.CDLL, first: str, names: list[str]) -> dict[str, int]:
    """Enum values of a run of fields, found by name in the installed library."""
    all_names = _names(lib)
    for start in range(len(all_names)):
        if all_names[start] != first:
            continue
        got: dict[str, int] = {}
        for i in range(start, min(start + 60, len(all_names))):
            n = all_names[i]
            if n in names and n not in got:
                got[n] = i
        if set(got) == set(names):
            return got
    raise AssertionError(f"fields {names} not found after {first}")


def _decode(lib: ctypes.CDLL, buf: bytes, fid: int) -> int:
    out = ctypes.c_uint64(0)
    raw = ctypes.create_string_buffer(buf, 256)
    lib.mad_decode_field(raw, fid, ctypes.byref(out))
    return out.value


def test_port_info_offsets_match_libibmad() -> None:
    lib = _libibmad()
    pairs = {
        "Lid": "lid",
        "SMLid": "sm_lid",
        "CapMask": "cap_mask",
        "LocalPort": "local_port",
        "LinkWidthEnabled": "width_enabled",
        "LinkWidthSupported": "width_supported",
        "LinkWidthActive": "width_active",
        "LinkSpeedSupported": "speed_supported",
        "LinkState": "state",
        "PhysLinkState": "phys_state",
        "LMC": "lmc",
        "LinkSpeedActive": "speed_active",
        "LinkSpeedEnabled": "speed_enabled",
    }
    ids = _field_ids(lib, "Mkey", list(pairs))
    ext = _field_ids(
        lib,
        "CapabilityMask2",
        ["CapabilityMask2", "LinkSpeedExtActive", "LinkSpeedExtSupported", "LinkSpeedExtEnabled"],
    )
    rng = random.Random(7)
    for _ in range(50):
        data = bytes(rng.randrange(256) for _ in range(64))
        pi = decode_port_info(data)
        for fname, attr in pairs.items():
            assert getattr(pi, attr) == _decode(lib, data, ids[fname]), fname
        assert pi.cap_mask2 == _decode(lib, data, ext["CapabilityMask2"])
        assert pi.speed_ext_active == _decode(lib, data, ext["LinkSpeedExtActive"])
        assert pi.speed_ext_supported == _decode(lib, data, ext["LinkSpeedExtSupported"])
        assert pi.speed_ext_enabled == _decode(lib, data, ext["LinkSpeedExtEnabled"])


def test_counter_offsets_match_libibmad() -> None:
    lib = _libibmad()
    narrow = [
        "SymbolErrorCounter",
        "LinkErrorRecoveryCounter",
        "LinkDownedCounter",
        "PortRcvErrors",
        "PortRcvRemotePhysicalErrors",
        "PortRcvSwitchRelayErrors",
        "PortXmitDiscards",
        "PortXmitConstraintErrors",
        "PortRcvConstraintErrors",
        "LocalLinkIntegrityErrors",
        "ExcessiveBufferOverrunErrors",
        "VL15Dropped",
        "PortXmitData",
        "PortRcvData",
        "PortXmitPkts",
        "PortRcvPkts",
        "PortXmitWait",
    ]
    ids = _field_ids(lib, "PortSelect", narrow)
    ext_names = [
        "PortXmitData",
        "PortRcvData",
        "PortXmitPkts",
        "PortRcvPkts",
        "PortUnicastXmitPkts",
        "PortUnicastRcvPkts",
        "PortMulticastXmitPkts",
        "PortMulticastRcvPkts",
    ]
    all_names = _names(lib)
    ext_start = next(
        i
        for i in range(len(all_names) - 3)
        if all_names[i : i + 3] == ["PortSelect", "CounterSelect", "PortXmitData"]
    )
    ext_ids = {n: ext_start + 2 + k for k, n in enumerate(ext_names)}
    err_start = next(
        i
        for i in range(len(all_names) - 1)
        if all_names[i : i + 2] == ["CounterSelect2", "SymbolErrorCounter"]
    )
    err_names = [
        "SymbolErrorCounter",
        "LinkErrorRecoveryCounter",
        "LinkDownedCounter",
        "PortRcvErrors",
        "PortRcvRemotePhysicalErrors",
        "PortRcvSwitchRelayErrors",
        "PortXmitDiscards",
        "PortXmitConstraintErrors",
        "PortRcvConstraintErrors",
        "LocalLinkIntegrityErrors",
        "ExcessiveBufferOverrunErrors",
        "VL15Dropped",
        "PortXmitWait",
        "QP1Dropped",
    ]
    err_ids = {n: err_start + 1 + k for k, n in enumerate(err_names)}
    qp1 = max(i for i, n in enumerate(all_names) if n == "QP1Dropped")
    rng = random.Random(11)
    for _ in range(30):
        data = bytes(rng.randrange(256) for _ in range(192))
        pc = port_counters(data, cap_mask=0x1000)
        for n in narrow:
            assert pc[n] == _decode(lib, data, ids[n]), n
        # IBA: QP1Dropped is bytes 20-21. libibmad 44 declares it {160, 16} without BITSOFFS,
        # which decodes VL15Dropped's bytes 22-23 instead (so perfquery prints VL15Dropped
        # twice); ibmon decodes the spec offset and the diags source drops perfquery's copy.
        assert pc["QP1Dropped"] == int.from_bytes(data[20:22], "big")
        assert _decode(lib, data, qp1) == pc["VL15Dropped"]
        ext = port_counters_ext(data, cap_mask=0x200, cap_mask2=0x2)
        for n in ext_names:
            assert ext[n] == _decode(lib, data, ext_ids[n]), n
        for n in err_names:
            assert ext[n] == _decode(lib, data, err_ids[n]), n


def test_detail_offsets_match_libibmad() -> None:
    """PortRcvErrorDetails and PortXmitDiscardDetails decode as libibmad's field tables say
    (IB_PC_RCV_LOCAL_PHY_ERR_F ... IB_PC_RCV_LOOPING_ERR_F, IB_PC_XMT_INACT_DISC_F ...
    IB_PC_XMT_SW_HOL_DISC_F), and the catalogue's PMA names are libibmad's spellings."""
    lib = _libibmad()
    rng = random.Random(13)
    for attr, specs in DETAIL_ATTRIBUTES.items():
        names = [spec.pma for spec in specs]
        ids = _field_ids(lib, names[0], names)
        assert [ids[n] for n in names] == list(range(ids[names[0]], ids[names[0]] + len(names)))
        for _ in range(30):
            data = bytearray(rng.randrange(256) for _ in range(192))
            data[1] = 7
            got = decode_details(attr, bytes(data), port=7)
            for spec in specs:
                assert got[spec.name] == _decode(lib, bytes(data), ids[spec.pma]), spec.pma
        with pytest.raises(ParseError, match="reply for port 7 where port 8 was asked"):
            decode_details(attr, bytes(data), port=8)
        need = 4 + 2 * len(specs)  # PortSelect, CounterSelect, then 16 bits a counter
        assert decode_details(attr, bytes(data[:need])) == decode_details(attr, bytes(data))
        for cut in (6, need - 1):
            with pytest.raises(ParseError, match="shorter than"):
                decode_details(attr, bytes(data[:cut]))


def test_class_port_info_and_node_info() -> None:
    cpi = bytes([1, 1, 0x13, 0x00]) + struct.pack(">I", (0x2 << 5) | 3) + bytes(56)
    c = decode_class_port_info(cpi)
    assert (c.cap_mask, c.cap_mask2) == (0x1300, 0x2)
    ni = bytearray(64)
    ni[2], ni[3] = 2, 36
    struct.pack_into(">QQQ", ni, 4, 1, 0x0002C90200000010, 0x0002C90200000010)
    ni[36] = 5
    n = decode_node_info(bytes(ni))
    assert (n.node_type, n.num_ports, n.node_guid, n.local_port) == (
        "switch",
        36,
        "0x0002c90200000010",
        5,
    )


def test_ibnd_cache_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="magic"):
        parse_ibnd_cache(b"\0" * 64)
    head = struct.pack("<IIIIQI", 0x8FE7832B, 1, 5, 5, 1, 1)
    with pytest.raises(ValueError, match="truncated"):
        parse_ibnd_cache(head + b"\1" * 40)


# ------------------------------------------------------------------ link speed rules


def _pi(wsup: int, wen: int, ssup: int, sen: int, esup: int = 0, een: int = 0) -> PortInfo:
    return PortInfo(
        lid=0,
        sm_lid=0,
        cap_mask=0,
        local_port=1,
        width_enabled=wen,
        width_supported=wsup,
        width_active=2,
        speed_supported=ssup,
        state=4,
        phys_state=5,
        lmc=0,
        speed_active=1,
        speed_enabled=sen,
        cap_mask2=0,
        speed_ext_active=0,
        speed_ext_supported=esup,
        speed_ext_enabled=een,
    )


def test_max_common_uses_supported_and_enabled_on_both_ends() -> None:
    a = _pi(0x1F, 0x02, 0x7, 0x7, 0x7, 0x7)  # supports 12X/HDR, 4X enabled
    b = _pi(0x0B, 0x0B, 0x7, 0x7, 0x3, 0x3)  # 1X|4X|12X, EDR max
    assert max_common(a, b) == ("4X", "EDR")
    # ibsim's ports: all widths supported, only the net file's enabled -> not degraded
    sim = _pi(0x1F, 0x03, 0x7, 0x7, 0x7, 0x3)
    assert max_common(sim, sim) == ("4X", "EDR")
    assert not is_degraded("4X", "EDR", "4X", "EDR")
    assert is_degraded("1X", "EDR", "4X", "EDR")
    assert is_degraded("4X", "FDR", "4X", "EDR")
    assert max_common(_pi(1, 1, 1, 1), _pi(2, 2, 2, 2)) == ("", "")
    assert effective_rate_bps("4X", "EDR") == 100e9
    assert effective_rate_bps("4X", "NDR") == 400e9
    assert effective_rate_bps("", "EDR") is None


def _port_info_bytes(*, ext: tuple[int, int, int], ext2: tuple[int, int, int],
                     speed: int = 4) -> bytes:
    """A 64-byte PortInfo of a 4X port: LinkSpeed{Supported,Enabled,Active} ``speed`` (QDR),
    LinkSpeedExt (active, supported, enabled) at bytes 62-63 and LinkSpeedExt*2 (IBA 1.7)
    at byte 56, bits 449-450, 451-452 and 453-455 (rdma-core libibmad ``fields.c``)."""
    data = bytearray(64)
    data[30], data[31] = 0x02, 0x02  # LinkWidthSupported, LinkWidthActive: 4X
    data[29] = 0x02  # LinkWidthEnabled
    data[32] = speed << 4 | 4  # LinkSpeedSupported, LinkState Active
    data[33] = 5 << 4  # PhysLinkState LinkUp
    data[35] = speed << 4 | speed  # LinkSpeedActive, LinkSpeedEnabled
    e_act, e_sup, e_en = ext
    data[62] = e_act << 4 | e_sup
    data[63] = e_en
    x_act, x_sup, x_en = ext2
    data[56] = x_act << 5 | x_sup << 3 | x_en
    return bytes(data)


def test_an_xdr_port_is_xdr_as_rdma_core_reads_it() -> None:
    """XDR is not a LinkSpeedExt bit: it is LinkSpeedExtActive2 and friends, which rdma-core
    folds in as bit 5 (libibnetdisc ``ibnd_get_agg_linkspeedext``). Read without them, an XDR
    port was its LinkSpeedActive (QDR here: 32 Gb/s for 800) and every XDR link degraded."""
    xdr = decode_port_info(_port_info_bytes(ext=(0, 0xF, 0xF), ext2=(1, 1, 1)))
    assert (xdr.speed_ext2_active, xdr.speed_ext2_supported, xdr.speed_ext2_enabled) == (1, 1, 1)
    assert active_speed(xdr.speed_active, xdr.speed_ext_active, xdr.speed_ext2_active) == "XDR"
    assert max_common(xdr, xdr) == ("4X", "XDR")
    assert effective_rate_bps("4X", "XDR") == 800e9
    # an NDR port facing it: the best both ends support is NDR, so NDR is not degraded
    ndr = decode_port_info(_port_info_bytes(ext=(8, 0xF, 0xF), ext2=(0, 0, 0)))
    assert active_speed(ndr.speed_active, ndr.speed_ext_active, ndr.speed_ext2_active) == "NDR"
    assert max_common(xdr, ndr) == ("4X", "NDR")
    # XDR supported but not enabled at one end: not the best common speed either
    off = decode_port_info(_port_info_bytes(ext=(8, 0xF, 0xF), ext2=(0, 1, 0)))
    assert max_common(xdr, off) == ("4X", "NDR")
    assert is_degraded("4X", "NDR", *max_common(xdr, xdr))


def test_extended_speeds_disabled_leave_the_base_speeds() -> None:
    """LinkSpeedExtEnabled 30 means "extended speeds disabled", not the mask 11110b (rdma-core
    reads it as none): such a link runs QDR on purpose and is not degraded."""
    a = decode_port_info(_port_info_bytes(ext=(0, 0x3, 30), ext2=(0, 0, 0)))
    assert max_common(a, a) == ("4X", "QDR")
    b = decode_port_info(_port_info_bytes(ext=(2, 0x3, 0x3), ext2=(0, 0, 0)))
    assert max_common(b, b) == ("4X", "EDR")


def _mlnx_bytes(supported: int, enabled: int, active: int) -> bytes:
    """A Mellanox ExtendedPortInfo payload: LinkSpeed{Supported,Enabled,Active} at bytes 7,
    11 and 15 (libibmad ``fields.c``), every other byte set so a wrong offset shows."""
    data = bytearray(b"\xa0" * 64)
    data[7], data[11], data[15] = supported, enabled, active
    return bytes(data)


def test_mlnx_ext_port_info_offsets_match_libibmad() -> None:
    lib = _libibmad()
    ids = _field_ids(lib, "StateChangeEnable",
                     ["StateChangeEnable", "LinkSpeedSupported", "LinkSpeedEnabled",
                      "LinkSpeedActive"])
    base = decode_port_info(_port_info_bytes(ext=(0, 0, 0), ext2=(0, 0, 0)))
    rng = random.Random(11)
    for _ in range(50):
        data = bytes(rng.randrange(256) for _ in range(64))
        pi = with_mlnx_speeds(base, data)
        assert pi.mlnx_speed_supported == _decode(lib, data, ids["LinkSpeedSupported"])
        assert pi.mlnx_speed_enabled == _decode(lib, data, ids["LinkSpeedEnabled"])
        assert pi.mlnx_speed_active == _decode(lib, data, ids["LinkSpeedActive"])
        assert pi._replace(mlnx_speed_supported=0, mlnx_speed_enabled=0,
                           mlnx_speed_active=0) == base  # the PortInfo part untouched


def test_an_fdr10_port_is_fdr10_as_rdma_core_reads_it() -> None:
    """FDR10 is in no PortInfo: the port says QDR there and FDR10 in Mellanox's vendor
    ExtendedPortInfo (bit 0 of its LinkSpeed fields), which ibnetdiscover and iblinkinfo print.
    Read as QDR, a 40 Gb/s link was 32 Gb/s: every utilization a quarter too high."""
    qdr = decode_port_info(_port_info_bytes(ext=(0, 0, 0), ext2=(0, 0, 0)))
    fdr10 = with_mlnx_speeds(qdr, _mlnx_bytes(1, 1, 1))
    assert active_speed(qdr.speed_active, 0, 0, fdr10.mlnx_speed_active) == "FDR10"
    assert active_speed(qdr.speed_active, 0, 0, 0) == "QDR"
    assert effective_rate_bps("4X", "FDR10") == 40e9
    assert max_common(fdr10, fdr10) == ("4X", "FDR10")
    # both ends can run FDR10 but the link came up at QDR: degraded (iblinkinfo: "Could be
    # FDR10 (Found link at QDR but expected speed is FDR10)")
    at_qdr = with_mlnx_speeds(qdr, _mlnx_bytes(1, 1, 0))
    assert active_speed(at_qdr.speed_active, 0, 0, at_qdr.mlnx_speed_active) == "QDR"
    assert is_degraded("4X", "QDR", *max_common(at_qdr, at_qdr))
    # FDR10 supported but not enabled at one end, or unknown there: QDR is the best
    assert max_common(fdr10, with_mlnx_speeds(qdr, _mlnx_bytes(1, 0, 0))) == ("4X", "QDR")
    assert max_common(fdr10, qdr) == ("4X", "QDR")
    # FDR beats FDR10 when both ends have both
    fdr = decode_port_info(_port_info_bytes(ext=(1, 1, 1), ext2=(0, 0, 0)))
    fdr_too = with_mlnx_speeds(fdr, _mlnx_bytes(1, 1, 0))
    assert max_common(fdr_too, fdr_too) == ("4X", "FDR")
    assert active_speed(fdr.speed_active, fdr.speed_ext_active, 0, 1) == "FDR"


def test_fdr10_is_asked_only_where_rdma_core_asks() -> None:
    """libibnetdisc asks ExtendedPortInfo of a listed Mellanox (or Bull) device whose port is
    LinkUp at QDR with no extended speed active: nowhere else can FDR10 hide."""
    assert all(has_mlnx_ext_port_info(0x02C9, d)
               for d in (0xC738, 0xC73B, 0xD2F0, 0x1003, 0x1011, 0x101B, 0xA2D2))
    assert not any(has_mlnx_ext_port_info(0x02C9, d) for d in (0xC737, 0xC73C, 0x101C, 0x1B33))
    assert has_mlnx_ext_port_info(0x119F, 0x1B33) and has_mlnx_ext_port_info(0x119F, 0x1BD5)
    assert not has_mlnx_ext_port_info(0x119F, 0x1BD6)
    qdr = decode_port_info(_port_info_bytes(ext=(0, 0, 0), ext2=(0, 0, 0)))
    assert may_be_fdr10(qdr)
    assert not may_be_fdr10(qdr._replace(phys_state=2))  # polling: no link
    assert not may_be_fdr10(qdr._replace(speed_active=2))  # DDR
    assert not may_be_fdr10(qdr._replace(speed_ext_active=1))  # FDR
    assert not may_be_fdr10(qdr._replace(speed_ext2_active=1))  # XDR


# ------------------------------------------------------------------ sharding


def _topology_of(fab: object) -> Topology:
    from mocks.topology import Fabric

    assert isinstance(fab, Fabric)
    topo = Topology(source="t")
    from ibmon.infiniband.model import LinkInfo, PortIdentity

    for guid, node in fab.nodes.items():
        for p in range(1, node.nports + 1):
            topo.ports[(guid, str(p))] = PortIdentity(guid=guid, port=str(p), node_type=node.kind)
            peer = fab.peer(guid, p)
            if peer:
                topo.links[(guid, str(p))] = LinkInfo(remote_guid=peer[0], remote_port=str(peer[1]))
    return topo


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_shards_partition_the_fabric(n: int) -> None:
    topo = _topology_of(fat_tree(levels=2, radix=16, leaves=6, hosts_per_leaf=8))
    parts = [filter_topology(topo, k, n) for k in range(n)]
    seen: set[tuple[str, str]] = set()
    for part in parts:
        assert not seen & set(part.ports)
        seen |= set(part.ports)
    assert seen == set(topo.ports)
    owner = assign_nodes(topo, n)
    for (guid, _p), link in topo.links.items():  # every host goes with its leaf switch
        if topo.ports[(guid, _p)].node_type == "ca":
            assert owner[guid] == owner[link.remote_guid]
    if n > 1:
        assert len(set(owner.values())) > 1


def test_parse_shard() -> None:
    assert parse_shard("2/3") == (2, 3)
    for bad in ("3/3", "1/0", "x/2", "-1/2"):
        with pytest.raises(ValueError, match="shard"):
            parse_shard(bad)
