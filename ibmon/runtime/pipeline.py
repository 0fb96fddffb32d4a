"""One poll pipeline: a source's ``discover()``/``sample()`` in, port views and events out.

Every entry point polls through this one class: the daemon (and so ``ibmon demo``), ``ibmon
scan``, ``ibmon top --source`` and the detection tests. None of them wires a tracker to a
detection engine by hand, so the same fabric reads the same way however you ask. Per source a
``Pipeline`` owns the tracker (counter semantics), the detection engine (conditions and their
events) and that source's self metrics (health and stage timings); ``build_state`` merges
several pipelines into the one ``FabricState`` exporters read.

A poll: discovery when due (on a source object's first poll, then every
``topology_interval``, and on the poll after a failed one), sample, track, detect, then health
bookkeeping. Tracking and detection are one synchronous step on plain data (``ingest``); for a
fabric-sized sample (``ibmon.runtime.sizes.OFFLOAD_PORTS`` ports or more, the program's one size
threshold) it runs in a worker thread, so the event loop stays responsive (scrapes never wait
behind a poll); a node's few HCAs stay on the loop.

Source health is decided here, in one place, for every source (``_judge``): a monitor must say
when it is blind. A poll fails when the source raised or hung, and also when its sample came back
but says nothing: no port answered (with errors, or only ports nothing can be asked of), or more
than half (``SILENT_FRACTION``) of the ports it knows did not answer this one. What did answer
is still tracked; the verdict only decides ``ibmon_source_up``, the ``source_failed`` edge and
``last_success``. A port that stops answering (a ``SourceError``
with its key, or any port of a failed poll) keeps its last view, marked ``stale``, instead of
vanishing: its totals never go down and the detectors leave its conditions as they were. A port
the source no longer asks about at all (its topology dropped it) leaves. After a failed poll the
next one rediscovers first: a fabric that comes back may come back with new LIDs.

Stage timings go to ``ibmon_pipeline_stage_seconds{source,stage}``: ``sample`` (reading the
source, discovery included when it was due), ``track``, ``detect``, and ``publish``, which the
caller measures where it publishes the merged state (``observe_publish``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, Final

import structlog

from ibmon.config import SourceConfig
from ibmon.detect.engine import ActiveCondition, Engine
from ibmon.detect.events import Event
from ibmon.infiniband.model import PortKey, PortView, Snapshot, replaced
from ibmon.jobs.routes import ForwardingTables
from ibmon.runtime.gcpause import paused_gc
from ibmon.runtime.polltime import MIN_POLL_TIMEOUT, POLL_TIMEOUT_INTERVALS, poll_timeout
from ibmon.runtime.selfmetrics import SelfMetrics
from ibmon.runtime.sizes import fabric_sized, run_bulk, submit_bulk
from ibmon.sources import Source
from ibmon.state import FabricState, SourceStatus
from ibmon.track.rowview import Span
from ibmon.track.totals import Totals
from ibmon.track.tracker import Tracker

__all__ = [
    "MIN_POLL_TIMEOUT",
    "POLL_TIMEOUT_INTERVALS",
    "SILENT_FRACTION",
    "STAGES",
    "Pipeline",
    "build_state",
    "stale_view",
]

log = structlog.get_logger("ibmon.runtime.pipeline")

STAGES: Final = ("sample", "track", "detect", "publish")
#: A poll in which more than this fraction of the ports the source knows (answered before, still
#: asked about) did not answer is a failed poll: mostly blind even though something came back.
SILENT_FRACTION: Final = 0.5


#: Intervals a poll may run before its source counts as blind (``ibmon_source_up`` 0).
OVERDUE_INTERVALS: Final = 3
#: A source bug's traceback is logged at most once in this many seconds (per source).
BUG_LOG_SECONDS: Final = 600.0

_NO_VIEWS: Mapping[PortKey, PortView] = MappingProxyType({})


class Pipeline:
    """Polls one configured source; keeps its totals and conditions across polls and reloads.

    The source object is passed to each ``poll`` rather than owned: the daemon builds new
    source objects on a config reload, and the pipeline (with its accumulated totals and firing
    conditions) carries on with them. ``clock`` (monotonic) and ``wall`` are injectable for tests;
    ``log_failures=False`` is for commands that report a failed poll themselves (``scan``).
    """

    def __init__(
        self,
        cfg: SourceConfig,
        *,
        metrics: SelfMetrics,
        tables: Mapping[str, Any] | None = None,
        fabric: str = "main",
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        log_failures: bool = True,
    ) -> None:
        self.cfg = cfg
        self.label = cfg.label
        self.metrics = metrics
        self.tracker = Tracker()
        self.engine = Engine(tables, fabric=fabric, source=self.label, shard=_shard_of(cfg))
        self.status = SourceStatus(name=self.label, kind=cfg.type)
        # Blind until its first success: a source whose first discovery hangs is down, not
        # absent from /metrics.
        metrics.source_up.labels(self.label).set(0)
        #: Simulated or real monotonic time of the latest successful sample.
        self.sampled_at: float | None = None
        #: Why the latest poll failed; None after a successful one.
        self.error: str | None = None
        self._log_failures = log_failures
        self._fabric = fabric
        self._clock = clock
        self._wall = wall
        #: Set by ``ingest`` when the tracker saw a counter reset or a saturation: state a
        #: restart needs (the old baseline is wrong from now on), so the daemon saves it
        #: before the next poll instead of at ``save_interval``. The daemon clears it.
        self.save_due = False
        self._views = _NO_VIEWS
        self._span: Span | None = None  # where ``_views`` are in the tracker's store
        self._discovered: Source | None = None
        self._bug_logged = -float(BUG_LOG_SECONDS)
        self._next_discover = 0.0
        #: The switches' forwarding tables as of the latest discovery (``ForwardingTables``).
        self._tables = ForwardingTables()
        self._stage = {s: metrics.stage_seconds.labels(self.label, s) for s in STAGES}
        #: Held while a poll's ``ingest`` runs (``_ingest_off_loop``); whoever reads or changes
        #: the tracker or engine from a worker thread, or across an await, holds it too.
        self.lock = asyncio.Lock()
        #: The conditions firing on the views above, made together with them: what the
        #: exporters read, whichever thread is ingesting the next poll meanwhile.
        self._conditions: tuple[ActiveCondition, ...] = ()
        #: The views a poll replaced, kept until the daemon has published the new ones and
        #: then freed in a worker thread a few at a time (``observe_publish``). Only once a
        #: caller has published (``_publishing``): ``scan`` and ``top`` never do, and would
        #: hold a second generation of views for nothing.
        self._retired: list[PortView] = []
        self._publishing = False

    # -- configuration ---------------------------------------------------------------------------

    def configure(self, cfg: SourceConfig) -> None:
        """A reloaded config for the same source label (interval, timeouts, even its type)."""
        if cfg.label != self.label:
            raise ValueError(f"pipeline {self.label!r} cannot take source {cfg.label!r}")
        self.cfg = cfg
        self.engine.shard = _shard_of(cfg)

    def retune(self, tables: Mapping[str, Any] | None) -> None:
        """New detector settings: fresh detectors, with active conditions and windows carried
        over, so a reload neither re-announces nor forgets a firing condition."""
        engine = Engine(tables, fabric=self._fabric, source=self.label,
                        shard=_shard_of(self.cfg))
        try:
            engine.load(self.engine.dump())
        except ValueError as exc:
            log.warning("detector_state_not_carried_over", source=self.label, error=str(exc))
        self.engine = engine
        self._conditions = tuple(engine.active())

    @property
    def timeout(self) -> float:
        """How long a poll may run before it counts as hung (``ibmon.runtime.polltime``, the number
        sources derive their own timeouts from)."""
        return poll_timeout(self.cfg.interval)

    # -- polling ---------------------------------------------------------------------------------

    async def poll(self, source: Source) -> list[Event]:
        """Discover when due, sample, track, detect; returns the events (edges) of this poll.

        Never raises for a source problem: a source that raises or hangs makes a failed poll
        (``ibmon_source_up`` 0, a ``source_failed`` edge, ``status.last_error``), and the views
        of the last good poll stay, marked stale. A sample that came back is always tracked,
        even when ``_judge`` says it does not count as a success.
        """
        started = self._clock()
        limit = self.timeout
        snap: Snapshot | None = None
        failure: tuple[str, BaseException | str] | None = None
        deadline = asyncio.timeout(limit)
        overdue: asyncio.TimerHandle | None = None
        try:
            async with deadline:
                await self._discover_if_due(source, started)
                # Blind means down within OVERDUE_INTERVALS of asking for a sample, long
                # before the poll's timeout. (A discovery is bounded by its own timeouts and
                # keeps the last topology when cut: its ports are still read this poll.)
                overdue = asyncio.get_running_loop().call_later(
                    OVERDUE_INTERVALS * self.cfg.interval, self._overdue, limit)
                snap = await source.sample()
        except TimeoutError as exc:
            if deadline.expired():
                failure = ("poll_timeout", f"poll took over {limit:.0f}s")
            else:
                failure = ("poll_failed", exc)
        except (OSError, RuntimeError) as exc:  # what a source says when it cannot see
            failure = ("poll_failed", exc)
        except Exception as exc:  # a bug (a parser's, a source's): seen, never only counted
            failure = ("source_bug", exc)
            self._report_bug(exc)
        finally:
            if overdue is not None:
                overdue.cancel()
        self._stage["sample"].observe(self._clock() - started)
        if snap is not None and failure is None:
            events = await self._ingest_off_loop(snap, self._judge(snap))
        else:
            assert failure is not None
            events = self.fail(*failure)
        self.metrics.poll_duration.labels(self.label).observe(self._clock() - started)
        return events

    async def _ingest_off_loop(
        self, snap: Snapshot, failure: tuple[str, str] | None
    ) -> list[Event]:
        """``ingest`` in a worker thread when the sample is large, so the event loop (scrapes,
        API requests, other sources' timers) is not held for the whole of it.

        The thread still needs the GIL, but the loop gets it back every switch interval
        instead of waiting out tracking and detection of the whole fabric (seconds at 100,000
        ports).
        A small sample (a node's HCAs) is ingested inline: a thread hand-off would cost more
        than it saves. Ingesting holds ``lock``, which the daemon also holds
        while it saves (``dump`` in a thread) or retunes, so those never overlap. While the
        thread runs, ``active()`` answers with the conditions of the views it replaces. A
        cancellation while the thread runs waits for it and returns the poll's events first,
        so a poll is ingested and its events emitted together or not at all, as when it ran on
        the loop; the cancellation is delivered at the caller's next await.
        """
        async with self.lock:
            if not fabric_sized(len(snap.ports)):
                return self.ingest(snap, failure)
            work = asyncio.ensure_future(run_bulk(self._ingest_and_free, snap, failure))
            cancelled = False
            while True:
                try:
                    events = await asyncio.shield(work)
                    break
                except asyncio.CancelledError:
                    if work.done():  # the thread itself was cancelled: nothing ran
                        raise
                    cancelled = True
        if cancelled:
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
        return events

    def _ingest_and_free(self, snap: Snapshot, failure: tuple[str, str] | None) -> list[Event]:
        """``ingest``, then free the sample's ports here, one at a time.

        The snapshot is this poll's own (sources build a new one every poll) and nothing keeps
        its samples once tracked. Freed wherever the last reference went (the loop, as the
        poll returned), a fabric's worth of samples, their counter dicts and ints (about a
        million objects at 36,720 ports) held the GIL for 10-20 ms in one piece; popped one
        by one here, the loop gets the GIL between any two.
        """
        try:
            with paused_gc():  # views and samples by the hundred thousand: no collections
                return self.ingest(snap, failure)
        finally:
            ports = snap.ports
            while ports:
                ports.popitem()

    @property
    def forwarding(self) -> Mapping[str, bytes]:
        """The switches' forwarding tables the routes use (``Topology.forwarding``, with a
        table this discovery could not read kept from the one before: ``ForwardingTables``)."""
        return self._tables.tables

    async def _discover_if_due(self, source: Source, now: float) -> None:
        if source is self._discovered and now < self._next_discover:
            return
        topo = await source.discover()
        self._discovered = source
        reading = bool(getattr(self.cfg, "forwarding_tables", False))
        if kept := self._tables.update(topo, reading=reading):
            log.info("forwarding_tables_kept", source=self.label, switches=len(kept),
                     first=kept[0], why="not read by this discovery; no LID moved since")
        interval = getattr(self.cfg, "topology_interval", None)
        self._next_discover = now + interval if interval else float("inf")
        self.metrics.unreachable_nodes.labels(self.label).set(len(topo.unreachable))
        if topo.handed_off:
            await self._hand_off(topo.handed_off)

    async def _hand_off(self, nodes: frozenset[str]) -> None:
        """Another shard polls these nodes now: their ports leave at once, with what the
        detectors knew of them, so they are neither stale here nor reported ``vanished``."""
        keys = [k for k in self._views if k[0] in nodes]
        if not keys:
            return
        async with self.lock:  # the engine is also read by a save, in a worker thread
            for key in keys:
                self.engine.forget(key)
            self._views = MappingProxyType(
                {k: v for k, v in self._views.items() if k[0] not in nodes})
            self._conditions = tuple(self.engine.active())

    def _judge(self, snap: Snapshot) -> tuple[str, str] | None:
        """Whether a sample that came back still counts as a failed poll: (reason, error).

        A port *answered* when its sample carries counters. Failed (the source is blind):

        - ``no_answer``: no port answered although the source asked (errors) or listed ports
          it could not ask (a fabric without LIDs: no subnet manager has configured it);
        - ``ports_silent``: more than ``SILENT_FRACTION`` of the known ports (those that have
          answered before, stale ones included) now have an error and no sample. A port the
          source stops asking about leaves the views and so stops counting: a topology that
          really shrank recovers, a fabric that fades port by port does not hide.

        A source with no ports and no errors (an empty shard, a filter that matches nothing) is
        not blind: there is nothing to see.
        """
        ports, errors = snap.ports, snap.errors
        # any() stops at the first port with counters: the usual poll costs next to nothing.
        if not any(s.counters or s.hw_counters for s in ports.values()):
            if errors:
                first = errors[0]
                return "no_answer", (f"no port answered ({len(errors)} errors, first: "
                                     f"{first.reason}: {first.detail})")
            if ports:
                return "no_answer", (f"no port answered: {len(ports)} ports have no LID to ask "
                                     "(is a subnet manager running?)")
            return None
        asked = {e.key for e in errors if e.key is not None}
        if asked:
            views = self._views
            known = sum(1 for v in views.values() if v.totals or v.hw_totals)
            silent = sum(
                1 for k in asked
                if k not in ports and (v := views.get(k)) is not None and (v.totals or v.hw_totals)
            )
            if silent > SILENT_FRACTION * known:
                return "ports_silent", f"{silent} of {known} known ports did not answer"
        return None

    def ingest(self, snap: Snapshot, failure: tuple[str, str] | None = None) -> list[Event]:
        """Track and detect one sample that came back; synchronous, plain data in and out.

        ``failure`` (from ``_judge``) makes it a failed poll all the same: the ports that
        answered are tracked, every port that did not is kept stale, and the source is reported
        down. Without it, a port missing from the sample stays (stale) only when the sample
        says it did not answer (a ``SourceError`` with its key); otherwise it has left.
        """
        clock = self._clock
        tracker = self.tracker
        seen = tracker.resets_seen + tracker.saturations_seen
        t0 = clock()
        for old, new in snap.renamed.items():
            if tracker.rename(old, new):
                self.save_due = True  # the totals' new key: on disk before it is published
        fresh = tracker.update(snap)
        views = self._with_stale(snap, fresh, keep_all=failure is not None)
        t1 = clock()
        if tracker.resets_seen + tracker.saturations_seen != seen:
            self.save_due = True
        layout = tracker.take_layout()
        events = self.engine.process(views, monotonic=snap.monotonic, wall=snap.wall,
                                     layout=layout)
        self._stage["track"].observe(t1 - t0)
        self._stage["detect"].observe(clock() - t1)
        m = self.metrics
        for err in snap.errors:
            m.poll_errors.labels(self.label, err.reason).inc()
        m.source_ports.labels(self.label).set(len(fresh))
        m.stale_ports.labels(self.label).set(len(views) - len(fresh))
        # Whoever drops the last reference to a fabric's worth of views pays for freeing
        # them (a million objects at 36,720 ports: 25 ms with the GIL held, 80 ms at
        # 118,400); holding them here makes that this pipeline (observe_publish).
        if self._publishing:
            self._retired = list(self._views.values())
        self._conditions = tuple(self.engine.active())
        self._views = MappingProxyType(views)
        self._span = (Span.of(layout, self._views)
                      if layout is not None and views is fresh else None)
        self.sampled_at = snap.monotonic
        if failure is not None:
            return events + self._down(*failure, wall=snap.wall)
        events += self.engine.source_poll(True, wall=snap.wall)
        m.source_up.labels(self.label).set(1)
        m.last_success.labels(self.label).set(snap.wall)
        self.error = None
        self.status = SourceStatus(
            name=self.label, kind=self.cfg.type, up=True, last_success=snap.wall, ports=len(views)
        )
        return events

    def _with_stale(
        self, snap: Snapshot, fresh: dict[PortKey, PortView], *, keep_all: bool
    ) -> dict[PortKey, PortView]:
        """``fresh`` plus the earlier views of ports that did not answer, marked stale."""
        if keep_all:
            missing = self._views.keys() - fresh.keys()
        else:  # only ports the sample says did not answer (no error: the port has left)
            missing = {e.key for e in snap.errors if e.key is not None and e.key not in fresh}
            missing &= self._views.keys()
        if not missing:
            return fresh
        views = dict(fresh)
        old = self._views
        for key in missing:
            views[key] = stale_view(old[key])
        return views

    def fail(self, reason: str, error: BaseException | str) -> list[Event]:
        """Record a failed poll (or a source that could not even be built): health, metrics, log.

        The views of the last good poll stay, marked stale, so ports do not vanish from
        ``/metrics`` and their totals stay where they were.
        """
        if self._views:
            self._views = MappingProxyType({k: stale_view(v) for k, v in self._views.items()})
        self.metrics.stale_ports.labels(self.label).set(len(self._views))
        self.metrics.source_ports.labels(self.label).set(0)
        return self._down(reason, str(error) or type(error).__name__, wall=self._wall())

    def _overdue(self, limit: float) -> None:
        """A poll still running after ``OVERDUE_INTERVALS`` intervals: the source is blind
        now (``ibmon_source_up`` 0); the poll goes on until its timeout, which fails it."""
        self.metrics.source_up.labels(self.label).set(0)
        prev = self.status
        self.status = dataclasses.replace(
            prev, up=False,
            last_error=f"poll_overdue: no answer for {OVERDUE_INTERVALS} intervals"
                       f" (timeout at {limit:.0f}s)")

    def _report_bug(self, exc: BaseException) -> None:
        """Log a bug's traceback, once per ``BUG_LOG_SECONDS`` per source (a bug that
        repeats every poll would flood the log); every occurrence is counted as a failed poll
        of reason ``source_bug``."""
        now = time.monotonic()
        if now - self._bug_logged < BUG_LOG_SECONDS:
            return
        self._bug_logged = now
        log.error("source_bug", source=self.label, error=f"{type(exc).__name__}: {exc}",
                  exc_info=exc)

    def _down(self, reason: str, text: str, *, wall: float) -> list[Event]:
        """The health side of a failed poll: metrics, status, log, the ``source_failed`` edge,
        and a rediscovery on the next poll (a fabric that comes back may have new LIDs)."""
        events = self.engine.source_poll(False, wall=wall, reason=reason, error=text)
        self.metrics.poll_errors.labels(self.label, reason).inc()
        self.metrics.source_up.labels(self.label).set(0)
        prev = self.status
        self.status = SourceStatus(
            name=self.label,
            kind=self.cfg.type,
            up=False,
            last_success=prev.last_success,
            ports=len(self._views),
            last_error=f"{reason}: {text}",
        )
        self.error = text
        self._next_discover = 0.0
        if self._log_failures:
            log.error("source_failed", source=self.label, reason=reason, error=text)
        return events

    def observe_publish(self, seconds: float) -> None:
        """The caller's time to publish the state this poll produced (the ``publish`` stage).

        The state the exporters served before is gone by now, so the views this poll
        replaced are held by nothing but this pipeline: a large batch is freed in a worker
        thread, a few hundred at a time (``_release``), so the event loop never waits out
        the whole deallocation (no loop stall over 50 ms).
        """
        self._stage["publish"].observe(seconds)
        self._publishing = True
        retired, self._retired = self._retired, []
        if fabric_sized(len(retired)):
            submit_bulk(_release, retired)

    # -- what it knows ---------------------------------------------------------------------------

    @property
    def views(self) -> Mapping[PortKey, PortView]:
        """The latest good poll's port views (read-only; a new mapping every poll)."""
        return self._views

    @property
    def span(self) -> Span | None:
        """Where ``views`` are in the tracker's store, when they are one span of it (for the
        renderer: ``ibmon.track.rowview.Span``); None once the views are others (a failed poll)."""
        span = self._span
        return span if span is not None and span.ports is self._views else None

    def active(self) -> list[ActiveCondition]:
        """Every condition firing on this source's ports: those of ``views``."""
        return list(self._conditions)

    # -- persistence -----------------------------------------------------------------------------

    def release(self, wall: float) -> list[Event]:
        """The source left the config: what its engine holds ends (``Engine.release``); the
        totals stay, for a source that comes back."""
        events = self.engine.release(wall)
        self._conditions = ()
        return events

    def dump(self) -> dict[str, Any]:
        """Tracker and engine state as JSON types, for the state file."""
        return {"tracker": self.tracker.dump(), "engine": self.engine.dump()}

    def load(self, saved: Mapping[str, Any]) -> None:
        """Restore ``dump`` output part by part; ValueError naming every part that was unusable
        (the usable parts are restored: a corrupt detector state does not cost the totals)."""
        problems: list[str] = []
        for part, target in (("tracker", self.tracker), ("engine", self.engine)):
            data = saved.get(part)
            if data is None:
                continue
            try:
                target.load(data)
            except ValueError as exc:
                problems.append(str(exc))
        self._conditions = tuple(self.engine.active())
        if problems:
            raise ValueError("; ".join(problems))


