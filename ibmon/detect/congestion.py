"""Congestion from PortXmitWait (InfiniBand) or ECN/CNP hw_counters (RoCE), with hysteresis.

docs/infiniband.md §4: ``xmit_wait_ratio`` at or above 0.10 for 3 polls is a warning, at or above
0.50 for 3 polls critical; it clears only after 3 polls below 0.05. A congested port that is busy
sending is a *hotspot*; one that sends little while waiting suffers *backpressure* from
downstream, and fixing it means looking further along the path. The event says which, or
``unknown`` when the port's data counters give no rate to tell by.

State exists only for ports at or above the clear level (or already firing), so a quiet fabric
of 20,000 ports costs one comparison per port.
"""

from __future__ import annotations

from collections.abc import Collection, Container
from operator import attrgetter
from typing import Any

from pydantic import Field, model_validator

from ibmon.detect.base import (
    KEEP,
    DetectorSettings,
    Finding,
    Pairs,
    PortDetector,
    Verdict,
    describe,
)
from ibmon.detect.cause import (
    HOTSPOT_ACTION,
    SUSPECT,
    UNKNOWN_LOAD_ACTION,
    action,
    end_name,
    far_end,
    peer_note,
    peer_summary,
)
from ibmon.detect.columns import Fresh
from ibmon.detect.events import Severity
from ibmon.infiniband.linkspeed import SPEED_ORDER, WIDTH_LANES
from ibmon.infiniband.model import PortKey, PortView

__all__ = ["Congestion", "CongestionSettings"]

_LINK_LAYER = attrgetter("link_layer")


