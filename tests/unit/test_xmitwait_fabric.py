"""The fabric sources decide each port's PortXmitWait unit at discovery (``fabric.WaitUnits``).

The rule is ``ibmon.infiniband.xmitwait.unit_for``: a documented ASIC family (NodeInfo.DeviceID)
decides and its nodes are never asked their Tick; any other node's PortSamplesControl.Tick decides;
a PMA that drops or refuses the Get (ibsim's) leaves the port's last Tick, else the default, and
is no error; a Tick without a vendor rule is an ``odd_tick`` SourceError. ibsim answers no
PortSamplesControl, so what only a real PMA can show (a Tick, an odd one, a reply for another
port) is answered here: MAD replies built here for ``mad``, and for ``diags`` perfquery text in
the format the installed libibmad prints (``SAMPLES_CONTROL`` below is its dump, checked against
the library). Both go through the real decoders and the sources' real discovery code.
"""

from __future__ import annotations

import asyncio
import ctypes
import struct
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from ibmon.infiniband.model import PortKey
from ibmon.infiniband.xmitwait import DEFAULT_UNIT, WaitUnit
from ibmon.sources.diags import CommandResult, DiagsSource
from ibmon.sources.fabric import FabricView, WaitUnits
from ibmon.sources.libibmad import (
    ATTR_CLASS_PORT_INFO,
    ATTR_PORT_SAMPLES_CONTROL,
    CLASS_PMA,
    MadRequest,
    MadResult,
    load_libraries,
)
from ibmon.sources.mad import MadSource, SweepResult, _Node
from ibmon.sources.parse import (
    NodeInfo,
    ParseError,
    decode_port_info,
    decode_samples_control_tick,
    parse_perfquery_tick,
)
from tests.ibnd_cache import CachePortSpec, port_info_bytes
from tests.unit.test_diags_runner import TOPO, answer_discovery, answer_tick_read

#: ``perfquery -c 2 1`` as rdma-core 44 prints it (``mad_dump_portsamples_control``) for a PMA
#: with Tick 7: OpCode 1, CounterWidth 5, some masks.
SAMPLES_CONTROL = """\
# PortSamplesControl: Lid 2 port 1
OpCode:..........................0x01
PortSelect:......................1
Tick:............................0x07
CounterWidth:....................5
CounterMask0:....................0x02
CounterMasks1to9:................0x02345678
CounterMasks10to14:..............0x7fff
SampleMechanisms:................0
SampleStatus:....................0
OptionMask:......................0x0000a5a500000000
VendorMask:......................0x0000000000000000
SampleStart:.....................123456
SampleInterval:..................0
Tag:.............................0x0000
CounterSelect0:..................0x0000
CounterSelect1:..................0x0000
CounterSelect2:..................0x0000
CounterSelect3:..................0x0000
CounterSelect4:..................0x0000
CounterSelect5:..................0x0000
CounterSelect6:..................0x0000
CounterSelect7:..................0x0000
CounterSelect8:..................0x0000
CounterSelect9:..................0x0000
CounterSelect10:.................0x0000
CounterSelect11:.................0x0000
CounterSelect12:.................0x0000
CounterSelect13:.................0x0000
CounterSelect14:.................0x0000
SamplesOnlyOptionMask:...........0x0000000000000000
"""


def samples_control_payload(port: int, tick: int) -> bytes:
    """A PortSamplesControl payload as a PMA answers it (what ``SAMPLES_CONTROL`` dumps)."""
    data = bytearray(192)
    data[0], data[1], data[2], data[3] = 0x01, port, tick, 0x05
    data[4:8] = bytes([0x12, 0x34, 0x56, 0x78])
    data[8:16] = (0xFFFF00000000A5A5).to_bytes(8, "big")
    data[28:32] = (123456).to_bytes(4, "big")
    return bytes(data)


def samples_control_text(lid: int, port: int, tick: int) -> str:
    dots = "." * 22
    return (SAMPLES_CONTROL.replace("Lid 2 port 1", f"Lid {lid} port {port}")
            .replace(f"PortSelect:{dots}1", f"PortSelect:{dots}{port}")
            .replace("Tick:....." + "." * 23 + "0x07", "Tick:" + "." * 28 + f"0x{tick:02x}"))


