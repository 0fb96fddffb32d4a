"""Source health: a source whose polls fail is an outage of everything it watches.

Not a port detector: the daemon reports each poll's outcome and gets back the edge, if any.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from ibmon.detect.base import DetectorSettings, Finding
from ibmon.detect.events import SEVERITIES, EventType, Severity

__all__ = ["SourceFailed", "SourceFailedSettings", "health_json", "load_health"]


class SourceFailedSettings(DetectorSettings):
    severity: Severity = "critical"
    after: int = Field(default=1, ge=1, description="consecutive failed polls before firing")


class SourceFailed:
    """Tracks consecutive failures of one source; ``observe`` returns the edge verdict."""

    type: ClassVar[EventType] = "source_failed"

    def __init__(self, settings: SourceFailedSettings, source: str) -> None:
        self.settings = settings
        self.source = source
        self.failures = 0
        self.active: Finding | None = None

    def observe(self, ok: bool, reason: str = "", error: str = "") -> tuple[str, Finding] | None:
        """``("firing"|"resolved", finding)`` when the condition changes, else None."""
        if ok:
            self.failures = 0
            if self.active is None:
                return None
            done, self.active = self.active, None
            return "resolved", done
        self.failures += 1
        if self.active is not None or self.failures < self.settings.after:
            return None
        self.active = Finding(
            self.settings.severity,
            float(self.failures),
            float(self.settings.after),
            f"source {self.source} failed: {reason}: {error}"[:500],
            {"source": self.source, "reason": reason, "error": error[:300]},
        )
        return "firing", self.active

    def dump(self) -> dict[str, Any]:
        """What ``load_health`` takes back (the engine's saved state), so a reload or a restart
        neither announces an outage again nor leaves it open."""
        return health_json(self.failures, self.active)


def health_json(failures: int, active: Finding | None) -> dict[str, Any]:
    """Failures in a row and the open outage, as JSON types."""
    return {"failures": failures, "active": None if active is None else {
        "severity": active.severity, "value": active.value, "threshold": active.threshold,
        "message": active.message, "details": active.details}}


def load_health(data: Any) -> tuple[int, Finding | None]:
    """``health_json`` output back; ValueError when it does not fit."""
    try:
        failures = int(data["failures"])
        raw = data["active"]
        finding = None if raw is None else Finding(
            raw["severity"], raw.get("value"), raw.get("threshold"), str(raw["message"]),
            dict(raw.get("details") or {}))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"engine state: bad source health: {exc!r}") from None
    if failures < 0 or (finding is not None and finding.severity not in SEVERITIES):
        raise ValueError("engine state: bad source health")
    return failures, finding
