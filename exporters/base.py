"""The one small interface every output implements, so the daemon can own them all alike.

An ``Exporter`` shows the latest ``FabricState`` somewhere (``/metrics`` and the JSON API, MQTT's
retained port state); an ``EventConsumer`` takes events off its own bounded bus subscription
(the log, the JSON-lines file, MQTT). The daemon starts each one inside its ``TaskGroup`` (any
background task an output needs is created there, never as a bare task), hands it every new
state or event, and stops it at shutdown or when a reload changes its configuration. Adding an
output means implementing this and adding one line where the daemon lists its outputs.

``publish`` is awaited on the polling path: it must hand the state over quickly (render in a
worker thread, or just remember the state for a background sender) and must not raise for an
unreachable peer. ``consume`` runs until cancelled; the bus never waits for it.
"""

from __future__ import annotations

import asyncio
from typing import Protocol, runtime_checkable

from ibmon.detect.events import Subscription
from ibmon.state import FabricState

__all__ = ["EventConsumer", "Exporter"]


@runtime_checkable
class Exporter(Protocol):
    """Publishes each new fabric state."""

    name: str

    async def start(self, tg: asyncio.TaskGroup) -> None: ...

    async def publish(self, state: FabricState) -> None: ...

    async def stop(self) -> None: ...


@runtime_checkable
class EventConsumer(Protocol):
    """Takes events from its bus subscription, in order, until cancelled."""

    name: str

    async def consume(self, events: Subscription) -> None: ...
