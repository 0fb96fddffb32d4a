"""Source health: a source whose polls fail is an outage of everything it watches.

Not a port detector: the daemon reports each poll's outcome and gets back the edge, if any.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from ibmon.detect.base import DetectorSettings, Finding
from ibmon.detect.events import EventType, Severity

__all__ = ["SourceFailed", "SourceFailedSettings"]


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
