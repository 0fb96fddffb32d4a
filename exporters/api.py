"""JSON API on the Prometheus listener: ports, events, health and readiness.

``/api/v1/ports/{guid}/{port}`` is one port with the far end of its link, its conditions and
their likely causes, the detail breakdown and the recent events of both ends (404 for a port
the daemon does not know). ``/api/v1/topology`` lists nodes in GUID order, each with its ports
and the links it is the lower end of, a page at a time like ``/api/v1/ports`` (``limit``,
``cursor``). ``/api/v1/ports`` lists ports worst first (firing conditions, then transmit wait,
BER and utilization) with their active conditions, one bounded page at a time: ``?limit=N`` (default
``DEFAULT_PAGE``, at most ``MAX_PAGE``), ``?condition=congestion`` filters, and the answer's
``next`` is an opaque cursor for ``?cursor=`` that continues after the page's last port (null
on the last page). ``/api/v1/jobs`` lists the running jobs (whether the scheduler could be asked,
what route attribution used, each job's rates and conditions) and ``/api/v1/jobs/{id}`` is one
job's hosts, their ports, the links with a firing condition it uses and its rates (404 for a job
that is not running, 503 while jobs are unknown); a port's answer lists the jobs on its link
(``exporters.jobs``). ``/api/v1/events`` returns recent events, newest last; ``?type=``,
``?since=<event id>`` and ``?limit=`` narrow it. ``/healthz`` answers while the process serves
(liveness); ``/readyz`` only once the daemon runs and at least one source's latest poll
succeeded (readiness). Both answer without basic auth (Kubernetes probes); ``/readyz`` then
leaves out source names and errors. A query value that cannot be meant (a condition or event
type that does not exist, a ``since`` that is no event id, a cursor this server did not give) is
a 400 whose ``error`` names what is accepted, never a 200 that looks like "nothing there".

Cost is paid once per state, never per client: the worst-first order of a state is built on the
first request that needs it, and each port's JSON is encoded the first time any client asks for
it, then reused by every client until the next state. All of that runs in one worker thread
that may use at most ``API_SHARE`` of the wall clock (``ApiWorker``), so however many clients
ask, polling keeps its CPU. A cursor names a position in the order (the last port's sort key),
not in a particular state, so paging goes on across polls: a port whose rank changed between
two pages may be seen twice or not at all, as with any live keyset pagination.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import bisect
import json
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, get_args

from exporters.jobs import job_detail_json, jobs_json, link_jobs_json
from exporters.ports import port_detail_json, port_json
from exporters.server import HttpError, Request, Response, Route
from ibmon.detect.engine import DETECTORS, ActiveCondition
from ibmon.detect.events import Event, EventType, severity_rank
from ibmon.infiniband.model import PortKey, PortView, normalize_guid
from ibmon.jobs.model import JobLink
from ibmon.state import FabricState
from ibmon.state.topology import node_rows

__all__ = [
    "API_SHARE",
    "DEFAULT_PAGE",
    "MAX_EVENTS",
    "MAX_PAGE",
    "ApiProvider",
    "ApiWorker",
    "PortsIndex",
    "TopologyIndex",
    "api_routes",
    "decode_cursor",
    "encode_cursor",
    "port_json",
    "query_count",
    "worst_first",
]

#: Ports per page when the client gives no ``limit``, and the most it may ask for.
DEFAULT_PAGE = 100
MAX_PAGE = 1000
#: Events per answer, by default and at most (``since`` pages forward).
MAX_EVENTS = 1000
#: Share of the wall clock the API's worker thread may spend encoding (the rest is polling's).
API_SHARE = 0.25
#: A cursor is small; anything longer is not one of ours.
MAX_CURSOR = 512
#: A job id is short (Slurm: ``123``, ``123_4``, ``123+1``); anything longer is no job's.
MAX_JOB_ID = 64
#: Jobs listed in a port's answer (the rest counted in ``total``).
PORT_JOBS = 100
#: The order and JSON of a state no client asked about for this long are let go (they hold
#: that state's port views, which the daemon itself has already replaced).
INDEX_TTL = 30.0
JSON = "application/json"

#: What ``?condition=`` may name: the conditions a port can have (the detectors' types).
CONDITIONS = tuple(sorted(DETECTORS))
#: What ``/api/v1/events?type=`` may name.
EVENT_TYPES = tuple(sorted(get_args(EventType)))
#: An event id (``ibmon.detect.events.event_id``): 32 lowercase hex digits.
_EVENT_ID = re.compile(r"[0-9a-f]{32}")
#: The one thing a refused cursor says: how it came about is the server's business, and a
#: decoder's words ("Incorrect padding", "Expecting value: line 1 column 1") help no client.
_NOT_OUR_CURSOR = "cursor is not one this server gave (pass the previous answer's next)"

T = TypeVar("T")
SortKey = tuple[float, float, float, float, float, str, int, str]


@dataclass(frozen=True, slots=True)
class ApiProvider:
    """What the API reads, as callables so it always sees the daemon's latest objects."""

    state: Callable[[], FabricState]
    events: Callable[[], Sequence[Event]]
    ready: Callable[[], bool]


