"""The detection engine: runs every enabled detector over each poll and emits edge events.

Detectors answer per port "holds at severity S", "does not hold" or "no opinion" (``KEEP``); the
engine remembers which conditions are active and emits exactly one ``firing`` event when one
starts, one more ``firing`` when its severity rises (warning to critical), and one ``resolved``
when it ends. Falling back from critical to warning is not an event: the condition keeps its
highest severity until it resolves, so an alert never flaps between two pages.

The engine also fills ``PortView.conditions`` (and, through the BER detector,
``symbol_error_ber``) in place before the daemon publishes the views. One engine serves one
source, like one tracker; its state (active conditions, every detector's windows and the
episode counts event ids are made of) is persisted with ``dump``/``load`` so a restart neither
re-announces nor forgets a condition, and goes on with the same ids as its HA twin.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from pydantic import BaseModel, ValidationError

from ibmon.detect.base import (
    KEEP,
    DetectorSettings,
    Finding,
    Pairs,
    PortDetector,
    key_from_json,
    key_to_json,
)
from ibmon.detect.columns import Fresh, PortOrder
from ibmon.detect.congestion import Congestion
from ibmon.detect.counters import CounterReset, CounterSaturated
from ibmon.detect.errors import Discards, HighBer, LinkIntegrity, ReceiveErrors
from ibmon.detect.events import (
    EVENT_TYPES,
    SEVERITIES,
    Event,
    EventType,
    PortRef,
    Status,
    event_id,
    peer_ref,
    port_ref,
    severity_rank,
)
from ibmon.detect.link import LinkDegraded, LinkFlapping, PortDown
from ibmon.detect.source import SourceFailed, SourceFailedSettings, health_json, load_health
from ibmon.detect.topology import TopologyChanged
from ibmon.infiniband.model import LinkInfo, PortIdentity, PortKey, PortView
from ibmon.track.rowview import Layout

__all__ = [
    "DETECTORS",
    "ENGINE_STATE_VERSION",
    "ActiveCondition",
    "Engine",
    "parse_detect_tables",
]

DETECTORS: Final[dict[str, type[PortDetector]]] = {
    cls.type: cls
    for cls in (
        HighBer,  # first: it fills symbol_error_ber, which later detectors quote as evidence
        PortDown,
        LinkFlapping,
        LinkDegraded,
        LinkIntegrity,
        ReceiveErrors,
        Discards,
        Congestion,
        CounterReset,
        CounterSaturated,
        TopologyChanged,
    )
}
"""Every port detector by its ``[detect.<name>]`` table name (= event type)."""

ENGINE_STATE_VERSION: Final = 1

#: Event types whose every firing is an episode of its own (instants: a reset, a move).
_INSTANTS: Final[frozenset[str]] = frozenset(t for t, cls in DETECTORS.items() if cls.oneshot)

_NONE_ACTIVE: Final[frozenset[PortKey]] = frozenset()


def parse_detect_tables(tables: Mapping[str, Any]) -> dict[str, BaseModel]:
    """Validate ``[detect.<name>]`` tables; ValueError naming the table and field."""
    out: dict[str, BaseModel] = {}
    for name, raw in tables.items():
        model: type[BaseModel]
        if name == SourceFailed.type:
            model = SourceFailedSettings
        elif name in DETECTORS:
            model = DETECTORS[name].settings_model
        else:
            known = ", ".join(sorted([*DETECTORS, SourceFailed.type]))
            raise ValueError(f"unknown detector {name!r} (known: {known})")
        table = raw.model_dump() if isinstance(raw, BaseModel) else raw
        if not isinstance(table, Mapping):
            raise ValueError(f"{name}: expected a table")
        try:
            out[name] = model.model_validate(dict(table))
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(p) for p in err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden" and err["loc"]:
                from ibmon.config import unknown_setting  # imports this module: not at the top

                msg = unknown_setting(str(err["loc"][-1]), model.model_fields)
            raise ValueError(f"{name}{'.' + loc if loc else ''}: {msg}") from None
    return out


#: ``details.resolution`` of a condition that ended because nothing watches it any more.
DETECTOR_DISABLED: Final = "detector_disabled"
SOURCE_REMOVED: Final = "source_removed"
_WHY: Final = {DETECTOR_DISABLED: "the detector is disabled",
               SOURCE_REMOVED: "the source was removed from the config"}


@dataclass(slots=True)
class _Episode:
    """One (type, port)'s firing episodes so far, for its event ids (``events.event_id``)."""

    number: int = 0  # the ordinal of the latest episode (0: none yet)
    open: bool = False  # fired and not resolved yet
    #: (status, severity) -> events of the open episode with them, for ``repeat``
    seen: dict[tuple[str, str], int] = field(default_factory=dict)


