"""The MAD worker: a child process that owns one umad port and runs ``MadEngine`` batches.

The ``mad`` source builds and decodes MADs in the daemon, but the umad port itself (and the
blocking send/receive loop) lives in this small child, one per port, for three reasons that a
thread cannot satisfy:

- **A frozen fabric must not hold later polls.** A thread blocked inside a umad call (a wedged
  driver; under ibsim a stopped simulator, where umad2sim blocks in ``write`` while holding its
  process-wide lock) can never be freed, and every later poll would queue behind it. A process
  is killed when the poll's deadline passes, and the next poll starts a fresh one.
- **A broken port is reopened by starting again.** libibumad and umad2sim keep per-process state
  that cannot be re-initialised in place (umad2sim attaches to the simulator once per process,
  so after a simulator restart only a new process can talk to it); on hardware a device that
  went away after a driver reload is likewise reopened from scratch.
- **Never two sweeps on one umad port.** The source sends one batch at a time to a worker and
  reaps a worker before it starts its replacement; a worker that does not die when killed is
  never replaced (``MadSource`` refuses to open the port a second time while it lives).

The child dies with the daemon (``PR_SET_PDEATHSIG``, and end of file on its stdin) and
otherwise only when the daemon ends it: it ignores SIGINT, SIGTERM and SIGHUP, which a terminal or
systemd's ``KillMode=control-group`` send to the whole group at once, so a stop never shows up as
a failed poll. It never prints a traceback: every failure goes back to the daemon as an error
frame and becomes a one-line ``MadError``.

Protocol, on the child's stdin/stdout: frames of a 4-byte big-endian length and a ``marshal``
payload (plain tuples, bytes, ints and strings only; both ends are this module). The child
first sends ``("ready",)`` or ``("error", message, cause)``; then for each ``("run",
[request tuple, ...])`` it answers ``("ok", [(data, error), ...])`` in request order, or
``("error", message, cause)`` and exits. A big batch's answers come in parts: zero or more
``("part", [(data, error), ...])`` frames, each the next ``STREAM_CHUNK`` answers in request
order as soon as they are all in, then ``("ok", [...])`` with the rest, so that the daemon
decodes the first answers while the worker is still sending (``MadWorker.stream``).
``("again",)`` runs the previous batch's requests once more: a counter poll sends the same
requests every time, so they cross the pipe once per topology, not once per poll.
``("once", [request tuple, ...])`` runs a batch without making it the one ``again`` repeats
(the few detail reads that follow a poll's counters, so the next poll is still an ``again``).
End of input (or ``("close",)``) closes the port.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import gc
import marshal
import os
import select
import signal
import struct
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ibmon.sources.libibmad import MadEngine, MadError, MadRequest, MadResult, RawResult

if TYPE_CHECKING:
    import subprocess
# ``subprocess`` is imported where the daemon's side uses it: the child, which starts on every
# (re)open of the MAD port and before the first MAD of a cold start, never needs it.

__all__ = ["MadWorker", "MadWorkerGoneError", "main"]

_LEN = struct.Struct(">I")
#: How often a blocked read re-checks whether the worker was killed (a child that ignores even
#: SIGKILL, e.g. stuck in the kernel, keeps its pipe open: the reader must give up by itself).
_READ_SLICE = 0.25
_PR_SET_PDEATHSIG = 1
#: A counter poll's answers are about 200 bytes a MAD: a bigger pipe means fewer wake-ups.
_PIPE_SIZE = 1 << 20
#: The child's command: ``python -S`` (no ``site``: the child needs only the standard library and
#: this package, and skipping it halves the interpreter's start, which a cold start waits for),
#: with the directory holding the ``ibmon`` package appended to its path.
_CHILD = (
    "import sys; sys.path.append(sys.argv[1]); "
    "from ibmon.sources.madworker import main; sys.exit(main(sys.argv[1:]))"
)
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: Answers per ``part`` frame: big enough that a frame costs little per MAD, small enough that
#: the daemon's decoding overlaps most of a batch (a cold start's batches are 600-5,000 MADs).
STREAM_CHUNK = 256


class MadWorkerGoneError(MadError):
    """The worker process ended (or was killed) before it answered."""


def _write_frame(fd: int, obj: Any) -> None:
    data = marshal.dumps(obj)
    view = memoryview(_LEN.pack(len(data)) + data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class _Reader:
    """Reads whole frames from a pipe, giving up when ``stop`` is set (or at ``deadline``)."""

    def __init__(self, fd: int, stop: threading.Event) -> None:
        self.fd = fd
        self.stop = stop

    def _exactly(self, n: int, deadline: float | None) -> bytes | None:
        """``n`` bytes; None when ``deadline`` passed before the first of them arrived (once
        a frame has begun, the rest is waited for: the writer sends it in one go)."""
        chunks: list[bytes] = []
        got = 0
        while got < n:
            if self.stop.is_set():
                raise MadWorkerGoneError("MAD worker stopped")
            wait = _READ_SLICE
            if deadline is not None and not chunks:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                wait = min(wait, left)
            readable, _, _ = select.select([self.fd], [], [], wait)
            if not readable:
                continue
            chunk = os.read(self.fd, n - got)
            if not chunk:
                raise MadWorkerGoneError("MAD worker exited")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def frame(self, deadline: float | None = None) -> Any:
        """The next frame's payload; None only when ``deadline`` passed before it began."""
        head = self._exactly(_LEN.size, deadline)
        if head is None:
            return None
        body = self._exactly(_LEN.unpack(head)[0], None)
        assert body is not None
        try:
            return marshal.loads(body)  # noqa: S302 - our own child, plain types only
        except (ValueError, EOFError, TypeError) as exc:
            raise MadError(f"MAD worker sent a malformed frame: {exc}") from None