def _sort_key(view: PortView, active: Sequence[ActiveCondition]) -> SortKey:
    """Ascending = worst first: severity, number of conditions, transmit wait, BER,
    utilization (all descending), then the one port order (GUID, port number)."""
    worst = max((severity_rank(a.finding.severity) for a in active), default=-1)
    port = view.identity.port
    return (
        -float(worst),
        -float(len(active)),
        -(view.xmit_wait_ratio or 0.0),
        -(view.symbol_error_ber or 0.0),
        -max(view.utilization_tx or 0.0, view.utilization_rx or 0.0),
        view.identity.guid,
        len(port),
        port,
    )


def _by_port(conditions: Iterable[ActiveCondition]) -> dict[PortKey, list[ActiveCondition]]:
    by_port: dict[PortKey, list[ActiveCondition]] = {}
    for a in conditions:
        by_port.setdefault(a.key, []).append(a)
    return by_port


def worst_first(
    state: FabricState, conditions: Iterable[ActiveCondition]
) -> list[tuple[PortView, list[ActiveCondition]]]:
    """Ports by how bad they look; equally bad ports in the one port order."""
    by_port = _by_port(conditions)
    rows = [(v, by_port.get(v.key, [])) for v in state.ports.values()]
    rows.sort(key=lambda r: _sort_key(*r))
    return rows


# --- cursors -------------------------------------------------------------------------------------