@dataclass(slots=True)
class ActiveCondition:
    """A condition that is firing on a port, as the API and ``ibmon top`` show it."""

    type: EventType
    key: PortKey
    finding: Finding
    since: float  # wall-clock time it fired
    identity: PortIdentity
    peer: PortRef | None


class Engine:
    """All detectors for one source. Call ``process`` after each ``Tracker.update``."""

    def __init__(
        self,
        tables: Mapping[str, Any] | None = None,
        *,
        fabric: str = "main",
        source: str = "",
        shard: str = "",
    ) -> None:
        settings = parse_detect_tables(tables or {})
        self.fabric = fabric
        self.source = source
        #: The source's ``shard`` ("K/N", "" unsharded): part of every event id.
        self.shard = shard
        #: Firing episodes by (type, GUID, port) ("", "" for ``source_failed``): event ids
        #: count them instead of reading a clock (``_event_id``). Kept in the saved state, and
        #: kept when a port is forgotten, so an id is never given twice.
        self._episodes: dict[tuple[str, str, str], _Episode] = {}
        self.detectors: list[PortDetector] = []
        for name, cls in DETECTORS.items():
            if name not in EVENT_TYPES:
                # Once here rather than on the first event: the Event model would refuse it.
                raise TypeError(f"detector {cls.__name__} emits unknown event type {name!r}")
            s = settings.get(name) or cls.settings_model()
            assert isinstance(s, DetectorSettings)
            if s.enabled:
                self.detectors.append(cls(s))
        sf = settings.get(SourceFailed.type) or SourceFailedSettings()
        assert isinstance(sf, SourceFailedSettings)
        self._source_health: SourceFailed | None = SourceFailed(sf, source) if sf.enabled else None
        #: A source outage loaded while ``source_failed`` is disabled: resolved at the next
        #: poll's outcome, like ``_retired``.
        self._source_owed: Finding | None = None
        self._active: dict[str, dict[PortKey, ActiveCondition]] = {
            d.type: {} for d in self.detectors if not d.oneshot
        }
        #: Link faults: which ends showed the fault at the latest poll, by carrying end.
        self._marks: dict[str, dict[PortKey, frozenset[PortKey]]] = {
            d.type: {} for d in self.detectors if d.link_scoped
        }
        #: The last link of each port that has none now, found in the poll before it lost it:
        #: a discovery shows no neighbour for a port whose link is down, and a link fault must
        #: still be judged (and raised) once per link. Only such ports: a fabric's few.
        self._lost: dict[PortKey, LinkInfo] = {}
        self._previous: Mapping[PortKey, PortView] = {}  # the views of the latest poll
        self._offset: float | None = None  # wall - monotonic of the latest poll
        self._order: PortOrder | None = None  # the answered ports of the latest poll
        self._pending: dict[str, Any] | None = None
        #: Loaded conditions of detectors now disabled: resolved at the next poll, so an event
        #: consumer does not hold them open for ever.
        self._retired: list[ActiveCondition] = []

    # ------------------------------------------------------------------ polling

    def process(
        self, views: Mapping[PortKey, PortView], *, monotonic: float, wall: float,
        layout: Layout | None = None,
    ) -> list[Event]:
        """Evaluate one poll; fill ``conditions`` on the views; return the edges, in order.

        Stale views (ports that did not answer this poll) count as present, so they never
        "vanish", but no detector judges them: their conditions neither fire nor resolve on
        data that was not read. ``layout`` is the tracker's, for the column readers.
        """
        self._offset = wall - monotonic
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._load_detectors(pending, self._offset)
        events = [self._resolved(cur, None, wall, DETECTOR_DISABLED) for cur in self._retired]
        self._retired = []
        now = monotonic
        # The conditions as of the previous poll, so a detector can quote what the port and
        # the far end of its link already show; refilled with this poll's below.
        before = self._fill_conditions(views)
        lost, previous = self._lost, self._previous
        # The ports read this poll, once for every detector: stale views (ports that did not
        # answer) count as present, so they never "vanish", but no detector judges them.
        fresh = Fresh(self._order, layout)
        for key, seen in views.items():
            if seen.link is None and key not in lost:
                last = previous.get(key)
                if last is not None and last.link is not None:
                    lost[key] = last.link
            if not seen.stale:
                fresh.append((key, seen))
        for key in [k for k in lost if (v := views.get(k)) is not None and v.link is not None]:
            del lost[key]
        self._previous = views
        for det in self.detectors:
            det.begin(now, views)
            if det.oneshot:
                self._instants(det, fresh, now, wall, events)
            elif det.link_scoped:
                self._links(det, views, fresh, now, wall=wall, events=events)
            else:
                self._conditions(det, fresh, now, wall, events)
            for identity, finding in det.vanished(now, views):
                events.append(self._event(det.type, "firing", finding, identity, None, wall=wall))
        for key in before - self._fill_conditions(views):
            left = views.get(key)
            if left is not None and not left.stale:  # a stale view keeps what it showed
                left.conditions = frozenset()
                left.causes = {}
        # The answered ports' order, kept for the next poll: the detectors' memos tell "the
        # same ports in the same order" by this object.
        self._order = fresh.known_order
        return events

    def _instants(
        self, det: PortDetector, fresh: Pairs, now: float, wall: float, events: list[Event]
    ) -> None:
        """A oneshot detector: one ``firing`` event per finding, nothing remembered."""
        check = det.check
        for key, view in det.needs(fresh, now, _NONE_ACTIVE):
            verdict = check(key, view, now, None)
            if isinstance(verdict, Finding):
                events.append(
                    self._event(det.type, "firing", verdict, view.identity, peer_ref(view),
                                wall=wall)
                )

    def _conditions(
        self, det: PortDetector, fresh: Pairs, now: float, wall: float, events: list[Event]
    ) -> None:
        """A condition detector: edges only, from the verdict against what is active."""
        check = det.check
        active = self._active[det.type]
        get = active.get
        for key, view in det.needs(fresh, now, active):
            cur = get(key)
            verdict = check(key, view, now, cur.finding if cur else None)
            if verdict is None:
                if cur is not None:
                    del active[key]
                    events.append(self._resolved(cur, view, wall))
            elif verdict is KEEP:
                continue
            elif isinstance(verdict, Finding):
                self._holds(kind=det.type, key=key, view=view, finding=verdict, cur=cur,
                            wall=wall, events=events)

    def _links(
        self,
        det: PortDetector,
        views: Mapping[PortKey, PortView],
        fresh: Pairs,
        now: float,
        *,
        wall: float,
        events: list[Event],
    ) -> None:
        """A link fault: each end judged alone, then one condition per link.

        The two ends of a link the source sees both are judged together: the fault holds when
        it holds at either end (``det.join`` tells it from the carrying end, naming both), it
        ends when an end that answered says it does not hold and none says it does, and it
        stays as it was when neither end has an opinion. It is kept on its *carrying end*
        (``carrier``): the switch end of a host link, the lower (GUID, port) of a link
        between two switches; a condition that fired keeps its end until it resolves. A port
        whose peer the source does not see (node-local sysfs) carries its own.
        """
        check = det.check
        active = self._active[det.type]
        marks = self._marks[det.type]
        # The verdicts of the ports checked; every other port read this poll (``needs``) votes
        # "does not hold" (None), and a stale port has no vote.
        verdicts: dict[PortKey, Any] = {}
        for key, view in det.needs(fresh, now, active):
            cur = active.get(key)
            verdicts[key] = check(key, view, now, cur.finding if cur else None)

        def voted(key: PortKey | None) -> bool:
            seen = views.get(key) if key is not None else None
            return seen is not None and not seen.stale

        # Only links where something holds or was holding can change: a healthy fabric costs
        # its ``needs`` pass and nothing more.
        candidates = [k for k, v in verdicts.items() if isinstance(v, Finding)]
        candidates += [k for k in active if k in views]
        done: set[PortKey] = set()
        for key in candidates:
            if key in done:
                continue
            view = views[key]
            # A link that is down has no neighbour in a discovery: its last known far end.
            link = view.link or self._lost.get(key)
            pk = (link.remote_guid, link.remote_port) if link and link.remote_guid else None
            if not voted(key) and not voted(pk):
                continue  # neither end was read this poll (stale): nothing to judge
            pview = views.get(pk) if pk is not None and pk != key else None
            if pview is None:
                group: tuple[PortKey, ...] = (key,)
            else:
                assert pk is not None
                group = (key, pk)
            done.update(group)
            held = [k for k in group if k in active]
            carrier = held[0] if held else _carrier(group, views)
            cur = active.get(carrier)
            votes = [verdicts.get(k) for k in group if voted(k)]
            findings = {k: v for k in group if isinstance(v := verdicts.get(k), Finding)}
            if findings:
                here = views[carrier]
                other = group[1] if len(group) == 2 and group[0] == carrier else group[0]
                peer = views[other] if other != carrier else None
                joined = det.join(here, findings.get(carrier), peer, findings.get(other))
                marks[carrier] = frozenset(findings)
                self._holds(kind=det.type, key=carrier, view=here, finding=joined, cur=cur,
                            wall=wall, events=events,
                            far=port_ref(peer.identity) if peer is not None else None)
            elif held and any(v is None for v in votes):
                # both ends may hold one (state saved before faults were kept per link):
                # each announced firing gets its resolved
                for k in held:
                    done_cond = active.pop(k)
                    marks.pop(k, None)
                    events.append(self._resolved(done_cond, views[k], wall))

    def _holds(
        self,
        *,
        kind: EventType,
        key: PortKey,
        view: PortView,
        finding: Finding,
        cur: ActiveCondition | None,
        wall: float,
        events: list[Event],
        far: PortRef | None = None,
    ) -> None:
        if cur is None:
            peer = peer_ref(view) or far
            self._active[kind][key] = ActiveCondition(kind, key, finding, wall, view.identity, peer)
            events.append(self._event(kind, "firing", finding, view.identity, peer, wall=wall))
            return
        if severity_rank(finding.severity) > severity_rank(cur.finding.severity):
            cur.finding = finding
            cur.peer = peer_ref(view) or far or cur.peer
            events.append(
                self._event(
                    kind, "firing", finding, view.identity, cur.peer, wall=wall, escalated=True
                )
            )
        elif finding is not cur.finding:
            # Nothing to announce: today's value and measurements, but the severity (never
            # de-escalate), message, cause and action stay as announced, so the API, the
            # alert's cause label and the last event never disagree.
            old = cur.finding
            details = finding.details
            if "cause" in old.details:
                details = {**details, "cause": old.details["cause"],
                           "action": old.details.get("action", details.get("action"))}
            cur.finding = Finding(old.severity, finding.value, old.threshold, old.message,
                                  details)

    def _fill_conditions(self, views: Mapping[PortKey, PortView]) -> set[PortKey]:
        """``conditions`` of every port where one holds (a link fault: on each end that
        showed it), and ``causes`` (condition -> cause) on the port that carries it; returns
        the ports it set."""
        per_port: dict[PortKey, set[str]] = {}
        causes: dict[PortKey, dict[str, str]] = {}
        for det in self.detectors:
            cond = det.condition
            if cond is None or det.oneshot:
                continue
            marks = self._marks.get(det.type)
            for key, a in self._active[det.type].items():
                ends = marks.get(key) if marks else None
                for end in ends or (key,):
                    per_port.setdefault(end, set()).add(cond)
                per_port.setdefault(key, set()).add(cond)
                causes.setdefault(key, {})[cond] = str(a.finding.details.get("cause", "unknown"))
        for key, conds in per_port.items():
            view = views.get(key)
            if view is not None:
                view.conditions = frozenset(conds)
        for key, by_cond in causes.items():
            view = views.get(key)
            if view is not None:
                view.causes = by_cond
        return per_port.keys() | causes.keys()

    def source_poll(
        self, ok: bool, *, wall: float, reason: str = "", error: str = ""
    ) -> list[Event]:
        """Report one poll's outcome; returns a ``source_failed`` edge when there is one."""
        health = self._source_health
        if health is None:
            owed, self._source_owed = self._source_owed, None
            return [] if owed is None else [self._outage_ended(owed, wall, DETECTOR_DISABLED)]
        edge = health.observe(ok, reason, error)
        if edge is None:
            return []
        status, finding = edge
        if status == "resolved":
            return [self._outage_ended(finding, wall, None)]
        return [self._source_event("firing", finding, wall)]

    def release(self, wall: float) -> list[Event]:
        """End everything this engine holds, its source having left the config (a reload):
        one ``resolved`` event per condition and for an outage. Detector windows stay, so a
        source that comes back raises what still holds again."""
        held = [*self.active(), *self._retired]
        events = [self._resolved(cur, None, wall, SOURCE_REMOVED) for cur in held]
        health = self._source_health
        outage = health.active if health is not None else self._source_owed
        if outage is not None:
            events.append(self._outage_ended(outage, wall, SOURCE_REMOVED))
        if health is not None:
            health.active, health.failures = None, 0
        self._source_owed = None
        self._active = {kind: {} for kind in self._active}
        self._retired = []
        self._marks = {kind: {} for kind in self._marks}
        return events

    def _outage_ended(self, finding: Finding, wall: float, why: str | None) -> Event:
        """The ``resolved`` edge of a source outage: recovered, or (``why``) no longer
        watched."""
        if why is None:
            text, details = f"source {self.source} recovered", finding.details
        else:
            text = f"source {self.source} no longer watched ({_WHY[why]})"
            details = {**finding.details, "resolution": why}
        done = Finding(finding.severity, None, finding.threshold, text, details)
        return self._source_event("resolved", done, wall)

    def _source_event(self, status: Status, finding: Finding, wall: float) -> Event:
        kind = SourceFailed.type
        return Event(
            id=self._event_id(kind, status, finding.severity, "", ""),
            time=Event.at(wall),
            fabric=self.fabric,
            type=kind,
            status=status,
            severity=finding.severity,
            value=finding.value,
            threshold=finding.threshold,
            details=finding.details,
            message=finding.message,
        )

    # ------------------------------------------------------------------ events

    def _event(
        self,
        kind: EventType,
        status: Status,
        finding: Finding,
        identity: PortIdentity,
        peer: PortRef | None,
        *,
        wall: float,
        escalated: bool = False,
    ) -> Event:
        details = dict(finding.details)
        if escalated:
            details["escalated"] = True
        if self.source:
            details.setdefault("source", self.source)
        # Validated: a detector whose type or severity the Event model does not know fails
        # here, not in a consumer. pydantic's (Rust) validation measured faster than
        # model_construct: 22 against 27 us per event, 20,000 events in a flood poll.
        return Event(
            id=self._event_id(kind, status, finding.severity, identity.guid, identity.port),
            time=Event.at(wall), fabric=self.fabric, type=kind, status=status,
            severity=finding.severity, port=port_ref(identity), peer=peer,
            value=_finite(finding.value), threshold=_finite(finding.threshold),
            details=details, message=finding.message,
        )

    def _event_id(self, kind: str, status: str, severity: str, guid: str, port: str) -> str:
        """Deterministic (``ibmon.detect.events.event_id``) and never repeated by this engine.

        A firing starts the next episode of (type, port) unless one is open (then it is an
        escalation, or a condition fired again after its port was forgotten unresolved); a
        resolved event closes the open one. An instant (``oneshot`` type) is an episode of its
        own. Two daemons that saw the same episodes agree on every id, whenever each polled.
        """
        what = (kind, guid, port)
        ep = self._episodes.get(what)
        if ep is None:
            ep = self._episodes[what] = _Episode()
        if status == "firing" and (not ep.open or kind in _INSTANTS):
            ep.number += 1
            ep.open = kind not in _INSTANTS
            ep.seen = {}
        mark = (status, severity)
        repeat = ep.seen.get(mark, 0)
        ep.seen[mark] = repeat + 1
        if status == "resolved":
            ep.open = False
        return event_id(fabric=self.fabric, source=self.source, shard=self.shard, kind=kind,
                        guid=guid, port=port, status=status, severity=severity,
                        episode=ep.number, repeat=repeat)

    def _resolved(self, cur: ActiveCondition, view: PortView | None, wall: float,
                  why: str = "") -> Event:
        """The ``resolved`` edge of ``cur``: it ended on ``view``, or nothing watches it any
        more (no view: ``why`` says what stopped watching)."""
        f = cur.finding
        took = _duration(wall - cur.since)
        details = {**f.details, "active_seconds": round(wall - cur.since, 3)}
        name = cur.type.replace("_", " ")
        if view is None:
            text = f"{name} no longer watched after {took} ({_WHY[why]})"
            details["resolution"] = why
            identity, peer = cur.identity, cur.peer
        else:
            text = f"{name} resolved after {took}"
            identity, peer = view.identity, peer_ref(view) or cur.peer
        done = Finding(f.severity, None, f.threshold, f"{text}: {f.message}", details)
        return self._event(cur.type, "resolved", done, identity, peer, wall=wall)

    # ------------------------------------------------------------------ queries

    def active(self) -> list[ActiveCondition]:
        """Every firing condition (copy of the list; entries are live)."""
        return [a for by_key in self._active.values() for a in by_key.values()]

    def forget(self, key: PortKey) -> None:
        for det in self.detectors:
            det.forget(key)
        for by_key in self._active.values():
            by_key.pop(key, None)
        for marks in self._marks.values():
            marks.pop(key, None)
        self._lost.pop(key, None)

    # ------------------------------------------------------------------ persistence

    def dump(self) -> dict[str, Any]:
        """Active conditions, detector windows and the source's health, times as wall clock,
        as JSON types."""
        offset = self._offset
        active = [
            {
                "type": a.type,
                "key": key_to_json(a.key),
                "since": a.since,
                "severity": a.finding.severity,
                "value": _finite(a.finding.value),
                "threshold": _finite(a.finding.threshold),
                "message": a.finding.message,
                "details": a.finding.details,
                "identity": {
                    "node_desc": a.identity.node_desc,
                    "device": a.identity.device,
                    "lid": a.identity.lid,
                    "node_type": a.identity.node_type,
                },
                "peer": a.peer.model_dump() if a.peer else None,
            }
            for a in [*self.active(), *self._retired]
        ]
        if offset is None:  # no poll since load (or ever): hand the loaded windows back as-is
            detectors = dict((self._pending or {}).get("detectors", {}))
        else:
            detectors = {d.type: d.dump(offset) for d in self.detectors}
        episodes = [
            [kind, guid, port, ep.number, ep.open,
             [[status, severity, n] for (status, severity), n in ep.seen.items()]]
            for (kind, guid, port), ep in self._episodes.items()
        ]
        health = self._source_health
        source = health.dump() if health else health_json(0, self._source_owed)
        return {"version": ENGINE_STATE_VERSION, "active": active, "detectors": detectors,
                "episodes": episodes, "source": source}

    def load(self, data: Mapping[str, Any]) -> None:
        """Restore ``dump`` output; ValueError (and no change) if it does not fit.

        Active conditions are restored at once (so they are neither re-announced nor lost);
        those of a detector disabled since resolve at the next poll (``detector_disabled``).
        Detector windows wait for the first poll, whose clock tells how to shift their times.
        """
        if not isinstance(data, Mapping) or data.get("version") != ENGINE_STATE_VERSION:
            raise ValueError("engine state: unsupported version")
        active: dict[str, dict[PortKey, ActiveCondition]] = {k: {} for k in self._active}
        retired: list[ActiveCondition] = []
        try:
            for raw in data.get("active", []):
                kind = raw["type"]
                if kind not in DETECTORS:
                    continue  # a type this version does not know (a newer one's file)
                key = key_from_json(raw["key"])
                ident = raw.get("identity") or {}
                identity = PortIdentity(
                    guid=key[0],
                    port=key[1],
                    node_desc=str(ident.get("node_desc", "")),
                    device=str(ident.get("device", "")),
                    lid=ident.get("lid"),
                    node_type=str(ident.get("node_type", "ca")),
                )
                finding = Finding(
                    raw["severity"],
                    raw.get("value"),
                    raw.get("threshold"),
                    str(raw.get("message", "")),
                    dict(raw.get("details") or {}),
                )
                if finding.severity not in SEVERITIES:
                    raise ValueError(f"bad severity {finding.severity!r}")
                peer = PortRef.model_validate(raw["peer"]) if raw.get("peer") else None
                cond = ActiveCondition(kind, key, finding, float(raw["since"]), identity, peer)
                if kind in active:
                    active[kind][key] = cond
                else:  # its detector is disabled now
                    retired.append(cond)
        except (KeyError, TypeError, ValidationError) as exc:
            raise ValueError(f"engine state: bad active condition: {exc}") from None
        episodes = _load_episodes(data.get("episodes", []))
        failures, outage = load_health(data.get("source") or health_json(0, None))
        for kind, by_key in active.items():
            for guid, port in by_key:
                # a state saved before episodes were: its conditions are open episodes
                episodes.setdefault((kind, guid, port), _Episode(0, True))
        detectors = data.get("detectors", {})
        if not isinstance(detectors, Mapping):
            raise ValueError("engine state: 'detectors' must be an object")
        # Validate detector data now (on throwaway instances) so a bad file fails here.
        for det in self.detectors:
            if det.type in detectors and detectors[det.type] is not None:
                probe = type(det)(det.settings)
                try:
                    probe.load(detectors[det.type], 0.0)
                except (KeyError, TypeError, IndexError, AttributeError) as exc:
                    raise ValueError(f"engine state: {det.type}: {exc}") from None
        self._active = active
        self._retired = retired
        self._episodes = episodes
        if self._source_health is not None:
            self._source_health.failures, self._source_health.active = failures, outage
        else:
            self._source_owed = outage
        self._marks = {t: {} for t in self._marks}
        self._pending = {"version": ENGINE_STATE_VERSION, "detectors": dict(detectors)}

    def _load_detectors(self, pending: Mapping[str, Any], offset: float) -> None:
        detectors = pending.get("detectors", {})
        for det in self.detectors:
            raw = detectors.get(det.type)
            if raw is not None:
                det.load(raw, offset)


