"""Likely causes: what the counters behind an event say went wrong, and what to check first.

Every fault event (``receive_errors``, ``discards``, ``high_ber``, ``link_integrity``,
``congestion``, ``link_flapping``, ``link_degraded``, ``port_down``) carries
``details.cause``, one of ``CAUSES``, ``details.breakdown`` (the counters behind the verdict:
their increments over the detector's window) and ``details.action`` (one sentence naming both
ends of the link). The set is small and fixed so an alert can be labelled with it and routed
on it (cardinality bounded), and so a person learns eight words, not a counter reference.

Where the cause comes from (docs/infiniband.md §1, the detail attributes):

- PortRcvErrorDetails splits PortRcvErrors: local physical errors (CRC, bad symbols: the
  cable or transceiver), malformed packets (a header the receiver refuses; in practice a
  packet longer than the receiver's MTU), buffer overruns (the sender ignored flow-control
  credits), DLID/VL mapping and looping errors (the routing tables sent it somewhere it may
  not go).
- PortXmitDiscardDetails splits PortXmitDiscards: inactive discards (the port was not
  Active: the link was down), neighbor MTU discards (the far end's MTU is smaller), switch
  lifetime and head-of-queue lifetime discards (the packet waited too long: congestion
  further along).

The cause is the detail class with the largest share of the window's increments. Ports that
never have detail counters (node-local sysfs, PMAs that do not support the attributes) or
whose details did not move fall back to the other counters: symbol errors or link integrity
errors on the same link mean ``physical``, excessive buffer overruns ``buffer_overrun``,
a transmit-wait ratio at congestion levels ``congestion_victim``, a port that is not Active
``link_down``. When nothing points anywhere the cause is ``unknown``: always present, so an
alert label and a route never go missing, and honest about it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Final, Literal, get_args

from ibmon.detect.columns import Fresh, Memo
from ibmon.detect.portstate import PerPortState
from ibmon.infiniband.model import PortIdentity, PortKey, PortState, PortView, state_json
from ibmon.track.totals import Totals

__all__ = [
    "ACTIONS",
    "CAUSES",
    "DETAIL_LABELS",
    "DISCARD_DETAILS",
    "HOTSPOT_ACTION",
    "MEANINGS",
    "RECEIVE_DETAILS",
    "SUSPECT",
    "UNKNOWN_LOAD_ACTION",
    "Cause",
    "DetailWindow",
    "action",
    "bit_errors",
    "dominant",
    "end_name",
    "far_end",
    "peer_note",
    "peer_summary",
    "preferred",
]

Cause = Literal[
    "physical",
    "buffer_overrun",
    "routing",
    "mtu_mismatch",
    "congestion_victim",
    "link_down",
    "speed_negotiation",
    "unknown",
]
CAUSES: Final[tuple[str, ...]] = get_args(Cause)

#: PortRcvErrorDetails fields (catalogue names) and the cause each one points to.
RECEIVE_DETAILS: Final[dict[str, Cause]] = {
    "receive_local_physical_errors": "physical",
    "receive_malformed_packet_errors": "mtu_mismatch",
    "receive_buffer_overrun_errors": "buffer_overrun",
    "receive_dlid_mapping_errors": "routing",
    "receive_vl_mapping_errors": "routing",
    "receive_looping_errors": "routing",
}
#: PortXmitDiscardDetails fields and their causes.
DISCARD_DETAILS: Final[dict[str, Cause]] = {
    "transmit_inactive_discards": "link_down",
    "transmit_neighbor_mtu_discards": "mtu_mismatch",
    "transmit_sw_lifetime_limit_discards": "congestion_victim",
    "transmit_sw_hoq_lifetime_limit_discards": "congestion_victim",
}
#: How a detail counter reads in a sentence ("98 % local physical errors").
DETAIL_LABELS: Final[dict[str, str]] = {
    "receive_local_physical_errors": "local physical errors",
    "receive_malformed_packet_errors": "malformed packets",
    "receive_buffer_overrun_errors": "buffer overruns",
    "receive_dlid_mapping_errors": "DLID mapping errors",
    "receive_vl_mapping_errors": "VL mapping errors",
    "receive_looping_errors": "looping packets",
    "transmit_inactive_discards": "discards while the port was inactive",
    "transmit_neighbor_mtu_discards": "neighbor MTU discards",
    "transmit_sw_lifetime_limit_discards": "switch lifetime limit discards",
    "transmit_sw_hoq_lifetime_limit_discards": "head-of-queue lifetime discards",
}

#: What each cause means physically (README, ``ibmon explain``).
MEANINGS: Final[dict[str, str]] = {
    "physical": "the signal is corrupted on the wire: a dirty, loose or failing cable or "
                "transceiver (symbol errors, CRC errors, link integrity errors)",
    "buffer_overrun": "a sender overran the receiver's buffers, ignoring flow-control credits: "
                      "mismatched VL or buffer settings or firmware on the two ends",
    "routing": "packets arrived that the forwarding or SL-to-VL tables do not allow (DLID or "
               "VL mapping errors, loops): stale or wrong routes from the subnet manager",
    "mtu_mismatch": "packets larger than one end accepts (malformed packets, neighbor MTU "
                    "discards): the two ends or the partition disagree on the MTU",
    "congestion_victim": "packets waited too long for credits and were dropped or stalled: "
                         "this port is blocked by congestion further along the path",
    "link_down": "the link went down or was not Active: the far end rebooted or was disabled, "
                 "or the cable was pulled",
    "speed_negotiation": "the link trained at a lower width or speed than both ends support: "
                         "a bad lane, a cable not rated for the speed, or firmware",
    "unknown": "no counter points to one of the causes above (no detail counters on this "
               "port, or nothing but the symptom moved)",
}

#: The short clause a message ends with ("...: suspect the cable or transceiver").
SUSPECT: Final[dict[str, str]] = {
    "physical": "suspect the cable or transceiver",
    "buffer_overrun": "suspect flow control (a sender overrunning the receive buffers)",
    "routing": "suspect the routing tables (DLID/VL mapping or a loop)",
    "mtu_mismatch": "suspect an MTU mismatch between the two ends",
    "congestion_victim": "a victim of congestion further along the path",
    "link_down": "the link was down",
    "speed_negotiation": "the link trained below what both ends support",
    "unknown": "no detail counter says why",
}

#: The first thing to check, per cause; ``{here}`` and ``{peer}`` name the two ends.
ACTIONS: Final[dict[str, str]] = {
    "physical": "Check the cable and transceivers between {here} and {peer}: clean and reseat "
                "both ends, then replace the cable or transceiver if errors continue.",
    "buffer_overrun": "Compare the VL, buffer and flow-control settings and the firmware of "
                      "{here} and {peer}: one end sends more than the other has credits for.",
    "routing": "Check the subnet manager's routes through {here} and {peer} (ibroute, SL-to-VL "
               "tables, the opensm log) for a stale or looping route; a resweep usually fixes it.",
    "mtu_mismatch": "Compare the MTU of {here} and {peer} (and the partition's MTU in opensm) "
                    "and set both to the same value.",
    "congestion_victim": "Look past {peer} for the congested hotspot that blocks {here} "
                         "(congestion dashboard); the cable is not at fault.",
    "link_down": "Check whether {peer} rebooted, went down or was disabled, then the cable "
                 "between it and {here}.",
    "speed_negotiation": "Reseat the cable between {here} and {peer}, check it is rated for "
                         "the link speed, then replace it or the transceiver if the link still "
                         "trains slow.",
    "unknown": "Compare the error counters of {here} and {peer} (perfquery -x, and -E/-D for "
               "the details) to see which class grows.",
}

#: The action of a congestion hotspot on a healthy link (cause ``unknown``: nothing is broken).
HOTSPOT_ACTION: Final = ("Too much traffic is routed over {here} towards {peer}: rebalance "
                         "jobs or routing (adaptive routing, more uplinks).")

#: The action of congestion on a port whose utilization is unknown (its data counters give no
#: rate), as the ``IBPortCongestion`` alert's "utilization unknown" text does.
UNKNOWN_LOAD_ACTION: Final = (
    "Compare the transmit rate of {here} with its link rate (perfquery -x, the congestion "
    "dashboard): near the link rate, too much traffic is routed over it (rebalance jobs or "
    "routing); well below it, look past {peer} for the hotspot that blocks it.")

_ACTIVE: Final = int(PortState.ACTIVE)
_STATE_WORDS: Final = {s.value: s.name.lower().replace("_", " ") for s in PortState}


def end_name(ident: PortIdentity | None, guid: str = "", port: str = "",
             desc: str = "") -> str:
    """``leaf07 port 12``, ``gpu031 mlx5_0 port 1`` (display only: untrusted text)."""
    if ident is not None:
        name = ident.node_desc or ident.device or ident.guid
        return f"{name} port {ident.port}"
    return f"{desc or guid} port {port}" if (desc or guid) else "its peer"


def far_end(view: PortView) -> str:
    """The far end's name from the port's link, or "its peer" when the source knows none."""
    link = view.link
    if link is None or not link.remote_guid:
        return "its peer"
    return end_name(None, link.remote_guid, link.remote_port, link.remote_node_desc)


def action(cause: str, view: PortView) -> str:
    """The cause's first action, naming this port and its peer."""
    return ACTIONS.get(cause, ACTIONS["unknown"]).format(here=end_name(view.identity),
                                                         peer=far_end(view))


