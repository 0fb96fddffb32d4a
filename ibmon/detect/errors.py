"""Error counters: bit error rate, link integrity, receive errors, discards (docs/infiniband.md §4).

BER is ``Δsymbol_errors / (window x link_bps)`` over a sliding window (default 10 minutes). The
denominator is always the full window, so the first minutes after start-up under-estimate rather
than cry wolf over a handful of errors; a strong fault still crosses 1e-12 within seconds. Only
change points of the symbol-error total are kept (coalesced to ``window/300``), so a clean port
costs one integer and an erroring one at most a few hundred tuples.
"""

from __future__ import annotations

from collections.abc import Container
from itertools import compress
from typing import Any

from pydantic import Field, model_validator

from ibmon.detect.base import (
    KEEP,
    DetectorSettings,
    Finding,
    IncreaseWindow,
    Pairs,
    PortDetector,
    Verdict,
    describe,
    rate_column,
    totals_column,
)
from ibmon.detect.cause import (
    DETAIL_LABELS,
    DISCARD_DETAILS,
    RECEIVE_DETAILS,
    SUSPECT,
    Cause,
    DetailWindow,
    action,
    bit_errors,
    dominant,
    peer_note,
    peer_summary,
)
from ibmon.detect.columns import Fresh, Memo, with_keep
from ibmon.detect.events import Severity
from ibmon.infiniband.model import PortKey, PortState, PortView
from ibmon.track.rates import Rates
from ibmon.track.rowview import store_numpy

__all__ = ["Discards", "HighBer", "LinkIntegrity", "ReceiveErrors"]

_ACTIVE = int(PortState.ACTIVE)


