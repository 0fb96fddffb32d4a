"""A broker that accepts TCP and never answers CONNECT is named within the connect timeout,
and each attempt it lets time out gives its socket back.

Before, nothing was logged for 45 s (aiomqtt's session timeout, 1.5 keepalives), then
"Operation timed out". Now the publisher gives the broker ``CONNECT_TIMEOUT`` to answer, says
which broker accepted the connection and stayed silent, and retries as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

import exporters.mqtt
from exporters.mqtt import MqttPublisher
from ibmon.config import MqttConfig
from ibmon.runtime.selfmetrics import SelfMetrics


@pytest.fixture
def silent_broker() -> Iterator[int]:
    """A TCP port that accepts connections and never says a word."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield int(listener.getsockname()[1])


async def test_a_broker_that_never_answers_connect_is_named_within_the_timeout(
        silent_broker: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exporters.mqtt, "CONNECT_TIMEOUT", 1.0)
    pub = MqttPublisher(MqttConfig(port=silent_broker), fabric="main", metrics=SelfMetrics(),
                        backoff_min=0.05, backoff_max=0.2)
    started = time.monotonic()
    with capture_logs() as logs:
        await pub.start()
        try:
            while not any(e["event"] == "mqtt_connect_failed" for e in logs):
                assert time.monotonic() - started < 10, logs
                await asyncio.sleep(0.05)
            while sum(e["event"] == "mqtt_connect_failed" for e in logs) < 2:  # it retries
                assert time.monotonic() - started < 10, logs
                await asyncio.sleep(0.05)
        finally:
            await pub.stop()
    failed = next(e for e in logs if e["event"] == "mqtt_connect_failed")
    assert f"127.0.0.1:{silent_broker} accepted the connection but did not answer CONNECT" \
        in failed["error"]
    assert time.monotonic() - started < 10


def _sockets() -> int:
    """Sockets this process holds open."""
    fds = Path("/proc/self/fd")
    count = 0
    for fd in fds.iterdir():
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
            count += os.readlink(fd).startswith("socket:")
    return count


async def test_each_timed_out_attempt_gives_its_socket_back(
        silent_broker: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Retried for as long as the broker stays silent (days, if nobody looks): an attempt that
    times out must close its socket, or the daemon runs out of descriptors."""
    monkeypatch.setattr(exporters.mqtt, "CONNECT_TIMEOUT", 0.2)
    pub = MqttPublisher(MqttConfig(port=silent_broker), fabric="main", metrics=SelfMetrics(),
                        backoff_min=0.05, backoff_max=0.1)
    gc.disable()  # the collector must not close a leaked socket for us meanwhile
    try:
        before = _sockets()
        with capture_logs() as logs:
            await pub.start()
            started = time.monotonic()
            while sum(e["event"] == "mqtt_connect_failed" for e in logs) < 6:
                assert time.monotonic() - started < 20, logs
                await asyncio.sleep(0.05)
            assert _sockets() - before <= 1  # at most the attempt under way
    finally:
        gc.enable()
        await pub.stop()