def _load_episodes(raw: Any) -> dict[tuple[str, str, str], _Episode]:
    """``dump``'s episode list back; ValueError when it does not fit."""
    out: dict[tuple[str, str, str], _Episode] = {}
    try:
        for kind, guid, port, number, is_open, seen in raw:
            if not all(isinstance(x, str) for x in (kind, guid, port)):
                raise TypeError("type, GUID and port must be strings")
            if type(number) is not int or number < 0 or type(is_open) is not bool:
                raise TypeError(f"bad episode number {number!r} or open flag {is_open!r}")
            counts: dict[tuple[str, str], int] = {}
            for status, severity, n in seen:
                if type(n) is not int or n < 1:
                    raise TypeError(f"bad event count {n!r}")
                counts[(str(status), str(severity))] = n
            out[(kind, guid, port)] = _Episode(number, is_open, counts)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"engine state: bad episodes: {exc}") from None
    return out


def _carrier(group: tuple[PortKey, ...], views: Mapping[PortKey, PortView]) -> PortKey:
    """The end of a link that carries its faults: the switch end of a host link (the stable
    one: the host end vanishes with the link from a fabric-wide view), else the lower key."""
    if len(group) == 1:
        return group[0]
    switches = [k for k in group if views[k].identity.node_type == "switch"]
    if len(switches) == 1:
        return switches[0]
    return min(group)


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _finite(x: float | None) -> float | None:
    return x if x is None or math.isfinite(x) else None
