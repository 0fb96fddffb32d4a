"""One poll pipeline: a source's ``discover()``/``sample()`` in, port views and events out.

Every entry point polls through this one class: the daemon (and so ``ibmon demo``), ``ibmon
scan``, ``ibmon top --source`` and the detection tests. None of them wires a tracker to a
detection engine by hand, so the same fabric reads the same way however you ask. Per source a
``Pipeline`` owns the tracker (counter semantics), the detection engine (conditions and their
events) and that source's self metrics (health and stage timings); ``build_state`` merges
several pipelines into the one ``FabricState`` exporters read.

A poll: discovery when due (on a source object's first poll, then every
``topology_interval``), sample, track, detect, then health bookkeeping. Only reading the source
is awaited. Tracking and detection are one synchronous step on plain data (``ingest``), so they
could move to a worker thread without touching anything else. Whether a poll failed is decided
here, in one place (``_judge`` for answers that came back but do not count as a success), so
source-health rules are added here and nowhere else.

Stage timings go to ``ibmon_pipeline_stage_seconds{source,stage}``: ``sample`` (reading the
source, discovery included when it was due), ``track``, ``detect``, and ``publish``, which the
caller measures where it publishes the merged state (``observe_publish``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, Final

import structlog

from ibmon.config import SourceConfig
from ibmon.detect.engine import ActiveCondition, Engine
from ibmon.events import Event
from ibmon.model import PortKey, PortView, Snapshot
from ibmon.selfmetrics import SelfMetrics
from ibmon.sources import Source
from ibmon.state import FabricState, SourceStatus
from ibmon.tracker import Tracker

__all__ = ["MIN_POLL_TIMEOUT", "POLL_TIMEOUT_INTERVALS", "STAGES", "Pipeline", "build_state"]

log = structlog.get_logger("ibmon.pipeline")

#: A poll that takes longer than this many intervals (and at least MIN_POLL_TIMEOUT) has hung.
POLL_TIMEOUT_INTERVALS: Final = 5
MIN_POLL_TIMEOUT: Final = 10.0
STAGES: Final = ("sample", "track", "detect", "publish")

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
        tick_seconds: float = 64e-9,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        log_failures: bool = True,
    ) -> None:
        self.cfg = cfg
        self.label = cfg.label
        self.metrics = metrics
        self.tracker = Tracker(tick_seconds=tick_seconds)
        self.engine = Engine(tables, fabric=fabric, source=self.label)
        self.status = SourceStatus(name=self.label, kind=cfg.type)
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
        self._discovered: Source | None = None
        self._next_discover = 0.0
        self._stage = {s: metrics.stage_seconds.labels(self.label, s) for s in STAGES}

    # -- configuration ---------------------------------------------------------------------------

    def configure(self, cfg: SourceConfig) -> None:
        """A reloaded config for the same source label (interval, timeouts, even its type)."""
        if cfg.label != self.label:
            raise ValueError(f"pipeline {self.label!r} cannot take source {cfg.label!r}")
        self.cfg = cfg

    def retune(self, tables: Mapping[str, Any] | None) -> None:
        """New detector settings: fresh detectors, with active conditions and windows carried
        over, so a reload neither re-announces nor forgets a firing condition."""
        engine = Engine(tables, fabric=self._fabric, source=self.label)
        try:
            engine.load(self.engine.dump())
        except ValueError as exc:
            log.warning("detector_state_not_carried_over", source=self.label, error=str(exc))
        self.engine = engine

    @property
    def timeout(self) -> float:
        return max(self.cfg.interval * POLL_TIMEOUT_INTERVALS, MIN_POLL_TIMEOUT)

    # -- polling ---------------------------------------------------------------------------------

    async def poll(self, source: Source) -> list[Event]:
        """Discover when due, sample, track, detect; returns the events (edges) of this poll.

        Never raises for a source problem: a source that raises or hangs makes a failed poll
        (``ibmon_source_up`` 0, a ``source_failed`` edge, ``status.last_error``), and the views
        of the last good poll stay.
        """
        started = self._clock()
        limit = self.timeout
        snap: Snapshot | None = None
        failure: tuple[str, BaseException | str] | None = None
        deadline = asyncio.timeout(limit)
        try:
            async with deadline:
                await self._discover_if_due(source, started)
                snap = await source.sample()
        except TimeoutError as exc:
            if deadline.expired():
                failure = ("poll_timeout", f"poll took over {limit:.0f}s")
            else:
                failure = ("poll_failed", exc)
        except Exception as exc:  # a broken source must never take the caller down
            failure = ("poll_failed", exc)
        self._stage["sample"].observe(self._clock() - started)
        if snap is not None and failure is None:
            failure = self._judge(snap)
        if failure is None:
            assert snap is not None
            events = self.ingest(snap)
        else:
            events = self.fail(*failure)
        self.metrics.poll_duration.labels(self.label).observe(self._clock() - started)
        return events

    async def _discover_if_due(self, source: Source, now: float) -> None:
        if source is self._discovered and now < self._next_discover:
            return
        await source.discover()
        self._discovered = source
        interval = getattr(self.cfg, "topology_interval", None)
        self._next_discover = now + interval if interval else float("inf")

    def _judge(self, snap: Snapshot) -> tuple[str, str] | None:
        """Whether a sample that came back still counts as a failed poll: (reason, error).

        Every sample that came back counts as a success today; the fault-matrix rules (a poll
        in which no port answered fails; ports that stop answering stay, marked stale) belong
        here and in ``ingest``.
        """
        return None

    def ingest(self, snap: Snapshot) -> list[Event]:
        """Track and detect one successful sample; synchronous, plain data in and out."""
        clock = self._clock
        tracker = self.tracker
        seen = tracker.resets_seen + tracker.saturations_seen
        t0 = clock()
        views = tracker.update(snap)
        t1 = clock()
        if tracker.resets_seen + tracker.saturations_seen != seen:
            self.save_due = True
        events = self.engine.process(views, monotonic=snap.monotonic, wall=snap.wall)
        events += self.engine.source_poll(True, wall=snap.wall)
        self._stage["track"].observe(t1 - t0)
        self._stage["detect"].observe(clock() - t1)
        m = self.metrics
        for err in snap.errors:
            m.poll_errors.labels(self.label, err.reason).inc()
        m.source_up.labels(self.label).set(1)
        m.last_success.labels(self.label).set(snap.wall)
        m.source_ports.labels(self.label).set(len(views))
        self._views = MappingProxyType(views)
        self.sampled_at = snap.monotonic
        self.error = None
        self.status = SourceStatus(
            name=self.label, kind=self.cfg.type, up=True, last_success=snap.wall, ports=len(views)
        )
        return events

    def fail(self, reason: str, error: BaseException | str) -> list[Event]:
        """Record a failed poll (or a source that could not even be built): health, metrics, log.

        The views of the last good poll stay, so ports do not vanish from ``/metrics``.
        """
        text = str(error) or type(error).__name__
        events = self.engine.source_poll(False, wall=self._wall(), reason=reason, error=text)
        self.metrics.poll_errors.labels(self.label, reason).inc()
        self.metrics.source_up.labels(self.label).set(0)
        prev = self.status
        self.status = SourceStatus(
            name=self.label,
            kind=self.cfg.type,
            up=False,
            last_success=prev.last_success,
            ports=prev.ports,
            last_error=f"{reason}: {text}",
        )
        self.error = text
        if self._log_failures:
            log.error("source_failed", source=self.label, reason=reason, error=text)
        return events

    def observe_publish(self, seconds: float) -> None:
        """The caller's time to publish the state this poll produced (the ``publish`` stage)."""
        self._stage["publish"].observe(seconds)

    # -- what it knows ---------------------------------------------------------------------------

    @property
    def views(self) -> Mapping[PortKey, PortView]:
        """The latest good poll's port views (read-only; a new mapping every poll)."""
        return self._views

    def active(self) -> list[ActiveCondition]:
        """Every condition firing on this source's ports."""
        return self.engine.active()

    def forget_views(self) -> None:
        """The source left the configuration: its ports leave the state (totals are kept)."""
        self._views = _NO_VIEWS
        self.status = SourceStatus(name=self.label, kind=self.cfg.type)

    # -- persistence -----------------------------------------------------------------------------

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
        if problems:
            raise ValueError("; ".join(problems))


def build_state(pipelines: Iterable[Pipeline], *, generated: float | None = None) -> FabricState:
    """The fabric as the pipelines see it, given in configuration order: when two sources report
    the same port, the first configured one wins."""
    ports: dict[PortKey, PortView] = {}
    sources: dict[str, SourceStatus] = {}
    for pipeline in pipelines:
        for key, view in pipeline.views.items():
            ports.setdefault(key, view)
        sources[pipeline.label] = pipeline.status
    return FabricState(
        generated=time.time() if generated is None else generated,
        ports=MappingProxyType(ports),
        sources=MappingProxyType(sources),
    )