def encode_cursor(key: SortKey) -> str:
    """The opaque ``next`` value: the page's last sort key, as URL-safe base64 of JSON."""
    raw = json.dumps(list(key), separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(text: str) -> SortKey:
    """The sort key in a cursor; ValueError for anything ``encode_cursor`` did not make."""
    if len(text) > MAX_CURSOR or not text.isascii():
        raise ValueError(_NOT_OUR_CURSOR)
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        items = json.loads(raw)
    except (binascii.Error, ValueError, RecursionError):
        raise ValueError(_NOT_OUR_CURSOR) from None
    if not isinstance(items, list) or len(items) != 8:
        raise ValueError(_NOT_OUR_CURSOR)
    nums, (guid, port_len, port) = items[:5], items[5:]
    if (
        any(isinstance(n, bool) or not isinstance(n, int | float) for n in nums)
        or not isinstance(guid, str)
        or isinstance(port_len, bool)
        or not isinstance(port_len, int)
        or not isinstance(port, str)
    ):
        raise ValueError(_NOT_OUR_CURSOR)
    a, b, c, d, e = (float(n) for n in nums)
    return (a, b, c, d, e, guid, port_len, port)


# --- one state's ports, encoded once -------------------------------------------------------------


class PortsIndex:
    """One state's ports worst first, with each port's JSON encoded at most once.

    Built and read only in the ``ApiWorker`` thread (one at a time), so the memo needs no lock.
    """

    def __init__(self, state: FabricState, conditions: Iterable[ActiveCondition]) -> None:
        self.state = state
        by_port = _by_port(conditions)
        rows = [(_sort_key(v, by_port.get(v.key, [])), v, by_port.get(v.key, []))
                for v in state.ports.values()]
        rows.sort(key=lambda r: r[0])
        self.keys: list[SortKey] = [r[0] for r in rows]
        self._rows = [(v, a) for _, v, a in rows]
        self._json: list[bytes | None] = [None] * len(rows)
        self._by_condition: dict[str, list[int]] | None = None

    def __len__(self) -> int:
        return len(self._rows)

    def positions(self, condition: str | None) -> Sequence[int]:
        """Row numbers in order, all or those with ``condition`` firing."""
        if not condition:
            return range(len(self._rows))
        if self._by_condition is None:
            groups: dict[str, list[int]] = {}
            for i, (view, _) in enumerate(self._rows):
                for name in view.conditions:
                    groups.setdefault(name, []).append(i)
            self._by_condition = groups
        return self._by_condition.get(condition, [])

    def encoded(self, i: int) -> bytes:
        body = self._json[i]
        if body is None:
            body = self._json[i] = _dumps(port_json(*self._rows[i]))
        return body

    def page(self, condition: str | None, after: SortKey | None, limit: int) -> bytes:
        """The whole response body for one page."""
        rows = self.positions(condition)
        keys = self.keys
        start = 0 if after is None else bisect.bisect_right(rows, after, key=lambda i: keys[i])
        chosen = rows[start : start + limit]
        more = start + len(chosen) < len(rows) and len(chosen) > 0
        cursor = encode_cursor(keys[chosen[-1]]) if more else None
        head = _dumps({"generated": self.state.generated, "count": len(rows), "limit": limit,
                       "next": cursor})
        return b"".join((head[:-1], b',"ports":[', b",".join(self.encoded(i) for i in chosen),
                         b"]}"))


def encode_guid_cursor(guid: str) -> str:
    """The ``next`` of a topology page: the page's last node GUID, opaque."""
    return base64.urlsafe_b64encode(json.dumps([guid]).encode()).decode().rstrip("=")


def decode_guid_cursor(text: str) -> str:
    if len(text) > MAX_CURSOR or not text.isascii():
        raise ValueError(_NOT_OUR_CURSOR)
    try:
        items = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (binascii.Error, ValueError, RecursionError):
        raise ValueError(_NOT_OUR_CURSOR) from None
    if not isinstance(items, list) or len(items) != 1 or not isinstance(items[0], str):
        raise ValueError(_NOT_OUR_CURSOR)
    return items[0]


class TopologyIndex:
    """One state's nodes in GUID order, each node's JSON (its ports and the links it lists)
    encoded at most once; built and read only in the ``ApiWorker`` thread, like PortsIndex."""

    def __init__(self, state: FabricState) -> None:
        self.state = state
        rows = node_rows(state)
        self.keys = [guid for guid, _ in rows]
        self._rows = [node for _, node in rows]
        self._json: list[bytes | None] = [None] * len(rows)
        self.links = sum(len(node["links"]) for node in self._rows)

    def page(self, after: str | None, limit: int) -> bytes:
        start = 0 if after is None else bisect.bisect_right(self.keys, after)
        end = min(start + limit, len(self._rows))
        parts: list[bytes] = []
        for i in range(start, end):
            body = self._json[i]
            if body is None:
                body = self._json[i] = _dumps(self._rows[i])
            parts.append(body)
        more = end < len(self._rows) and end > start
        head = _dumps({"generated": self.state.generated, "count": len(self._rows),
                       "links": self.links, "limit": limit,
                       "next": encode_guid_cursor(self.keys[end - 1]) if more else None})
        return b"".join((head[:-1], b',"nodes":[', b",".join(parts), b"]}"))


class ApiWorker:
    """Runs the API's CPU work one job at a time in a thread, within a share of the clock.

    After a job that took ``t`` seconds of thread CPU, the next one starts no sooner than
    ``t * (1 - share) / share`` later: with ``share`` 0.25 the API may use a quarter of one
    core, whatever the number of clients, and the poll loop (which needs the same GIL) keeps the
    rest. Waiting clients queue on the lock; the listener's connection cap bounds them.
    """

    def __init__(self, share: float = API_SHARE) -> None:
        if not 0 < share <= 1:
            raise ValueError("share must be in (0, 1]")
        self.share = share
        self._lock = asyncio.Lock()
        self._rest_until = 0.0

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    async def run(self, job: Callable[[], T]) -> T:
        async with self._lock:
            if (delay := self._rest_until - time.monotonic()) > 0:
                await asyncio.sleep(delay)
            spent: list[float] = []

            def timed() -> T:
                started = time.thread_time()
                try:
                    return job()
                finally:
                    spent.append(time.thread_time() - started)

            task = asyncio.ensure_future(asyncio.to_thread(timed))
            try:
                return await asyncio.shield(task)
            finally:
                if not task.done():  # the client went away: keep the slot until the thread ends
                    await asyncio.wait({task})
                cpu = spent[0] if spent else 0.0
                self._rest_until = time.monotonic() + cpu * (1 - self.share) / self.share


# --- query parameters ----------------------------------------------------------------------------


def _bad_request(message: str) -> HttpError:
    return HttpError(400, _dumps({"error": message}), content_type=JSON)


def query_count(query: Mapping[str, str], name: str, *, default: int, maximum: int) -> int:
    """A non-negative count from the query, at most ``maximum``; HTTP 400 unless ASCII digits.

    ``str.isdigit`` alone accepts ``²`` (which ``int`` then refuses: a 500) and fullwidth or
    Arabic-Indic digits (which ``int`` accepts): neither is a number a client meant to send.
    """
    raw = query.get(name)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 12:
        raise _bad_request(f"{name} must be a non-negative integer (ASCII digits)")
    return min(int(raw), maximum)


def query_choice(query: Mapping[str, str], name: str, choices: Sequence[str]) -> str | None:
    """``name``'s value if it is one of ``choices``, None if absent or empty; else HTTP 400
    naming the choices (a typo must not answer 200 with nothing, as if nothing were firing)."""
    raw = query.get(name) or None
    if raw is not None and raw not in choices:
        raise _bad_request(f"{name} must be one of {', '.join(choices)}")
    return raw


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False, default=str).encode()