class MadWorker:
    """The daemon's handle on one worker process (see the module docstring).

    Start it on the event loop's thread (``PR_SET_PDEATHSIG`` follows the thread that forked),
    then call the blocking methods from one worker thread: ``wait_ready`` until it says the
    port is open, ``run`` for each batch. ``kill`` may be called from any thread at any time;
    ``close`` ends it gracefully (the port is released, under ibsim the client detaches).
    """

    def __init__(
        self,
        *,
        ca: str | None,
        port: int,
        timeout: float,
        retries: int,
        window: int,
        python: str = sys.executable,
    ) -> None:
        args = {"ca": ca, "port": port, "timeout": timeout, "retries": retries,
                "window": window, "parent": os.getpid()}
        import subprocess  # see the imports

        self.proc: subprocess.Popen[bytes] = subprocess.Popen(  # fixed argv: this interpreter
            [python, "-S", "-c", _CHILD, _PACKAGE_ROOT, marshal.dumps(args).hex()],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError, AttributeError):  # Linux only; an optimisation
                fcntl.fcntl(stream.fileno(), fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
        self._sent: list[MadRequest] | None = None  # the batch the worker holds
        self.started = time.monotonic()
        self.ready = False
        self._stop = threading.Event()
        self._reader = _Reader(self.proc.stdout.fileno(), self._stop)
        # Held while reading: ``close`` takes it before closing the pipe, so a reader never
        # waits on a descriptor number that was closed (and perhaps reused) under it.
        self._reading = threading.Lock()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def _gone(self) -> MadWorkerGoneError:
        import subprocess  # see the imports

        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=1.0)  # a killed worker exits at once: say how it ended
        code = self.proc.poll()
        if code is None:
            how = "stopped"
        elif code < 0:
            how = f"killed by signal {-code}"
        else:
            how = f"exited with status {code}"
        return MadWorkerGoneError(f"MAD worker (pid {self.pid}) {how}")

    def _answer(self, msg: Any) -> Any:
        if not isinstance(msg, tuple) or not msg:
            raise MadError(f"MAD worker (pid {self.pid}) sent a malformed answer")
        if msg[0] == "error":
            raise MadError(str(msg[1]), str(msg[2]) if msg[2] is not None else None)
        return msg

    def wait_ready(self, wait: float) -> bool:
        """Blocking: True once the worker has opened its port, False if it has not within
        ``wait`` seconds (it keeps trying); MadError when it could not open it."""
        if self.ready:
            return True
        try:
            with self._reading:
                msg = self._reader.frame(time.monotonic() + wait)
        except MadWorkerGoneError:
            raise self._gone() from None
        if msg is None:
            return False
        self._answer(msg)
        self.ready = True
        return True

    def send(self, requests: Sequence[MadRequest], *, keep: bool = True) -> None:
        """Blocking: hand a batch to the worker (``receive`` collects the answers).

        ``keep=False``: a one-off batch; the worker keeps the batch it held for ``again``.
        """
        stdin = self.proc.stdin
        assert stdin is not None
        again = keep and self._sent is not None and self._sent == requests
        try:
            if not keep:
                _write_frame(stdin.fileno(), ("once", [tuple(r) for r in requests]))
            elif again:
                _write_frame(stdin.fileno(), ("again",))
            else:
                self._sent = None  # until the worker has it
                _write_frame(stdin.fileno(), ("run", [tuple(r) for r in requests]))
                self._sent = list(requests)
        except OSError:
            raise self._gone() from None

    def stream(self) -> Iterator[list[MadResult]]:
        """Blocking: the answers to the batch last sent, in request order, part by part as the
        worker sends them (see the module docstring). Read it to the end before the next batch:
        a reader that stops early leaves the rest in the pipe (the source then retires us)."""
        while True:
            try:
                with self._reading:
                    msg = self._answer(self._reader.frame())
            except MadWorkerGoneError:
                raise self._gone() from None
            yield list(map(MadResult._make, msg[1]))
            if msg[0] != "part":
                return

    def receive(self) -> list[MadResult]:
        """Blocking: the answers to the batch last sent, in request order."""
        out: list[MadResult] = []
        for part in self.stream():
            out += part
        return out

    def run(self, requests: Sequence[MadRequest], *, keep: bool = True) -> list[MadResult]:
        self.send(requests, keep=keep)
        return self.receive()

    def kill(self) -> None:
        """SIGKILL, from any thread; a reader blocked on this worker gives up at once."""
        self._stop.set()
        with contextlib.suppress(ProcessLookupError, OSError):
            self.proc.kill()

    def close(self, grace: float = 0.5, reap: float = 2.0) -> bool:
        """Blocking: end of input (the worker closes its port and exits), SIGKILL after
        ``grace`` seconds; True once the process is gone and reaped (its pipes closed)."""
        import subprocess  # see the imports

        stdin = self.proc.stdin
        if stdin is not None:
            with contextlib.suppress(OSError):
                stdin.close()
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.kill()
            try:
                self.proc.wait(timeout=reap)
            except subprocess.TimeoutExpired:
                return False
        self._stop.set()
        with self._reading:  # a reader sees the stop (or end of file) within a read slice
            stdout = self.proc.stdout
            if stdout is not None:
                stdout.close()
        return True