def dominant(breakdown: Mapping[str, int], causes: Mapping[str, Cause]) -> tuple[str, float]:
    """The cause with the largest share of the breakdown's increments, and that share.

    Counters of the same cause add up (DLID, VL mapping and looping errors are all routing);
    ties go to the cause listed first in ``CAUSES`` (physical before everything else: the
    cheapest thing to check). ``("unknown", 0.0)`` when nothing moved.
    """
    by_cause: dict[str, int] = {}
    for name, n in breakdown.items():
        cause = causes.get(name)
        if cause is not None and n > 0:
            by_cause[cause] = by_cause.get(cause, 0) + n
    total = sum(by_cause.values())
    if not total:
        return "unknown", 0.0
    best = min(by_cause, key=lambda c: (-by_cause[c], CAUSES.index(c)))
    return best, by_cause[best] / total


#: When two ends of a link name different causes, the more specific one wins.
_PREFERENCE: Final = ("physical", "buffer_overrun", "routing", "mtu_mismatch",
                      "congestion_victim", "speed_negotiation", "link_down", "unknown")


def preferred(*causes: str) -> str:
    """The most specific of several causes (``physical`` over ``link_down`` over ``unknown``)."""
    return min(causes, key=lambda c: _PREFERENCE.index(c) if c in _PREFERENCE else 99)


