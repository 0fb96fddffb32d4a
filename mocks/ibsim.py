"""Run ibsim + opensm for a net file so the real infiniband-diags and libibmad talk to it.

A test or the CLI starts one ``IbSim`` per fabric. Every child gets its own process group, so a
stop (or the atexit hook after a crash of the test) can kill the whole group: opensm ignores
SIGTERM once its simulator is gone (docs/infiniband.md §6), so SIGTERM is followed by SIGKILL after
a grace period. Each simulator listens on a unique ``IBSIM_SOCKNAME`` so several can run side by
side, and all files (net file, opensm log and cache, the ``sys-<pid>`` trees umad2sim writes into
its client's working directory) live in one temporary directory removed on stop. ibsim runs with
``ibsim_guard.c`` preloaded (built once per process), so a tool killed while it attaches does not
take the simulator down with it.

The console (ibsim's stdin) is driven synchronously: a batch of commands is followed by a
comment line, which ibsim echoes, so ``console`` returns only after ibsim has applied every
command. That is what lets a test set a counter and read it back with perfquery at once.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType

from ibmon.infiniband.counters import CATALOGUE
from ibmon.state.persist import pid_alive

__all__ = [
    "MAX_CLIENTS",
    "PMA_FIELDS",
    "IbSim",
    "IbSimError",
    "find_umad2sim",
    "guard_library",
    "ibsim_field",
]

#: ibsim accepts at most this many attached clients at once; opensm is one of them.
MAX_CLIENTS = 10
#: ibsim's console reads lines into a 128-byte buffer: longer lines are split into garbage commands.
MAX_CONSOLE_LINE = 127

#: PMA field -> the ibsim attribute that holds it, for ``set_counters`` without a prefix.
#: PortXmitData & co exist in both attributes; unprefixed names mean the 32-bit PortCounters copy.
PMA_FIELDS: dict[str, str] = {
    c.pma: c.attribute or ("PortCountersExtended" if c.bits == 64 else "PortCounters")
    for c in CATALOGUE
    if c.name != "qp1_dropped"  # ibsim's PortCounters has no QP1Dropped field
}
# ibsim 0.10 spells the multicast fields with a capital C, and MalformedPacket in full.
_IBSIM_SPELLING = {
    "PortMulticastXmitPkts": "PortMultiCastXmitPkts",
    "PortMulticastRcvPkts": "PortMultiCastRcvPkts",
    "PortMalformedPktErrors": "PortMalformedPacketErrors",
}

_PROMPT = b"sim> "
_counter = itertools.count(1)
_live: weakref.WeakSet[IbSim] = weakref.WeakSet()
_NODE_RE = re.compile(r'^\s*(Switch|Hca|Ca|Rt)\s*(\d+)\s+"', re.MULTILINE)


def ibsim_field(pma: str) -> str:
    """A PMA field name (libibmad's spelling) as ibsim's PerformanceSet spells it."""
    return _IBSIM_SPELLING.get(pma, pma)


class IbSimError(RuntimeError):
    """ibsim or opensm did not start, died, or rejected a console command."""


def find_umad2sim() -> str | None:
    """Path of libumad2sim.so, from dpkg's file list or the multiarch library directories."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["dpkg", "-L", "libumad2sim0"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
        for line in out.splitlines():
            if line.endswith("/libumad2sim.so") and os.path.exists(line):
                return line
    for pattern in (
        "/usr/lib/*/umad2sim/libumad2sim.so",
        "/usr/lib*/umad2sim/libumad2sim.so",
        "/usr/local/lib*/umad2sim/libumad2sim.so",
    ):
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[0]
    return None


_guard: list[str | None] = []
_guard_lock = threading.Lock()


def guard_library() -> str | None:
    """Path of ``ibsim_guard.c`` compiled for this process (None, with a warning, without a C
    compiler): preloaded into ibsim so that a tool killed while it attaches costs that tool, not
    the simulator (the C file says how). Built once per process into a private temporary
    directory, so nothing another user could have planted is ever loaded into ibsim."""
    with _guard_lock:
        if not _guard:
            _guard.append(_build_guard())
        return _guard[0]


def _build_guard() -> str | None:
    source = Path(__file__).with_name("ibsim_guard.c")
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        print("ibsim runs unguarded: no C compiler (apt package gcc), so a tool killed while "
              "it attaches takes the simulator down", file=sys.stderr)
        return None
    outdir = Path(tempfile.mkdtemp(prefix="ibmon-ibsim-guard-"))
    atexit.register(shutil.rmtree, outdir, True)
    lib = outdir / "ibsim_guard.so"
    argv = [compiler, "-shared", "-fPIC", "-O2", "-Wall", "-o", str(lib), str(source), "-ldl"]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if res.returncode != 0:
        raise IbSimError(f"cannot build {source.name}: {res.stderr.strip()[-2000:]}")
    return str(lib)


def _sizing(netfile: str) -> list[str]:
    """ibsim's -N/-S/-P limits, raised above its defaults only when the fabric needs it."""
    nodes = switches = ports = 0
    for m in _NODE_RE.finditer(netfile):
        nodes += 1
        ports += int(m.group(2)) + 1
        switches += m.group(1) == "Switch"
    args: list[str] = []
    if nodes + 1 > 2048:
        args += ["-N", str(nodes + 16)]
    if switches + 1 > 256:
        args += ["-S", str(switches + 16)]
    if ports + 1 > 13312:
        args += ["-P", str(ports + 64)]
    return args


def _kill_group(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM the process group, SIGKILL it after ``grace`` seconds, and reap the leader."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
    # The leader may be gone while others in its group live on: always sweep the group.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def _stop_all_at_exit() -> None:
    for sim in list(_live):
        with contextlib.suppress(Exception):
            sim.stop()


atexit.register(_stop_all_at_exit)


class IbSim:
    """One simulated fabric: ``ibsim -s <netfile>`` plus (optionally) opensm assigning LIDs.

    Use as ``with IbSim(text) as sim:`` / ``async with IbSim(text) as sim:`` or call
    ``start()``/``stop()``. Child tools need ``sim.env`` in their environment and are best run
    with ``cwd=sim.workdir`` (umad2sim writes a ``sys-<pid>`` tree into the working directory).
    """

    def __init__(
        self,
        netfile: str,
        *,
        sm: bool = True,
        sweep_interval: int = 0,
        start_timeout: float = 120.0,
        grace: float = 2.0,
        keep_workdir: bool = False,
        ibsim_bin: str = "ibsim",
        opensm_bin: str = "opensm",
    ) -> None:
        self.netfile = netfile
        self.sm = sm
        self.sweep_interval = sweep_interval
        self.start_timeout = start_timeout
        self.grace = grace
        self.keep_workdir = keep_workdir
        self._ibsim_bin = ibsim_bin
        self._opensm_bin = opensm_bin
        self.sockname = f"ibmon{os.getpid()}x{next(_counter)}"
        self.workdir: Path = Path()
        self.env: dict[str, str] = {}
        self._ibsim: subprocess.Popen[bytes] | None = None
        self._opensm: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._out = bytearray()
        self._cond = threading.Condition()
        self._console_lock = threading.Lock()
        self._marker = itertools.count(1)
        self._log: Path = Path()
        #: Times ``revive`` found the simulator dead and started it again.
        self.restarts = 0

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> IbSim:
        """Start ibsim, then opensm; return once the subnet is up (LIDs assigned)."""
        if self._ibsim is not None:
            raise IbSimError("already started")
        lib = find_umad2sim()
        if lib is None:
            raise IbSimError("libumad2sim.so not found (apt package libumad2sim0)")
        self.workdir = Path(tempfile.mkdtemp(prefix="ibmon-ibsim-"))
        (self.workdir / "osm").mkdir()
        self.env = {"LD_PRELOAD": lib, "IBSIM_SOCKNAME": self.sockname}
        netpath = self.workdir / "net"
        netpath.write_text(self.netfile, encoding="utf-8")
        _live.add(self)
        try:
            self._start_ibsim(netpath)
            if self.sm:
                self._start_opensm()
                self._first_sweep()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Kill opensm then ibsim (whole process groups) and remove the work directory."""
        for attr in ("_opensm", "_ibsim"):
            proc: subprocess.Popen[bytes] | None = getattr(self, attr)
            if proc is not None:
                _kill_group(proc, self.grace)
                for stream in (proc.stdin, proc.stdout):
                    if stream is not None:
                        with contextlib.suppress(OSError):
                            stream.close()
                setattr(self, attr, None)
        if self._reader is not None:
            self._reader.join(timeout=5)
            self._reader = None
        _live.discard(self)
        if not self.keep_workdir and self.workdir != Path() and self.workdir.exists():
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> IbSim:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def __aenter__(self) -> IbSim:
        import asyncio

        return await asyncio.to_thread(self.start)

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        import asyncio

        await asyncio.to_thread(self.stop)

    @property
    def running(self) -> bool:
        return self._ibsim is not None and self._ibsim.poll() is None

    def revive(self) -> bool:
        """Start the simulator again if it has exited; True if it had to.

        ibsim exits by itself (``IBPANIC`` in ``sim_ctl_new_client``) when a tool dies
        between asking to attach and being connected, which a tool killed on a timeout can do
        at any moment: a limit of the simulator, not of the program under test.
        ``guard_library`` keeps it up through that; this is the backstop for a machine without
        a C compiler or any other death. Tests that have tools killed on purpose call this
        before each test, so that a death costs at most the test it happened in, not every
        later test of the module. The fabric comes back from the same netfile, swept again by
        opensm; the death is reported on stderr.
        """
        if self.running:
            return False
        print(f"ibsim had exited, restarting it: {self.how_it_ended()}", file=sys.stderr)
        self.stop()
        self.start()
        self.restarts += 1
        return True

    def how_it_ended(self) -> str:
        """How ibsim ended (a negative status is the signal) and its last output: a simulator
        that died under a test is otherwise undiagnosable from the failure alone."""
        proc = self._ibsim
        status = "never started" if proc is None else f"exit status {proc.returncode}"
        return f"{status}; its output ends: {self.output()[-1500:]!r}"

    def tool_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """An environment for a child tool: ``base`` (default os.environ) plus ``env``."""
        out = dict(os.environ if base is None else base)
        out.update(self.env)
        return out

    # ------------------------------------------------------------------ processes

    def _popen(self, argv: list[str], env: dict[str, str], **kw: object) -> subprocess.Popen[bytes]:
        return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
            argv, cwd=self.workdir, env=env, start_new_session=True, **kw
        )

    def _start_ibsim(self, netpath: Path) -> None:
        env = dict(os.environ)
        env.pop("LD_PRELOAD", None)
        guard = guard_library()
        if guard is not None:
            env["LD_PRELOAD"] = guard
        env["IBSIM_SOCKNAME"] = self.sockname
        argv = [self._ibsim_bin, "-s", *_sizing(self.netfile), str(netpath)]
        try:
            self._ibsim = self._popen(
                argv, env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
        except FileNotFoundError as exc:
            raise IbSimError(f"{self._ibsim_bin} not installed (apt package ibsim-utils)") from exc
        self._reader = threading.Thread(target=self._read_loop, name="ibsim-console", daemon=True)
        self._reader.start()
        if not self._wait_output(_PROMPT, 0, self.start_timeout):
            raise IbSimError(f"ibsim did not become ready: {self.output()[-2000:]}")

    def _start_opensm(self) -> None:
        env = self.tool_env()
        osm = str(self.workdir / "osm")
        env.update({"OSM_TMP_DIR": osm, "OSM_CACHE_DIR": osm})
        self._log = self.workdir / "opensm.log"
        argv = [self._opensm_bin, "-d2", "-f", str(self._log), "-s", str(self.sweep_interval)]
        try:
            self._opensm = self._popen(
                argv,
                env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        except FileNotFoundError as exc:
            raise IbSimError(f"{self._opensm_bin} not installed (apt package opensm)") from exc

    def _read_loop(self) -> None:
        proc = self._ibsim
        assert proc is not None
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""
            with self._cond:
                if chunk:
                    self._out += chunk
                self._cond.notify_all()
            if not chunk:
                return

    def _wait_output(self, token: bytes, start: int, timeout: float) -> bool:
        end = time.monotonic() + timeout
        with self._cond:
            while self._out.find(token, start) < 0:
                left = end - time.monotonic()
                if left <= 0 or (self._ibsim is None or self._ibsim.poll() is not None):
                    return self._out.find(token, start) >= 0
                self._cond.wait(min(left, 0.2))
        return True

    def output(self) -> str:
        """Everything ibsim printed so far (console echo, warnings)."""
        with self._cond:
            return self._out.decode("utf-8", "replace")

    def subnet_up_count(self) -> int:
        """How many sweeps opensm has completed with the subnet up."""
        try:
            return self._log.read_text(encoding="utf-8", errors="replace").count("SUBNET UP")
        except OSError:
            return 0

    def wait_subnet_up(self, *, count: int, timeout: float = 60.0) -> None:
        """Block until opensm has logged ``count`` "SUBNET UP" lines in total."""
        end = time.monotonic() + timeout
        while self.subnet_up_count() < count:
            if self._opensm is None or self._opensm.poll() is not None:
                raise IbSimError(f"opensm exited; log: {self._tail_log()}")
            if not self.running:
                raise IbSimError(f"ibsim exited: {self.output()[-2000:]}")
            if time.monotonic() > end:
                raise IbSimError(f"subnet not up after {timeout:.0f}s; log: {self._tail_log()}")
            time.sleep(0.05)

    def _tail_log(self, *, full: bool = False) -> str:
        try:
            text = self._log.read_text(encoding="utf-8", errors="replace")
            return text if full else text[-2000:]
        except OSError:
            return "(no log)"

    def _first_sweep(self) -> None:
        # opensm becomes master, then runs its first heavy sweep by itself, also with periodic
        # sweeping off (-s 0); later sweeps are ``resweep``'s (SIGHUP).
        end = time.monotonic() + self.start_timeout
        while "Entering MASTER state" not in self._tail_log(full=True):
            if self._opensm is None or self._opensm.poll() is not None:
                raise IbSimError(f"opensm exited; log: {self._tail_log()}")
            if time.monotonic() > end:
                raise IbSimError(f"opensm did not become master; log: {self._tail_log()}")
            time.sleep(0.05)
        self.wait_subnet_up(count=1, timeout=max(1.0, end - time.monotonic()))

    def resweep(self, timeout: float = 60.0) -> None:
        """Make opensm run a heavy sweep now (SIGHUP) and wait until it reports the subnet up.

        Needed after ReLink: a relinked port stays INIT until the SM activates it.
        """
        if self._opensm is None:
            raise IbSimError("no opensm running")
        before = self.subnet_up_count()
        self._opensm.send_signal(signal.SIGHUP)
        self.wait_subnet_up(count=before + 1, timeout=timeout)

    # ------------------------------------------------------------------ console

    def console(self, cmd: str | Iterable[str], timeout: float = 30.0) -> str:
        """Send one or more console lines; return ibsim's answer once all were applied."""
        lines = [cmd] if isinstance(cmd, str) else list(cmd)
        for line in lines:
            if "\n" in line or "\r" in line:
                raise ValueError(f"console command contains a newline: {line!r}")
            if len(line.encode("utf-8")) > MAX_CONSOLE_LINE:
                raise ValueError(f"console line longer than {MAX_CONSOLE_LINE} bytes: {line!r}")
        proc = self._ibsim
        if proc is None or proc.stdin is None or proc.poll() is not None:
            raise IbSimError(f"ibsim is not running ({self.how_it_ended()})")
        with self._console_lock:
            marker = f"# ibmon-sync-{next(self._marker)}"
            with self._cond:
                start = len(self._out)
            payload = "".join(f"{line}\n" for line in lines) + marker + "\n"
            try:
                proc.stdin.write(payload.encode("utf-8"))
                proc.stdin.flush()
            except BrokenPipeError as exc:
                raise IbSimError("ibsim console closed") from exc
            token = marker.encode()
            if not self._wait_output(token, start, timeout):
                raise IbSimError(f"ibsim did not answer {lines[:3]!r}")
            with self._cond:
                end = self._out.find(token, start)
                text = bytes(self._out[start:end]).decode("utf-8", "replace")
        return text.replace(_PROMPT.decode(), "\n").strip()

    @staticmethod
    def _target(node_id: str, port: int | None) -> str:
        if '"' in node_id:
            raise ValueError(f"node id cannot contain a quote: {node_id!r}")
        return f'"{node_id}"' + (f"[{port}]" if port is not None else "")

    def set_counters(self, node_id: str, port: int, values: Mapping[str, int]) -> None:
        """PerformanceSet each PMA field; ``"PortCountersExtended.PortXmitData"`` picks the copy.

        Unprefixed names go to the attribute in ``PMA_FIELDS`` (32-bit PortCounters for fields
        that exist in both). Raises IbSimError when ibsim rejects one.
        """
        lines: list[str] = []
        for name, value in values.items():
            attr, _, fld = name.rpartition(".")
            if not attr:
                try:
                    attr = PMA_FIELDS[fld]
                except KeyError:
                    raise ValueError(f"unknown PMA field {fld!r}") from None
            fld = ibsim_field(fld)
            lines.append(f"PerformanceSet {self._target(node_id, port)} {attr}.{fld}={int(value)}")
        if not lines:
            return
        answer = self.console(lines)
        ok = answer.count("has been set to")
        if ok != len(lines):
            raise IbSimError(f"PerformanceSet failed ({ok}/{len(lines)} applied): {answer[-500:]}")

    def _checked(self, line: str) -> str:
        answer = self.console(line)
        bad = [ln for ln in answer.splitlines() if ln.startswith("#") or "unknown" in ln]
        if bad:
            raise IbSimError(f"{line!r}: {bad[0]}")
        return answer

    def unlink(self, node_id: str, port: int | None = None) -> str:
        """Disconnect a port (or every port of the node). Does not bump LinkDownedCounter."""
        return self._checked(f"Unlink {self._target(node_id, port)}")

    def relink(self, node_id: str, port: int | None = None) -> str:
        """Restore a link removed by ``unlink``; call ``resweep`` to make it Active again."""
        return self._checked(f"ReLink {self._target(node_id, port)}")

    def clear(self, node_id: str, port: int | None = None) -> str:
        """Unlink and reset the port (counters too)."""
        return self._checked(f"Clear {self._target(node_id, port)}")

    def reap_clients(self) -> int:
        """Force-disconnect attached clients whose process is gone; return how many.

        umad2sim detaches only on a clean exit, so every tool killed by a timeout keeps one of
        ibsim's 10 client slots until this runs.
        """
        # A slot is freed by number. Listed once, a client that was still exiting cleanly when
        # listed is gone when checked, and its slot may already belong to a new tool: freeing
        # it then cuts that live tool off (its writes fail: "umad2sim_write: cannot write").
        # So a slot is freed only if a second listing, taken after its pid was found dead,
        # still shows that pid: a dead client cannot give its slot up, so it is still the
        # holder, and nothing but this frees the slot before the "X".
        dead = {slot: pid for slot, pid in self._attached() if not pid_alive(pid)}
        if not dead:
            return 0
        gone = 0
        for slot, pid in self._attached():
            if dead.get(slot) == pid:
                self.console(f"X {slot}")
                gone += 1
        return gone

    def _attached(self) -> list[tuple[int, int]]:
        """(slot, pid) of every attached client."""
        out = []
        for line in self.console("Attached").splitlines():
            m = re.match(r"^Client\s+(\d+):\s+pid\s+(\d+)", line.strip())
            if m:
                out.append((int(m.group(1)), int(m.group(2))))
        return out

    def error(self, node_id: str, port: int | None, rate: int, attribute: int | None = None) -> str:
        """Drop ``rate`` percent of the MADs arriving at that port (0 turns it off)."""
        extra = f" {attribute}" if attribute is not None else ""
        return self._checked(f"Error {self._target(node_id, port)} {int(rate)}{extra}")
