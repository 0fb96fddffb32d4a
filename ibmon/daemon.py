"""The composition root: sources, tracker, detectors and exporters in one TaskGroup.

One named task per source poll loop, one for the systemd watchdog, one supervisor that waits for
SIGTERM/SIGINT (stop) or SIGHUP (reload). A reload re-reads the config file; a bad new config is
logged and the running one stays. Trackers survive reloads, so accumulated totals are never lost.

After each poll the source's detection engine turns the tracker's views into events (and fills
the views' conditions) before they are published; events go to the bounded event bus, whose
consumers (log, event file, MQTT) can never slow polling down. Tracker and engine state is saved
atomically to ``state.path`` periodically, soon after any event, and at stop, and restored at
start, so a restart (even ``kill -9``) counts every increment once and re-announces nothing.
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
from prometheus_client import Counter

from exporters.api import ApiProvider, api_routes
from exporters.mqtt import MqttPublisher
from exporters.prometheus import PrometheusExporter
from ibmon.config import ConfigError, PrometheusConfig, Settings, SourceConfig, load_settings
from ibmon.detect.engine import ActiveCondition, Engine
from ibmon.events import Event, EventBus, EventFileWriter, log_events
from ibmon.model import PortKey, PortView
from ibmon.persist import StateFile
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
#: After a poll with events, save state this soon (at most this often), not only periodically.
EVENT_SAVE_DELAY = 1.0


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
        self._mqtt: MqttPublisher | None = None
        self._mqtt_key: tuple[object, str] | None = None
        self.ready = asyncio.Event()
        self._engines: dict[str, Engine] = {}
        self._engine_tables = settings.detect.tables()
        self._restored: dict[str, dict[str, object]] = {}
        self._statefile = StateFile(settings.state.path)
        self._dirty = asyncio.Event()
        self._save_failing = False
        self.state_errors = Counter(
            "ibmon_state_file_errors",
            "State file problems: missing (first start), corrupt or unreadable at start, or a "
            "failed save.",
            ["reason"],
            registry=self.metrics.registry,
        )
        self.events_dropped = Counter(
            "ibmon_events_dropped",
            "Events a slow consumer's full queue refused (the consumer missed them).",
            ["consumer"],
            registry=self.metrics.registry,
        )
        self.bus = EventBus(
            history=settings.events.history,
            on_publish=self._count_event,
            on_drop=lambda name: self.events_dropped.labels(name).inc(),
        )

    # -- control -----------------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()

    def reload(self) -> None:
        self._reload.set()

    @property
    def exporter(self) -> PrometheusExporter | None:
        return self._exporter

    def conditions(self) -> list[ActiveCondition]:
        """Every firing condition of every source (for the API and ``ibmon top``)."""
        return [a for engine in self._engines.values() for a in engine.active()]

    def _count_event(self, event: Event) -> None:
        self.metrics.events.labels(event.type, event.severity).inc()

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
        tables = new.detect.tables()
        if tables != self._engine_tables:
            # New thresholds: fresh detectors, but active conditions and windows carry over.
            self._engine_tables = tables
            for label, old in list(self._engines.items()):
                engine = self._new_engine(label)
                with contextlib.suppress(ValueError):
                    engine.load(old.dump())
                self._engines[label] = engine
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
        self._load_state()
        consumers = self._start_consumers()
        try:
            while not self._stop.is_set():
                self._reload.clear()
                await self._run_generation()
                if self._reload.is_set() and not self._stop.is_set():
                    self._apply_reload()
        finally:
            notify("STOPPING=1")
            self._save_state()
            if self._exporter is not None:
                await self._exporter.stop()
                self._exporter = None
            await self._stop_mqtt()
            await self._stop_consumers(consumers)
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
        self._exporter.add_routes(
            api_routes(
                ApiProvider(
                    state=lambda: self.state,
                    conditions=self.conditions,
                    events=lambda: self.bus.history,
                    ready=self.ready.is_set,
                )
            )
        )
        self._exporter_cfg = cfg
        await self._exporter.start()
        log.info("listening", address=cfg.listen, port=self._exporter.port)

    async def _ensure_mqtt(self) -> None:
        """Start, keep or replace the MQTT publisher; a down broker is its problem, not ours."""
        cfg = self.settings.mqtt
        key = None if cfg is None else (cfg, self.settings.fabric)
        if self._mqtt is not None and self._mqtt_key == key:
            return
        await self._stop_mqtt()
        if cfg is None:
            return
        self._mqtt = MqttPublisher(cfg, fabric=self.settings.fabric, metrics=self.metrics)
        self._mqtt_key = key
        await self._mqtt.start()
        self._mqtt.attach(self.bus)
        self._mqtt.publish_state(self.state)

    async def _stop_mqtt(self) -> None:
        if self._mqtt is not None:
            await self._mqtt.stop()
            self._mqtt = None
            self._mqtt_key = None

    async def _run_generation(self) -> None:
        """Run every configured source until a stop or reload is requested."""
        await self._ensure_exporter()
        await self._ensure_mqtt()
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
                tasks.append(tg.create_task(self._saver(), name="state-saver"))
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
        self._emit(
            self._engine(label).source_poll(False, wall=time.time(), reason=reason, error=str(exc))
        )
        self.metrics.poll_errors.labels(label, reason).inc()
        self.metrics.source_up.labels(label).set(0)
        prev = self._status.get(label)
        self._status[label] = SourceStatus(
            name=label,
            kind=kind,
            up=False,
            last_success=prev.last_success if prev else None,
            ports=prev.ports if prev else 0,
            last_error=f"{reason}: {exc}",
        )
        log.error("source_failed", source=label, reason=reason, error=str(exc))

    async def _poll_loop(self, cfg: SourceConfig, source: Source) -> None:
        label = cfg.label
        tracker = self._tracker(label)
        engine = self._engine(label)
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
                        next_discover = started + topo_interval if topo_interval else float("inf")
                    snap = await source.sample()
            except TimeoutError:
                self._fail(label, cfg.type, "poll_timeout", f"poll took over {timeout:.0f}s")
            except Exception as exc:
                self._fail(label, cfg.type, "poll_failed", exc)
            else:
                views = tracker.update(snap)
                events = engine.process(views, monotonic=snap.monotonic, wall=snap.wall)
                events += engine.source_poll(True, wall=snap.wall)
                self._emit(events)
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
        if self._mqtt is not None:
            self._mqtt.publish_state(state)
        if self._exporter is not None:
            await self._exporter.publish_async(state)

    # -- detection, events, persistence ------------------------------------------------------

    def _tracker(self, label: str) -> Tracker:
        tracker = self._trackers.get(label)
        if tracker is None:
            tracker = self._trackers[label] = Tracker(
                tick_seconds=self.settings.detect.tick_seconds
            )
            saved = self._restored.get(label, {}).get("tracker")
            if saved is not None and self._persistent(label):
                try:
                    tracker.load(saved)  # type: ignore[arg-type]
                except ValueError as exc:
                    self._state_problem("corrupt", f"source {label}: {exc}")
        return tracker

    def _new_engine(self, label: str) -> Engine:
        return Engine(self._engine_tables, fabric=self.settings.fabric, source=label)

    def _engine(self, label: str) -> Engine:
        engine = self._engines.get(label)
        if engine is None:
            engine = self._engines[label] = self._new_engine(label)
            saved = self._restored.get(label, {}).get("engine")
            if saved is not None and self._persistent(label):
                try:
                    engine.load(saved)  # type: ignore[arg-type]
                except ValueError as exc:
                    self._state_problem("corrupt", f"source {label}: {exc}")
        return engine

    def _emit(self, events: list[Event]) -> None:
        if events:
            self.bus.publish_many(events)
            self._dirty.set()

    def _state_problem(self, reason: str, detail: str) -> None:
        self.state_errors.labels(reason).inc()
        if reason == "save_failed":
            if self._save_failing:
                return  # counted, but logged once until a save works again
            self._save_failing = True
        if reason == "missing":
            log.info("state_file_missing", detail=detail)
        else:
            log.error(
                "state_file_problem",
                reason=reason,
                detail=detail,
                consequence="starting without saved state; the file will be replaced",
            )

    @property
    def _persistence(self) -> bool:
        """Only real fabrics persist: an all-simulated daemon (``ibmon demo``) leaves disk alone."""
        return any(c.type != "mock" for c in self.settings.sources)

    def _load_state(self) -> None:
        if not self._persistence:
            return
        result = self._statefile.load()
        if result.problem is not None:
            self._state_problem(result.problem, result.detail)
            return
        self._restored = result.sources
        log.info(
            "state_restored",
            path=str(self._statefile.path),
            sources=sorted(result.sources),
            saved_at=result.saved_at,
        )

    def _persistent(self, label: str) -> bool:
        """Simulated fabrics restart their clock with the process: their state means nothing."""
        return not any(c.label == label and c.type == "mock" for c in self.settings.sources)

    def _snapshot_state(self) -> dict[str, dict[str, object]]:
        out: dict[str, dict[str, object]] = {}
        for label in self._trackers.keys() | self._engines.keys():
            if not self._persistent(label):
                continue
            part: dict[str, object] = {}
            if label in self._trackers:
                part["tracker"] = self._trackers[label].dump()
            if label in self._engines:
                part["engine"] = self._engines[label].dump()
            out[label] = part
        # Sources not polled yet this run keep what was restored for them.
        for label, part in self._restored.items():
            if self._persistent(label):
                out.setdefault(label, part)
        return out

    def _save_state(self) -> bool:
        if not self._persistence:
            return True
        try:
            self._statefile.save(self._snapshot_state(), fabric=self.settings.fabric)
        except (OSError, ValueError) as exc:
            self._state_problem("save_failed", f"{self._statefile.path}: {exc}")
            return False
        self._save_failing = False
        return True

    async def _saver(self) -> None:
        """Save periodically, and soon after events (so a kill -9 re-announces nothing)."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), self.settings.state.save_interval)
                await asyncio.sleep(EVENT_SAVE_DELAY)
            self._dirty.clear()
            if not self._persistence:
                continue
            data = self._snapshot_state()
            try:
                await asyncio.to_thread(self._statefile.save, data, fabric=self.settings.fabric)
            except (OSError, ValueError) as exc:
                self._state_problem("save_failed", f"{self._statefile.path}: {exc}")
            else:
                self._save_failing = False

    def _start_consumers(self) -> list[asyncio.Task[None]]:
        cfg = self.settings.events
        tasks = [
            asyncio.create_task(
                log_events(self.bus.subscribe("log", maxsize=cfg.queue_size)), name="events:log"
            )
        ]
        if cfg.file is not None:
            writer = EventFileWriter(cfg.file, max_bytes=cfg.max_bytes, backups=cfg.backups)
            tasks.append(
                asyncio.create_task(
                    writer.run(self.bus.subscribe("file", maxsize=cfg.queue_size)),
                    name="events:file",
                )
            )
        return tasks

    async def _stop_consumers(self, tasks: list[asyncio.Task[None]]) -> None:
        # Give consumers a moment to drain what the last poll published, then stop them.
        for _ in range(20):
            if all(s.queue.empty() for s in self.bus.subscriptions):
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