# ------------------------------------------------------------------ the parsers


def test_the_captured_text_is_what_the_installed_libibmad_prints() -> None:
    mad, _umad = load_libraries()
    dump = mad.mad_dump_portsamples_control
    dump.restype = None
    dump.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    out = ctypes.create_string_buffer(1280)
    payload = ctypes.create_string_buffer(samples_control_payload(1, 7), 192)
    dump(out, 1280, payload, 192)
    assert "# PortSamplesControl: Lid 2 port 1\n" + out.value.decode() == SAMPLES_CONTROL


def test_perfquery_tick() -> None:
    assert parse_perfquery_tick(SAMPLES_CONTROL, lid=2, port=1) == 7
    assert parse_perfquery_tick(samples_control_text(9, 3, 0x1F), lid=9, port=3) == 31
    # an older libibmad prints fewer fields: only OpCode, PortSelect and Tick are required
    short = "".join(SAMPLES_CONTROL.splitlines(keepends=True)[:4])
    assert parse_perfquery_tick(short, lid=2, port=1) == 7


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (SAMPLES_CONTROL.replace("Lid 2", "Lid 3"), "not the answer for lid 2 port 1"),
        (SAMPLES_CONTROL.replace("port 1\n", "port 4\n"), "not the answer"),
        (SAMPLES_CONTROL.replace("PortSelect:......................1", "PortSelect:....4"),
         "says PortSelect 4"),
        (SAMPLES_CONTROL.replace("PortSamplesControl:", "Port counters:"),
         "not a PortSamplesControl header"),
        (SAMPLES_CONTROL.replace("Tick:.....", "Tock:....."), "Tock does not belong"),
        (SAMPLES_CONTROL + "Tick:....0x1f\n", "Tick repeated"),
        (SAMPLES_CONTROL.replace("0x07", "0x107"), "Tick does not fit in 8 bits"),
        (SAMPLES_CONTROL.replace("Tick:............................0x07\n", ""),
         r"incomplete \(no Tick\)"),
        (SAMPLES_CONTROL[:-9], "cut short"),
        (SAMPLES_CONTROL + SAMPLES_CONTROL, "a second block header"),
        (SAMPLES_CONTROL.replace("\nTag:", "\n%%% \x1b[31m junk\nTag:"), "not a perfquery line"),
        ("perfquery: iberror: failed: sampctlquery\n", "not a perfquery line"),
        ("", "no PortSamplesControl block"),
        ("Tick:....0x07\n", "before the block header"),
    ],
)
def test_perfquery_tick_is_strict(text: str, problem: str) -> None:
    with pytest.raises(ParseError, match=problem):
        parse_perfquery_tick(text, lid=2, port=1)


def test_samples_control_payload_tick() -> None:
    assert decode_samples_control_tick(samples_control_payload(3, 31), port=3) == 31
    with pytest.raises(ParseError, match="for port 4 where port 3"):
        decode_samples_control_tick(samples_control_payload(4, 7), port=3)
    with pytest.raises(ParseError, match="shorter"):
        decode_samples_control_tick(b"\x01\x03")


# ------------------------------------------------------------------ the rule

QUANTUM, CX6, CX5, UNKNOWN = 0xD2F0, 0x101B, 0x1017, 0x1234
S: PortKey = ("0x0000000000200000", "1")
A: PortKey = ("0x0000000000100001", "1")
B: PortKey = ("0x0000000000100002", "1")
C: PortKey = ("0x0000000000100003", "1")


def view_of(*keys: PortKey) -> FabricView:
    view = FabricView(source="t")
    for guid, port in keys:
        view.add(guid, int(port), desc=guid, node_type="ca", lid=int(guid[-1]) + 1)
    return view


def units(view: FabricView) -> dict[PortKey, WaitUnit]:
    return {k: fp.identity.xmit_wait for k, fp in view.ports.items()}