def bit_errors(view: PortView) -> bool:
    """Whether the port shows bit errors: symbol errors in this poll's BER window, or a high
    BER or physical link integrity errors still firing from the previous poll (integrity
    errors from buffer overruns point at flow control, not the cable)."""
    return (bool(view.symbol_error_ber) or "high_ber" in view.conditions
            or view.causes.get("link_integrity") == "physical")


def peer_note(view: PortView, peer: PortView | None, *, own_ber: bool = True) -> str:
    """What the rest of the link shows, as a clause for a message (empty when nothing).

    Symbol errors at either end (their BER over the BER window, filled by the BER detector
    earlier in the same poll), a far end that is down or does not answer, and the far end's
    conditions as of the previous poll.
    """
    notes: list[str] = []
    here_ber = view.symbol_error_ber
    if own_ber and here_ber:
        notes.append(f"symbol errors are rising on the same link (BER {here_ber:.0e})")
    if peer is not None:
        if peer.stale:
            notes.append("the far end does not answer")
        elif peer.state is not None and peer.state != _ACTIVE:
            notes.append(f"the far end is {_STATE_WORDS.get(peer.state, str(peer.state))}")
        elif peer.symbol_error_ber:
            notes.append(f"symbol errors are rising at the far end too "
                         f"(BER {peer.symbol_error_ber:.0e})")
        others = sorted(peer.conditions)
        if others:
            notes.append(f"the far end has {', '.join(others)}")
    return "; ".join(notes)


def peer_summary(peer: PortView | None) -> dict[str, object] | None:
    """The far end's state for ``details.peer_shows`` (None when the source does not see it)."""
    if peer is None:
        return None
    return {
        **state_json(peer.state, peer.phys_state),
        "stale": peer.stale,
        "symbol_error_ber": peer.symbol_error_ber,
        "conditions": sorted(peer.conditions),
    }


