"""sd_notify without libsystemd: one datagram to ``$NOTIFY_SOCKET`` per message.

Outside systemd (no NOTIFY_SOCKET) every call is a cheap no-op, so the daemon can always call it.
"""

from __future__ import annotations

import os
import socket

__all__ = ["notify", "watchdog_interval"]


def notify(message: str) -> bool:
    """Send ``READY=1``, ``WATCHDOG=1``, ``STATUS=...``, ``STOPPING=1``; False outside systemd."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]  # abstract namespace socket
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(message.encode("utf-8", "replace"), addr)
    except OSError:
        return False
    return True


def watchdog_interval() -> float | None:
    """Half of systemd's WatchdogSec (WATCHDOG_USEC), the usual ping period; None when unset."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return max(int(usec) / 2_000_000, 0.1)
    except ValueError:
        return None
