"""FabricState: the single, immutable, latest view that every exporter reads.

The daemon builds a new FabricState after each poll and swaps one reference; readers never lock
and never see a half-updated fabric.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ibmon.model import PortKey, PortView

__all__ = ["EMPTY_STATE", "FabricState", "SourceStatus", "in_port_order", "port_order"]


def port_order(view: PortView) -> tuple[str, int, str]:
    """The one order ports are listed in (``/metrics``, ``scan``, ties in the API).

    GUID, then port number as a number ("2" before "10"), compared by length then text, so
    untrusted port strings are never parsed as integers.
    """
    port = view.identity.port
    return (view.identity.guid, len(port), port)


def in_port_order(views: Iterable[PortView]) -> list[PortView]:
    return sorted(views, key=port_order)


@dataclass(frozen=True, slots=True)
class SourceStatus:
    """Health of one configured source, as of its latest poll."""

    name: str
    kind: str
    up: bool = False
    last_success: float | None = None  # wall-clock seconds
    ports: int = 0
    last_error: str | None = None


@dataclass(frozen=True, slots=True)
class FabricState:
    """Every port view and every source's status at one moment (wall-clock ``generated``)."""

    generated: float
    ports: Mapping[PortKey, PortView] = field(default_factory=lambda: MappingProxyType({}))
    sources: Mapping[str, SourceStatus] = field(default_factory=lambda: MappingProxyType({}))


EMPTY_STATE = FabricState(generated=0.0)
