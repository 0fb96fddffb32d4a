"""The composition root: pipelines, outputs and housekeeping, all in one ``asyncio.TaskGroup``.

Inside the group: one named task per source poll loop, one per event consumer (log, event file,
MQTT), the exporters' own background tasks (MQTT's connection), the state saver, the loop-lag probe
(``ibmon.runtime.looplag``) and the systemd watchdog. The main task waits for SIGTERM/SIGINT (stop)
or SIGHUP (reload). A reload re-reads the config the way the daemon was started (file, environment,
the command line's flags) and runs every start check on it; a listener whose address or TLS changed
is opened before the old one is closed (on the same address the listening socket is handed over, so
no connection is refused). Any failure, a config that does not validate or one that cannot start,
is logged and counted (``ibmon_config_reloads_total{result}``) and the running config stays,
untouched: a reload never stops the daemon. An applied reload replaces the source objects and any
output whose configuration changed, and keeps every ``Pipeline``: accumulated totals and firing
conditions survive, so nothing is re-announced.

Each poll goes through the source's ``Pipeline`` (``ibmon.runtime.pipeline``): events go to the
bounded event bus, whose consumers can never slow polling down, and the merged ``FabricState`` is
published to every exporter (``exporters.base``). Pipeline state is saved atomically to
``state.path`` periodically, soon after any event, at stop, and right after any poll that saw a
counter reset or saturation (before that source polls again), and restored at start, so a
restart (even ``kill -9``) counts every increment once, never lowers a total and re-announces
nothing. A start that cannot happen (the listen address is taken) raises ``StartError``: one
line for the operator, no traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import structlog

from exporters.api import ApiProvider, api_routes
from exporters.base import EventConsumer, Exporter
from exporters.prometheus import PrometheusExporter
from ibmon.config import ConfigError, Settings, SourceConfig, load_settings
from ibmon.detect.engine import ActiveCondition, Engine
from ibmon.detect.events import Event, EventBus, EventFileWriter, EventLog, Subscription
from ibmon.jobs.attribute import Attributor
from ibmon.jobs.model import JobTable
from ibmon.jobs.watch import JobMetrics, JobWatcher, SimulatedScheduler
from ibmon.runtime.looplag import IDLE_PERIOD, LoopLagProbe, period_for
from ibmon.runtime.metrics import Counter, Gauge
from ibmon.runtime.pipeline import Pipeline, build_state
from ibmon.runtime.sdnotify import notify, watchdog_interval
from ibmon.runtime.selfmetrics import SelfMetrics
from ibmon.runtime.sizes import fabric_sized, run_bulk
from ibmon.runtime.tuning import freeze_long_lived, tune_process
from ibmon.sources import Source
from ibmon.sources.registry import build_source
from ibmon.state import EMPTY_STATE, FabricState
from ibmon.state.persist import LoadResult, StateFile

__all__ = ["Daemon", "StartError"]

log = structlog.get_logger("ibmon.runtime.daemon")

#: After a poll with events, save state this soon (at most this often), not only periodically.
EVENT_SAVE_DELAY = 1.0
#: At stop, how long consumers get to take what the last poll published.
DRAIN_SECONDS = 1.0
DRAIN_STEP = 0.05
#: How long a source gets to close.
CLOSE_TIMEOUT = 1.0
#: What a reload can come to, each a value of ``ibmon_config_reloads_total{result}``.
RELOAD_RESULTS = ("applied", "rejected", "failed")


class StartError(Exception):
    """The daemon (or a reload) cannot start an output: one line naming what and why."""


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
        reload_settings: Callable[[], Settings] | None = None,
        source_factory: Callable[[SourceConfig], Source] = build_source,
    ) -> None:
        """``reload_settings`` builds the settings a SIGHUP switches to, the way the caller
        built ``settings`` (the CLI re-reads the file and re-applies its flags) and raises
        ``ConfigError`` for a config that does not validate or cannot start. Without it, a
        reload re-reads ``config_path``; with neither, a reload is skipped."""
        self.settings = settings
        self.config_path = config_path
        if reload_settings is None and config_path is not None:
            reload_settings = _file_loader(config_path)
        self._reload_settings = reload_settings
        #: Why the latest reload was refused (None: applied, or none asked for).
        self._refused: str | None = None
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
        self._save_lock = asyncio.Lock()
        self._save_failing = False
        self.state_errors = Counter(
            "ibmon_state_file_errors",
            "State file problems: missing (first start), corrupt, unreadable or not_a_file at "
            "start, or a failed save (save_failed).",
            ["reason"],
            registry=self.metrics.registry,
        )
        self.reloads = Counter(
            "ibmon_config_reloads",
            "Config reloads (SIGHUP) by result: applied; rejected (the config does not "
            "validate or fails a start check); failed (valid, but an output could not start). "
            "After rejected or failed the running config stays.",
            ["result"],
            registry=self.metrics.registry,
        )
        for result in RELOAD_RESULTS:
            self.reloads.labels(result)
        self.reload_ok = Gauge(
            "ibmon_config_last_reload_successful",
            "1 if the latest reload was applied (or none was asked for), 0 if it was refused "
            "and the previous config is still running.",
            registry=self.metrics.registry,
        )
        self.reload_ok.set(1)
        self.loop_lag = LoopLagProbe(self.metrics.registry, period=IDLE_PERIOD)
        self.events_dropped = Counter(
            "ibmon_events_dropped",
            "Events a slow consumer's full queue refused (the consumer missed them).",
            ["consumer"],
            registry=self.metrics.registry,
        )
        #: Jobs: who runs where (``ibmon.jobs``); a watcher only with a job source.
        self.jobs = Attributor(settings.slurm)
        self._job_watch: JobWatcher | None = None
        self._job_task: asyncio.Task[None] | None = None
        self._job_metrics: JobMetrics | None = None
        self._forwarding: tuple[tuple[int, ...], Mapping[str, bytes]] = ((), {})
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
        tune_process(fabric_scale=any(c.fabric_scale for c in self.settings.sources))
        self._load_state()
        failed = False
        try:
            async with asyncio.TaskGroup() as tg:
                try:
                    await self._serve(tg)
                finally:
                    await self._shutdown()
        except BaseExceptionGroup as group:
            failed = True
            # One failure (e.g. the listen address is taken) is reported as itself.
            only = group.exceptions[0]
            if len(group.exceptions) == 1 and isinstance(only, Exception):
                raise only from None
            raise
        finally:
            if self.ready.is_set():  # a daemon that never started has nothing new to save
                self._save_state()
            for sig in installed:
                loop.remove_signal_handler(sig)
            if not failed:  # a start that failed says why instead (one error line), not this
                log.info("stopped")

    async def _serve(self, tg: asyncio.TaskGroup) -> None:
        """Start everything, then poll until a stop, applying reloads in between."""
        for consumer in self._event_consumers():
            self._consumers.append(self._feed(tg, consumer))
        self._chores.append(tg.create_task(self._saver(), name="state-saver"))
        self._chores.append(tg.create_task(self.loop_lag.run(), name="loop-lag"))
        await self._sync_exporters(tg)  # a StartError here ends the start: exit 2, one line
        self._polls = self._start_polls(tg)
        self._release_removed()
        await self._publish()
        while True:
            notify("READY=1\nSTATUS=" + self._status())
            if not self.ready.is_set() and (period := watchdog_interval()) is not None:
                # systemd expects the first WATCHDOG=1 after READY=1.
                self._chores.append(tg.create_task(self._watchdog(period), name="watchdog"))
            self.ready.set()
            while not (self._stop.is_set() or self._reload.is_set()):
                await self._wake.wait()
                self._wake.clear()
            if self._stop.is_set():
                return
            self._reload.clear()
            if await self._apply_reload(tg):
                await self._stop_polls()
                self._polls = self._start_polls(tg)
                self._release_removed()
                await self._publish()

    async def _shutdown(self) -> None:
        """Stop polling, let consumers take the last events, stop outputs, end the chores.

        Runs to its end even when ``run`` is cancelled meanwhile (each step is bounded), so a
        cancelled daemon still closes its sources and listeners; the cancellation goes on after.
        """
        steps = asyncio.create_task(self._shutdown_steps(), name="shutdown")
        try:
            await asyncio.shield(steps)
        except asyncio.CancelledError:
            await steps
            raise

    async def _shutdown_steps(self) -> None:
        notify("STOPPING=1")
        await self._stop_polls()
        await self._drain([c.subscription for c in self._all_feeds()])
        await _cancel([c.task for c in self._all_feeds()])
        for name in list(self._outputs):
            await self._stop_exporter(name)
        await _cancel(self._chores)

    def _all_feeds(self) -> list[_Consuming]:
        return self._consumers + [o.feed for o in self._outputs.values() if o.feed is not None]

    async def _apply_reload(self, tg: asyncio.TaskGroup) -> bool:
        """Switch to the re-read config; False (and nothing changed) when it cannot be used.

        Polling goes on while the new config is read and checked (in a worker thread: a
        listen host may need a DNS lookup) and while new listeners open; sources restart
        only once every output of the new config is running.
        """
        if self._reload_settings is None:
            log.info("reload_skipped", reason="no config file")
            return False
        try:
            new = await asyncio.to_thread(self._reload_settings)
        except ConfigError as exc:
            self._reload_refused("rejected", str(exc))
            return False
        except Exception as exc:  # a bug in reading the config must not end the daemon
            self._reload_refused("rejected", f"{type(exc).__name__}: {exc}")
            return False
        old = self.settings
        self.settings = new
        try:
            await self._sync_exporters(tg)
        except Exception as exc:  # StartError, or anything else: never the daemon's end
            self.settings = old
            text = str(exc) if isinstance(exc, StartError) else f"{type(exc).__name__}: {exc}"
            self._reload_refused("failed", text)
            return False
        tables = new.detect.tables()
        if tables != self._engine_tables:
            self._engine_tables = tables
            async with self._pipelines_held():
                for pipeline in self._pipelines.values():
                    pipeline.retune(tables)
        if new.state.path != old.state.path:
            self._statefile = StateFile(new.state.path)
            self._dirty.set()
        self._refused = None
        self.reloads.labels("applied").inc()
        self.reload_ok.set(1)
        log.info("config_reloaded", path=str(self.config_path) if self.config_path else None)
        return True

    def _status(self) -> str:
        """The one line ``systemctl status`` shows: what is polled, and a refused reload."""
        status = "polling " + ", ".join(sorted(self._pipelines))
        if self._refused is not None:
            status += f"; reload refused, previous config running: {self._refused}"
        return status[:400]

    def _reload_refused(self, result: str, error: str) -> None:
        self._refused = error
        self.reloads.labels(result).inc()
        self.reload_ok.set(0)
        log.error(
            "reload_" + result,
            error=error,
            consequence="the running config stays; fix the config and reload again",
        )

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
            fabric=self.settings.fabric,
        )
        provider = ApiProvider(
            state=lambda: self.state,
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
        """Make the running outputs those ``self.settings`` asks for; StartError, with the
        running outputs untouched, when a new one cannot be built or cannot listen.

        New listeners open before the old ones close (see ``PrometheusExporter.start``'s
        ``inherit``), so neither a reload nor a failed one leaves a gap in scrapes. Outputs
        that only connect out (MQTT) are swapped stop-then-start, so the old connection's
        "offline" can never land after the new one's "online".
        """
        wanted = self._wanted_exporters()
        running = self._outputs
        changed = [n for n in wanted if n not in running or wanted[n][0] != running[n].config]
        built: dict[str, Exporter] = {}
        for name in changed:
            try:
                built[name] = wanted[name][1]()
            except (OSError, ValueError) as exc:  # a TLS or auth file that changed under us
                raise StartError(f"cannot start {name}: {_reason(exc)}") from None
        for name, exporter in built.items():
            # one listener at most ([prometheus]): when it cannot listen, nothing has started
            if isinstance(exporter, PrometheusExporter):
                await self._listen(exporter, self._outputs.get(name))
        for name in list(self._outputs):
            if name not in wanted or name in built:
                await self._stop_exporter(name)
        for name, exporter in built.items():
            if not isinstance(exporter, PrometheusExporter):
                await exporter.start(tg)
            feed = self._feed(tg, exporter) if isinstance(exporter, EventConsumer) else None
            self._outputs[name] = _Output(wanted[name][0], exporter, feed)

    async def _listen(self, exporter: PrometheusExporter, old: _Output | None) -> None:
        """Start ``exporter``'s listener (taking over ``old``'s socket on the same address);
        StartError naming the address when it cannot listen."""
        inherit = old.exporter if old is not None and isinstance(old.exporter,
                                                                  PrometheusExporter) else None
        listen = self.settings.prometheus.listen
        try:
            await exporter.start(inherit=inherit)
        except OSError as exc:
            raise StartError(f"cannot listen on {listen}: {_reason(exc)}") from None

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
        if self._job_watch is not None:
            args = (state, self._job_watch.table, self._merged_forwarding())
            # a fabric's (re)index of hosts and routes takes a few tenths of a second at
            # 100,000 ports: in a bulk thread, as the poll's other bulk work
            jobs = (await run_bulk(self.jobs.view, *args) if fabric_sized(len(state.ports))
                    else self.jobs.view(*args))
            state = replace(state, jobs=jobs)
        self.state = state
        self.loop_lag.period = period_for(len(state.ports))
        for out in list(self._outputs.values()):
            await out.exporter.publish(state)
        if pipeline is not None:
            pipeline.observe_publish(time.monotonic() - started)

    # -- polling -----------------------------------------------------------------------------

    def _start_polls(self, tg: asyncio.TaskGroup) -> list[_Poll]:
        polls: list[_Poll] = []
        self.metrics.describe_sources(self.settings.fabric, self.settings.sources)
        for cfg in self.settings.sources:
            pipeline = self._pipeline(cfg)
            try:
                source = self._source_factory(cfg)
            except Exception as exc:  # a broken source must not take the others down
                self._emit(pipeline.fail("init_failed", exc))
                continue
            task = tg.create_task(self._poll_loop(pipeline, source), name=f"poll:{cfg.label}")
            polls.append(_Poll(source, task))
        self._start_jobs(tg, polls)
        return polls

    def _start_jobs(self, tg: asyncio.TaskGroup, polls: list[_Poll]) -> None:
        """The job watcher, when there is a job source: ``[slurm]``, else the simulated
        fabric's scheduler when its scenario places jobs. Restarted with the polls, so a
        reload that adds, changes or drops ``[slurm]`` takes effect."""
        cfg = self.settings.slurm
        self.jobs = Attributor(cfg)
        scheduled = _scheduled(polls)
        self._job_watch = None
        if cfg is None and scheduled is None:
            return
        if self._job_metrics is None:
            self._job_metrics = JobMetrics(self.metrics.registry)
        if cfg is not None:
            from ibmon.jobs.slurm import SlurmJobs

            slurm = SlurmJobs(cfg)
            watch = JobWatcher(slurm.fetch, cfg.interval, self._job_metrics, close=slurm.close)
        else:
            assert scheduled is not None
            interval = next((c.interval for c in self.settings.sources
                             if c.label == scheduled.name), 1.0)
            watch = JobWatcher(_simulated_jobs(scheduled), interval, self._job_metrics)
        self._job_watch = watch
        self._job_task = tg.create_task(watch.run(), name="jobs")

    def _merged_forwarding(self) -> Mapping[str, bytes]:
        """Every pipeline's forwarding tables as one mapping, the same object until one of
        them is replaced by a discovery (the attribution reindexes when it changes)."""
        tables = [p.forwarding for p in self._pipelines.values() if p.forwarding]
        ids = tuple(map(id, tables))
        if ids != self._forwarding[0]:
            merged: Mapping[str, bytes] = tables[0] if len(tables) == 1 else {
                k: v for t in tables for k, v in t.items()}
            self._forwarding = (ids, merged)
        return self._forwarding[1]

    async def _stop_polls(self) -> None:
        polls, self._polls = self._polls, []
        jobs, self._job_task = self._job_task, None
        await _cancel([p.task for p in polls] + ([jobs] if jobs is not None else []))
        for p in polls:
            try:
                async with asyncio.timeout(CLOSE_TIMEOUT):
                    await p.source.close()
            except Exception as exc:
                log.warning(
                    "source_close_failed",
                    source=getattr(p.source, "name", "?"),
                    error=str(exc) or type(exc).__name__,
                )

    async def _poll_loop(self, pipeline: Pipeline, source: Source) -> None:
        interval = pipeline.cfg.interval
        next_poll = time.monotonic()
        first = True
        while True:
            events = await pipeline.poll(source)
            if pipeline.save_due:
                # A reset or saturation changed what a restart must know: save it before it is
                # published, so a kill -9 that follows what a user saw never loses it (a restart
                # would otherwise count the reset again or not at all). A save slower than an
                # interval stops holding the poll at that deadline (its worker thread still
                # completes the write).
                pipeline.save_due = False
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(interval):
                        await self._saving()
            self._emit(events)
            await self._publish(pipeline)
            if first:
                first = False
                freeze_long_lived()
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
        )
        saved = self._restored.get(cfg.label)
        if saved is not None and self._persistent(cfg.label):
            try:
                pipeline.load(saved)
            except ValueError as exc:
                self._state_problem(
                    "corrupt",
                    f"{self._statefile.path}: source {cfg.label}: {exc}"[:500],
                    f"source {cfg.label} starts without the saved parts named (the usable ones "
                    "were restored); the next save replaces them",
                )
        return pipeline

    def _release_removed(self) -> None:
        """End what sources no longer in the config held, at a reload or, from the state file,
        at a start: one ``resolved`` event each (``source_removed``), so no consumer keeps
        them open. Their totals stay (a pipeline, or the saved part), for a source that comes
        back."""
        configured = {c.label for c in self.settings.sources}
        wall = time.time()
        for label, pipeline in self._pipelines.items():
            if label not in configured:
                self._emit(pipeline.release(wall))
        for label, part in self._restored.items():
            if label in configured or label in self._pipelines:
                continue
            saved = part.get("engine")
            if not isinstance(saved, Mapping):
                continue
            engine = Engine(self._engine_tables, fabric=self.settings.fabric, source=label)
            try:
                engine.load(saved)
            except ValueError:
                continue  # nothing usable to end (the saved part stays as it is)
            if events := engine.release(wall):
                self._restored[label] = {**part, "engine": engine.dump()}
                self._emit(events)

    def _emit(self, events: list[Event]) -> None:
        if events:
            if self._job_watch is not None:
                events = self.jobs.annotate(events)
            self.bus.publish_many(events)
            self._dirty.set()

    # -- persistence -------------------------------------------------------------------------

    def _state_problem(self, reason: str, detail: str, consequence: str) -> None:
        """Count a state file problem and log it once, saying what happens because of it."""
        self.state_errors.labels(reason).inc()
        if reason == "save_failed":
            if self._save_failing:
                return  # counted, but logged once until a save works again
            self._save_failing = True
        log.error("state_file_problem", reason=reason, detail=detail, consequence=consequence)

    @property
    def _persistence(self) -> bool:
        """Only real fabrics persist: an all-simulated daemon (``ibmon demo``) leaves disk alone."""
        return any(not c.simulated for c in self.settings.sources)

    def _load_state(self) -> None:
        if not self._persistence:
            return
        removed = self._statefile.remove_stale_temporaries()
        if removed:
            log.warning(
                "state_temporaries_removed",
                files=[str(p) for p in removed],
                detail="left by a save that was interrupted (kill -9, crash, power loss)",
            )
        result = self._statefile.load()
        if result.problem is None:
            self._restored = result.sources
            log.info(
                "state_restored",
                path=str(self._statefile.path),
                sources=sorted(result.sources),
                saved_at=result.saved_at,
            )
        elif result.problem == "missing":
            self.state_errors.labels("missing").inc()
            log.info(
                "state_file_missing",
                detail=result.detail,
                consequence="first start: totals begin at the hardware counters' values",
            )
        else:
            self._state_problem(result.problem, result.detail, _load_consequence(result))

    @contextlib.asynccontextmanager
    async def _pipelines_held(self) -> AsyncIterator[None]:
        """Hold every pipeline's lock (none is ingesting meanwhile): for saving and retuning."""
        async with contextlib.AsyncExitStack() as stack:
            for label in sorted(self._pipelines):
                await stack.enter_async_context(self._pipelines[label].lock)
            yield

    def _persistent(self, label: str) -> bool:
        """Simulated fabrics restart their clock with the process: their state means nothing."""
        return not any(c.label == label and c.simulated for c in self.settings.sources)

    def _snapshot_builder(self) -> Callable[[], dict[str, dict[str, object]]]:
        """What builds the state to save, from the pipelines and restored parts as they are
        now, so it can run in a worker thread while the loop changes them."""
        pipelines = [(label, p) for label, p in self._pipelines.items() if self._persistent(label)]
        restored = {k: v for k, v in self._restored.items() if self._persistent(k)}

        def build() -> dict[str, dict[str, object]]:
            out: dict[str, dict[str, object]] = {label: p.dump() for label, p in pipelines}
            for label, part in restored.items():  # not polled yet: keep what was restored
                out.setdefault(label, part)
            return out

        return build

    async def _snapshot_off_loop(self) -> dict[str, dict[str, object]]:
        """The ``_snapshot_builder`` in a worker thread (0.1-0.3 s of the loop at 36,720 ports
        otherwise); the caller holds every pipeline's lock. A cancelled caller still waits for
        the thread, so the locks are never released while it reads a tracker."""
        work = asyncio.ensure_future(asyncio.to_thread(self._snapshot_builder()))
        try:
            return await asyncio.shield(work)
        finally:
            if not work.done():
                await asyncio.wait({work})

    def _save_failed(self, exc: OSError | ValueError) -> None:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        self._state_problem(
            "save_failed",
            f"{self._statefile.path}: {reason}",
            "state kept in memory and saved again at the next save; the file on disk is the "
            "last good save, and a restart before a save works resumes from it",
        )

    def _save_state(self) -> bool:
        """Save now, in this thread (at stop, when the loop is done)."""
        if not self._persistence:
            return True
        try:
            self._statefile.save(self._snapshot_builder()(), fabric=self.settings.fabric)
        except (OSError, ValueError) as exc:
            self._save_failed(exc)
            return False
        self._save_failing = False
        return True

    async def _saving(self) -> None:
        """One save of the state as it is once the previous save is done (saves never run
        concurrently, and a caller never gets a save of older data than when it asked)."""
        if not self._persistence:
            return
        async with self._save_lock:
            async with self._pipelines_held():
                data = await self._snapshot_off_loop()
            try:
                await asyncio.to_thread(self._statefile.save, data, fabric=self.settings.fabric)
            except (OSError, ValueError) as exc:
                self._save_failed(exc)
            else:
                self._save_failing = False

    async def _saver(self) -> None:
        """Save periodically, and soon after events (so a kill -9 re-announces nothing)."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.state.save_interval):
                    await self._dirty.wait()
                await asyncio.sleep(EVENT_SAVE_DELAY)
            self._dirty.clear()
            await self._saving()


def _scheduled(polls: list[_Poll]) -> SimulatedScheduler | None:
    """The first simulated source whose scenario places jobs."""
    for poll in polls:
        if isinstance(poll.source, SimulatedScheduler) and poll.source.places_jobs:
            return poll.source
    return None


def _simulated_jobs(source: SimulatedScheduler) -> Callable[[], Awaitable[JobTable]]:
    """The simulated fabric's scheduler, read through Slurm's own parser."""
    from ibmon.jobs.slurm import parse_squeue

    def read() -> JobTable:
        text = source.squeue_json()
        return JobTable.of(parse_squeue(text or '{"jobs": []}'), fetched=time.time())

    async def fetch() -> JobTable:
        return await asyncio.to_thread(read)  # as Slurm's: off the event loop

    return fetch


def _file_loader(path: Path) -> Callable[[], Settings]:
    """Re-read ``path`` and run every start check (the default way to reload)."""

    def load() -> Settings:
        from ibmon.runtime.preflight import check_startable

        settings = load_settings(path)
        check_startable(settings, path=path)
        return settings

    return load


def _reason(exc: BaseException) -> str:
    """An OSError's reason without asyncio's "error while attempting to bind on address
    ('127.0.0.1', 9683): " preamble (the caller names the address), plus the file, if any."""
    if isinstance(exc, OSError):
        if exc.errno is not None and exc.errno in errno.errorcode and not exc.filename:
            text = os.strerror(exc.errno)
            return text[:1].lower() + text[1:]
        if exc.strerror:
            return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    return str(exc) or type(exc).__name__


def _load_consequence(result: LoadResult) -> str:
    """What happens because of a state file that could not be used, in words that are true."""
    if result.problem == "corrupt":
        moved = (
            f"moved aside to {result.aside}"
            if result.aside is not None
            else "could not be moved aside (it will be overwritten)"
        )
        return f"{moved}; starting without saved state; the next save writes a new file"
    if result.problem == "not_a_file":
        return "starting without saved state; saves are refused until it is removed"
    return "starting without saved state; saves will try to replace the file"


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel tasks of the daemon's TaskGroup and wait until they have ended."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
