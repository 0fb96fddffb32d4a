"""The composition root: sources, tracker and exporters in one TaskGroup.

One named task per source poll loop, one for the systemd watchdog, one supervisor that waits for
SIGTERM/SIGINT (stop) or SIGHUP (reload). A reload re-reads the config file; a bad new config is
logged and the running one stays. Trackers survive reloads, so accumulated totals are never lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType

import structlog

from exporters.prometheus import PrometheusExporter
from ibmon.config import ConfigError, PrometheusConfig, Settings, SourceConfig, load_settings
from ibmon.model import PortKey, PortView
from ibmon.sdnotify import notify, watchdog_interval
from ibmon.selfmetrics import SelfMetrics
from ibmon.sources import Source
from ibmon.sources.registry import build_source
from ibmon.state import EMPTY_STATE, FabricState, SourceStatus
from ibmon.tracker import Tracker

__all__ = ["Daemon"]

log = structlog.get_logger("ibmon.daemon")

#: A poll that takes longer than this many intervals (and at least MIN_POLL_TIMEOUT) has hung.
POLL_TIMEOUT_INTERVALS = 5
MIN_POLL_TIMEOUT = 10.0


class Daemon:
    """Runs until ``stop()``; ``reload()`` swaps in a new config without losing totals."""

    def __init__(
        self,
        settings: Settings,
        *,
        config_path: Path | None = None,
        source_factory: Callable[[SourceConfig], Source] = build_source,
    ) -> None:
        self.settings = settings
        self.config_path = config_path
        self.metrics = SelfMetrics()
        self.state: FabricState = EMPTY_STATE
        self._source_factory = source_factory
        self._trackers: dict[str, Tracker] = {}
        self._views: dict[str, dict[PortKey, PortView]] = {}
        self._status: dict[str, SourceStatus] = {}
        self._stop = asyncio.Event()
        self._reload = asyncio.Event()
        self._exporter: PrometheusExporter | None = None
        self._exporter_cfg: PrometheusConfig | None = None
        self.ready = asyncio.Event()

    # -- control -----------------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()

    def reload(self) -> None:
        self._reload.set()

    @property
    def exporter(self) -> PrometheusExporter | None:
        return self._exporter

    def _apply_reload(self) -> None:
        if self.config_path is None:
            log.info("reload_skipped", reason="no config file")
            return
        try:
            new = load_settings(self.config_path)
        except ConfigError as exc:
            log.error("reload_rejected", error=str(exc))
            return
        self.settings = new
        log.info("config_reloaded", path=str(self.config_path))

    # -- main loop ---------------------------------------------------------------------------

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        for sig, handler in (
            (signal.SIGTERM, self.stop),
            (signal.SIGINT, self.stop),
            (signal.SIGHUP, self.reload),
        ):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, handler)
                installed.append(sig)
        try:
            while not self._stop.is_set():
                self._reload.clear()
                await self._run_generation()
                if self._reload.is_set() and not self._stop.is_set():
                    self._apply_reload()
        finally:
            notify("STOPPING=1")
            if self._exporter is not None:
                await self._exporter.stop()
                self._exporter = None
            for sig in installed:
                loop.remove_signal_handler(sig)
            log.info("stopped")

    async def _ensure_exporter(self) -> None:
        cfg = self.settings.prometheus
        if self._exporter is not None and self._exporter_cfg == cfg:
            return
        if self._exporter is not None:
            await self._exporter.stop()
        self._exporter = PrometheusExporter(
            listen=cfg.listen,
            self_metrics=self.metrics,
            tls_cert=cfg.tls_cert,
            tls_key=cfg.tls_key,
            basic_auth_file=cfg.basic_auth_file,
        )
        self._exporter_cfg = cfg
        await self._exporter.start()
        log.info("listening", address=cfg.listen, port=self._exporter.port)

    async def _run_generation(self) -> None:
        """Run every configured source until a stop or reload is requested."""
        await self._ensure_exporter()
        sources: list[tuple[SourceConfig, Source]] = []
        for cfg in self.settings.sources:
            try:
                sources.append((cfg, self._source_factory(cfg)))
            except Exception as exc:  # a broken source must not take the others down
                self._fail(cfg.label, cfg.type, "init_failed", exc)
        live = {cfg.label for cfg, _ in sources}
        for label in list(self._views):
            if label not in {c.label for c in self.settings.sources}:
                self._views.pop(label, None)
                self._status.pop(label, None)
        try:
            async with asyncio.TaskGroup() as tg:
                tasks = [
                    tg.create_task(self._poll_loop(cfg, src), name=f"poll:{cfg.label}")
                    for cfg, src in sources
                ]
                if (period := watchdog_interval()) is not None:
                    tasks.append(tg.create_task(self._watchdog(period), name="watchdog"))
                self.ready.set()
                notify("READY=1\nSTATUS=polling " + ", ".join(sorted(live)))
                waiters = [
                    asyncio.ensure_future(self._stop.wait()),
                    asyncio.ensure_future(self._reload.wait()),
                ]
                try:
                    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waiters:
                        w.cancel()
                    for t in tasks:
                        t.cancel()
        finally:
            for _, src in sources:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(src.close(), timeout=1.0)

    async def _watchdog(self, period: float) -> None:
        while True:
            notify("WATCHDOG=1")
            await asyncio.sleep(period)

    # -- polling -----------------------------------------------------------------------------

    def _fail(self, label: str, kind: str, reason: str, exc: BaseException | str) -> None:
        self.metrics.poll_errors.labels(label, reason).inc()
        self.metrics.source_up.labels(label).set(0)
        prev = self._status.get(label)
        self._status[label] = SourceStatus(
            name=label, kind=kind, up=False,
            last_success=prev.last_success if prev else None,
            ports=prev.ports if prev else 0, last_error=f"{reason}: {exc}",
        )
        log.error("source_failed", source=label, reason=reason, error=str(exc))

    async def _poll_loop(self, cfg: SourceConfig, source: Source) -> None:
        label = cfg.label
        tracker = self._trackers.setdefault(
            label, Tracker(tick_seconds=self.settings.detect.tick_seconds)
        )
        timeout = max(cfg.interval * POLL_TIMEOUT_INTERVALS, MIN_POLL_TIMEOUT)
        topo_interval = getattr(cfg, "topology_interval", None)
        next_discover = 0.0
        next_poll = time.monotonic()
        while True:
            started = time.monotonic()
            try:
                async with asyncio.timeout(timeout):
                    if started >= next_discover:
                        await source.discover()
                        next_discover = (
                            started + topo_interval if topo_interval else float("inf")
                        )
                    snap = await source.sample()
            except TimeoutError:
                self._fail(label, cfg.type, "poll_timeout", f"poll took over {timeout:.0f}s")
            except Exception as exc:
                self._fail(label, cfg.type, "poll_failed", exc)
            else:
                views = tracker.update(snap)
                for err in snap.errors:
                    self.metrics.poll_errors.labels(label, err.reason).inc()
                self._views[label] = views
                self.metrics.source_up.labels(label).set(1)
                self.metrics.last_success.labels(label).set(snap.wall)
                self.metrics.source_ports.labels(label).set(len(views))
                self._status[label] = SourceStatus(
                    name=label, kind=cfg.type, up=True, last_success=snap.wall, ports=len(views)
                )
            self.metrics.poll_duration.labels(label).observe(time.monotonic() - started)
            await self._publish()
            next_poll += cfg.interval
            now = time.monotonic()
            if next_poll < now:  # fell behind: skip missed ticks rather than burst
                next_poll = now + cfg.interval
            await asyncio.sleep(next_poll - now)

    async def _publish(self) -> None:
        ports: dict[PortKey, PortView] = {}
        for cfg in self.settings.sources:  # first configured source wins a shared port
            for key, view in self._views.get(cfg.label, {}).items():
                ports.setdefault(key, view)
        state = FabricState(
            generated=time.time(),
            ports=MappingProxyType(ports),
            sources=MappingProxyType(dict(self._status)),
        )
        self.state = state
        if self._exporter is not None:
            await self._exporter.publish_async(state)
