"""Link faults: a port that went down, a link that keeps going down, a link running slow.

docs/infiniband.md §3-4: a port that was Active and is not is down; three or more LinkDowned
increments within 10 minutes is flapping; a link whose active width or speed is below the best
both ends support and enable is degraded. sysfs knows only the active rate, so node-local ports
compare against a configured expected rate or the majority rate of the host's other ports of
the same link layer and adapter model.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Container, Mapping
from itertools import compress
from typing import TypeGuard

from pydantic import Field

from ibmon.detect.base import (
    KEEP,
    DetectorSettings,
    Finding,
    IncreaseWindow,
    Pairs,
    PortDetector,
    Verdict,
    describe,
    totals_column,
)
from ibmon.detect.cause import SUSPECT, bit_errors
from ibmon.detect.columns import Memo, attribute, with_keep
from ibmon.detect.events import Severity
from ibmon.infiniband.linkspeed import SPEED_ORDER, WIDTH_LANES
from ibmon.infiniband.model import (
    LinkInfo,
    PhysState,
    PortIdentity,
    PortKey,
    PortState,
    PortView,
    state_json,
    state_label,
)

__all__ = ["LinkDegraded", "LinkFlapping", "PortDown"]

_ACTIVE = int(PortState.ACTIVE)
# Derived from linkspeed's tables (the one copy), never restated here.
_SPEED_RANK = {name: i for i, name in enumerate(SPEED_ORDER)}


#: What a port that is not Active says by its physical state (docs/infiniband.md, section 3):
#: Polling, no signal from a peer; Disabled, switched off by management; LinkUp while the port
#: is Init or Armed, the link trained but no subnet manager made the port Active.
_WHY_DOWN: dict[object, str] = {
    PhysState.POLLING: "no signal: the cable is out, or the far end is down or rebooting",
    PhysState.DISABLED: "the port is disabled (by an administrator, ibportstate or the subnet "
                        "manager)",
    PhysState.LINK_UP: "the link trained, but no subnet manager has made the port Active "
                       "(is one running?)",
    PhysState.PORT_CONFIGURATION_TRAINING: "the link is training",
    PhysState.LINK_ERROR_RECOVERY: "the link is recovering from errors",
}


class PortDownSettings(DetectorSettings):
    severity: Severity = "critical"


class PortDown(PortDetector):
    """Fires when a port that has been Active is seen in any other state; resolves when Active.

    Ports never seen Active (unused ports, a cable never plugged) are not faults.
    """

    type = "port_down"
    condition = "down"
    link_scoped = True
    settings_model = PortDownSettings
    per_port = saved = ("_was_active",)

    def __init__(self, settings: DetectorSettings) -> None:
        super().__init__(settings)
        assert isinstance(settings, PortDownSettings)
        self._severity: Severity = settings.severity
        self._was_active: set[PortKey] = set()
        self.memo = Memo()  # ``needs``' answers of the last poll

    def needs(self, fresh: Pairs, now: float, active: Container[PortKey]) -> Pairs:
        up = _ACTIVE
        states = attribute(fresh, "state")
        reuse = self.memo.redo(fresh, states)
        if reuse is None:
            self._was_active.update(
                [key for (key, _), s in zip(fresh, states, strict=True) if s == up])
            answers = bytearray([s != up for s in states])
        else:  # an Active port whose state is unchanged was recorded Active already
            answers, redo = reuse
            for i in redo:
                answers[i] = states[i] != up
                if states[i] == up:
                    self._was_active.add(fresh[i][0])
        self.memo.keep(answers)
        return list(compress(fresh, with_keep(fresh, answers, active)))

    def suspect(self, finding: Finding, cause: str) -> str:
        """What the physical state says of a port that is not Active."""
        return _WHY_DOWN.get(finding.details.get("phys_state"), SUSPECT[cause])

    def check(self, key: PortKey, view: PortView, now: float, active: Finding | None) -> Verdict:
        state = view.state
        if state == _ACTIVE:
            self._was_active.add(key)
            return None
        if state is None or key not in self._was_active:
            return KEEP
        return Finding(
            self._severity,
            float(state),
            float(_ACTIVE),
            f"{describe(view)} is down ({state_label(state, view.phys_state)})",
            {**state_json(state, view.phys_state), "cause": "link_down", "breakdown": {}},
        )


class LinkFlappingSettings(DetectorSettings):
    window: float = Field(default=600.0, gt=0, description="seconds")
    count: int = Field(default=3, ge=1, description="LinkDowned increments within the window")
    severity: Severity = "warning"


class LinkFlapping(PortDetector):
    """Counts LinkDowned increments (software totals, so resets do not matter) in a window."""

    type = "link_flapping"
    condition = "flapping"
    link_scoped = True
    settings_model = LinkFlappingSettings
    per_port = saved = ("_window",)

    def __init__(self, settings: DetectorSettings) -> None:
        super().__init__(settings)
        assert isinstance(settings, LinkFlappingSettings)
        self._s = settings
        self._window = IncreaseWindow(settings.window)

    def needs(self, fresh: Pairs, now: float, active: Container[PortKey]) -> Pairs:
        changes = self._window.changes(fresh, totals_column(fresh, "link_downed"), active)
        return list(compress(fresh, changes))

    def suspect(self, finding: Finding, cause: str) -> str:
        """Without bit errors, what takes a link down again and again (``link_down``'s own
        clause, "the link was down", would repeat the symptom)."""
        if cause == "link_down":
            return ("a far end that keeps restarting, or a cable or transceiver that keeps "
                    "losing the signal")
        return SUSPECT[cause]

    def check(self, key: PortKey, view: PortView, now: float, active: Finding | None) -> Verdict:
        total = view.totals.get("link_downed")
        if total is None:
            return KEEP
        n = self._window.observe(key, now, total)
        if n < self._s.count:
            return None
        minutes = self._s.window / 60
        # Bit errors on either end of the link make it the cable; otherwise the link just
        # went down.
        peer = self.peer_of(view)
        physical = bit_errors(view) or (peer is not None and bit_errors(peer))
        return Finding(
            self._s.severity,
            float(n),
            float(self._s.count),
            f"{describe(view)} is flapping: link went down {n} times in {minutes:g} min",
            {"link_downs": n, "window_seconds": self._s.window,
             "cause": "physical" if physical else "link_down",
             "breakdown": {"link_downed": n}},
        )


def _kind(identity: PortIdentity) -> tuple[str, str]:
    """What a node-local port's rate is compared within: its link layer and its adapter's model
    (the board id, else the HCA type; ``""`` where the source reads neither)."""
    return identity.link_layer, identity.board_id or identity.hca_type


class LinkDegradedSettings(DetectorSettings):
    severity: Severity = "warning"
    expected_rate_gbps: float | None = Field(
        None, gt=0, description="node-local ports: the rate every active port should run at"
    )
    majority_min_ports: int = Field(
        3, ge=2, description="node-local ports: how many active ports a majority needs"
    )


class LinkDegraded(PortDetector):
    """Active width/speed below the link's best common; else below expected or majority rate."""

    type = "link_degraded"
    condition = "degraded"
    link_scoped = True
    settings_model = LinkDegradedSettings

    def __init__(self, settings: DetectorSettings) -> None:
        super().__init__(settings)
        assert isinstance(settings, LinkDegradedSettings)
        self._s = settings
        self._majority: dict[tuple[str, str], float] = {}
        #: (active width, active speed, max width, max speed) -> whether a link running so
        #: is fine (``_grade`` is True): a handful of combinations on any fabric.
        self._fine: dict[tuple[str, str, str, str], bool] = {}
        self.memo = Memo()  # ``needs``' answers of the last poll (a function of its inputs)

    def begin(self, now: float, views: Mapping[PortKey, PortView]) -> None:
        super().begin(now, views)
        # Per link layer and adapter model: a 25G RoCE port is no degraded copy of the host's
        # 100G IB ports, nor is a storage adapter at HDR (or an iWARP NIC the kernel lists as
        # InfiniBand) a degraded copy of the compute adapters at NDR beside it.
        self._majority = {}
        if self._s.expected_rate_gbps is not None:
            return
        by_kind: dict[tuple[str, str], Counter[float]] = {}
        for v in views.values():
            if (
                v.state == _ACTIVE
                and v.rate_bytes_per_second
                and not _graded(v.link)
            ):
                counts = by_kind.setdefault(_kind(v.identity), Counter())
                counts[v.rate_bytes_per_second] += 1
        for kind, rates in by_kind.items():
            n = sum(rates.values())
            if n >= self._s.majority_min_ports:
                rate, count = rates.most_common(1)[0]
                if count * 2 > n:
                    self._majority[kind] = rate

    def needs(self, fresh: Pairs, now: float, active: Container[PortKey]) -> Pairs:
        # An Active port whose link names all four rates, in a combination already graded
        # fine, gets None from ``check``.
        # The answer is the same for the same state and link (equal objects): kept a poll.
        fine = self._fine

        def picked(state: int | None, link: LinkInfo | None) -> bool:
            if state != _ACTIVE or link is None:
                return True
            rates = (link.active_width, link.active_speed, link.max_width, link.max_speed)
            ok = fine.get(rates)
            if ok is None:
                ok = fine[rates] = all(rates) and _grade(*rates) is True
            return not ok

        states = attribute(fresh, "state")
        links = attribute(fresh, "link")
        reuse = self.memo.redo(fresh, states, links)
        if reuse is None:
            answers = bytearray(map(picked, states, links))
        else:
            answers, redo = reuse
            for i in redo:
                answers[i] = picked(states[i], links[i])
        self.memo.keep(answers)
        return list(compress(fresh, with_keep(fresh, answers, active)))

    def check(self, key: PortKey, view: PortView, now: float, active: Finding | None) -> Verdict:
        if view.state != _ACTIVE:
            return KEEP
        link = view.link
        if _graded(link):
            return self._fabric(
                view,
                link.active_width or view.active_width,
                link.active_speed or view.active_speed,
                link.max_width,
                link.max_speed,
            )
        rate = view.rate_bytes_per_second
        if not rate:
            return KEEP
        gbps = rate * 8 / 1e9
        if self._s.expected_rate_gbps is not None:
            expected = self._s.expected_rate_gbps
            basis = "configured expected rate"
        elif (majority := self._majority.get(kind := _kind(view.identity))) is not None:
            expected = majority * 8 / 1e9
            layer, model = kind
            basis = f"rate of most of the host's {layer} ports" + (
                f" on {model} adapters" if model else "")
        else:
            return KEEP
        if gbps >= expected * 0.999:
            return None
        return Finding(
            self._s.severity,
            gbps,
            expected,
            f"{describe(view)} runs at {gbps:g} Gb/s, below the {basis} ({expected:g} Gb/s)",
            {"rate_gbps": gbps, "expected_gbps": expected, "basis": basis,
             "cause": "speed_negotiation", "breakdown": {}},
        )

    def _fabric(
        self, view: PortView, width: str, speed: str, max_width: str, max_speed: str
    ) -> Verdict:
        grade = _grade(width, speed, max_width, max_speed)
        if grade is None:
            return KEEP
        if grade:
            return None
        return Finding(
            self._s.severity,
            None,
            None,
            f"{describe(view)} runs at {width} {speed}, could be {max_width} {max_speed}",
            {
                "active_width": width,
                "active_speed": speed,
                "max_width": max_width,
                "max_speed": max_speed,
                "cause": "speed_negotiation",
                "breakdown": {},
            },
        )


def _graded(link: LinkInfo | None) -> TypeGuard[LinkInfo]:
    """Whether the link names its best width and speed, so it is graded against them (else
    the port's rate is judged against the expected or majority rate)."""
    return link is not None and bool(link.max_width) and bool(link.max_speed)


def _grade(width: str, speed: str, max_width: str, max_speed: str) -> bool | None:
    """Whether a link running at ``width`` and ``speed`` runs at its best (``max_*``);
    None when a name is unknown."""
    lanes, max_lanes = WIDTH_LANES.get(width), WIDTH_LANES.get(max_width)
    rank, max_rank = _SPEED_RANK.get(speed), _SPEED_RANK.get(max_speed)
    if lanes is None or max_lanes is None or rank is None or max_rank is None:
        return None
    return lanes >= max_lanes and rank >= max_rank
