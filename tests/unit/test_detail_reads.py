"""When the fabric sources read the error and discard details, and what they report in between.

The rule (``ibmon.sources.fabric.DetailReads``) is tested directly, then through both sources
where the simulator cannot show it: a PMA that answers a detail Get with an error status (ibsim
supports both attributes on every port). ``diags`` gets perfquery's real output for that case
(captured against ibsim with ``-e``); ``mad`` gets MAD replies built here, decoded by the real
decoders. Everything ibsim can show is tested against it in
``tests/integration/test_ibsim_details.py``.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator, Sequence

from ibmon.infiniband.counters import DETAIL_ATTRIBUTES, DETAILS
from ibmon.infiniband.model import PortIdentity, PortKey, PortSample, Snapshot
from ibmon.sources.diags import CommandResult, DiagsSource
from ibmon.sources.fabric import DETAIL_MISSES_TO_GIVE_UP, DetailReads, FabricView
from ibmon.sources.libibmad import (
    ATTR_CLASS_PORT_INFO,
    ATTR_PORT_COUNTERS,
    ATTR_PORT_COUNTERS_EXT,
    ATTR_PORT_RCV_ERROR_DETAILS,
    MadRequest,
    MadResult,
)
from ibmon.sources.mad import MadSource
from ibmon.sources.parse import PortCounterValues
from ibmon.track.tracker import Tracker
from tests.unit.test_diags_runner import (
    TOPO,
    _narrow,
    answer_details,
    answer_discovery,
    answer_tick_read,
    is_tick_read,
)

RCV, XMIT = "PortRcvErrorDetails", "PortXmitDiscardDetails"
A: PortKey = ("0x0000000000100001", "1")
B: PortKey = ("0x0000000000100002", "1")
C: PortKey = ("0x0000000000100003", "1")


def pcv(rcv: int | None = 0, disc: int | None = 0, wide: frozenset[str] = frozenset()
        ) -> PortCounterValues:
    counters = {"symbol_errors": 0}
    if rcv is not None:
        counters["receive_errors"] = rcv
    if disc is not None:
        counters["transmit_discards"] = disc
    return PortCounterValues(counters=counters, wide=frozenset(wide))


def zeros(attr: str) -> dict[str, int]:
    return {spec.name: 0 for spec in DETAIL_ATTRIBUTES[attr]}


# ------------------------------------------------------------------ the rule


def test_baselines_only_for_new_ports_capped_in_asking_order() -> None:
    d = DetailReads(baselines_per_poll=3)
    d.discovered([A, B, C])
    first = d.planned([C, B, A])
    assert first == [(C, RCV), (C, XMIT), (B, RCV)]  # the poll's order, not the discovery's
    for read in first:
        d.answered(read, zeros(read[1]))
    assert d.planned([C, B, A]) == [(B, XMIT), (A, RCV), (A, XMIT)]
    for read in [(B, XMIT), (A, RCV), (A, XMIT)]:
        d.answered(read, zeros(read[1]))
    assert d.planned([A, B, C]) == []
    d.discovered([A, B, C])  # a rediscovery: nothing new, no read
    assert d.planned([A, B, C]) == []
    d.discovered([A, B])  # C left the fabric: forgotten; it comes back as a new port
    assert C not in d.values
    d.discovered([A, B, C])
    assert d.planned([A, B, C]) == [(C, RCV), (C, XMIT)]


def test_a_read_only_when_the_aggregate_moved() -> None:
    d = DetailReads()
    d.discovered([A, B])
    assert d.moved({A: pcv(5, 0), B: pcv(0, 0)}) == []  # first answer: the baseline's job
    assert d.moved({A: pcv(5, 0), B: pcv(0, 0)}) == []  # nothing moved: nothing read
    assert d.moved({A: pcv(6, 0), B: pcv(0, 1)}) == [(A, RCV), (B, XMIT)]
    assert d.moved({A: pcv(6, 0), B: pcv(0, 1)}) == []
    assert d.moved({A: pcv(2, 0)}) == [(A, RCV)]  # a reset moved it too
    # a port that did not answer keeps its last aggregate: the next answer compares with it
    assert d.moved({B: pcv(0, 3)}) == [(B, XMIT)]
    # already read this poll (a baseline or an owed read): not twice
    assert d.moved({A: pcv(9, 0)}, done={(A, RCV)}) == []


def test_a_pinned_narrow_aggregate_is_read_every_poll() -> None:
    d = DetailReads()
    d.discovered([A])
    d.moved({A: pcv(65535, 0)})
    assert d.moved({A: pcv(65535, 0)}) == [(A, RCV)]  # cannot move any more: keep reading
    assert d.moved({A: pcv(65535, 0)}) == [(A, RCV)]
    # read from a 64-bit copy it is just a number, which moves when errors happen
    wide = frozenset({"receive_errors"})
    assert d.moved({A: pcv(65535, 0, wide)}) == []


def test_between_reads_a_port_reports_what_it_last_read() -> None:
    d = DetailReads()
    d.discovered([A])
    d.answered((A, RCV), {**zeros(RCV), "receive_local_physical_errors": 4})
    d.answered((A, XMIT), zeros(XMIT))
    values = {A: pcv(4, 0)}
    d.fill(values)
    assert values[A].counters["receive_local_physical_errors"] == 4
    assert set(DETAILS["transmit_discards"]) <= values[A].counters.keys()
    assert not values[A].wide & set(DETAILS["receive_errors"])  # 16-bit: they saturate
    # a read that failed: unknown this poll, so left out (never reported as unchanged)
    d.missed((A, RCV), port_answered=True)
    values = {A: pcv(9, 0)}
    d.fill(values)
    assert "receive_local_physical_errors" not in values[A].counters
    assert "transmit_inactive_discards" in values[A].counters
    assert d.planned([A]) == [(A, RCV)]  # owed: read next poll whatever the aggregate does


def test_unanswered_reads_give_up_only_while_the_port_answers() -> None:
    d = DetailReads()
    d.discovered([A])
    for _ in range(DETAIL_MISSES_TO_GIVE_UP + 2):  # the whole port is silent: keep trying
        assert d.missed((A, RCV), port_answered=False) is False
        assert d.planned([A])[0] == (A, RCV)
    gave_up = [d.missed((A, RCV), port_answered=True) for _ in range(DETAIL_MISSES_TO_GIVE_UP)]
    assert gave_up == [False] * (DETAIL_MISSES_TO_GIVE_UP - 1) + [True]
    assert (A, RCV) in d.unsupported
    assert (A, RCV) not in d.planned([A])
    d.moved({A: pcv(1, 0)})
    assert d.moved({A: pcv(2, 0)}) == []  # unsupported: not asked although it moved


def test_an_error_status_is_remembered_until_the_next_discovery() -> None:
    d = DetailReads()
    d.discovered([A])
    d.answered((A, XMIT), zeros(XMIT))
    d.refused((A, RCV))
    d.moved({A: pcv(0, 0)})
    assert d.moved({A: pcv(3, 0)}) == []
    assert d.planned([A]) == []
    d.discovered([A])
    assert d.planned([A]) == []  # no new baseline: asked again when its aggregate moves
    assert d.moved({A: pcv(4, 0)}) == [(A, RCV)]


def test_disabled_reads_nothing() -> None:
    d = DetailReads(enabled=False)
    d.discovered([A])
    assert d.planned([A]) == [] and d.moved({A: pcv(1, 1)}) == [] and d.moved({A: pcv(2, 2)}) == []


def test_the_tracker_keeps_totals_and_rates_between_reads() -> None:
    """Carried values are unchanged values (rate 0); a failed read is a gap that loses nothing."""
    d = DetailReads()
    d.discovered([A])
    t = Tracker()
    name = "receive_local_physical_errors"

    def poll(at: float, rcv: int, detail: int | None) -> dict[str, float]:
        values = {A: pcv(rcv, 0)}
        for read in d.planned([A]) + d.moved(values):
            if detail is None:
                d.missed(read, port_answered=True)
            else:
                d.answered(read, {**zeros(read[1]), name: detail})
        d.fill(values)
        snap = Snapshot(source="t", monotonic=at, wall=1e9 + at)
        snap.ports[A] = PortSample(identity=PortIdentity(guid=A[0], port=A[1]),
                                   counters=values[A].counters, wide=frozenset())
        view = t.update(snap)[A]
        assert view.totals[name] >= totals[-1]
        totals.append(view.totals[name])
        return view.rates

    totals = [0]
    poll(0.0, 10, 10)  # baseline
    assert poll(10.0, 10, None)[name] == 0.0  # not asked: carried, rate 0
    assert poll(20.0, 30, 30)[name] == 2.0  # moved: read, 20 in 10 s
    assert name not in poll(30.0, 50, None)  # moved, read failed: no value, no rate
    rates = poll(40.0, 50, 50)  # owed: read although nothing moved; the increase is counted
    assert name not in rates  # (spanning two polls: no honest rate this once)
    assert totals[-1] == 50 and poll(50.0, 50, 50)[name] == 0.0


# ------------------------------------------------------------------ diags: an error status

REFUSED = CommandResult(  # perfquery -e -E against a PMA that refuses the attribute (ibsim)
    255,
    "perfquery: iberror: failed: cannot query PortRcvErrorDetails\n",
    'ibwarn: [30130] sim_connect: attached as client 1 at node "S-0002c90200000000"\n'
    "ibwarn: [30130] mad_rpc: MAD completed with error status 0x1c; dport (Lid 2)\n",
)
TIMED_OUT = CommandResult(
    255,
    "perfquery: iberror: failed: cannot query PortRcvErrorDetails\n",
    "ibwarn: [7] _do_madrpc: timeout after 3 retries, 3000 ms\n"
    "ibwarn: [7] mad_rpc: _do_madrpc failed; dport (Lid 2)\n",
)


class Fabric:
    """ibnetdiscover and perfquery for TOPO; lid 2's PMA refuses PortRcvErrorDetails."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.rcv_errors = 0
        self.detail_answer: CommandResult | None = REFUSED

    async def run(self, argv: list[str], timeout: float, max_output: int = 0) -> CommandResult:
        self.calls.append(argv)
        if "ibnetdiscover" in argv[0]:
            return answer_discovery(argv, TOPO)
        if is_tick_read(argv):
            return answer_tick_read(argv)
        if "-E" in argv or "-D" in argv:
            if argv[-2] == "2" and "-E" in argv and self.detail_answer is not None:
                return self.detail_answer
            return answer_details(argv)
        lid = int(argv[argv.index("-l") + 1])
        ports = [int(p) for p in argv[-1].split(",")]
        text = "".join(_narrow(lid, p) for p in ports)
        if "-x" in argv:  # no 64-bit error copies: the narrow query gives the errors
            text = "".join(
                f"# Port extended counters: Lid {lid} port {p} (CapMask: 0x1300 CapMask2: 0x0)\n"
                f"PortSelect:....{p}\nCounterSelect:....0x0\n"
                + "".join(f"{n}:....1\n" for n in (
                    "PortXmitData", "PortRcvData", "PortXmitPkts", "PortRcvPkts",
                    "PortUnicastXmitPkts", "PortUnicastRcvPkts", "PortMulticastXmitPkts",
                    "PortMulticastRcvPkts"))
                for p in ports)
        elif lid == 2:
            text = text.replace("PortRcvErrors:....1", f"PortRcvErrors:....{self.rcv_errors}")
        return CommandResult(0, text, "")

    def detail_reads(self) -> list[tuple[str, str]]:
        out = [(c[-2], c[c.index("-e") + 1]) for c in self.calls
               if "-E" in c or "-D" in c]
        self.calls.clear()
        return out


