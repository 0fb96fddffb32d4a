"""A real Mosquitto for tests and benchmarks: loopback only, free port, generated config.

The broker can be stopped and started again on the same port with its persistence file, so a
test can take the broker away and bring it back like an operator restarting it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiomqtt

__all__ = ["Collector", "Mosquitto", "TlsFiles", "free_port", "make_tls", "write_passwd"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def make_tls(directory: Path) -> TlsFiles:
    """A throwaway CA plus a server cert for 127.0.0.1 and a client cert, with the openssl CLI."""
    d = directory
    d.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=ibmon test CA", cwd=d)
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, cn in (("server", "127.0.0.1"), ("client", "ibmon")):
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={cn}", cwd=d)
        extra = ["-extfile", "server.ext"] if name == "server" else []
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", *extra, cwd=d)
    return TlsFiles(d / "ca.crt", d / "server.crt", d / "server.key",
                    d / "client.crt", d / "client.key")


def write_passwd(path: Path, user: str, password: str) -> Path:
    """A Mosquitto password file made by ``mosquitto_passwd`` (argv, no shell)."""
    path.write_text("")
    subprocess.run(["mosquitto_passwd", "-b", str(path), user, password],
                   check=True, capture_output=True, timeout=30)
    return path


@dataclass
class Mosquitto:
    """One broker process; ``start``/``stop`` may be repeated, the port stays the same."""

    binary: str
    workdir: Path
    port: int = field(default_factory=free_port)
    tls: TlsFiles | None = None
    passwd: Path | None = None
    persistence: bool = False
    extra: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.workdir / "mosquitto.log"

    def _config(self) -> Path:
        lines = [f"listener {self.port} 127.0.0.1"]
        if self.tls is not None:
            lines += [
                f"cafile {self.tls.ca}",
                f"certfile {self.tls.server_cert}",
                f"keyfile {self.tls.server_key}",
                "require_certificate true",
            ]
        if self.passwd is not None:
            lines += ["allow_anonymous false", f"password_file {self.passwd}"]
        else:
            lines.append("allow_anonymous true")
        if self.persistence:
            lines += ["persistence true", f"persistence_location {self.workdir}/"]
        else:
            lines.append("persistence false")
        if os.geteuid() == 0:
            lines.append("user root")  # otherwise it drops to "mosquitto" and cannot read tmp
        lines += self.extra
        path = self.workdir / "mosquitto.conf"
        path.write_text("\n".join(lines) + "\n")
        return path

    def start(self, timeout: float = 10.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        conf = self._config()
        log = self.log_path.open("ab")
        try:
            self.proc = subprocess.Popen(
                [self.binary, "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mosquitto exited: {self.log_path.read_text()[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(
                ("127.0.0.1", self.port), timeout=0.2
            ):
                return
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"mosquitto did not listen on {self.port}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


@dataclass
class Collector:
    """An aiomqtt subscriber that records (topic, payload, retain) in arrival order."""

    port: int
    topic: str
    identifier: str | None = None
    clean_session: bool = True
    client_kwargs: dict[str, object] = field(default_factory=dict)
    messages: list[tuple[str, bytes, bool]] = field(default_factory=list)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Collector]:
        subscribed = asyncio.Event()
        task = asyncio.create_task(self._run(subscribed))
        try:
            waiter = asyncio.create_task(subscribed.wait())
            await asyncio.wait({task, waiter}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if task.done():
                task.result()
            assert subscribed.is_set(), "subscriber did not connect"
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
                await task

    async def _run(self, subscribed: asyncio.Event) -> None:
        async with aiomqtt.Client(
            "127.0.0.1", self.port, identifier=self.identifier,
            clean_session=self.clean_session, **self.client_kwargs,  # type: ignore[arg-type]
        ) as client:
            await client.subscribe(self.topic, qos=1)
            subscribed.set()
            async for msg in client.messages:
                raw = msg.payload
                payload = raw if isinstance(raw, bytes) else str(raw).encode()
                self.messages.append((str(msg.topic), payload, bool(msg.retain)))

    def on(self, topic: str) -> list[bytes]:
        return [p for t, p, _ in self.messages if t == topic]

    async def wait_for(self, pred: object, within: float = 10.0) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if callable(pred) and pred():
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"condition not reached; got {self.messages[-5:]!r}")