def test_family_decides_else_tick_else_default() -> None:
    assert not WaitUnits.needs_tick(QUANTUM) and not WaitUnits.needs_tick(CX6)
    assert WaitUnits.needs_tick(CX5) and WaitUnits.needs_tick(0) and WaitUnits.needs_tick(None)
    w = WaitUnits()
    view = view_of(S, A, B, C)
    devices = {S[0]: QUANTUM, A[0]: CX5, B[0]: UNKNOWN, C[0]: 0}
    errors = w.decide("t", view, devices, {A: 31, B: ("unread", "timeout"), C: 7})
    assert errors == []  # a PMA without PortSamplesControl is no error
    assert units(view) == {
        S: WaitUnit(8, False, "family", "Quantum"),
        A: WaitUnit(32, True, "tick"),
        B: DEFAULT_UNIT,
        C: WaitUnit(8, False, "tick"),
    }
    assert (w.asked, w.unread) == (3, 1)


def test_a_lost_tick_keeps_the_last_one_and_a_port_that_left_is_forgotten() -> None:
    w = WaitUnits()
    devices = {A[0]: CX5, B[0]: CX5}
    w.decide("t", view_of(A, B), devices, {A: 31, B: 31})
    view = view_of(A, B)
    w.decide("t", view, devices, {A: ("unread", "timeout"), B: ("unread", "status_0x000c")})
    assert units(view) == {A: WaitUnit(32, True, "tick"), B: WaitUnit(32, True, "tick")}
    w.decide("t", view_of(A), devices, {A: ("unread", "timeout")})  # B left the fabric
    view = view_of(A, B)
    w.decide("t", view, devices, {A: ("unread", "timeout"), B: ("unread", "timeout")})
    assert units(view) == {A: WaitUnit(32, True, "tick"), B: DEFAULT_UNIT}


def test_an_odd_tick_or_a_broken_read_is_an_error_of_that_port() -> None:
    w = WaitUnits()
    view = view_of(A, B)
    errors = w.decide("t", view, {}, {A: 15, B: ("parse_error", "line 3: junk")})
    assert [(e.reason, e.key) for e in errors] == [("odd_tick", A), ("parse_error", B)]
    assert "Tick 15" in errors[0].detail and "16/lane" in errors[0].detail
    assert units(view) == {A: WaitUnit(16, True, "tick"), B: DEFAULT_UNIT}


# ------------------------------------------------------------------ mad

SW_GUID, ODD_SW_GUID = "0x0000000000200000", "0x0000000000200001"
HCA = {"0x0000000000100001": (CX5, 3), "0x0000000000100002": (CX6, 4),
       "0x0000000000100003": (0, 5)}


def node(guid: str, kind: str, device: int, ports: dict[int, int], sm_lid: int = 1) -> _Node:
    """A swept node: NodeInfo with ``device`` and a PortInfo per port (port -> LID) whose
    master SM is at ``sm_lid``."""
    info = NodeInfo(kind, max(ports), guid, guid, guid, device, 0x2C9, min(ports))
    return _Node(info=info, path=(), desc=guid, ports={
        p: decode_port_info(port_info_bytes(CachePortSpec(int(guid, 16), p, lid)))._replace(
            sm_lid=sm_lid)
        for p, lid in ports.items()})