async def test_diags_remembers_a_refusal_and_a_healthy_poll_runs_nothing_more() -> None:
    fab = Fabric()
    src = DiagsSource(runner=fab, state_interval=3600)
    h1 = ("0x0000000000100001", "1")
    try:
        await src.discover()
        snap = await src.sample()  # baselines: 6 ports x 2 attributes
        assert len(fab.detail_reads()) == 12
        assert "receive_local_physical_errors" not in snap.ports[h1].counters  # refused
        assert "transmit_inactive_discards" in snap.ports[h1].counters
        assert not [e for e in snap.errors if e.key == h1]  # a refusal is no error
        await src.sample()
        assert fab.detail_reads() == []  # healthy: not one process more
        fab.rcv_errors = 7
        await src.sample()
        assert fab.detail_reads() == []  # lid 2 moved, but it refused: not asked again
        await src.discover()
        fab.detail_answer = TIMED_OUT  # this time its PMA does not answer at all
        fab.rcv_errors = 8
        snap = await src.sample()
        assert fab.detail_reads() == [("2", "-E")]  # after a discovery: asked when it moves
        assert [(e.reason, e.key) for e in snap.errors] == [("mad_timeout", h1)]
        snap = await src.sample()  # owed: read again, although nothing moved
        assert fab.detail_reads() == [("2", "-E")]
        fab.detail_answer = None
        snap = await src.sample()
        assert fab.detail_reads() == [("2", "-E")] and snap.errors == []
        assert snap.ports[h1].counters["receive_local_physical_errors"] == 0
    finally:
        await src.close()