#: Views freed per step of ``_release``: about 0.2 ms of deallocation with the GIL held.
_RELEASE_STEP: Final = 256


def _release(views: list[PortView]) -> None:
    """Drop ``views`` (the caller's last references) ``_RELEASE_STEP`` at a time.

    Freeing a view and what only it holds (its rates, the totals it did not share with
    the next poll, the floats and ints in them) is C code that never lets another thread
    run; one ``del`` of the whole list would hold the GIL for all of them.
    """
    while views:
        del views[-_RELEASE_STEP:]


def _shard_of(cfg: SourceConfig) -> str:
    """The source's ``shard`` ("K/N"), "" for a source that has none: part of event ids."""
    shard = getattr(cfg, "shard", None)
    return shard if isinstance(shard, str) else ""


def stale_view(view: PortView) -> PortView:
    """``view`` as it stays while its port does not answer: totals, state, identity, link and
    conditions as last read; rates, utilization, transmit-wait ratio and BER gone (they would
    claim a measurement that did not happen)."""
    if view.stale:
        return view
    totals = view.totals
    if type(totals) is Totals and (own := totals.own()) is not totals.packed:
        # A row of the tracker's column store (``ibmon.track.columns``): its own copy, so a
        # port that stays silent does not keep that poll's whole generation of totals.
        totals = Totals(totals.index, own)
    return replaced(
        view,
        stale=True,
        totals=totals,
        rates={},
        hw_rates={},
        utilization_tx=None,
        utilization_rx=None,
        xmit_wait_ratio=None,
        symbol_error_ber=None,
    )


def build_state(pipelines: Iterable[Pipeline], *, generated: float | None = None) -> FabricState:
    """The fabric as the pipelines see it, given in configuration order: when two sources report
    the same port, the first configured one wins."""
    sources: dict[str, SourceStatus] = {}
    each: list[Mapping[PortKey, PortView]] = []
    span: Span | None = None
    conditions: list[ActiveCondition] = []
    for pipeline in pipelines:
        each.append(pipeline.views)
        conditions += pipeline.active()
        span = pipeline.span
        sources[pipeline.label] = pipeline.status
    ports: Mapping[PortKey, PortView]
    if len(each) == 1:
        # The pipeline's own read-only views, which it replaces and never changes: no copy
        # (hashing 36,720 keys into a new dict held the event loop for milliseconds).
        ports = each[0]
    else:
        merged = dict(each[0]) if each else {}
        for views in each[1:]:
            for key, view in views.items():
                merged.setdefault(key, view)
        ports = MappingProxyType(merged)
    return FabricState(
        generated=time.time() if generated is None else generated,
        ports=ports,
        sources=MappingProxyType(sources),
        span=span if len(each) == 1 else None,
        conditions=tuple(conditions),
    )
