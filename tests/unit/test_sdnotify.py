"""sd_notify as systemd sees it: a real `ibmon run` talking to a test $NOTIFY_SOCKET.

The unit is Type=notify with WatchdogSec: systemd waits for READY=1 before calling the service
started, kills it when WATCHDOG=1 stops arriving, and expects STOPPING=1 on the way down.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ibmon.runtime import sdnotify
from tests.sysfs_tree import write_device, write_port

IBMON = Path(sys.executable).with_name("ibmon")


@pytest.fixture
def notify_socket() -> Iterator[tuple[socket.socket, str]]:
    # AF_UNIX paths are limited to 107 bytes: a short private directory, not pytest's tmp_path.
    with tempfile.TemporaryDirectory(prefix="ibmon-sd-") as d:
        path = os.path.join(d, "notify")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        try:
            yield sock, path
        finally:
            sock.close()


def receive(sock: socket.socket, until: str, timeout: float) -> list[str]:
    """Datagrams received until one contains ``until`` (inclusive)."""
    messages: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"no {until!r} within {timeout}s; got {messages}")
        sock.settimeout(remaining)
        try:
            data = sock.recv(4096).decode()
        except TimeoutError:
            continue
        messages.append(data)
        if until in data.splitlines():
            return messages


def test_ibmon_run_sends_ready_watchdog_and_stopping(
    tmp_path: Path, notify_socket: tuple[socket.socket, str]
) -> None:
    sock, path = notify_socket
    root = tmp_path / "sys"
    write_device(root, "mlx5_0")
    write_port(root, "mlx5_0", 1)
    config = tmp_path / "ibmon.toml"
    config.write_text(
        '[prometheus]\nlisten = "127.0.0.1:0"\n'
        f'[[sources]]\ntype = "sysfs"\nname = "local"\ninterval = "100ms"\nroot = "{root}"\n'
        f'[state]\npath = "{tmp_path / "state.json"}"\n'
    )
    env = {k: v for k, v in os.environ.items() if k not in {"WATCHDOG_PID", "LISTEN_PID"}}
    env.update(NOTIFY_SOCKET=path, WATCHDOG_USEC="400000")  # WatchdogSec=0.4s: ping every 0.2s
    log = (tmp_path / "stderr").open("wb")
    proc = subprocess.Popen([str(IBMON), "run", "--config", str(config)], env=env,
                            stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    try:
        first = receive(sock, "READY=1", timeout=20)
        ready = first[-1].splitlines()
        assert any(line.startswith("STATUS=") and "local" in line for line in ready), ready
        assert not any("WATCHDOG=1" in m for m in first[:-1]), "watchdog before READY"
        # Pings every WATCHDOG_USEC/2 = 0.2 s: about 10 in 2 s (5 would be once per WatchdogSec,
        # cutting it too close for systemd; a burst would mean the loop is not pacing them).
        pings = 0
        window_end = time.monotonic() + 2.0
        while (remaining := window_end - time.monotonic()) > 0:
            sock.settimeout(remaining)
            with contextlib.suppress(TimeoutError):
                pings += sock.recv(4096).decode().splitlines().count("WATCHDOG=1")
        assert 7 <= pings <= 14, pings
        proc.send_signal(signal.SIGTERM)
        receive(sock, "STOPPING=1", timeout=10)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
        log.close()
    stderr = (tmp_path / "stderr").read_text(errors="replace")
    assert "Traceback" not in stderr, stderr


def test_a_refused_reload_shows_in_the_status_line(
    tmp_path: Path, notify_socket: tuple[socket.socket, str]
) -> None:
    """``systemctl status`` must say that the running config is not the file's any more."""
    sock, path = notify_socket
    root = tmp_path / "sys"
    write_device(root, "mlx5_0")
    write_port(root, "mlx5_0", 1)
    config = tmp_path / "ibmon.toml"
    good = (f'[prometheus]\nlisten = "127.0.0.1:0"\n[[sources]]\ntype = "sysfs"\nname = "local"\n'
            f'interval = "100ms"\nroot = "{root}"\n[state]\npath = "{tmp_path / "state.json"}"\n')
    config.write_text(good)
    env = {k: v for k, v in os.environ.items() if k not in {"WATCHDOG_PID", "WATCHDOG_USEC"}}
    env.update(NOTIFY_SOCKET=path)
    proc = subprocess.Popen([str(IBMON), "run", "--config", str(config)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        receive(sock, "READY=1", timeout=20)
        config.write_text(good.replace("interval = \"100ms\"", "interval = nan"))
        proc.send_signal(signal.SIGHUP)
        refused = receive(sock, "READY=1", timeout=20)[-1].splitlines()
        (status,) = [line for line in refused if line.startswith("STATUS=")]
        assert status.startswith("STATUS=polling local; reload refused, previous config "
                                 f"running: {config}: sources.0.interval: must be a finite")
        config.write_text(good)
        proc.send_signal(signal.SIGHUP)
        applied = receive(sock, "READY=1", timeout=20)[-1].splitlines()
        assert "STATUS=polling local" in applied
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


def test_notify_reaches_abstract_socket_and_is_a_noop_outside_systemd(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = f"ibmon-test-{os.getpid()}-{time.monotonic_ns()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert sdnotify.notify("STATUS=polling")
        assert sock.recv(100) == b"STATUS=polling"
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert sdnotify.notify("READY=1") is False


def test_watchdog_interval_is_half_of_watchdog_usec_for_this_process_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    assert sdnotify.watchdog_interval() is None
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    assert sdnotify.watchdog_interval() == 15.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert sdnotify.watchdog_interval() == 15.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))  # meant for another process
    assert sdnotify.watchdog_interval() is None
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    monkeypatch.setenv("WATCHDOG_USEC", "100000")  # 0.1 s: pinged every 0.1 s, not 0.05
    assert sdnotify.watchdog_interval() == 0.1
    monkeypatch.setenv("WATCHDOG_USEC", "soon")
    assert sdnotify.watchdog_interval() is None


def test_notify_to_a_socket_nobody_listens_on_is_false_not_an_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone.sock"))
    assert sdnotify.notify("WATCHDOG=1") is False