# ------------------------------------------------------------------ mad: an error status


class PmaSource(MadSource):
    """A MadSource whose MADs are answered here: counters per port, and a PMA (lid 2) that
    answers PortRcvErrorDetails with an error status. Decoding and bookkeeping are the real
    source's."""

    def __init__(self, cap_mask: int = 0x1200) -> None:
        super().__init__(state_interval=1e9)
        self.cap_mask = cap_mask
        self.rcv_errors: dict[int, int] = {2: 0, 3: 0}
        self.sent: list[MadRequest] = []
        self.refusal = "status_0x000c"  # method/attribute not supported

    async def _ensure_worker(self) -> None:
        return None

    def _results(self, reqs: Sequence[MadRequest], *, keep: bool = True) -> Iterator[MadResult]:
        self.sent += reqs
        return iter([self._answer(r) for r in reqs])

    def _answer(self, r: MadRequest) -> MadResult:
        data = bytearray(192)
        data[1] = r.port_select or 0
        if r.attr_id == ATTR_CLASS_PORT_INFO:
            struct.pack_into(">H", data, 2, self.cap_mask)  # 0x1200: no 64-bit errors
        elif r.attr_id == ATTR_PORT_COUNTERS:
            struct.pack_into(">H", data, 8, self.rcv_errors[r.lid])
        elif r.attr_id == ATTR_PORT_RCV_ERROR_DETAILS and r.lid == 2:
            return MadResult(None, self.refusal)
        elif r.attr_id not in (ATTR_PORT_COUNTERS_EXT, 0x16, ATTR_PORT_RCV_ERROR_DETAILS):
            return MadResult(None, "timeout")
        return MadResult(bytes(data))

    def detail_mads(self) -> list[tuple[int, int]]:
        out = [(r.lid, r.attr_id) for r in self.sent if r.attr_id in (0x15, 0x16)]
        self.sent.clear()
        return out