class HighBerSettings(DetectorSettings):
    window: float = Field(default=600.0, gt=0, description="seconds")
    warning: float = Field(default=1e-12, gt=0)
    critical: float = Field(default=1e-10, gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> HighBerSettings:
        if self.critical < self.warning:
            raise ValueError("critical must not be below warning")
        return self


class HighBer(PortDetector):
    """Symbol-error BER against the active link rate; also fills ``PortView.symbol_error_ber``."""

    type = "high_ber"
    condition = "high_ber"
    settings_model = HighBerSettings
    per_port = saved = ("_window",)

    def __init__(self, settings: DetectorSettings) -> None:
        super().__init__(settings)
        assert isinstance(settings, HighBerSettings)
        self._s = settings
        self._window = IncreaseWindow(settings.window, grain=settings.window / 300)

    def needs(self, fresh: Pairs, now: float, active: Container[PortKey]) -> Pairs:
        changes = self._window.changes(fresh, totals_column(fresh, "symbol_errors"), active)
        for (_, view), changed in zip(fresh, changes, strict=True):
            # No symbol error in the window: a BER of 0, below every threshold, which
            # ``check`` would publish on an Active port with a link rate and no pinned counter.
            if (not changed and view.state == _ACTIVE and view.rate_bytes_per_second
                    and "symbol_errors" not in view.saturated):
                view.symbol_error_ber = 0.0
        return list(compress(fresh, changes))

    def check(self, key: PortKey, view: PortView, now: float, active: Finding | None) -> Verdict:
        total = view.totals.get("symbol_errors")
        if total is None:
            return KEEP
        delta = self._window.observe(key, now, total)
        if view.state != _ACTIVE:
            return KEEP  # no link to measure
        rate = view.rate_bytes_per_second
        if not rate:
            return KEEP
        s = self._s
        ber = delta / (s.window * rate * 8.0)
        # A pinned counter loses increments: the BER is only a lower bound. Above a threshold
        # it still proves the fault; below, nothing is known (no gauge, no resolve).
        saturated = "symbol_errors" in view.saturated
        if not saturated:
            view.symbol_error_ber = ber
        if ber >= s.critical:
            severity: Severity = "critical"
            threshold = s.critical
        elif ber >= s.warning:
            severity = "warning"
            threshold = s.warning
        else:
            return KEEP if saturated else None
        minutes = s.window / 60
        peer = self.peer_of(view)
        note = peer_note(view, peer, own_ber=False)
        return Finding(
            severity,
            ber,
            threshold,
            f"{describe(view)}: bit error rate {'at least ' if saturated else ''}{ber:.1e} "
            f"over {minutes:g} min "
            f"({severity} at {threshold:.0e}): {SUSPECT['physical']}"
            + (f"; {note}" if note else ""),
            {"symbol_errors": delta, "window_seconds": s.window, "lower_bound": saturated,
             "cause": "physical", "breakdown": {"symbol_errors": delta},
             "action": action("physical", view), "peer_shows": peer_summary(peer)},
        )



class LinkIntegritySettings(DetectorSettings):
    hold: float = Field(default=600.0, gt=0, description="seconds without an increase to resolve")
    severity: Severity = "critical"
    counters: tuple[str, ...] = ("local_link_integrity_errors", "excessive_buffer_overrun_errors")


#: LocalLinkIntegrityErrors: the physical error rate crossed the port's threshold;
#: ExcessiveBufferOverrunErrors: the sender overran the receive buffers (flow control).
_INTEGRITY_CAUSES: dict[str, Cause] = {
    "local_link_integrity_errors": "physical",
    "excessive_buffer_overrun_errors": "buffer_overrun",
}


class LinkIntegrity(PortDetector):
    """Any increase of LocalLinkIntegrity or ExcessiveBufferOverrun errors (NVSentinel: fatal)."""

    type = "link_integrity"
    condition = "link_integrity"
    settings_model = LinkIntegritySettings
    per_port = saved = ("_last", "_since")

    def __init__(self, settings: DetectorSettings) -> None:
        super().__init__(settings)
        assert isinstance(settings, LinkIntegritySettings)
        self._s = settings
        self._last: dict[PortKey, tuple[int, ...]] = {}
        self._since: dict[PortKey, tuple[float, dict[str, int]]] = {}
        self._zeros: tuple[int, ...] = (0,) * len(settings.counters)
        self.memo = Memo()  # ``needs``' answers of the last poll

    def needs(self, fresh: Pairs, now: float, active: Container[PortKey]) -> Pairs:
        # Unchanged totals and no increase within the hold: nothing to record or report.
        last = self._last
        since = self._since
        columns = [totals_column(fresh, c, -1) for c in self._s.counters]
        reuse = self.memo.redo(fresh, *columns)
        if reuse is None:
            answers = bytearray([
                last.get(key) != values or key in since
                for (key, _), values in zip(fresh, zip(*columns, strict=True), strict=True)
            ])
        else:
            answers, redo = reuse
            for i in redo:
                key = fresh[i][0]
                answers[i] = last.get(key) != tuple(c[i] for c in columns) or key in since
        self.memo.keep(answers)
        return list(compress(fresh, with_keep(fresh, answers, active)))

    def check(self, key: PortKey, view: PortView, now: float, active: Finding | None) -> Verdict:
        totals = view.totals
        values = tuple(totals.get(c, -1) for c in self._s.counters)
        prev = self._last.get(key)
        if values != prev:
            # A healthy port's totals are all zero: those ports share one tuple (2 MB at
            # 36,720 ports), and an unchanged port keeps the one it has.
            self._last[key] = self._zeros if values == self._zeros else values
        seen = self._since.get(key)
        if prev is not None and values != prev:
            grown = {
                c: v - p
                for c, v, p in zip(self._s.counters, values, prev, strict=True)
                if p >= 0 and v > p
            }
            if grown:
                counts = dict(seen[1]) if seen else {}
                for c, n in grown.items():
                    counts[c] = counts.get(c, 0) + n
                seen = self._since[key] = (now, counts)
        if seen is None:
            return None
        if now - seen[0] >= self._s.hold:
            del self._since[key]
            return None
        counts = seen[1]
        what = ", ".join(f"{n} {c.replace('_', ' ')}" for c, n in sorted(counts.items()))
        cause, _ = dominant(counts, _INTEGRITY_CAUSES)
        peer = self.peer_of(view)
        note = peer_note(view, peer)
        return Finding(
            self._s.severity,
            float(sum(counts.values())),
            0.0,
            f"{describe(view)}: link integrity errors ({what}): {SUSPECT[cause]}"
            + (f"; {note}" if note else ""),
            {"counters": counts, "cause": cause, "breakdown": dict(counts),
             "action": action(cause, view), "peer_shows": peer_summary(peer)},
        )

    def encode(self, name: str, value: Any, offset: float) -> list[Any]:
        if name == "_since":  # (monotonic time of the last increase, counts)
            return [value[0] + offset, value[1]]
        return [list(value)]

    def decode(self, name: str, fields: list[Any], offset: float) -> Any:
        if name == "_since":
            return (float(fields[0]) - offset, {str(k): int(v) for k, v in fields[1].items()})
        return tuple(int(x) for x in fields[0])


#: How several detail counters of one cause read in a sentence.
_GROUPS: dict[str, str] = {
    "routing": "routing errors (DLID/VL mapping, looping)",
    "congestion_victim": "lifetime-limit discards",
}


class RateSettings(DetectorSettings):
    threshold: float = Field(gt=0, description="per second")
    clear_polls: int = Field(
        default=3, ge=1, description="polls at or below the threshold to resolve"
    )
    severity: Severity = "warning"
    window: float = Field(
        default=60.0, gt=0,
        description="seconds over which the event counts the errors and their breakdown",
    )


class ReceiveErrorsSettings(RateSettings):
    threshold: float = Field(default=10.0, gt=0)


class DiscardsSettings(RateSettings):
    threshold: float = Field(default=100.0, gt=0)


class _RateDetector(PortDetector):
    """Fires at the first poll whose rate exceeds the threshold, resolves after quiet polls.

    The event counts the errors of the trailing ``window`` and splits them by detail counter
    (``details.breakdown``), from totals: a source reads the details only for ports whose
    aggregate moved, so one poll's sample may not carry them.
    """

    counter: str
    label: str
    details: dict[str, Cause]
    per_port = ("_quiet", "_held", "_window")
    saved = ("_quiet",)

    def __init__(self, settings: DetectorSettings) -> None:
        super().__init__(settings)
        assert isinstance(settings, RateSettings)
        self._s = settings
        self._quiet: dict[PortKey, int] = {}
        #: ports over the threshold whose details were first read this poll: fire next poll
        self._held: dict[PortKey, float] = {}
        self._window = DetailWindow(self.counter, tuple(self.details), settings.window)

    def needs(self, fresh: Pairs, now: float, active: Container[PortKey]) -> Pairs:
        # A port whose totals the window would not record, with no rate over the threshold
        # and no condition, gets None (no rate: KEEP, the same for a port without one).
        threshold = self._s.threshold
        moves = self._window.moves(fresh, totals_column(fresh, self.counter))
        over = fresh.column_array(Rates, self.counter) if type(fresh) is Fresh else None
        if over is None:
            rates = rate_column(fresh, self.counter)
            picks = bytearray([moved or rate > threshold
                               for moved, rate in zip(moves, rates, strict=True)])
        else:  # the same, in numpy (NaN > threshold is False): no float object a port
            np = store_numpy()  # ``over`` is gathered from the column store
            picks = bytearray((np.frombuffer(moves, dtype=np.uint8) | (over > threshold))
                              .tobytes())
        return list(compress(fresh, with_keep(fresh, picks, active)))

    def check(self, key: PortKey, view: PortView, now: float, active: Finding | None) -> Verdict:
        self._window.observe(key, now, view.totals)
        rate = view.rates.get(self.counter)
        held = self._held.pop(key, None)
        if held is not None and active is None:
            # fired one poll late, with the cause the details now give (or without one)
            self._quiet.pop(key, None)
            return self._finding(key, view, now, max(held, rate or 0.0))
        if rate is None:
            return KEEP
        s = self._s
        if rate > s.threshold:
            self._quiet.pop(key, None)
            if active is None and self._window.first_read(key, now):
                # the details arrived in this poll, with no earlier value to count from: the
                # first event would say "unknown"; the next poll's read names the cause
                self._held[key] = rate
                return None
            return self._finding(key, view, now, rate)
        if active is None:
            return None
        quiet = self._quiet.get(key, 0) + 1
        if quiet >= s.clear_polls:
            self._quiet.pop(key, None)
            return None
        self._quiet[key] = quiet
        return active

    def fallback(self, view: PortView) -> str:
        """The cause when no detail counter moved: what the port's other counters say."""
        return "unknown"

    def _finding(self, key: PortKey, view: PortView, now: float, rate: float) -> Finding:
        s = self._s
        n, breakdown = self._window.increase(key, now)
        cause, share = dominant(breakdown, self.details)
        text = f"{describe(view)}: {max(n, 0):,} {self.label} in {s.window:g} s"
        if cause == "unknown":
            cause = self.fallback(view)
            why = "no detail counters" if not breakdown else "no detail counter moved"
            text += f" ({rate:.0f}/s; {why})"
        else:
            moved = [c for c, m in breakdown.items() if m > 0 and self.details[c] == cause]
            top = max(moved, key=lambda c: breakdown[c])
            label = DETAIL_LABELS[top] if len(moved) == 1 else _GROUPS.get(cause, cause)
            share = sum(breakdown[c] for c in moved) / max(n, sum(breakdown.values()), 1)
            text += f", {share * 100:.0f} % {label}"
        peer = self.peer_of(view)
        note = peer_note(view, peer)
        return Finding(
            s.severity,
            rate,
            s.threshold,
            f"{text}: {SUSPECT[cause]}" + (f"; {note}" if note else ""),
            {"counter": self.counter, "cause": cause, "breakdown": breakdown,
             "window_seconds": s.window, "count": max(n, 0), "action": action(cause, view),
             "peer_shows": peer_summary(peer)},
        )

    def decode(self, name: str, fields: list[Any], offset: float) -> Any:
        return int(fields[0])


class ReceiveErrors(_RateDetector):
    type = "receive_errors"
    condition = "receive_errors"
    settings_model = ReceiveErrorsSettings
    counter = "receive_errors"
    label = "receive errors"
    details = RECEIVE_DETAILS

    def fallback(self, view: PortView) -> str:
        # PortRcvErrors counts both bad packets off the wire and packets dropped for buffer
        # overruns: bit errors on this receiver mean the wire; integrity errors still firing
        # from overruns alone mean flow control.
        if bit_errors(view):
            return "physical"
        if view.causes.get("link_integrity") == "buffer_overrun":
            return "buffer_overrun"
        return "unknown"


class Discards(_RateDetector):
    type = "discards"
    condition = "discards"
    settings_model = DiscardsSettings
    counter = "transmit_discards"
    label = "transmit discards"
    details = DISCARD_DETAILS

    def fallback(self, view: PortView) -> str:
        # Stalled for credits: discards from waiting too long. A link that was down: inactive.
        if "congestion" in view.conditions or (view.xmit_wait_ratio or 0.0) >= 0.10:
            return "congestion_victim"
        if view.conditions & {"down", "flapping"}:
            return "link_down"
        return "unknown"