class TickFabric(MadSource):
    """A MadSource whose sweep and MADs are answered here: a Quantum switch (LID 1), a switch
    of no documented family (LID 2: Tick 31, but 15 on its port 2), a ConnectX-5 HCA (Tick 7),
    a ConnectX-6 HCA, and an HCA whose PMA drops PortSamplesControl like ibsim's."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.sent: list[MadRequest] = []
        self.dropped: set[int] = {5}
        self.sm_lid = 1

    async def _ensure_worker(self) -> None:
        return None

    def sweep_sync(self) -> SweepResult:
        res = SweepResult()
        sm = self.sm_lid
        res.nodes[SW_GUID] = node(SW_GUID, "switch", QUANTUM, {0: 1, 1: 1, 2: 1}, sm)
        res.nodes[ODD_SW_GUID] = node(ODD_SW_GUID, "switch", UNKNOWN, {0: 2, 1: 2, 2: 2}, sm)
        for guid, (device, lid) in HCA.items():
            res.nodes[guid] = node(guid, "ca", device, {1: lid}, sm)
        return res

    def _results(self, reqs: Sequence[MadRequest], *, keep: bool = True) -> Iterator[MadResult]:
        self.sent += reqs
        return iter([self._answer(r) for r in reqs])

    def _answer(self, r: MadRequest) -> MadResult:
        port = r.port_select or 0
        if r.attr_id == ATTR_PORT_SAMPLES_CONTROL and r.mgmt_class == CLASS_PMA:
            if r.lid in self.dropped:
                return MadResult(None, "timeout")
            tick = {1: 31, 2: 31 if port == 1 else 15, 3: 7}[r.lid]
            return MadResult(samples_control_payload(port, tick))
        data = bytearray(192)
        data[1] = port
        if r.attr_id == ATTR_CLASS_PORT_INFO:
            struct.pack_into(">H", data, 2, 0x1200)
        return MadResult(bytes(data))

    def ticks_asked(self) -> list[tuple[int, int]]:
        out = [(r.lid, r.port_select or 0) for r in self.sent
               if r.attr_id == ATTR_PORT_SAMPLES_CONTROL and r.mgmt_class == CLASS_PMA]
        self.sent.clear()
        return sorted(out)


async def test_mad_decides_every_ports_unit_at_discovery() -> None:
    src = TickFabric(state_interval=1e9)
    try:
        topo = await src.discover()
        # the documented families (Quantum switch, ConnectX-6) are never asked
        assert src.ticks_asked() == [(2, 1), (2, 2), (3, 1), (5, 1)]
        got = {k: v.xmit_wait for k, v in topo.ports.items()}
        assert got == {
            (SW_GUID, "1"): WaitUnit(8, False, "family", "Quantum"),
            (SW_GUID, "2"): WaitUnit(8, False, "family", "Quantum"),
            (ODD_SW_GUID, "1"): WaitUnit(32, True, "tick"),
            (ODD_SW_GUID, "2"): WaitUnit(16, True, "tick"),
            ("0x0000000000100001", "1"): WaitUnit(8, False, "tick"),
            ("0x0000000000100002", "1"): WaitUnit(8, False, "family", "ConnectX-6"),
            ("0x0000000000100003", "1"): DEFAULT_UNIT,
        }
        assert (src.wait_units.asked, src.wait_units.unread) == (4, 1)
        snap = await src.sample()
        # the odd Tick is reported with the discovery's errors; the dropped Get is not an error
        assert [(e.reason, e.key) for e in snap.errors] == [("odd_tick", (ODD_SW_GUID, "2"))]
        assert snap.ports[(ODD_SW_GUID, "1")].identity.xmit_wait == WaitUnit(32, True, "tick")
        assert src.ticks_asked() == []  # polls never ask it
        # the next discovery asks again; a Tick lost now keeps the port's last one
        src.dropped = {3, 5}
        topo = await src.discover()
        assert src.ticks_asked() == [(2, 1), (2, 2), (3, 1), (5, 1)]
        assert topo.ports[("0x0000000000100001", "1")].xmit_wait == WaitUnit(8, False, "tick")
    finally:
        await src.close()


async def test_mad_never_asks_at_the_subnet_managers_lid() -> None:
    """ibsim hands a PortSamplesControl Get at the SM's port to opensm, which exits: the SM's
    LID (here the undocumented switch's) is not asked, and its ports keep the default."""
    src = TickFabric(state_interval=1e9)
    src.sm_lid = 2
    try:
        topo = await src.discover()
        assert src.ticks_asked() == [(3, 1), (5, 1)]
        assert topo.ports[(ODD_SW_GUID, "1")].xmit_wait == DEFAULT_UNIT
        assert topo.ports[("0x0000000000100001", "1")].xmit_wait == WaitUnit(8, False, "tick")
    finally:
        await src.close()


async def test_mad_with_a_shard_asks_only_its_own_ports() -> None:
    src = TickFabric(shard="0/2", state_interval=1e9)
    try:
        topo = await src.discover()
        asked = src.ticks_asked()
        mine = {(v.lid, int(k[1])) for k, v in topo.ports.items()
                if k[0] in (ODD_SW_GUID, "0x0000000000100001", "0x0000000000100003")}
        assert asked == sorted(mine)
        for key, ident in topo.ports.items():
            if key == (ODD_SW_GUID, "1"):
                assert ident.xmit_wait == WaitUnit(32, True, "tick")
    finally:
        await src.close()


# ------------------------------------------------------------------ diags

SW, H1, H2, H3 = (("0x0000000000200000", "1"), ("0x0000000000100001", "1"),
                  ("0x0000000000100002", "1"), ("0x0000000000100003", "1"))


def set_device_ids(cache: Path, devices: Mapping[int, tuple[int, int]]) -> None:
    """Give nodes of a written cache a (vendor, device) ID in their NodeInfo (bytes 30-31 and
    37-39; the node record's NodeInfo follows its GUID, type and port count)."""
    data = bytearray(cache.read_bytes())
    for guid, (vendor, device) in devices.items():
        at = data.find(struct.pack("<Q", guid), 28) + 10  # after the header
        struct.pack_into(">H", data, at + 30, device)
        data[at + 37 : at + 40] = vendor.to_bytes(3, "big")
    cache.write_bytes(bytes(data))


class TickTools:
    """ibnetdiscover for ``TOPO`` (every device ID 0 unless ``devices`` gives one: no
    documented family; every PortInfo names lid 1, the switch, as the master SM's, so the
    switch is never asked) and perfquery -c: the switch (lid 1) would have Tick 31, h1
    (lid 2) Tick 7, the PMAs of the LIDs in ``dropped`` (h2's, lid 3, by default) drop the
    Get like ibsim's, and h3 (lid 4) does what ``h3`` says (junk by default, ``hang``,
    ``refuse``: an error status, as a PMA without PortSamplesControl answers)."""

    def __init__(self, h3: str = "junk", devices: Mapping[int, tuple[int, int]] | None = None,
                 dropped: frozenset[int] = frozenset({3})) -> None:
        self.ticks: list[list[str]] = []
        self.h3 = h3
        self.devices = devices or {}
        self.dropped = dropped

    async def run(self, argv: list[str], timeout: float, max_output: int = 0) -> CommandResult:
        if "ibnetdiscover" in argv[0]:
            res = answer_discovery(argv, TOPO)
            if "--cache" in argv:
                set_device_ids(Path(argv[argv.index("--cache") + 1]), self.devices)
            return res
        assert "-c" in argv, argv  # discovery only: no poll in these tests
        self.ticks.append(argv)
        lid, port = int(argv[-2]), int(argv[-1])
        if lid in self.dropped:
            return answer_tick_read(argv)
        if lid == 4 and self.h3 == "junk":
            return CommandResult(0, samples_control_text(lid, port, 7).replace("\nTag:", "\nTg:"),
                                 "")
        if lid == 4 and self.h3 == "hang":
            await asyncio.sleep(3600)
        if lid == 4 and self.h3 == "refuse":  # libibmad prints the MAD status only with -e
            status = (f"ibwarn: [1] mad_rpc: MAD completed with error status 0xc; dport (Lid "
                      f"{lid})\n" if "-e" in argv else "")
            return CommandResult(255, "perfquery: iberror: failed: sampctlquery\n", status)
        return CommandResult(0, samples_control_text(lid, port, 31 if lid == 1 else 7), "")


async def test_diags_reads_one_tick_per_node_and_books_it_on_all_its_ports() -> None:
    tools = TickTools()
    src = DiagsSource(runner=tools, command_timeout=2.0)
    try:
        topo = await src.discover()
    finally:
        await src.close()
    # one process per node, on its first port, none at the SM's LID (the switch's); argv
    # only, the LID and port as numbers
    assert sorted(a[-2:] for a in tools.ticks) == [["2", "1"], ["3", "1"], ["4", "1"]]
    assert all(a[0] == "perfquery" and a[a.index("-c") + 1 :] == a[-2:] for a in tools.ticks)
    got = {k: v.xmit_wait for k, v in topo.ports.items()}
    assert got[SW] == got[("0x0000000000200000", "3")] == DEFAULT_UNIT
    assert got[H1] == WaitUnit(8, False, "tick")
    assert got[H2] == got[H3] == DEFAULT_UNIT
    assert (src.wait_units.asked, src.wait_units.unread) == (3, 1)
    errors = [(e.reason, e.key) for e in src._discover_errors]
    assert errors == [("parse_error", H3)]  # junk is an error; a dropped Get is not


async def test_diags_a_hung_tick_read_costs_its_node_the_tick_not_the_discovery() -> None:
    tools = TickTools(h3="hang")
    src = DiagsSource(runner=tools, command_timeout=0.3)
    try:
        t0 = time.monotonic()
        topo = await src.discover()
        elapsed = time.monotonic() - t0
    finally:
        await src.close()
    assert elapsed < 3.0
    assert topo.ports[H3].xmit_wait == DEFAULT_UNIT
    assert topo.ports[H1].xmit_wait == WaitUnit(8, False, "tick")
    assert [(e.reason, e.key) for e in src._discover_errors] == [("timeout", H3)]


async def test_diags_a_pma_that_refuses_the_tick_read_is_no_error() -> None:
    """A device without PortSamplesControl answers with an error status: the fallback unit
    and no error, as the ``mad`` source does (the read asks with ``-e``, which prints it)."""
    tools = TickTools(h3="refuse")
    src = DiagsSource(runner=tools, command_timeout=2.0)
    try:
        topo = await src.discover()
    finally:
        await src.close()
    assert all("-e" in a for a in tools.ticks)
    assert topo.ports[H3].xmit_wait == DEFAULT_UNIT
    assert (src.wait_units.asked, src.wait_units.unread) == (3, 2)
    assert src._discover_errors == []


CX5_HCAS = {0x100001: (0x2C9, CX5), 0x100002: (0x2C9, CX5), 0x100003: (0x2C9, CX5),
            0x200000: (0x2C9, UNKNOWN)}


@pytest.mark.parametrize("dropped", [frozenset(), frozenset({2})])
async def test_diags_asks_a_model_twice_at_most_and_its_tick_stands_for_every_node(
    dropped: frozenset[int],
) -> None:
    """Three ConnectX-5 HCAs (no documented unit): h1 and h2 are asked, h3 is not, and the
    first Tick answered is all three's, also when h1's PMA drops the Get."""
    tools = TickTools(devices=CX5_HCAS, dropped=dropped)
    src = DiagsSource(runner=tools, command_timeout=2.0)
    try:
        topo = await src.discover()
    finally:
        await src.close()
    assert sorted(a[-2:] for a in tools.ticks) == [["2", "1"], ["3", "1"]]  # not the SM's
    got = {k: v.xmit_wait for k, v in topo.ports.items()}
    assert got[H1] == got[H2] == got[H3] == WaitUnit(8, False, "tick")
    assert got[SW] == DEFAULT_UNIT
    assert src._discover_errors == []


async def test_mad_reports_a_garbled_tick_answer_and_keeps_the_default() -> None:
    """A PortSamplesControl answer that cannot be decoded is a ``parse_error`` of that port (a
    PMA that answers wrongly is worth a look), unlike a Get that was dropped or refused."""

    class Garbled(TickFabric):
        def _answer(self, r: MadRequest) -> MadResult:
            if r.attr_id == ATTR_PORT_SAMPLES_CONTROL and r.lid == 3:
                return MadResult(b"\x00")  # shorter than its fields
            return super()._answer(r)

    src = Garbled(state_interval=1e9)
    try:
        topo = await src.discover()
        snap = await src.sample()
    finally:
        await src.close()
    key = ("0x0000000000100001", "1")
    assert topo.ports[key].xmit_wait == DEFAULT_UNIT
    garbled = [e for e in snap.errors if e.key == key]
    assert [e.reason for e in garbled] == ["parse_error"]
    assert "PortSamplesControl" in garbled[0].detail
    assert src.wait_units.unread == 1  # only lid 5's dropped Get


async def test_mad_reports_one_error_for_a_port_that_answers_nothing() -> None:
    """A port whose PMA and SMA both stay silent in a poll that refreshes state is one error
    (its PMA's), not two."""

    class Silent(TickFabric):
        silent: frozenset[int] = frozenset()

        def _answer(self, r: MadRequest) -> MadResult:
            if r.lid in self.silent:
                return MadResult(None, "timeout")
            return super()._answer(r)

    src = Silent(state_interval=0.0)
    key = ("0x0000000000100001", "1")
    try:
        await src.discover()
        await src.sample()  # right after the discovery: no state refresh
        src.silent = frozenset({3})
        snap = await src.sample()
    finally:
        await src.close()
    assert [(e.reason, e.detail) for e in snap.errors if e.key == key] == [
        ("timeout", f"{key[0]} port 1: PMA")]