def two_hosts() -> FabricView:
    view = FabricView(source="mad")
    for guid, lid in (("0x0000000000100001", 2), ("0x0000000000100002", 3)):
        view.add(guid, 1, desc=guid, node_type="ca", lid=lid)
    return view


async def test_a_busy_pma_is_asked_again_at_the_next_poll() -> None:
    """Busy is "not now": the read is owed, unlike an unsupported attribute's refusal."""
    src = PmaSource()
    src.refusal = "busy"
    try:
        src._adopt(two_hosts(), [], time.monotonic())
        snap = await src.sample()
        assert (2, 0x15) in src.detail_mads()
        assert [(e.reason, e.key) for e in snap.errors] == [
            ("busy", ("0x0000000000100001", "1"))]
        await src.sample()
        assert src.detail_mads() == [(2, 0x15)]
    finally:
        await src.close()


async def test_mad_remembers_a_refusal_and_a_healthy_poll_sends_nothing_more() -> None:
    src = PmaSource()
    view = two_hosts()
    try:
        src._adopt(view, [], time.monotonic())
        snap = await src.sample()
        assert sorted(src.detail_mads()) == [(2, 0x15), (2, 0x16), (3, 0x15), (3, 0x16)]
        assert src.last_detail_mads == 4 and snap.errors == []
        h1 = snap.ports[("0x0000000000100001", "1")].counters
        assert "receive_local_physical_errors" not in h1 and "transmit_inactive_discards" in h1
        await src.sample()
        assert src.detail_mads() == [] and src.last_detail_mads == 0
        src.rcv_errors = {2: 5, 3: 5}
        snap = await src.sample()
        assert src.detail_mads() == [(3, 0x15)]  # lid 2 refused: not asked although it moved
        assert snap.ports[("0x0000000000100002", "1")].counters["receive_errors"] == 5
        src._adopt(view, [], time.monotonic() - 10)
        src.rcv_errors = {2: 6, 3: 5}
        await src.sample()
        assert src.detail_mads() == [(2, 0x15)]  # after a discovery: asked again on a move
    finally:
        await src.close()