# ---------------------------------------------------------------------------------------------
# The child


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when the daemon dies, even by ``kill -9``: no orphan holds a port."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the daemon died before the line above took effect
        os._exit(0)


def _serve(out: int, args: dict[str, Any]) -> int:
    try:
        engine = MadEngine(
            ca=args["ca"], port=int(args["port"]), timeout=float(args["timeout"]),
            retries=int(args["retries"]), window=int(args["window"]),
        )
    except MadError as exc:
        _write_frame(out, ("error", str(exc), exc.cause))
        return 0
    _write_frame(out, ("ready",))
    reader = _Reader(0, threading.Event())
    requests: Sequence[MadRequest] = []

    def batch_of(tuples: list[tuple[Any, ...]]) -> Sequence[MadRequest]:
        return list(map(MadRequest._make, tuples))

    def part(results: list[RawResult]) -> None:
        _write_frame(out, ("part", results))

    with engine:
        while True:
            try:
                msg = reader.frame()
            except MadWorkerGoneError:  # end of input: the daemon closed us
                return 0
            if not isinstance(msg, tuple) or not msg or msg[0] not in ("run", "again", "once"):
                return 0
            if msg[0] == "run":
                requests = batch_of(msg[1])
            batch = batch_of(msg[1]) if msg[0] == "once" else requests
            try:
                results = engine.run_raw(batch, part, STREAM_CHUNK)
            except MadError as exc:
                _write_frame(out, ("error", str(exc), exc.cause))
                return 0
            _write_frame(out, ("ok", results))


def main(argv: Sequence[str]) -> int:
    """The worker process: ``argv[1]`` is its arguments, ``marshal``-ed, in hex (``_CHILD``)."""
    args = marshal.loads(bytes.fromhex(argv[1]))  # noqa: S302 - our own parent, plain types
    _die_with_parent(int(args["parent"]))
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # the daemon decides
        signal.signal(sig, signal.SIG_IGN)
    # The engine allocates short-lived tuples per MAD and creates no cycles: no GC at all.
    gc.disable()
    out = os.dup(1)
    os.dup2(2, 1)  # anything a library prints goes to stderr, never into the frames
    try:
        return _serve(out, args)
    except BrokenPipeError:
        return 0  # the daemon went away mid-answer
    except Exception as exc:  # one line back to the daemon, never a traceback
        with contextlib.suppress(OSError):
            _write_frame(out, ("error", f"MAD worker failed: {type(exc).__name__}: {exc}",
                               "unknown"))
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
