"""Per-port state of detectors and their windows: declared once, forgotten, saved and restored
here, so adding a detector adds no persistence code."""

from __future__ import annotations

from typing import Any, ClassVar

from ibmon.infiniband.model import PortKey

__all__ = ["PerPortState", "key_from_json", "key_to_json"]


class PerPortState:
    """What a detector (or a window it keeps) remembers per port, forgotten, saved and
    restored here once, from two declarations.

    ``per_port`` names the attributes that hold it: each a dict or a set keyed by port, or
    another ``PerPortState`` (a window). ``forget`` drops a port from every one. ``saved`` names
    those ``dump`` writes and ``load`` reads back: a set as a list of keys, a dict as rows
    ``[guid, port, *encode(value)]``, a ``PerPortState`` as its own ``dump``; one attribute is
    saved as that, several as an object by name (without the leading underscore). Times in a
    value are shifted by ``offset`` (wall minus monotonic) in ``encode``/``decode``, so they
    survive a reboot, when the monotonic clock restarts. A ``Memo`` kept as ``memo`` is
    emptied whenever the state changes outside a poll (``forget``, ``load``).
    """

    __slots__ = ()

    per_port: ClassVar[tuple[str, ...]] = ()
    saved: ClassVar[tuple[str, ...]] = ()

    def forget(self, key: PortKey) -> None:
        """Drop everything about a port that left the fabric."""
        for name in self.per_port:
            held = getattr(self, name)
            if isinstance(held, PerPortState):
                held.forget(key)
            elif isinstance(held, dict):
                held.pop(key, None)
            else:
                held.discard(key)
        self._changed()

    def encode(self, name: str, value: Any, offset: float) -> list[Any]:
        """The JSON fields that follow a port's key in a saved row of dict ``name``."""
        return [value]

    def decode(self, name: str, fields: list[Any], offset: float) -> Any:
        """A value of dict ``name`` from the fields ``encode`` wrote; any of TypeError,
        IndexError, KeyError, ValueError when they do not fit."""
        return fields[0]

    def loaded(self) -> None:
        """Called after ``load`` replaced the saved attributes."""

    def dump(self, offset: float) -> Any:
        """The ``saved`` attributes as JSON types (None when nothing is saved)."""
        parts = {name.lstrip("_"): self._dump_one(name, offset) for name in self.saved}
        if len(parts) <= 1:
            return next(iter(parts.values()), None)
        return parts

    def load(self, data: Any, offset: float) -> None:
        """Restore ``dump`` output; ValueError (and no change) when it does not fit."""
        try:
            restored = self._restored(data, offset)
        except (TypeError, IndexError, KeyError, ValueError, AttributeError) as exc:
            raise ValueError(f"{self._label()}{exc}") from None
        self._apply(restored)

    def _label(self) -> str:
        """What a message about bad saved state starts with."""
        return ""

    def _dump_one(self, name: str, offset: float) -> Any:
        held = getattr(self, name)
        if isinstance(held, PerPortState):
            return held.dump(offset)
        if isinstance(held, dict):
            return [[*key_to_json(k), *self.encode(name, v, offset)] for k, v in held.items()]
        return [key_to_json(k) for k in held]

    def _restored(self, data: Any, offset: float) -> dict[str, Any]:
        """The saved attributes read from ``data``, not yet set."""
        if not self.saved:
            return {}
        if len(self.saved) > 1:
            if not isinstance(data, dict):
                raise ValueError("expected an object")
            parts = {name: data.get(name.lstrip("_"), []) for name in self.saved}
        else:
            parts = {self.saved[0]: data}
        out: dict[str, Any] = {}
        for name, raw in parts.items():
            held = getattr(self, name)
            if isinstance(held, PerPortState):
                out[name] = held._restored(raw, offset)
            elif not isinstance(raw, list):
                raise ValueError("expected a list")
            elif isinstance(held, dict):
                out[name] = {key_from_json(r[:2]): self.decode(name, r[2:], offset) for r in raw}
            else:
                out[name] = {key_from_json(r) for r in raw}
        return out

    def _apply(self, restored: dict[str, Any]) -> None:
        for name, value in restored.items():
            held = getattr(self, name)
            if isinstance(held, PerPortState):
                held._apply(value)
            else:
                setattr(self, name, value)
        if restored:
            self.loaded()
            self._changed()

    def _changed(self) -> None:
        memo = getattr(self, "memo", None)
        if memo is not None:
            memo.clear()


def key_to_json(key: PortKey) -> list[str]:
    return [key[0], key[1]]


def key_from_json(raw: Any) -> PortKey:
    if not isinstance(raw, list) or len(raw) != 2 or not all(isinstance(x, str) for x in raw):
        raise ValueError(f"bad port key {raw!r}")
    return (raw[0], raw[1])
