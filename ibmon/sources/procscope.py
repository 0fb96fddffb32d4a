"""Kill scopes: no process a tool starts outlives the command that started it.

A process-group kill is not enough: a tool's grandchild that calls ``setsid`` leaves the group
(and the session), keeps the tool's stdout open so the command never sees end-of-file, and
lives on after the tool is killed (seen: 4 orphans, polls of 14 s). Cgroups would contain
it but need privileges; this module does it with what an unprivileged process has:

- ``become_subreaper`` makes this process a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``,
  Linux 3.4+): an orphan anywhere below it is re-parented to it instead of to init, so it can
  always be found among this process's own children (``/proc/self/task/*/children``), however
  it detached.
- every tool runs with ``IBMON_TOOL_SCOPE=<token>`` in its environment, which its descendants
  inherit (``/proc/<pid>/environ`` shows the environment a process was started with), so an
  adopted orphan says which command it came from.
- a tool that has to be stopped (timeout, output too large, cancelled) is killed with
  everything below it (``ToolScopes.stop``) while it is still unreaped, so its pid cannot have
  been reused; ``ToolScopes.close`` runs as soon as the tool has exited (``wait_exit``, which
  unlike asyncio's ``Process.wait`` does not wait for the pipes a leftover holds): it kills
  every adopted orphan whose token belongs to a command that is over, then reaps what it
  killed. Orphans of commands still running are left alone until their own command ends.

Zombies are reaped only when they are known to come from a tool (a process this module
killed, or one in a finished tool's session): another component's child may be waiting for
its own ``waitpid``. A descendant that both leaves the session and clears its environment
before it is adopted cannot be told apart from a foreign child and is left alone; tools do not
do that. Without ``/proc`` or the subreaper (not Linux), scopes fall back to the group kill.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import itertools
import os
import signal
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = [
    "SCOPES",
    "SCOPE_ENV",
    "ProcStat",
    "ToolScopes",
    "become_subreaper",
    "children",
    "descendants",
    "kill_tree",
    "read_stat",
    "wait_exit",
]

#: The environment variable that carries a command's scope token to everything it starts.
SCOPE_ENV = "IBMON_TOOL_SCOPE"
_PR_SET_CHILD_SUBREAPER = 36
#: How long a close waits for the processes it killed to become zombies it can reap.
_REAP_WAIT = 1.0
#: Finished tools whose sessions still identify their zombies.
_SESSIONS_KEPT = 4096


@functools.cache
def become_subreaper() -> bool:
    """Make this process the reaper of orphans below it; True when it is one (idempotent)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
        prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                          ctypes.c_ulong]
        prctl.restype = ctypes.c_int
        return bool(prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


@dataclass(frozen=True, slots=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` a scope needs."""

    pid: int
    comm: str
    state: str
    ppid: int
    pgrp: int
    session: int

    @property
    def zombie(self) -> bool:
        return self.state in ("Z", "X")


def read_stat(pid: int) -> ProcStat | None:
    """``/proc/<pid>/stat``, or None when the process is gone (or /proc is not there)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    left, right = raw.find(b"("), raw.rfind(b")")  # comm may itself contain ")"
    fields = raw[right + 2 :].split()
    if left < 0 or right < left or len(fields) < 4:
        return None
    comm = raw[left + 1 : right].decode("ascii", "backslashreplace")
    return ProcStat(
        pid=pid,
        comm=comm,
        state=fields[0].decode("ascii", "replace"),
        ppid=int(fields[1]),
        pgrp=int(fields[2]),
        session=int(fields[3]),
    )


def _children_by_scan(pid: int) -> list[int]:
    """Children of ``pid`` from every process's ppid (kernels without the children files)."""
    out: list[int] = []
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if name.isdigit():
                st = read_stat(int(name))
                if st is not None and st.ppid == pid:
                    out.append(st.pid)
    return out


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (every thread's, zombies included)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    out: list[int] = []
    readable = False
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(x) for x in f.read().split())
            readable = True
        except OSError:
            continue
    if not readable and tids:
        return _children_by_scan(pid)
    return out


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, parents before their children."""
    out: list[int] = []
    queue = deque(children(pid))
    seen: set[int] = set()
    while queue:
        child = queue.popleft()
        if child in seen:
            continue
        seen.add(child)
        out.append(child)
        queue.extend(children(child))
    return out


async def wait_exit(pid: int, reaped: Callable[[], bool]) -> None:
    """Return once child ``pid`` has exited and its spawner has collected it (``reaped()``).

    ``asyncio``'s ``Process.wait()`` returns only once the process's pipes are closed too, so a
    leftover that holds the tool's stdout would hold the command until its timeout, however
    soon the tool exited. This waits for the tool itself: a pidfd (Linux 5.3+) turns readable
    when it exits; without one, ``/proc`` is polled. Then it waits (briefly: asyncio's child
    watcher collects an exited child at once) until the spawner has its status, so nothing
    here or in the transport ever reaps the tool behind the watcher's back. Without a pidfd,
    that status is all there is to wait for.
    """
    if reaped():
        return
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = -1
    if fd >= 0:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def ready() -> None:
            if not done.done():
                done.set_result(None)

        loop.add_reader(fd, ready)
        try:
            await done
        finally:
            loop.remove_reader(fd)
            os.close(fd)
    # the status reaches the loop through a callback: there is no event to wait on
    delay = 0.001
    while not reaped():
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.05)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def kill_tree(pid: int) -> list[ProcStat]:
    """SIGKILL ``pid``, everything below it and its process group; the processes killed below
    ``pid`` (it is the caller's to reap) are returned."""
    below = [st for d in descendants(pid) if (st := read_stat(d)) is not None and not st.zombie]
    _kill(pid)
    for st in below:
        _kill(st.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    return below


def _scope_of(pid: int) -> str | None:
    """The scope token a process was started with, if any."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
    except OSError:
        return None
    key = SCOPE_ENV.encode() + b"="
    for item in env.split(b"\0"):
        if item.startswith(key):
            return item[len(key) :].decode("ascii", "replace")
    return None


class ToolScopes:
    """The scopes of one process's tool commands (use the module's ``SCOPES``).

    ``open`` before spawning (the token goes into the tool's environment through ``env``),
    ``stop`` a tool that must not finish, ``close`` once the tool has exited (``wait_exit``).
    The tool itself is never reaped here: whoever spawned it does.
    """

    def __init__(self) -> None:
        self._seq = itertools.count(1)
        self._running: set[str] = set()
        self._sessions: deque[int] = deque(maxlen=_SESSIONS_KEPT)
        #: processes this scope killed and must reap once they are its children and zombies
        self._adopted: set[int] = set()

    def _prefix(self) -> str:
        return f"{os.getpid()}."

    def open(self) -> str:
        """A new scope token; the scope counts as running until ``close``."""
        token = f"{self._prefix()}{next(self._seq)}"
        self._running.add(token)
        return token

    @staticmethod
    def env(token: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment for a tool in scope ``token``: ``base`` (default: ours) plus it."""
        env = dict(os.environ if base is None else base)
        env[SCOPE_ENV] = token
        return env

    def stop(self, pid: int) -> list[ProcStat]:
        """Kill a tool that is still running (not yet reaped) and everything below it; what
        was below it is this scope's to reap."""
        below = kill_tree(pid)
        self._adopted.update(st.pid for st in below)
        return below

    def discard(self, token: str) -> None:
        """A scope whose tool never started."""
        self._running.discard(token)

    async def close(self, token: str, pid: int | None) -> list[ProcStat]:
        """End scope ``token`` whose tool was ``pid``: kill and reap every process it left
        behind; returns them (an empty list for a well-behaved tool).

        Call it once the tool itself has exited (``stop`` one that must not finish first). Its
        leftovers were then re-parented here (with the subreaper) and carry the token; without
        the subreaper, its process group is killed instead, which is all a plain process can
        do.
        """
        self._running.discard(token)
        if pid is not None:
            self._sessions.append(pid)
            if not become_subreaper():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
        mine: dict[int, ProcStat] = {}
        await self._settle(token, mine)
        return list(mine.values())

    def _sweep(self, token: str, mine: dict[int, ProcStat]) -> bool:
        """Kill every adopted orphan of a finished scope (the ones of ``token`` go into
        ``mine``); True when it killed anything not killed before. A process that forks while
        it is killed leaves a child re-parented here: ``_settle`` sweeps again for it."""
        prefix = self._prefix()
        killed_any = False
        for child in children(os.getpid()):
            if child in self._adopted:
                continue  # already killed, waiting to be reaped
            st = read_stat(child)
            if st is None or st.zombie:
                continue
            owner = _scope_of(child)
            if owner is None or not owner.startswith(prefix) or owner in self._running:
                continue
            killed_any = True
            killed = [st, *kill_tree(child)]
            self._adopted.update(k.pid for k in killed)
            if owner == token:
                mine.update((k.pid, k) for k in killed)
        return killed_any

    def _reapable(self, st: ProcStat) -> bool:
        """A zombie child that came from a tool: one this scope killed, or a member (never the
        leader: that is the tool, its spawner reaps it) of a finished tool's session."""
        if st.pid in self._adopted:
            return True
        return st.session != st.pid and st.session in self._sessions

    def _reap_zombies(self) -> int:
        """Reap the zombie children known to come from tools; how many adopted ones remain."""
        for child in children(os.getpid()):
            st = read_stat(child)
            if st is None or not st.zombie or not self._reapable(st):
                continue
            with contextlib.suppress(ChildProcessError):
                os.waitpid(child, os.WNOHANG)
            self._adopted.discard(child)
        self._adopted = {p for p in self._adopted if read_stat(p) is not None}
        return len(self._adopted)

    async def _settle(self, token: str, mine: dict[int, ProcStat]) -> None:
        """Kill leftovers and reap them until none is left; a process that takes long to die
        (uninterruptible sleep) is reaped by a later close. Sweeping again while waiting catches
        a child re-parented here after its parent was killed."""
        delay = 0.001
        waited = 0.0
        while True:
            killed = self._sweep(token, mine)
            if not self._reap_zombies() and not killed:
                return
            if waited >= _REAP_WAIT:
                return
            await asyncio.sleep(delay)
            waited += delay
            delay = min(delay * 2, 0.1)

    async def sweep(self) -> None:
        """Kill and reap orphans of every finished scope (a source's close does this last)."""
        await self._settle("", {})


#: The scopes of this process: one registry, because orphans come back to the process, not to
#: the runner that started their tool.
SCOPES = ToolScopes()
