"""Detector thresholds for boundary tests, read from the detectors' own settings.

Boundary tests must follow the settings, not copies of today's numbers: each runs once with the
defaults (empty table) and once with a configured table whose every threshold differs from the
default, so a detector that ignored its table, or a test that hard-coded a number, shows.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel

from ibmon.detect.engine import DETECTORS, parse_detect_tables

__all__ = ["CONFIGURED", "TABLES", "TABLE_IDS", "above", "below", "settings_for"]

#: Every threshold, level, count and time moved away from its default.
CONFIGURED: dict[str, dict[str, Any]] = {
    "congestion": {
        "warning": 0.2, "critical": 0.7, "clear": 0.12, "sustain": 2, "clear_polls": 4,
        "roce_warning": 1500.5, "roce_critical": 20000.0, "roce_clear": 250.0,
    },
    "high_ber": {"window": 300.0, "warning": 2e-12, "critical": 5e-11},
    "receive_errors": {"threshold": 3.5, "clear_polls": 2},
    "discards": {"threshold": 250.25, "clear_polls": 5},
    "link_flapping": {"count": 5, "window": 120.0},
    "link_integrity": {"hold": 45.0},
}

#: ``pytest.mark.parametrize("tables", TABLES, ids=...)``: defaults, then the configured tables.
TABLES: list[dict[str, Any]] = [{}, CONFIGURED]
TABLE_IDS = ["defaults", "configured"]


def settings_for(name: str, tables: dict[str, Any]) -> Any:
    """The validated settings the engine uses for detector ``name`` under ``tables``."""
    parsed: BaseModel | None = parse_detect_tables(tables).get(name)
    return parsed if parsed is not None else DETECTORS[name].settings_model()


def below(x: float) -> float:
    """The largest float below ``x``: as close to a threshold as a measurement can get."""
    return math.nextafter(x, -math.inf)


def above(x: float) -> float:
    """The smallest float above ``x``."""
    return math.nextafter(x, math.inf)
