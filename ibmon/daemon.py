"""The composition root: pipelines, outputs and housekeeping, all in one ``asyncio.TaskGroup``.

Inside the group: one named task per source poll loop, one per event consumer (log, event file,
MQTT), the exporters' own background tasks (MQTT's connection), the state saver and the systemd
watchdog. The main task waits for SIGTERM/SIGINT (stop) or SIGHUP (reload). A reload re-reads
the config file (a bad one is logged and the running config stays), replaces the source objects
and any output whose configuration changed, and keeps every ``Pipeline``: accumulated totals and
firing conditions survive, so nothing is re-announced.

Each poll goes through the source's ``Pipeline`` (``ibmon.pipeline``): events go to the bounded
event bus, whose consumers can never slow polling down, and the merged ``FabricState`` is
published to every exporter (``exporters.base``). Pipeline state is saved atomically to
``state.path`` periodically, soon after any event, and at stop, and restored at start, so a
restart (even ``kill -9``) counts every increment once and re-announces nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog
from prometheus_client import Counter

from exporters.api import ApiProvider, api_routes
from exporters.base import EventConsumer, Exporter
from exporters.prometheus import PrometheusExporter
from ibmon.config import ConfigError, Settings, SourceConfig, load_settings
from ibmon.detect.engine import ActiveCondition
from ibmon.events import Event, EventBus, EventFileWriter, EventLog, Subscription
from ibmon.persist import StateFile
from ibmon.pipeline import Pipeline, build_state
from ibmon.sdnotify import notify, watchdog_interval
from ibmon.selfmetrics import SelfMetrics
from ibmon.sources import Source
from ibmon.sources.registry import build_source
from ibmon.state import EMPTY_STATE, FabricState

__all__ = ["Daemon"]

log = structlog.get_logger("ibmon.daemon")

#: After a poll with events, save state this soon (at most this often), not only periodically.
EVENT_SAVE_DELAY = 1.0
#: At stop, how long consumers get to take what the last poll published.
DRAIN_SECONDS = 1.0
DRAIN_STEP = 0.05
#: How long a source gets to close.
CLOSE_TIMEOUT = 1.0


@dataclass(slots=True)
class _Consuming:
    """An event consumer at work: its bus subscription and the task reading it."""

    subscription: Subscription
    task: asyncio.Task[None]


@dataclass(slots=True)
class _Output:
    """A running exporter, the configuration it was built from, and its event feed, if any."""

    config: object
    exporter: Exporter
    feed: _Consuming | None


@dataclass(slots=True)
class _Poll:
    source: Source
    task: asyncio.Task[None]


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
        self.ready = asyncio.Event()
        self._source_factory = source_factory
        self._pipelines: dict[str, Pipeline] = {}
        self._engine_tables = settings.detect.tables()
        self._outputs: dict[str, _Output] = {}
        self._consumers: list[_Consuming] = []
        self._polls: list[_Poll] = []
        self._chores: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()
        self._reload = asyncio.Event()
        self._wake = asyncio.Event()
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
        self._wake.set()

    def reload(self) -> None:
        self._reload.set()
        self._wake.set()

    @property
    def exporter(self) -> PrometheusExporter | None:
        """The ``/metrics`` listener (tests and the CLI banner read its port)."""
        out = self._outputs.get("prometheus")
        return out.exporter if out and isinstance(out.exporter, PrometheusExporter) else None

    def conditions(self) -> list[ActiveCondition]:
        """Every firing condition of every source (for the API and ``ibmon top``)."""
        return [a for pipeline in self._pipelines.values() for a in pipeline.active()]

    def _count_event(self, event: Event) -> None:
        self.metrics.events.labels(event.type, event.severity).inc()

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
        try:
            async with asyncio.TaskGroup() as tg:
                try:
                    await self._serve(tg)
                finally:
                    await self._shutdown()
        except BaseExceptionGroup as group:
            # One failure (e.g. the listen address is taken) is reported as itself.
            only = group.exceptions[0]
            if len(group.exceptions) == 1 and isinstance(only, Exception):
                raise only from None
            raise
        finally:
            self._save_state()
            for sig in installed:
                loop.remove_signal_handler(sig)
            log.info("stopped")

    async def _serve(self, tg: asyncio.TaskGroup) -> None:
        """Start everything, then run generations of poll loops until a stop."""
        for consumer in self._event_consumers():
            self._consumers.append(self._feed(tg, consumer))
        self._chores.append(tg.create_task(self._saver(), name="state-saver"))
        while True:
            self._reload.clear()
            await self._sync_exporters(tg)
            self._polls = self._start_polls(tg)
            await self._publish()
            notify("READY=1\nSTATUS=polling " + ", ".join(sorted(self._pipelines)))
            if not self.ready.is_set() and (period := watchdog_interval()) is not None:
                # systemd expects the first WATCHDOG=1 after READY=1.
                self._chores.append(tg.create_task(self._watchdog(period), name="watchdog"))
            self.ready.set()
            while not (self._stop.is_set() or self._reload.is_set()):
                await self._wake.wait()
                self._wake.clear()
            await self._stop_polls()
            if self._stop.is_set():
                return
            self._apply_reload()

    async def _shutdown(self) -> None:
        """Stop polling, let consumers take the last events, stop outputs, end the chores."""
        notify("STOPPING=1")
        await self._stop_polls()
        await self._drain([c.subscription for c in self._all_feeds()])
        await _cancel([c.task for c in self._all_feeds()])
        for name in list(self._outputs):
            await self._stop_exporter(name)
        await _cancel(self._chores)

    def _all_feeds(self) -> list[_Consuming]:
        return self._consumers + [o.feed for o in self._outputs.values() if o.feed is not None]

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
            self._engine_tables = tables
            for pipeline in self._pipelines.values():
                pipeline.retune(tables)
        log.info("config_reloaded", path=str(self.config_path))

    async def _watchdog(self, period: float) -> None:
        while True:
            notify("WATCHDOG=1")
            await asyncio.sleep(period)

    # -- outputs -----------------------------------------------------------------------------

    def _wanted_exporters(self) -> dict[str, tuple[object, Callable[[], Exporter]]]:
        """Every exporter the config asks for: name -> (the config it is built from, factory).

        An exporter whose config is unchanged across a reload keeps running (and its MQTT
        connection stays up); one whose config changed is replaced.
        """
        s = self.settings
        wanted: dict[str, tuple[object, Callable[[], Exporter]]] = {
            "prometheus": (s.prometheus, self._prometheus),
        }
        if (mqtt := s.mqtt) is not None:
            from exporters.mqtt import MqttPublisher

            wanted["mqtt"] = (
                (mqtt, s.fabric),
                lambda: MqttPublisher(mqtt, fabric=s.fabric, metrics=self.metrics),
            )
        return wanted

    def _event_consumers(self) -> list[EventConsumer]:
        """The consumers that only take events (exporters that also take them are fed too)."""
        cfg = self.settings.events
        consumers: list[EventConsumer] = [EventLog()]
        if cfg.file is not None:
            consumers.append(
                EventFileWriter(cfg.file, max_bytes=cfg.max_bytes, backups=cfg.backups)
            )
        return consumers

    def _prometheus(self) -> PrometheusExporter:
        cfg = self.settings.prometheus
        exporter = PrometheusExporter(
            listen=cfg.listen,
            self_metrics=self.metrics,
            tls_cert=cfg.tls_cert,
            tls_key=cfg.tls_key,
            basic_auth_file=cfg.basic_auth_file,
            max_connections=cfg.max_connections,
        )
        provider = ApiProvider(
            state=lambda: self.state,
            conditions=self.conditions,
            events=lambda: self.bus.history,
            ready=self.ready.is_set,
        )
        exporter.add_routes(api_routes(provider))
        return exporter

    def _feed(self, tg: asyncio.TaskGroup, consumer: EventConsumer) -> _Consuming:
        sub = self.bus.subscribe(consumer.name, maxsize=self.settings.events.queue_size)
        task = tg.create_task(consumer.consume(sub), name=f"events:{consumer.name}")
        return _Consuming(sub, task)

    async def _sync_exporters(self, tg: asyncio.TaskGroup) -> None:
        wanted = self._wanted_exporters()
        for name, out in list(self._outputs.items()):
            if name not in wanted or wanted[name][0] != out.config:
                await self._stop_exporter(name)
        for name, (config, make) in wanted.items():
            if name in self._outputs:
                continue
            exporter = make()
            await exporter.start(tg)
            feed = self._feed(tg, exporter) if isinstance(exporter, EventConsumer) else None
            self._outputs[name] = _Output(config, exporter, feed)
            await exporter.publish(self.state)

    async def _stop_exporter(self, name: str) -> None:
        out = self._outputs.pop(name)
        if out.feed is not None:
            await self._drain([out.feed.subscription])
            await _cancel([out.feed.task])
            self.bus.unsubscribe(out.feed.subscription)
        await out.exporter.stop()

    async def _drain(self, subscriptions: list[Subscription]) -> None:
        """Give consumers a moment to take what is queued for them (never waits long)."""
        for _ in range(round(DRAIN_SECONDS / DRAIN_STEP)):
            if all(s.queue.empty() for s in subscriptions):
                break
            await asyncio.sleep(DRAIN_STEP)
        await asyncio.sleep(0)

    async def _publish(self, pipeline: Pipeline | None = None) -> None:
        started = time.monotonic()
        state = build_state(
            self._pipelines[c.label] for c in self.settings.sources if c.label in self._pipelines
        )
        self.state = state
        for out in list(self._outputs.values()):
            await out.exporter.publish(state)
        if pipeline is not None:
            pipeline.observe_publish(time.monotonic() - started)

    # -- polling -----------------------------------------------------------------------------

    def _start_polls(self, tg: asyncio.TaskGroup) -> list[_Poll]:
        polls: list[_Poll] = []
        for cfg in self.settings.sources:
            pipeline = self._pipeline(cfg)
            try:
                source = self._source_factory(cfg)
            except Exception as exc:  # a broken source must not take the others down
                self._emit(pipeline.fail("init_failed", exc))
                continue
            task = tg.create_task(self._poll_loop(pipeline, source), name=f"poll:{cfg.label}")
            polls.append(_Poll(source, task))
        return polls

    async def _stop_polls(self) -> None:
        polls, self._polls = self._polls, []
        await _cancel([p.task for p in polls])
        for p in polls:
            try:
                await asyncio.wait_for(p.source.close(), timeout=CLOSE_TIMEOUT)
            except Exception as exc:
                log.warning(
                    "source_close_failed",
                    source=getattr(p.source, "name", "?"),
                    error=str(exc) or type(exc).__name__,
                )

    async def _poll_loop(self, pipeline: Pipeline, source: Source) -> None:
        interval = pipeline.cfg.interval
        next_poll = time.monotonic()
        while True:
            self._emit(await pipeline.poll(source))
            await self._publish(pipeline)
            next_poll += interval
            now = time.monotonic()
            if next_poll < now:  # fell behind: skip missed ticks rather than burst
                next_poll = now + interval
            await asyncio.sleep(next_poll - now)

    def _pipeline(self, cfg: SourceConfig) -> Pipeline:
        """The source's pipeline: kept across reloads, restored from the state file when new."""
        pipeline = self._pipelines.get(cfg.label)
        if pipeline is not None:
            pipeline.configure(cfg)
            return pipeline
        pipeline = self._pipelines[cfg.label] = Pipeline(
            cfg,
            metrics=self.metrics,
            tables=self._engine_tables,
            fabric=self.settings.fabric,
            tick_seconds=self.settings.detect.tick_seconds,
        )
        saved = self._restored.get(cfg.label)
        if saved is not None and self._persistent(cfg.label):
            try:
                pipeline.load(saved)
            except ValueError as exc:
                self._state_problem("corrupt", f"source {cfg.label}: {exc}")
        return pipeline

    def _emit(self, events: list[Event]) -> None:
        if events:
            self.bus.publish_many(events)
            self._dirty.set()

    # -- persistence -------------------------------------------------------------------------

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
        out: dict[str, dict[str, object]] = {
            label: pipeline.dump()
            for label, pipeline in self._pipelines.items()
            if self._persistent(label)
        }
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


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel tasks of the daemon's TaskGroup and wait until they have ended."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
