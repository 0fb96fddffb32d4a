"""The source registry: every source type, declared once, one line each.

A source type is one module that defines

- ``Config``: its pydantic model, a ``SourceConfigBase`` subclass whose ``type`` field is
  ``Literal["<name>"]`` (the ``[[sources]]`` table and the CLI's ``--source`` value), and
- ``build(cfg) -> Source``: its factory,

plus one ``SourceType`` line in ``SOURCES`` below. ``ibmon.config.SourceConfig`` validates a
table with the model its ``type`` names, the daemon builds sources through ``build_source``,
and the CLI takes its ``--source`` choices from ``SOURCES``' keys: nothing else lists sources.

Modules are imported only when their type is used, so a node-local ``ibmon run`` with only
sysfs never loads the ctypes bindings for libibmad, the diags runner or the simulator, and an
optional source that cannot load fails with its own message instead of breaking every command.
This module itself imports nothing heavy (``ibmon.config`` imports it).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ibmon.config import SourceConfigBase
    from ibmon.sources import Source

__all__ = ["SOURCES", "SourceType", "build_source", "source_type"]


@dataclass(frozen=True, slots=True)
class SourceType:
    """One registered source type: its name, its module and a line of help for the CLI.

    Calling it builds a source from a config of this type (the registry's values used to be
    plain factories, and callers may still treat them so).
    """

    name: str
    module: str
    help: str

    def load(self) -> ModuleType:
        """The source's module (imported on first use)."""
        return importlib.import_module(self.module)

    @property
    def config(self) -> type[SourceConfigBase]:
        """The source's config model, checked against its registration."""
        from ibmon.config import SourceConfigBase

        model = getattr(self.load(), "Config", None)
        if not (isinstance(model, type) and issubclass(model, SourceConfigBase)):
            raise TypeError(f"{self.module}.Config must be a SourceConfigBase subclass")
        if model.model_fields["type"].default != self.name:
            raise TypeError(f"{self.module}.Config.type must default to {self.name!r}")
        return model

    def build(self, cfg: SourceConfigBase) -> Source:
        """A source for ``cfg``; ``cfg`` must be of this type's model."""
        if not isinstance(cfg, self.config):
            raise TypeError(f"{type(cfg).__name__} is not a {self.name} source config")
        source: Source = self.load().build(cfg)
        return source

    __call__ = build


def _by_name(*types: SourceType) -> dict[str, SourceType]:
    return {t.name: t for t in types}


#: Every source type, in the order the CLI offers them. Adding a source: one module, one line.
SOURCES: dict[str, SourceType] = _by_name(
    SourceType("sysfs", "ibmon.sources.sysfs", "this host's ports, from /sys/class/infiniband"),
    SourceType("mad", "ibmon.sources.mad", "the whole fabric over in-process MADs (libibmad)"),
    SourceType("diags", "ibmon.sources.diags", "the whole fabric via ibnetdiscover + perfquery"),
    SourceType("mock", "ibmon.sources.mock", "a simulated fabric playing a scenario"),
)


def source_type(name: str) -> SourceType:
    """The registered type ``name``; KeyError names the known ones."""
    try:
        return SOURCES[name]
    except KeyError:
        raise KeyError(f"unknown source type {name!r} (one of {', '.join(SOURCES)})") from None


def build_source(cfg: SourceConfigBase) -> Source:
    """The source a validated config describes."""
    return source_type(cfg.type).build(cfg)
