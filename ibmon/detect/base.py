"""What every detector shares: findings, the ``KEEP`` verdict, settings and port descriptions.

A port detector looks at one port view per poll and answers with a *verdict*: a ``Finding``
(the condition holds, at this severity), ``None`` (it does not hold), or ``KEEP`` (no opinion this
poll: the value needed is missing, saturated or the port is down). The engine turns verdicts
into edge-triggered events, so detectors never have to remember whether they already fired.
"""

from __future__ import annotations

import builtins
from collections import deque
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

from pydantic import BaseModel, ConfigDict

from ibmon.detect.cause import SUSPECT, action, end_name, far_end, preferred
from ibmon.detect.columns import Fresh, Memo, read_column, with_keep
from ibmon.detect.events import EventType, Severity, severity_rank
from ibmon.detect.portstate import PerPortState, key_from_json, key_to_json
from ibmon.infiniband.model import PortKey, PortView, state_json
from ibmon.track.rates import NO_RATE, Rates
from ibmon.track.totals import Totals

__all__ = [
    "KEEP",
    "DetectorSettings",
    "Finding",
    "IncreaseWindow",
    "Keep",
    "Pairs",
    "PerPortState",
    "PortDetector",
    "Verdict",
    "describe",
    "key_from_json",
    "key_to_json",
    "rate_column",
    "totals_column",
]

Pairs = list[tuple[PortKey, PortView]]
"""(key, view) of the ports a detector is to judge, in the views' order."""


class Keep:
    """The "no opinion this poll" verdict (a singleton)."""

    _instance: ClassVar[Keep | None] = None

    def __new__(cls) -> Keep:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "KEEP"


KEEP: Final = Keep()


@dataclass(frozen=True, slots=True)
class Finding:
    """A condition that holds on a port right now."""

    severity: Severity
    value: float | None = None
    threshold: float | None = None
    message: str = ""
    details: dict[str, Any] = field(default_factory=dict)


Verdict = Finding | None | Keep


class DetectorSettings(BaseModel):
    """``[detect.<name>]``: every detector can be switched off; unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    enabled: bool = True


class PortDetector(PerPortState):
    """One family's rule, evaluated per port per poll.

    ``type`` is the event type, ``condition`` the ``ibmon_port_condition`` label (None when the
    condition has no such series), ``oneshot`` detectors report instants (a reset) rather than
    conditions: the engine emits one ``firing`` event per finding and remembers nothing.
    What it remembers per port is declared once (``PerPortState``): ``forget``, ``dump`` and
    ``load`` are the base class's.
    """

    type: ClassVar[EventType]
    condition: ClassVar[str | None] = None
    oneshot: ClassVar[bool] = False
    #: A fault of the link rather than of one port's counters: the engine raises it once per
    #: link, on the link's carrying end, with both ends' verdicts joined (``join``).
    link_scoped: ClassVar[bool] = False
    settings_model: ClassVar[builtins.type[DetectorSettings]] = DetectorSettings

    def __init__(self, settings: DetectorSettings) -> None:
        self.settings = settings
        self.views: Mapping[PortKey, PortView] = {}

    def begin(self, now: float, views: Mapping[PortKey, PortView]) -> None:
        """Called once per poll before ``check``, for rules that compare ports with each other
        or look at the far end of a link (``peer_of``). Overrides call this first."""
        self.views = views

    def peer_of(self, view: PortView) -> PortView | None:
        """The view of the far end of ``view``'s link, when the same source sees it."""
        link = view.link
        if link is None or not link.remote_guid:
            return None
        return self.views.get((link.remote_guid, link.remote_port))

    def join(self, here: PortView, mine: Finding | None, peer: PortView | None,
             theirs: Finding | None) -> Finding:
        """One finding for a link from its ends' verdicts (at least one holds), told from
        ``here``, the carrying end: the higher severity, the more specific cause, which ends
        show it, the suspect clause and the action. ``peer`` is None when the source sees only
        this end. Link-scoped detectors' ``check`` messages are the bare symptom
        (``leaf02 port 3 (to host021 mlx5_0 port 1) is down (DOWN/Polling)``); this completes them.
        """
        first = mine if mine is not None else theirs
        assert first is not None
        severity = first.severity
        if theirs is not None and severity_rank(theirs.severity) > severity_rank(severity):
            severity = theirs.severity
        cause = preferred(*(str(f.details.get("cause", "unknown"))
                            for f in (mine, theirs) if f is not None))
        if mine is not None:
            text = mine.message
        else:
            assert theirs is not None
            assert peer is not None
            # the far end's words, told from this end: "... is down (DOWN/Polling)"
            text = f"{describe(here)}: at the far end, {theirs.message}"
        if peer is not None:
            if mine is not None and theirs is not None:
                text += ", at both ends"
            elif mine is not None and peer.stale:
                # nothing is known of an end that did not answer: never call it fine
                text += f", the far end ({end_name(peer.identity)}) does not answer"
            elif mine is not None:
                text += f", not at the far end ({end_name(peer.identity)})"
        details = dict(first.details)
        details.update(cause=cause, action=action(cause, here))
        if peer is not None:
            details["ends"] = [_end(here, mine), _end(peer, theirs)]
        return Finding(severity, first.value, first.threshold,
                       f"{text}: {self.suspect(first, cause)}", details)

    def suspect(self, finding: Finding, cause: str) -> str:
        """The clause after a link fault's symptom: what probably caused it."""
        return SUSPECT[cause]

    def check(self, key: PortKey, view: PortView, now: float, active: Finding | None) -> Verdict:
        raise NotImplementedError

    def needs(self, fresh: Pairs, now: float, active: Container[PortKey]) -> Pairs:
        """The ports of ``fresh`` (this poll's ports that answered, in order) to ``check``.

        Every port left out must be one where ``check(key, view, now, None)`` would answer
        None (or ``KEEP``, for a detector that is not link-scoped) and change nothing this
        method has not already changed the same way (a window's last value, a gauge on the
        view); a port in ``active`` (a condition it carries) is never left out. It exists for
        speed: on a healthy fabric nearly every port is left out by one short loop
        over plain attributes, instead of a method call per port per detector. A ``Memo``
        kept as ``memo`` reuses last poll's answers on this contract alone (a port left out
        was not changed), so no ``check`` has to say what it changed. Default: all.
        """
        return fresh

    def vanished(self, now: float, views: Mapping[PortKey, PortView]) -> list[tuple[Any, Finding]]:
        """Findings about ports absent from ``views`` (vanished ports): ``(identity, finding)``."""
        return []

    def _label(self) -> str:
        return f"{self.type}: "


