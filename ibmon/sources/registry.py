"""The explicit SOURCES registry: config type -> constructor, imported lazily.

Lazy imports keep ``ibmon run`` on a sysfs host from loading ctypes bindings for libibmad, and let
an optional source fail with a clear message instead of breaking every command.
"""

from __future__ import annotations

from collections.abc import Callable

from ibmon.config import (
    DiagsSourceConfig,
    MadSourceConfig,
    MockSourceConfig,
    SourceConfig,
    SysfsSourceConfig,
)
from ibmon.sources import Source

__all__ = ["SOURCES", "build_source"]


def _sysfs(cfg: SourceConfig) -> Source:
    from ibmon.sources.sysfs import SysfsSource

    assert isinstance(cfg, SysfsSourceConfig)
    return SysfsSource(root=cfg.root, include=cfg.include, exclude=cfg.exclude, name=cfg.label)


def _mock(cfg: SourceConfig) -> Source:
    from ibmon.sources.mock import MockSource

    assert isinstance(cfg, MockSourceConfig)
    return MockSource.from_scenario(
        cfg.scenario, hosts=cfg.hosts, speed=cfg.speed, seed=cfg.seed, name=cfg.label
    )


def _diags(cfg: SourceConfig) -> Source:
    from ibmon.sources.diags import DiagsSource

    assert isinstance(cfg, DiagsSourceConfig)
    return DiagsSource.from_config(cfg)


def _mad(cfg: SourceConfig) -> Source:
    from ibmon.sources.mad import MadSource

    assert isinstance(cfg, MadSourceConfig)
    return MadSource.from_config(cfg)


SOURCES: dict[str, Callable[[SourceConfig], Source]] = {
    "sysfs": _sysfs,
    "mock": _mock,
    "diags": _diags,
    "mad": _mad,
}


def build_source(cfg: SourceConfig) -> Source:
    return SOURCES[cfg.type](cfg)