async def test_mad_reads_details_of_ports_without_extended_counters() -> None:
    """A PMA with PortCounters only (no CapMask bit 9/10) is asked with one Get per port; its
    details follow the same rule."""
    src = PmaSource(cap_mask=0x1000)
    try:
        src._adopt(two_hosts(), [], time.monotonic())
        await src.sample()
        assert sorted(src.detail_mads()) == [(2, 0x15), (2, 0x16), (3, 0x15), (3, 0x16)]
        assert ATTR_PORT_COUNTERS_EXT not in {r.attr_id for r in src.sent}
        src.rcv_errors = {2: 0, 3: 1}
        await src.sample()
        assert src.detail_mads() == [(3, 0x15)]
    finally:
        await src.close()


class MislabelledPma(PmaSource):
    """lid 2's PMA answers PortCounters with another port's PortSelect (a reply that is not
    this port's, whatever its values say)."""

    def _answer(self, r: MadRequest) -> MadResult:
        got = super()._answer(r)
        if r.lid == 2 and r.attr_id == ATTR_PORT_COUNTERS and got.data is not None:
            data = bytearray(got.data)
            data[1] = 9
            return MadResult(bytes(data))
        return got


async def test_mad_refuses_counters_answered_for_another_port_and_reads_the_rest() -> None:
    """A reply is booked only on the port it answers: the port whose PMA named another port
    has no counters this poll and a ``parse_error`` naming it and the port the reply named,
    the other port is read."""
    src = MislabelledPma()
    h1, h2 = ("0x0000000000100001", "1"), ("0x0000000000100002", "1")
    try:
        src._adopt(two_hosts(), [], time.monotonic())
        src.rcv_errors = {2: 4, 3: 5}
        snap = await src.sample()
        assert h1 not in snap.ports
        assert snap.ports[h2].counters["receive_errors"] == 5
        assert [(e.reason, e.key) for e in snap.errors] == [("parse_error", h1)]
        # the log says what was wrong with the reply, not only that it was
        assert snap.errors[0].detail == (f"{h1[0]} port 1: PMA: PortCounters reply for port 9 "
                                         "where port 1 was asked")
    finally:
        await src.close()
