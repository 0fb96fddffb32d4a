"""What every detector shares: findings, the ``KEEP`` verdict, settings and port descriptions.

A port detector looks at one port view per poll and answers with a *verdict*: a ``Finding``
(the condition holds, at this severity), ``None`` (it does not hold), or ``KEEP`` (no opinion this
poll: the value needed is missing, saturated or the port is down). The engine turns verdicts
into edge-triggered events, so detectors never have to remember whether they already fired.
"""

from __future__ import annotations

import builtins
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

from pydantic import BaseModel, ConfigDict

from ibmon.events import EventType, Severity
from ibmon.model import PortKey, PortView

__all__ = [
    "KEEP",
    "DetectorSettings",
    "Finding",
    "IncreaseWindow",
    "Keep",
    "PortDetector",
    "Verdict",
    "describe",
    "key_from_json",
    "key_to_json",
]

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


class PortDetector:
    """One family's rule, evaluated per port per poll.

    ``type`` is the event type, ``condition`` the ``ibmon_port_condition`` label (None when the
    condition has no such series), ``oneshot`` detectors report instants (a reset) rather than
    conditions: the engine emits one ``firing`` event per finding and remembers nothing.
    ``dump``/``load`` persist internal windows; times are shifted by ``offset`` (wall minus
    monotonic) so they survive a reboot, when the monotonic clock restarts.
    """

    type: ClassVar[EventType]
    condition: ClassVar[str | None] = None
    oneshot: ClassVar[bool] = False
    settings_model: ClassVar[builtins.type[DetectorSettings]] = DetectorSettings

    def __init__(self, settings: DetectorSettings) -> None:
        self.settings = settings

    def begin(self, now: float, views: Mapping[PortKey, PortView]) -> None:
        """Called once per poll before ``check``, for rules that compare ports with each other."""

    def check(self, key: PortKey, view: PortView, now: float, active: Finding | None) -> Verdict:
        raise NotImplementedError

    def vanished(self, now: float, views: Mapping[PortKey, PortView]) -> list[tuple[Any, Finding]]:
        """Findings about ports absent from ``views`` (vanished ports): ``(identity, finding)``."""
        return []

    def forget(self, key: PortKey) -> None:
        """Drop everything about a port that left the fabric."""

    def dump(self, offset: float) -> Any:
        return None

    def load(self, data: Any, offset: float) -> None:
        """Restore ``dump`` output; ValueError when it does not fit."""


def describe(view: PortView) -> str:
    """``leaf07 port 12 to spine02`` (display only: node descriptions are untrusted text)."""
    ident = view.identity
    name = ident.node_desc or ident.device or ident.guid
    text = f"{name} port {ident.port}"
    link = view.link
    if link is not None and (link.remote_node_desc or link.remote_guid):
        text += f" to {link.remote_node_desc or link.remote_guid}"
    return text


def key_to_json(key: PortKey) -> list[str]:
    return [key[0], key[1]]


def key_from_json(raw: Any) -> PortKey:
    if not isinstance(raw, list) or len(raw) != 2 or not all(isinstance(x, str) for x in raw):
        raise ValueError(f"bad port key {raw!r}")
    return (raw[0], raw[1])


class IncreaseWindow:
    """Per port: how much a software-accumulated total rose within a sliding time window.

    Shared by the detectors that judge "N increments in T seconds" (flapping, BER). Totals come
    from the tracker, so hardware resets never show as drops. Increases less than ``grain``
    seconds after the previous recorded one are merged into it (bounded memory for a counter
    that rises every poll; the merged increase then leaves the window up to one grain early).
    """

    def __init__(self, window: float, grain: float = 0.0) -> None:
        self.window = window
        self.grain = grain
        self._last: dict[PortKey, int] = {}
        self._hist: dict[PortKey, deque[tuple[float, int]]] = {}

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

    def forget(self, key: PortKey) -> None:
        self._last.pop(key, None)
        self._hist.pop(key, None)

    def dump(self, offset: float) -> dict[str, Any]:
        """JSON state with wall-clock times (``offset`` = wall - monotonic) to survive reboots."""
        return {
            "last": [[*key_to_json(k), v] for k, v in self._last.items()],
            "hist": [
                [*key_to_json(k), [[t + offset, n] for t, n in h]] for k, h in self._hist.items()
            ],
        }

    def load(self, data: Any, offset: float) -> None:
        if not isinstance(data, dict):
            raise ValueError("expected an object")
        last = {key_from_json(r[:2]): int(r[2]) for r in data.get("last", [])}
        hist = {
            key_from_json(r[:2]): deque((float(t) - offset, int(n)) for t, n in r[2])
            for r in data.get("hist", [])
        }
        self._last, self._hist = last, hist
