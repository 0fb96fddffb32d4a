"""MQTT publisher: events, retained port state and availability, over aiomqtt.

Automation (ticketing, schedulers that drain nodes, chat bots) wants events pushed. The contract
(README, "MQTT (optional)"):

- ``{prefix}/{fabric}/status``: retained ``online`` while connected; the broker publishes the
  retained Last Will ``offline`` if ibmon dies, and ibmon publishes it itself on a clean stop.
- ``{prefix}/{fabric}/events/{type}``: one JSON event per message, QoS from config (default 1).
- ``{prefix}/{fabric}/ports/{guid}/{port}``: retained current state of a port, published only
  when it changes and cleared (empty retained message) when the port disappears.

Topic levels are built from validated values only: the prefix and fabric are checked by the
config, the GUID against ``GUID_RE``, the port as 1-3 digits and the event type against a fixed
set. Node descriptions are user-controlled text; they travel in payloads, never in topics.

The broker is never on the polling path: ``submit`` and ``publish_state`` are O(1) and never
block or raise. A background task owns the connection, reconnects with jittered exponential
backoff and keeps events in a bounded queue while the broker is away (oldest dropped first),
delivering them in order after reconnect. An event leaves the queue only once the broker
acknowledged it, so delivery is at least once. aiomqtt is imported only in this module.

Lost events: ``ibmon_events_dropped_total{consumer="mqtt"}`` is the one number that says how
many events MQTT lost, for any reason (the bus queue was full, the publisher's queue overflowed
while the broker was away, events still queued at stop). ``ibmon_mqtt_dropped_total`` is the part
of it lost inside the publisher, waiting for the broker.

Stopping is bounded (``stop``): a session gets ``flush_timeout`` to deliver what is queued and
``OFFLINE_GRACE`` to say ``offline``; a connection attempt that has not been answered is
abandoned at once, and a TLS handshake blocked in paho's connect thread is interrupted, so
SIGTERM stays within the daemon's 2 s even when the broker accepts TCP and never answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import socket
import ssl
import time
import weakref
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import aiomqtt
import structlog

from ibmon.config import MqttConfig, MqttTlsConfig
from ibmon.detect.events import EVENT_TYPES, Event, Subscription
from ibmon.infiniband.model import GUID_RE, PortKey, PortView, state_json
from ibmon.runtime.selfmetrics import MqttMetrics, SelfMetrics
from ibmon.state import FabricState

__all__ = [
    "MqttPublisher",
    "Topics",
    "describe_connect_error",
    "port_state_payload",
    "tls_context",
]

log = structlog.get_logger("ibmon.mqtt")

#: Event types that may become a topic level are ``ibmon.detect.events.EVENT_TYPES``; anything else
#: goes to ``events/other``, so an unexpected type can never inject topic syntax.
OTHER_EVENT_TYPE = "other"

_PORT_RE = re.compile(r"^[0-9]{1,3}$")
_PREFIX_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}(/[a-zA-Z0-9_-]{1,64}){0,3}$")
_FABRIC_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")

#: Publishes awaited together; paho keeps them in order on the one connection.
BATCH = 100
#: Messages serialized or handed to paho between yields to the event loop, and ports diffed
#: between yields: each step stays around a millisecond, so a burst never stalls polling.
SLICE = 20
#: At stop: how long a connected session may keep delivering queued events (default).
FLUSH_TIMEOUT = 1.0
#: Seconds a broker has to answer CONNECT (TCP, TLS and CONNACK). aiomqtt's own timeout is
#: the session's (1.5 keepalives, 45 s by default), too long to say nothing about a broker
#: that accepts connections and never answers.
CONNECT_TIMEOUT = 10.0
#: Then: how long publishing the retained "offline" may take before we disconnect anyway.
OFFLINE_GRACE = 0.3
#: Then: how long a cancelled connection task gets to end.
CANCEL_GRACE = 0.3
STATE_CHUNK = 200


class TlsFileError(ValueError):
    """A TLS file named in ``[mqtt.tls]`` cannot be used; the message names the key and file."""


class _ClosingSSLSocket(ssl.SSLSocket):
    """Closes itself when its handshake fails.

    paho drops the socket of a failed handshake (a refused certificate, a reset, or a
    handshake that outlasts the connect timeout on a loaded host) without closing it: the
    descriptor stayed open until the garbage collector found the socket, which then warned
    (``ResourceWarning: unclosed <ssl.SSLSocket ...>``) wherever the process was at the time.
    """

    def do_handshake(self, block: bool = False) -> None:
        try:
            super().do_handshake(block)
        except BaseException:
            with contextlib.suppress(OSError):
                self.close()
            raise


class _TlsContext(ssl.SSLContext):
    """A client context that remembers the sockets it wraps.

    paho connects and does the TLS handshake in a worker thread that cannot be cancelled; a
    broker that accepts TCP and never answers the handshake holds that thread (and so the
    process's exit) for paho's whole connect timeout. ``interrupt`` shuts those sockets down,
    which ends the blocked handshake at once.
    """

    sslsocket_class = _ClosingSSLSocket

    def __init__(self, protocol: int) -> None:
        super().__init__()
        self.handshakes: weakref.WeakSet[ssl.SSLSocket] = weakref.WeakSet()
        self.wrapped = 0  # sockets handed to TLS: the TCP connection was up

    def wrap_socket(self, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
        sock = super().wrap_socket(*args, **kwargs)
        self.handshakes.add(sock)
        self.wrapped += 1
        return sock

    def interrupt(self) -> None:
        for sock in list(self.handshakes):
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)

    def close(self) -> None:
        """Close what paho left open: it drops the socket of a failed handshake unclosed."""
        for sock in list(self.handshakes):
            with contextlib.suppress(OSError):
                sock.close()


def _load(what: str, path: Any, load: Any) -> None:
    try:
        load()
    except ssl.SSLError as exc:  # before OSError: it is one, and strerror is not set
        raise TlsFileError(f"mqtt.tls.{what} {path}: not usable: {exc}") from None
    except OSError as exc:
        raise TlsFileError(f"mqtt.tls.{what} {path}: {exc.strerror or exc}") from None


def tls_context(tls: MqttTlsConfig | None) -> _TlsContext | None:
    """The client context for ``[mqtt.tls]``; TlsFileError names the file that is wrong."""
    if tls is None:
        return None
    ctx = _TlsContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the chain and the host name
    if tls.ca_file is not None:
        _load("ca_file", tls.ca_file, lambda: ctx.load_verify_locations(cafile=str(tls.ca_file)))
    else:
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if tls.cert_file is not None:
        what = "cert_file" if tls.key_file is None else "cert_file/key_file"
        files = tls.cert_file if tls.key_file is None else f"{tls.cert_file} + {tls.key_file}"
        _load(what, files, lambda: ctx.load_cert_chain(
            str(tls.cert_file), str(tls.key_file) if tls.key_file is not None else None))
    if not tls.verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


_NOT_TLS = ("reset by peer", "eof occurred", "unexpected eof", "wrong version number",
            "record layer failure", "packet length too long", "http request")


def describe_connect_error(exc: BaseException, *, tls: bool, host: str, port: int,
                           handshake_started: bool = False) -> str:
    """One line saying what went wrong with a connection attempt, and where to look.

    aiomqtt turns paho's socket and TLS errors into ``MqttError(str(exc))``, which leaves
    "[Errno 104] Connection reset by peer" for a TLS client talking to a plain MQTT port; the
    original error is still its ``__context__``.
    """
    original = exc.__context__ if exc.__context__ is not None else exc
    text = str(exc) or type(exc).__name__
    if isinstance(exc, TlsFileError) or not tls:
        return text
    low = f"{text} {original}".lower()
    if "certificate verify failed" in low or isinstance(original, ssl.SSLCertVerificationError):
        return (f"TLS: the broker at {host}:{port} presented a certificate that does not verify"
                f" ({original}); check mqtt.tls.ca_file and the broker's host name")
    in_tls = handshake_started or isinstance(original, ssl.SSLError)
    if in_tls and any(marker in low for marker in _NOT_TLS):
        return (f"TLS handshake with {host}:{port} failed ({text}): the broker's port does not"
                " seem to speak TLS (a plain MQTT listener? use its TLS port, or drop"
                " [mqtt.tls])")
    if in_tls:
        return f"TLS handshake with {host}:{port} failed: {text}"
    return text


class Topics:
    """Topic names for one prefix and fabric; every level is validated here or in the config."""

    __slots__ = ("base",)

    def __init__(self, prefix: str, fabric: str) -> None:
        if not _PREFIX_RE.fullmatch(prefix):
            raise ValueError(f"invalid MQTT prefix {prefix!r}")
        if not _FABRIC_RE.fullmatch(fabric):
            raise ValueError(f"invalid fabric name {fabric!r}")
        self.base = f"{prefix}/{fabric}"

    @property
    def status(self) -> str:
        return f"{self.base}/status"

    def event(self, event_type: str) -> str:
        kind = str(event_type)
        return f"{self.base}/events/{kind if kind in EVENT_TYPES else OTHER_EVENT_TYPE}"

    def port(self, key: PortKey) -> str | None:
        """``None`` for a key that is not a clean GUID and port number: no topic, no publish."""
        guid, port = key
        if not GUID_RE.fullmatch(guid) or not _PORT_RE.fullmatch(port):
            return None
        return f"{self.base}/ports/{guid}/{port}"


def _signature(view: PortView) -> tuple[Any, ...]:
    """Everything the retained state shows; rates and totals are left out on purpose, so a
    busy port does not republish every poll and the retained message changes only on news."""
    ident = view.identity
    link = view.link
    return (
        ident.node_desc, ident.device, ident.node_type, ident.lid, ident.link_layer,
        ident.source, view.state, view.phys_state, view.rate_bytes_per_second,
        view.active_width, view.active_speed,
        None if link is None else (link.remote_guid, link.remote_port, link.remote_node_desc),
        view.conditions,
    )


def port_state_payload(view: PortView, *, fabric: str, changed: float) -> bytes:
    """The retained JSON for one port (compact, NULs and non-ASCII escaped by json)."""
    ident = view.identity
    link = view.link
    doc = {
        "fabric": fabric,
        "guid": ident.guid,
        "port": ident.port,
        "node_desc": ident.node_desc,
        "device": ident.device,
        "node_type": ident.node_type,
        "lid": ident.lid,
        "link_layer": ident.link_layer,
        "source": ident.source,
        **state_json(view.state, view.phys_state),
        "rate_bytes_per_second": view.rate_bytes_per_second,
        "active_width": view.active_width,
        "active_speed": view.active_speed,
        "peer": None if link is None else {
            "guid": link.remote_guid,
            "port": link.remote_port,
            "node_desc": link.remote_node_desc,
        },
        "conditions": sorted(view.conditions),
        "changed": datetime.fromtimestamp(changed, UTC).isoformat().replace("+00:00", "Z"),
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def _has_socket(client: aiomqtt.Client) -> bool:
    """Whether paho holds a connected socket (the broker accepted TCP, and TLS if any)."""
    paho = getattr(client, "_client", None)
    sock = getattr(paho, "_sock", None)
    return sock is not None


def _close_socket(client: aiomqtt.Client) -> None:
    """Close the socket a failed connection attempt leaves behind.

    An attempt ended by ``CONNECT_TIMEOUT`` (a broker, or another service, that accepts TCP
    and never answers CONNECT) leaves paho's socket open; with a retry every few seconds that
    leaks one descriptor per attempt until the garbage collector runs. paho's ``_sock_close`` also
    unregisters the socket from the event loop through aiomqtt's callbacks, so no stale reader
    stays behind on a reused descriptor.
    """
    paho = getattr(client, "_client", None)
    close = getattr(paho, "_sock_close", None)
    if callable(close):
        with contextlib.suppress(Exception):
            close()


class MqttPublisher:
    """Owns one broker connection for the daemon's lifetime (across config reloads).

    Both an ``exporters.base.Exporter`` (retained port state) and an ``EventConsumer`` (events).
    """

    def __init__(
        self,
        config: MqttConfig,
        *,
        fabric: str,
        metrics: SelfMetrics,
        backoff_min: float = 0.5,
        backoff_max: float = 30.0,
        flush_timeout: float = FLUSH_TIMEOUT,
    ) -> None:
        self.name = "mqtt"
        self.config = config
        self.fabric = fabric
        self.topics = Topics(config.prefix, fabric)
        self._metrics: MqttMetrics = metrics.enable_mqtt()
        self._backoff_min = backoff_min
        self._backoff_max = backoff_max
        self._flush_timeout = flush_timeout
        self._queue: deque[Event] = deque()
        self._wake = asyncio.Event()
        self._stopping = False
        self._connected = False
        self._task: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._pump_task: asyncio.Task[None] | None = None
        self._feed: Subscription | None = None  # where lost events are reported
        self._tls: _TlsContext | None = None
        self._state: FabricState | None = None
        self._state_dirty = False
        # What the broker holds per port topic: a signature, or None when it must be resent.
        self._sent: dict[PortKey, tuple[Any, ...] | None] = {}
        self._bad_keys: set[PortKey] = set()
        self._metrics.connected.set(0)

    # -- public API (called from the poll loop / event bus: O(1), never raises) --------------

    @property
    def connected(self) -> bool:
        return self._connected

    @property
    def queued(self) -> int:
        """Events waiting for the broker."""
        return len(self._queue)

    def submit(self, event: Event) -> None:
        """Queue one event; when the queue is full the oldest event is dropped and counted."""
        if len(self._queue) >= self.config.queue_size:
            self._queue.popleft()
            self._lost(1)
        self._queue.append(event)
        self._wake.set()

    def _lost(self, count: int) -> None:
        """Count events that will never reach the broker, in both series (module docstring)."""
        if count <= 0:
            return
        self._metrics.dropped.inc(count)
        if self._feed is not None:
            self._feed.lost(count)

    def submit_many(self, events: Iterable[Event]) -> None:
        for event in events:
            self.submit(event)

    async def consume(self, events: Subscription) -> None:
        """``exporters.base.EventConsumer``: move events from a bus subscription to the send
        queue, until cancelled (never waits for the broker)."""
        self._feed = events
        while True:
            first = await events.queue.get()
            self.submit_many([first, *events.drain(BATCH * 10)])

    def publish_state(self, state: FabricState) -> None:
        """Remember the newest fabric state; the sender diffs it against what it published."""
        self._state = state
        self._state_dirty = True
        self._wake.set()

    async def publish(self, state: FabricState) -> None:
        """``exporters.base.Exporter``: ``publish_state`` (O(1); the sender does the work)."""
        self.publish_state(state)

    async def start(self, tg: asyncio.TaskGroup | None = None) -> None:
        """Start the connection task (in ``tg``, the daemon's TaskGroup, when given); a broker
        that is down is retried, never an error here."""
        if self._task is None:
            if tg is not None:
                self._task = tg.create_task(self._run(), name="mqtt")
            else:
                self._task = asyncio.create_task(self._run(), name="mqtt")

    async def stop(self) -> None:
        """Flush what fits in ``flush_timeout``, publish ``offline`` and disconnect.

        Bounded: ``flush_timeout + OFFLINE_GRACE + CANCEL_GRACE`` at most, and at once when no
        session is up (connecting, or waiting to retry): there is nobody to flush to. Events
        still queued are counted as lost.
        """
        task, self._task = self._task, None
        self._stopping = True
        self._wake.set()
        if task is not None:
            if self._connected:
                done, _ = await asyncio.wait({task}, timeout=self._flush_timeout)
                if not done and self._pump_task is not None:
                    # Give up flushing but still say "offline" ourselves: a cancelled session
                    # would send DISCONNECT, which discards the Last Will and leaves "online".
                    self._pump_task.cancel()
                    await asyncio.wait({task}, timeout=OFFLINE_GRACE + CANCEL_GRACE)
            if not task.done():
                if self._tls is not None:
                    self._tls.interrupt()  # a handshake blocked in paho's thread ends now
                task.cancel()
                await asyncio.wait({task}, timeout=CANCEL_GRACE)
        if self._queue:
            log.warning("mqtt_events_dropped_at_shutdown", count=len(self._queue))
            self._lost(len(self._queue))
            self._queue.clear()
        self._set_connected(False)

    # -- connection management ---------------------------------------------------------------

    def _set_connected(self, value: bool) -> None:
        self._connected = value
        self._metrics.connected.set(1 if value else 0)

    def _client(self) -> aiomqtt.Client:
        cfg = self.config
        password: str | None = None
        if cfg.password_file is not None:
            # Read at every connect so a rotated secret is picked up; never logged.
            try:
                password = cfg.password_file.read_text(encoding="utf-8").rstrip("\r\n")
            except (OSError, UnicodeDecodeError) as exc:
                reason = getattr(exc, "strerror", None) or str(exc)
                raise TlsFileError(
                    f"mqtt.password_file {cfg.password_file}: cannot read it: {reason}"
                ) from None
        # Read at every connect too (renewed certificates); a bad file is named in the error.
        self._tls = tls_context(cfg.tls)
        client = aiomqtt.Client(
            cfg.host,
            cfg.port,
            username=cfg.username,
            password=password,
            identifier=cfg.client_id,
            will=aiomqtt.Will(self.topics.status, b"offline", qos=1, retain=True),
            clean_session=True,
            keepalive=max(1, round(cfg.keepalive)),
            tls_context=self._tls,
            max_inflight_messages=BATCH,
            timeout=max(10.0, cfg.keepalive * 1.5),
        )
        # aiomqtt warns on every publish beyond 10 in flight; we pipeline BATCH on purpose.
        client.pending_calls_threshold = BATCH * 2 + 10
        return client

    async def _run(self) -> None:
        """Connect, publish, reconnect; returns only when stopping. Never raises."""
        attempt = 0
        while not self._stopping:
            client: aiomqtt.Client | None = None
            try:
                client = self._client()
                async with contextlib.AsyncExitStack() as stack:
                    try:
                        async with asyncio.timeout(CONNECT_TIMEOUT):
                            await stack.enter_async_context(client)
                    except TimeoutError:
                        where = f"the broker at {self.config.host}:{self.config.port}"
                        raise aiomqtt.MqttError(
                            f"{where} accepted the connection but did not answer CONNECT"
                            f" within {CONNECT_TIMEOUT:g}s" if _has_socket(client) else
                            f"{where} did not accept a connection within"
                            f" {CONNECT_TIMEOUT:g}s") from None
                    attempt = 0
                    self._set_connected(True)
                    log.info("mqtt_connected", host=self.config.host, port=self.config.port)
                    await self._session(client)
                    return  # _session returns only after a graceful stop
            except (aiomqtt.MqttError, OSError, ssl.SSLError, ValueError) as exc:
                tls = self._tls
                error = describe_connect_error(
                    exc, tls=self.config.tls is not None, host=self.config.host,
                    port=self.config.port,
                    handshake_started=tls is not None and tls.wrapped > 0,
                )
            except Exception as exc:  # a publisher bug must not take the daemon down
                error = f"{type(exc).__name__}: {exc}"
                log.exception("mqtt_unexpected_error", error=error)
            finally:
                was_connected = self._connected
                self._set_connected(False)
                if client is not None:
                    _close_socket(client)
                if self._tls is not None:
                    self._tls.close()
                self._tls = None
            if self._stopping:
                return
            delay = min(self._backoff_max, self._backoff_min * 2**attempt)
            delay *= 0.5 + random.random() / 2  # noqa: S311 - jitter, not cryptography
            attempt = min(attempt + 1, 32)
            log.warning(
                "mqtt_disconnected" if was_connected else "mqtt_connect_failed",
                host=self.config.host, port=self.config.port, error=error,
                retry_in=round(delay, 2),
            )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wait_stopping()

    async def _wait_stopping(self) -> None:
        while not self._stopping:
            self._wake.clear()
            await self._wake.wait()

    async def _session(self, client: aiomqtt.Client) -> None:
        watcher = asyncio.create_task(self._watch(client), name="mqtt-watch")
        self._watcher = watcher
        try:
            await self._publish(client, [(self.topics.status, b"online", 1, True)])
            # The broker may have restarted without persistence: resend every port's state,
            # and clear ports we published that are gone now.
            for key in self._sent:
                self._sent[key] = None
            self._state_dirty = self._state is not None or bool(self._sent)
            pump = asyncio.create_task(self._pump(client, watcher), name="mqtt-pump")
            self._pump_task = pump
            try:
                await asyncio.wait({pump})  # does not raise when stop() cancels the pump
            finally:
                self._pump_task = None
                pump.cancel()
            if not pump.cancelled() and (exc := pump.exception()) is not None:
                raise exc
            await self._shutdown(client)
        finally:
            self._watcher = None
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
                await watcher

    @staticmethod
    async def _watch(client: aiomqtt.Client) -> None:
        """Raise MqttError when the connection drops (we never subscribe, so no messages)."""
        async for _ in client.messages:
            pass
        raise aiomqtt.MqttError("connection closed")

    async def _pump(self, client: aiomqtt.Client, watcher: asyncio.Task[None]) -> None:
        while True:
            if watcher.done():
                watcher.result()  # raises the disconnect
            if self._queue:
                await self._send_events(client)
            elif self._state_dirty:
                await self._send_state(client)
            elif self._stopping:
                return
            else:
                self._wake.clear()
                waiter = asyncio.create_task(self._wake.wait())
                try:
                    await asyncio.wait({waiter, watcher}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiter.cancel()

    async def _shutdown(self, client: aiomqtt.Client) -> None:
        with contextlib.suppress(aiomqtt.MqttError, TimeoutError):
            async with asyncio.timeout(OFFLINE_GRACE):
                await self._publish(client, [(self.topics.status, b"offline", 1, True)])

    async def _publish(
        self, client: aiomqtt.Client, messages: Sequence[tuple[str, bytes, int, bool]]
    ) -> int:
        """Publish in order; return how many leading messages the broker accepted.

        aiomqtt leaves a QoS 1 publish waiting for its PUBACK until its timeout even after the
        connection dropped, so the wait also ends when the disconnect watcher fires. Raises the
        first error after counting, so the caller requeues the rest.
        """
        tasks: list[asyncio.Task[None]] = []
        for t, p, q, r in messages:
            if len(tasks) % SLICE == SLICE - 1:
                await asyncio.sleep(0)  # earlier tasks send first: order is kept
            tasks.append(asyncio.create_task(client.publish(t, p, qos=q, retain=r)))
        watcher = self._watcher
        try:
            everything = asyncio.gather(*tasks, return_exceptions=True)
            waits: set[asyncio.Future[Any]] = {everything}
            if watcher is not None:
                waits.add(watcher)
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
        ok = 0
        for task in tasks:
            if not task.done() or task.cancelled() or task.exception() is not None:
                break
            ok += 1
        if ok:
            self._metrics.published.inc(ok)
        if ok < len(tasks):
            for task in tasks[ok:]:
                if task.done() and not task.cancelled() and (exc := task.exception()):
                    raise exc
            if watcher is not None and watcher.done():
                watcher.result()
            raise aiomqtt.MqttError("publish interrupted")
        return ok

    async def _send_events(self, client: aiomqtt.Client) -> None:
        batch = [self._queue.popleft() for _ in range(min(BATCH, len(self._queue)))]
        qos = self.config.qos
        ok = 0
        try:
            messages = []
            for i, e in enumerate(batch):
                if i % SLICE == SLICE - 1:
                    await asyncio.sleep(0)
                payload = e.model_dump_json().encode()
                messages.append((self.topics.event(e.type), payload, qos, False))
            ok = await self._publish(client, messages)
        finally:
            if ok < len(batch):  # not acknowledged: back to the front, in order
                self._queue.extendleft(reversed(batch[ok:]))
                overflow = len(self._queue) - self.config.queue_size
                for _ in range(max(0, overflow)):
                    self._queue.popleft()
                self._lost(overflow)

    async def _send_state(self, client: aiomqtt.Client) -> None:
        self._state_dirty = False
        state = self._state
        ports: Mapping[PortKey, PortView] = state.ports if state is not None else {}
        now = time.time()
        pending: list[tuple[PortKey, tuple[Any, ...] | None, tuple[str, bytes, int, bool]]] = []
        work = 0
        for key, view in ports.items():
            if work >= STATE_CHUNK:
                work = 0
                await asyncio.sleep(0)
            work += 1
            sig = _signature(view)
            if key in self._sent and self._sent[key] == sig:
                continue
            work += STATE_CHUNK // SLICE  # serializing costs about ten comparisons
            topic = self.topics.port(key)
            if topic is None:
                if key not in self._bad_keys:
                    self._bad_keys.add(key)
                    log.warning("mqtt_port_skipped", reason="key is not a GUID and port number")
                continue
            payload = port_state_payload(view, fabric=self.fabric, changed=now)
            pending.append((key, sig, (topic, payload, self.config.qos, True)))
        for key in [k for k in self._sent if k not in ports]:
            topic = self.topics.port(key)
            if topic is not None:
                pending.append((key, None, (topic, b"", self.config.qos, True)))
        for start in range(0, len(pending), BATCH):
            chunk = pending[start : start + BATCH]
            ok = 0
            try:
                ok = await self._publish(client, [m for _, _, m in chunk])
            finally:
                for key, new_sig, _ in chunk[:ok]:
                    if new_sig is None:
                        self._sent.pop(key, None)
                    else:
                        self._sent[key] = new_sig
                if ok < len(chunk):
                    self._state_dirty = True