class CongestionSettings(DetectorSettings):
    warning: float = Field(default=0.10, gt=0, le=1, description="xmit_wait_ratio")
    critical: float = Field(default=0.50, gt=0, le=1)
    clear: float = Field(default=0.05, ge=0, le=1)
    sustain: int = Field(default=3, ge=1, description="polls at or above a level before it counts")
    clear_polls: int = Field(default=3, ge=1, description="polls below clear before resolving")
    hotspot_utilization: float = Field(
        0.4, ge=0, le=1, description="transmit utilization at or above which it is a hotspot"
    )
    roce_counters: tuple[str, ...] = ("rp_cnp_handled", "np_ecn_marked_roce_packets")
    roce_warning: float = Field(default=1000.0, gt=0, description="CNP/ECN per second")
    roce_critical: float = Field(default=10000.0, gt=0)
    roce_clear: float = Field(default=100.0, ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> CongestionSettings:
        if not self.clear <= self.warning <= self.critical:
            raise ValueError("need clear <= warning <= critical")
        if not self.roce_clear <= self.roce_warning <= self.roce_critical:
            raise ValueError("need roce_clear <= roce_warning <= roce_critical")
        return self


class Congestion(PortDetector):
    type = "congestion"
    condition = "congestion"
    settings_model = CongestionSettings
    per_port = saved = ("_runs",)

    def __init__(self, settings: DetectorSettings) -> None:
        super().__init__(settings)
        assert isinstance(settings, CongestionSettings)
        self._s = settings
        # [polls >= warning, polls >= critical, polls < clear], consecutive
        self._runs: dict[PortKey, list[int]] = {}

    def needs(self, fresh: Pairs, now: float, active: Container[PortKey]) -> Pairs:
        # An InfiniBand port with no run under way, no condition and a transmit-wait ratio
        # below ``clear`` (or none: KEEP) gets None. ``not ratio < clear`` as ``check`` has it.
        runs = self._runs
        clear = self._s.clear
        if type(fresh) is Fresh and isinstance(active, Collection):
            wait = fresh.ratios("wait_ratio")
            if wait is not None:
                return self._laid_out_needs(fresh, wait, active)
        return [
            pair for pair in fresh
            if pair[0] in runs or pair[0] in active
            or pair[1].identity.link_layer == "Ethernet"
            or ((ratio := pair[1].xmit_wait_ratio) is not None and not ratio < clear)
        ]

    def _laid_out_needs(self, fresh: Fresh, wait: Any, active: Collection[PortKey]) -> Pairs:
        """``needs`` of a poll the tracker laid out, from its array of ratios (NaN: none,
        which ``>=`` leaves out as ``is not None`` does): no property called and no key looked
        up a port, only the keys of ports with a run or a condition, and the views read once
        for their identities (a list ``topology_changed`` reads as well): 9-13 ms a poll at
        118,400 ports, where a pass over every view took 23-29."""
        picked = set((wait >= self._s.clear).nonzero()[0].tolist())
        order = fresh.order()
        picked.update(order.positions(self._runs))
        picked.update(order.positions(active))
        layers = list(map(_LINK_LAYER, fresh.attribute("identity")))
        if "Ethernet" in layers:  # RoCE ports: a fabric's MADs never answer for one
            picked.update(i for i, layer in enumerate(layers) if layer == "Ethernet")
        return [fresh[i] for i in sorted(picked)]

    def check(self, key: PortKey, view: PortView, now: float, active: Finding | None) -> Verdict:
        s = self._s
        if view.identity.link_layer == "Ethernet":
            value = self._roce_signal(view)
            warn, crit, clear, unit = s.roce_warning, s.roce_critical, s.roce_clear, "roce"
        else:
            value = view.xmit_wait_ratio
            warn, crit, clear, unit = s.warning, s.critical, s.clear, "ratio"
        if value is None:
            return KEEP  # no rate this poll (baseline, saturated PortXmitWait): keep as is
        runs = self._runs.get(key)
        if runs is None:
            if value < clear and active is None:
                return None
            runs = self._runs[key] = [0, 0, 0]
        runs[0] = runs[0] + 1 if value >= warn else 0
        runs[1] = runs[1] + 1 if value >= crit else 0
        runs[2] = runs[2] + 1 if value < clear else 0
        if active is None:
            if runs[0] < s.sustain:
                if value < clear:
                    del self._runs[key]
                return None
        elif runs[2] >= s.clear_polls:
            del self._runs[key]
            return None
        severity: Severity = "critical" if runs[1] >= s.sustain else "warning"
        if active is not None and active.severity in (severity, "critical"):
            return _updated(active, value)  # nothing new: the engine never de-escalates
        return self._finding(view, value, severity, warn if severity == "warning" else crit, unit)

    def _roce_signal(self, view: PortView) -> float | None:
        rates = [view.hw_rates[c] for c in self._s.roce_counters if c in view.hw_rates]
        return max(rates) if rates else None

    def _finding(
        self, view: PortView, value: float, severity: Severity, threshold: float, unit: str
    ) -> Finding:
        util = view.utilization_tx
        if util is None:  # the data counters give no rate (a pinned 32-bit counter)
            kind = "unknown"
        elif util >= self._s.hotspot_utilization:
            kind = "hotspot"
        else:
            kind = "backpressure"
        used = "utilization unknown" if util is None else f"{kind}, {util * 100:.0f} % utilized"
        if unit == "ratio":
            what = f"{value * 100:.0f} % of the time stalled"
        else:
            what = f"{value:.0f} ECN/CNP per second"
        # Backpressure: blocked by congestion further along. A hotspot on a link that trained
        # slow is slow because of that; a hotspot on a healthy link is just oversubscribed:
        # nothing is broken (cause unknown), the action is to spread the traffic. Without a
        # utilization neither can be told, and the action says how to tell.
        if kind == "backpressure":
            cause = "congestion_victim"
        elif kind == "hotspot" and _trained_slow(view):
            cause = "speed_negotiation"
        else:
            cause = "unknown"
        ends = {"here": end_name(view.identity), "peer": far_end(view)}
        if kind == "unknown":
            act = UNKNOWN_LOAD_ACTION.format(**ends)
            suspect = "whether it is the hotspot or blocked further along cannot be told"
        elif cause == "unknown":
            act = HOTSPOT_ACTION.format(**ends)
            suspect = "too much traffic for this link"
        else:
            act = action(cause, view)
            suspect = SUSPECT[cause]
        peer = self.peer_of(view)
        note = peer_note(view, peer)
        return Finding(
            severity,
            value,
            threshold,
            f"{describe(view)} is congested ({used}, {what}): {suspect}"
            + (f"; {note}" if note else ""),
            {
                "kind": kind,
                "utilization": util,
                "signal": "xmit_wait" if unit == "ratio" else "ecn_cnp",
                "cause": cause,
                "breakdown": {},
                "action": act,
                "peer_shows": peer_summary(peer),
            },
        )

    def decode(self, name: str, fields: list[Any], offset: float) -> Any:
        runs = [int(x) for x in fields[0]]
        if len(runs) != 3:
            raise ValueError("bad run counters")
        return runs


_SPEED_RANK = {name: i for i, name in enumerate(SPEED_ORDER)}


def _trained_slow(view: PortView) -> bool:
    """Whether the link runs below the best width or speed both ends support and enable."""
    link = view.link
    if link is None or not link.max_width or not link.max_speed:
        return False
    width = link.active_width or view.active_width
    speed = link.active_speed or view.active_speed
    lanes, best_lanes = WIDTH_LANES.get(width), WIDTH_LANES.get(link.max_width)
    rank, best_rank = _SPEED_RANK.get(speed), _SPEED_RANK.get(link.max_speed)
    if None in (lanes, best_lanes, rank, best_rank):
        return False
    return bool(lanes < best_lanes or rank < best_rank)  # type: ignore[operator]


def _updated(active: Finding, value: float) -> Finding:
    """The same condition with today's value (for the API); the engine emits nothing for it."""
    return Finding(active.severity, value, active.threshold, active.message, active.details)