class DetailWindow(PerPortState):
    """Per port: how an aggregate counter and its detail counters grew over a sliding window.

    Read from software totals, so it works whether or not this poll's sample carried the
    details (sources read them only for ports whose aggregate moved). A detail counter only
    moves with its aggregate (PortRcvErrors includes every PortRcvErrorDetails field), so a
    record is kept only when the aggregate changed (or new counters appeared): a quiet port
    costs one dict lookup and one comparison per poll, and one small tuple of memory.
    """

    __slots__ = ("_absent", "_details", "_hist", "_last", "_shared", "_zeros", "aggregate",
                 "memo", "window")
    per_port = ("_last", "_hist")  # not saved: a restart starts the windows afresh

    def __init__(self, aggregate: str, details: tuple[str, ...], window: float) -> None:
        self.aggregate = aggregate
        self._details = details
        # The detail totals of a port whose source reads no details (sysfs): one shared tuple
        # instead of one per port.
        self._absent = (-1,) * len(details)
        # Likewise those of a healthy port whose source reads them (the simulator): all zero.
        self._zeros = (0,) * len(details)
        self.window = window
        # (time, aggregate total, number of totals, detail totals or -1 when absent)
        self._last: dict[PortKey, tuple[float, int, int, tuple[int, ...]]] = {}
        self._hist: dict[PortKey, deque[tuple[float, int, int, tuple[int, ...]]]] = {}
        # The latest record built, handed to the next port whose record is equal (same poll,
        # same totals): at first sight a fabric's ports all record the same baseline, and an
        # equal tuple per port was 5 MB at 36,720 ports.
        self._shared: tuple[float, int, int, tuple[int, ...]] | None = None
        self.memo = Memo()  # ``moves``' answers of the last poll

    def observe(self, key: PortKey, now: float, totals: Mapping[str, int]) -> None:
        agg = totals.get(self.aggregate)
        if agg is None:
            return
        last = self._last.get(key)
        if last is not None and last[1] == agg and last[2] == len(totals):
            hist = self._hist.get(key)
            if hist is not None and hist[-1][0] <= now - self.window:
                del self._hist[key]  # a whole window without a change
            return
        details = tuple(totals.get(d, -1) for d in self._details)
        if details == self._absent:
            details = self._absent
        elif details == self._zeros:
            details = self._zeros
        rec = (now, agg, len(totals), details)
        if rec == self._shared:
            rec = self._shared
        else:
            self._shared = rec
        self._last[key] = rec
        if last is None or last[1] == agg:
            return  # first sight (a baseline) or only new counters: nothing happened
        hist = self._hist.get(key)
        if hist is None:
            hist = self._hist[key] = deque([last])
        hist.append(rec)
        horizon = now - self.window
        while len(hist) >= 2 and hist[1][0] <= horizon:
            hist.popleft()

    def moves(self, fresh: Sequence[tuple[PortKey, PortView]],
              aggregates: list[int | None]) -> bytearray:
        """For each port of ``fresh`` (with its ``aggregate`` total): whether ``observe``
        could record or drop anything for it. False only for a port without the aggregate or
        whose aggregate and number of totals are the ones recorded, with no history."""
        last = self._last
        hist = self._hist
        sizes = (fresh.sizes(Totals) if type(fresh) is Fresh else
                 [len(t.index) if type(t := view.totals) is Totals else len(t)
                  for _, view in fresh])
        reuse = self.memo.redo(fresh, aggregates, sizes)
        if reuse is None:
            answers = bytearray([
                agg is not None and (
                    (rec := last.get(key)) is None or rec[1] != agg or key in hist
                    or size != rec[2])
                for (key, _), agg, size in zip(fresh, aggregates, sizes, strict=True)
            ])
        else:
            answers, redo = reuse
            for i in redo:
                key, agg, size = fresh[i][0], aggregates[i], sizes[i]
                answers[i] = agg is not None and (
                    (rec := last.get(key)) is None or rec[1] != agg or key in hist
                    or size != rec[2])
        self.memo.keep(answers)
        return answers

    def increase(self, key: PortKey, now: float) -> tuple[int, dict[str, int]]:
        """(aggregate increase, detail increases) within the trailing window.

        A detail absent at the window's start counts from its first record inside the window
        (a source reads a port's details first when its aggregate moves, when the baseline
        read has not reached the port yet): a lower bound, never an invention. A detail
        absent at the end, or first read in the latest record, is left out (its increase is
        unknown yet).
        """
        hist = self._hist.get(key)
        if not hist or hist[-1][0] <= now - self.window:
            return 0, {}
        ref, cur = self._ends(hist, now)
        out: dict[str, int] = {}
        for i, (name, start, b) in enumerate(zip(self._details, ref[3], cur[3], strict=True)):
            if b < 0:
                continue
            a = start if start >= 0 else next(
                (r[3][i] for r in hist if r[0] > ref[0] and r is not cur and r[3][i] >= 0), -1)
            if a >= 0:
                out[name] = b - a
        return cur[1] - ref[1], out

    def first_read(self, key: PortKey, now: float) -> bool:
        """Whether the port's details were first read in its latest record, after the window
        started without them: their increase shows from the next read on, not yet."""
        hist = self._hist.get(key)
        if not hist or hist[-1][0] <= now - self.window:
            return False
        ref, cur = self._ends(hist, now)
        if cur[3] is self._absent:
            return False
        inside = [r for r in hist if r[0] > ref[0]]
        return all(v < 0 for r in (ref, *inside[:-1]) for v in r[3])

    def _ends(self, hist: deque[tuple[float, int, int, tuple[int, ...]]], now: float
              ) -> tuple[tuple[float, int, int, tuple[int, ...]],
                         tuple[float, int, int, tuple[int, ...]]]:
        """The window's reference record (the last one before it starts) and its latest."""
        horizon = now - self.window
        ref = hist[0]
        for rec in hist:
            if rec[0] > horizon:
                break
            ref = rec
        return ref, hist[-1]