def _json(body: bytes, status: int = 200) -> Response:
    return Response(body, status=status, content_type=JSON)


# --- routes --------------------------------------------------------------------------------------


class _Api:
    """The route handlers and what they keep between requests (one index, event JSON)."""

    def __init__(self, provider: ApiProvider, worker: ApiWorker) -> None:
        self.provider = provider
        self.worker = worker
        self.index: PortsIndex | None = None
        self.topology: TopologyIndex | None = None
        #: One-port answers of the current state and event history, by port.
        self.port_json: dict[PortKey, bytes] = {}
        self._port_basis: tuple[int, int, str | None] = (0, 0, None)
        self.event_json: dict[str, bytes] = {}
        #: ``/api/v1/jobs`` of the latest state asked about, encoded once.
        self.jobs_body: tuple[FabricState, bytes] | None = None
        self._release: asyncio.TimerHandle | None = None

    def _keep_index(self) -> None:
        """(Re)start the countdown after which an unused index is let go."""
        if self._release is not None:
            self._release.cancel()
        self._release = asyncio.get_running_loop().call_later(INDEX_TTL, self._drop_index)

    def _drop_index(self) -> None:
        self._release = None
        if self.worker.busy:  # never pull it from under a running job
            self._keep_index()
        else:
            self.index = None
            self.topology = None
            self.port_json = {}
            self.jobs_body = None

    def _index_for(self, state: FabricState, conditions: list[ActiveCondition]) -> PortsIndex:
        index = self.index
        if index is None or index.state is not state:
            index = self.index = None  # release the old order before building the new one
            index = self.index = PortsIndex(state, conditions)
        return index

    async def ports(self, request: Request) -> Response:
        query = request.query
        limit = query_count(query, "limit", default=DEFAULT_PAGE, maximum=MAX_PAGE)
        condition = query_choice(query, "condition", CONDITIONS)
        after: SortKey | None = None
        if (cursor := query.get("cursor")) is not None:
            try:
                after = decode_cursor(cursor)
            except ValueError as exc:
                raise _bad_request(str(exc)) from None
        state = self.provider.state()
        conditions = list(state.conditions)

        def build() -> bytes:
            return self._index_for(state, conditions).page(condition, after, limit)

        body = await self.worker.run(build)
        self._keep_index()
        return _json(body)

    async def port(self, request: Request) -> Response:
        """One port with both ends of its link, its conditions, breakdown and recent events;
        encoded once per state (and event history) however many clients ask."""
        try:
            guid = normalize_guid(request.match_info["guid"])
        except ValueError:
            raise _bad_request("guid must be a node GUID (0x + up to 16 hex digits)") from None
        number = request.match_info["port"]
        if not (number.isascii() and number.isdigit()) or len(number) > 3:
            raise _bad_request("port must be a port number (ASCII digits)")
        key = (guid, str(int(number)))
        state = self.provider.state()
        if key not in state.ports:
            raise HttpError(404, _dumps({"error": f"no port {guid}/{key[1]}"}),
                            content_type=JSON)
        events = self.provider.events()
        last = events[-1].id if events else None
        basis = (id(state), len(events), last)
        if basis != self._port_basis:
            self._port_basis, self.port_json = basis, {}
        body = self.port_json.get(key)
        if body is None:
            conditions = list(state.conditions)
            history = list(events)

            def build() -> bytes:
                found = port_detail_json(state, key, conditions, history)
                if found is not None:
                    links = self._link_jobs(state, key)
                    found["jobs"] = link_jobs_json(state, links, PORT_JOBS)
                return _dumps(found)

            body = await self.worker.run(build)
            if self._port_basis == basis:
                self.port_json[key] = body
            self._keep_index()
        return _json(body)

    @staticmethod
    def _link_jobs(state: FabricState, key: PortKey) -> list[JobLink]:
        """The jobs on ``key``'s link (both ends), one entry per job."""
        link = state.ports[key].link
        ends = [key] if link is None or not link.remote_guid else [
            key, (link.remote_guid, link.remote_port)]
        return state.jobs.on_link(ends)

    async def jobs(self, request: Request) -> Response:
        """``/api/v1/jobs``: the running jobs of the latest state, encoded once per state."""
        state = self.provider.state()
        kept = self.jobs_body
        if kept is not None and kept[0] is state:
            return _json(kept[1])

        def build() -> bytes:
            return _dumps(jobs_json(state))

        body = await self.worker.run(build)
        self.jobs_body = (state, body)
        self._keep_index()
        return _json(body)

    async def job(self, request: Request) -> Response:
        """``/api/v1/jobs/{id}``: one running job; 404 when it is not running, 503 while the
        scheduler could not be asked (the job may well run)."""
        job_id = request.match_info["id"]
        if len(job_id) > MAX_JOB_ID or not job_id.isprintable():
            raise _bad_request(f"id must be a job id (at most {MAX_JOB_ID} printable characters)")
        state = self.provider.state()
        table = state.jobs.table
        if not table.known:
            reason = table.error or "no job source configured, or not asked yet"
            raise HttpError(503, _dumps({"error": f"jobs are unknown: {reason}"}),
                            content_type=JSON)
        if job_id not in table.jobs:
            raise HttpError(404, _dumps({"error": f"no running job {job_id}"}),
                            content_type=JSON)

        def build() -> bytes:
            return _dumps(job_detail_json(state, job_id))

        return _json(await self.worker.run(build))

    async def topology_page(self, request: Request) -> Response:
        """``/api/v1/topology``: nodes in GUID order with their ports and links, a bounded page
        at a time (``limit``, ``cursor``), each node's JSON encoded once per state."""
        query = request.query
        limit = query_count(query, "limit", default=DEFAULT_PAGE, maximum=MAX_PAGE)
        after: str | None = None
        if (cursor := query.get("cursor")) is not None:
            try:
                after = decode_guid_cursor(cursor)
            except ValueError as exc:
                raise _bad_request(str(exc)) from None
        state = self.provider.state()

        def build() -> bytes:
            index = self.topology
            if index is None or index.state is not state:
                self.topology = None
                index = self.topology = TopologyIndex(state)
            return index.page(after, limit)

        body = await self.worker.run(build)
        self._keep_index()
        return _json(body)

    async def events(self, request: Request) -> Response:
        limit = query_count(request.query, "limit", default=MAX_EVENTS, maximum=MAX_EVENTS)
        kind = query_choice(request.query, "type", EVENT_TYPES)
        since = request.query.get("since")
        if since and _EVENT_ID.fullmatch(since) is None:
            raise _bad_request(
                "since must be an event id (32 hex digits: the id of an event this API gave)")
        items = list(self.provider.events())
        if since:
            ids = [e.id for e in items]
            items = items[ids.index(since) + 1:] if since in ids else items
        if kind:
            items = [e for e in items if e.type == kind]
        items = items[-limit:] if limit else []
        memo = self.event_json
        if len(memo) > 2 * max(MAX_EVENTS, len(self.provider.events())):
            keep = {e.id for e in self.provider.events()}
            self.event_json = memo = {k: v for k, v in memo.items() if k in keep}
        missing = [e for e in items if e.id not in memo]
        if missing:
            def encode() -> None:
                for e in missing:
                    memo[e.id] = e.model_dump_json().encode()

            await self.worker.run(encode)
        return _json(b'{"events":[' + b",".join(memo[e.id] for e in items) + b"]}")

    async def healthz(self, request: Request) -> Response:
        return _json(b'{"ok":true}')

    async def readyz(self, request: Request) -> Response:
        state = self.provider.state()
        up = sorted(name for name, s in state.sources.items() if s.up)
        ok = self.provider.ready() and bool(up)
        if request.anonymous:
            body = _dumps({"ready": ok})
        else:
            down = {name: s.last_error for name, s in state.sources.items() if not s.up}
            body = _dumps({"ready": ok, "sources_up": up, "sources_down": down})
        return _json(body, status=200 if ok else 503)


def api_routes(provider: ApiProvider, *, worker: ApiWorker | None = None) -> list[Route]:
    """The routes, for ``PrometheusExporter.add_routes``."""
    api = _Api(provider, worker or ApiWorker())
    return [
        Route("/api/v1/ports", api.ports),
        Route("/api/v1/ports/{guid}/{port}", api.port),
        Route("/api/v1/topology", api.topology_page),
        Route("/api/v1/events", api.events),
        Route("/api/v1/jobs", api.jobs),
        Route("/api/v1/jobs/{id}", api.job),
        Route("/healthz", api.healthz),
        Route("/readyz", api.readyz),
    ]