def describe(view: PortView) -> str:
    """``leaf07 port 12 (to gpu031 mlx5_0 port 1)``: both ends of the link, when known
    (display only: node descriptions are untrusted text)."""
    text = end_name(view.identity)
    link = view.link
    if link is not None and (link.remote_node_desc or link.remote_guid):
        text += f" (to {far_end(view)})"
    return text


def _end(view: PortView, finding: Finding | None) -> dict[str, Any]:
    """One end of a link in ``details.ends``: who, its state, whether the fault shows there."""
    ident = view.identity
    return {"guid": ident.guid, "port": ident.port, "node_desc": ident.node_desc,
            **state_json(view.state, view.phys_state), "stale": view.stale,
            "holds": finding is not None}


class IncreaseWindow(PerPortState):
    """Per port: how much a software-accumulated total rose within a sliding time window.

    Shared by the detectors that judge "N increments in T seconds" (flapping, BER). Totals come
    from the tracker, so hardware resets never show as drops. Increases less than ``grain``
    seconds after the previous recorded one are merged into it (bounded memory for a counter
    that rises every poll; the merged increase then leaves the window up to one grain early).
    """

    per_port = saved = ("_last", "_hist")

    def __init__(self, window: float, grain: float = 0.0) -> None:
        self.window = window
        self.grain = grain
        self._last: dict[PortKey, int] = {}
        self._hist: dict[PortKey, deque[tuple[float, int]]] = {}
        self.memo = Memo()  # ``changes``' answers of the last poll

    def observe(self, key: PortKey, now: float, total: int) -> int:
        """Record the port's current total; return its increase within the trailing window."""
        prev = self._last.get(key)
        self._last[key] = total
        hist = self._hist.get(key)
        if prev is not None and total > prev:
            if hist is None:
                hist = self._hist[key] = deque()
            if hist and now - hist[-1][0] < self.grain:
                t, n = hist[-1]
                hist[-1] = (t, n + total - prev)
            else:
                hist.append((now, total - prev))
        if hist is None:
            return 0
        horizon = now - self.window
        while hist and hist[0][0] <= horizon:
            hist.popleft()
        if not hist:
            del self._hist[key]
            return 0
        return sum(n for _, n in hist)

    def changes(
        self, fresh: Pairs, totals: list[int | None], keep: Container[PortKey]
    ) -> Sequence[int]:
        """For each port of ``fresh``, given its current total (``totals_column``): False
        when ``observe`` would answer 0 and leave it as it is (its total is the last one
        recorded, no increase is left in the window, and it is not in ``keep``)."""
        last = self._last
        hist = self._hist
        reuse = self.memo.redo(fresh, totals)
        if reuse is None:
            answers = bytearray([total is None or key in hist or last.get(key) != total
                                 for (key, _), total in zip(fresh, totals, strict=True)])
        else:
            answers, redo = reuse
            for i in redo:
                key, total = fresh[i][0], totals[i]
                answers[i] = total is None or key in hist or last.get(key) != total
        self.memo.keep(answers)
        return with_keep(fresh, answers, keep)

    def encode(self, name: str, value: Any, offset: float) -> list[Any]:
        if name == "_hist":  # (monotonic time, increase) pairs
            return [[[t + offset, n] for t, n in value]]
        return [value]

    def decode(self, name: str, fields: list[Any], offset: float) -> Any:
        if name == "_hist":
            return deque((float(t) - offset, int(n)) for t, n in fields[0])
        return int(fields[0])


def totals_column(fresh: Pairs, name: str, default: int | None = None) -> list[int | None]:
    """The total of counter ``name`` of every port of ``fresh`` (``default`` where it has
    none), for ``needs``."""
    if isinstance(fresh, Fresh):
        return fresh.column(Totals, name, default)
    return read_column([view.totals for _, view in fresh], Totals, name, default)


def rate_column(fresh: Pairs, name: str) -> list[float]:
    """The rate of counter ``name`` of every port of ``fresh``, NaN where it has none: only
    for comparisons (``rate > threshold``), which NaN fails like a missing rate would."""
    if isinstance(fresh, Fresh):
        return fresh.column(Rates, name, NO_RATE)
    return read_column([view.rates for _, view in fresh], Rates, name, NO_RATE)
