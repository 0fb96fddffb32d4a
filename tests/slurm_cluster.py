"""A real Slurm for tests: munged, slurmctld and one ``slurmd -N <host>`` per simulated host.

Everything runs as root without systemd, in one temporary directory, on free loopback ports,
with a generated ``slurm.conf`` whose node names are the hosts a test asks for (they all
resolve to localhost through ``NodeHostname``). Jobs are ``sleep`` in a batch script, so a test
places jobs on exactly the hosts it wants and ``squeue --json`` lists them as on a cluster.

Nothing here touches the machine's own Slurm or munge (``/etc/slurm``, ``/etc/munge``): the
munge key is generated into the directory and munged listens on a socket there, which
``AuthInfo`` names; Slurm tools find the config through ``SLURM_CONF`` (see ``env``).

    with SlurmCluster(["host001", "host002"], tmp_path) as cluster:
        job = cluster.submit(["host001", "host002"], "train")
        cluster.wait_running(job, timeout=20)
        subprocess.run(["squeue", "--json"], env=cluster.env(), ...)
        cluster.cancel(job)
        cluster.wait_gone(job, timeout=20)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from tests.syspkg import require_binary, unavailable

__all__ = ["SlurmCluster", "SlurmError"]

#: Daemons and tools the cluster needs (their Debian packages are in tests/syspkg.py).
BINARIES = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")
#: How long the daemons get to come up before the cluster gives up with their logs.
START_TIMEOUT = 60.0
#: How long a daemon gets to exit on SIGTERM before its process group is killed.
STOP_GRACE = 5.0
#: Slurm tools get this long per call (a daemon that does not answer fails the call, not the run).
TOOL_TIMEOUT = 30.0


class SlurmError(RuntimeError):
    """The cluster did not come up or a Slurm tool failed; the message carries the logs."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"--- {path.name}: (none)"
    return f"--- {path.name}:\n" + "\n".join(text.splitlines()[-lines:])


class SlurmCluster:
    """munged + slurmctld + a slurmd per host; a context manager that stops them all on exit.

    A missing package skips the test (fails it under CI, as ``tests/syspkg.py`` decides);
    not being root skips it too, since slurmd must start jobs as their user.
    """

    def __init__(self, hosts: list[str], workdir: Path) -> None:
        if not hosts:
            raise ValueError("a cluster needs at least one host")
        self.hosts = list(hosts)
        self.dir = Path(workdir)
        self.conf = self.dir / "slurm.conf"
        #: Unix sockets (munged's, slurmstepd's in the spool) live in a short directory of
        #: their own: a socket path is at most 107 bytes, which pytest's temporary paths under
        #: xdist (``.../popen-gw1/test_<name>0/...``) exceed.
        self.sockets = Path(tempfile.mkdtemp(prefix="slurm-"))
        self.socket = self.sockets / "munge.socket"
        self._procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._logs: list[Path] = []

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> SlurmCluster:
        for name in BINARIES:
            require_binary(name)
        if os.geteuid() != 0:
            unavailable("the Slurm cluster runs slurmd as root (run the test as root)")
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def env(self) -> dict[str, str]:
        """The environment for Slurm tools: this cluster's config, nothing else changed."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def _start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        for sub in ("state", "munge"):
            (self.dir / sub).mkdir(mode=0o700, exist_ok=True)
        (self.sockets / "spool").mkdir(mode=0o700, exist_ok=True)
        key = self.dir / "munge" / "munge.key"
        subprocess.run(
            ["mungekey", "--create", f"--keyfile={key}", "--force"],
            check=True, capture_output=True, timeout=TOOL_TIMEOUT,
        )
        key.chmod(0o600)
        munge_log = self.dir / "munged.log"
        self._spawn("munged", [
            "munged", "--foreground", "--force", f"--socket={self.socket}", f"--key-file={key}",
            f"--log-file={munge_log}", f"--pid-file={self.dir / 'munge' / 'munged.pid'}",
            f"--seed-file={self.dir / 'munge' / 'munged.seed'}",
        ], munge_log)
        self._wait_for(self.socket.exists, "munged's socket")
        self._write_conf()
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)],
                    self.dir / "slurmctld.log")
        for host in self.hosts:
            self._spawn(f"slurmd {host}", ["slurmd", "-D", "-N", host, "-f", str(self.conf)],
                        self.dir / f"slurmd-{host}.log")
        self._wait_for(self._all_idle, "every node idle in sinfo")

    def _write_conf(self) -> None:
        d = self.dir
        nodes = "\n".join(
            f"NodeName={h} NodeHostname=localhost NodeAddr=127.0.0.1 Port={_free_port()} "
            "CPUs=1 State=UNKNOWN"
            for h in self.hosts
        )
        self.conf.write_text(f"""\
ClusterName=ibmontest
SlurmctldHost=localhost
SlurmctldPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.socket}
StateSaveLocation={d / "state"}
SlurmdSpoolDir={self.sockets / "spool"}/%n
SlurmctldPidFile={d / "slurmctld.pid"}
SlurmdPidFile={d / "slurmd-%n.pid"}
SlurmctldLogFile={d / "slurmctld.log"}
SlurmdLogFile={d / "slurmd-%n.log"}
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/linear
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SchedulerType=sched/builtin
SlurmctldTimeout=30
SlurmdTimeout=30
MinJobAge=2
InactiveLimit=0
KillWait=1
{nodes}
PartitionName=debug Default=YES Nodes=ALL MaxTime=INFINITE State=UP
""")

    def _spawn(self, label: str, argv: list[str], log: Path) -> None:
        """A daemon in the foreground in its own session (so its whole group can be killed)."""
        self._logs.append(log)
        out = open(self.dir / f"{label.replace(' ', '-')}.stdout", "wb")  # noqa: SIM115
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, env=self.env(), cwd=self.dir,
            )
        finally:
            out.close()
        self._procs.append((label, proc))

    def _wait_for(self, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            for label, proc in self._procs:
                if proc.poll() is not None:
                    raise SlurmError(f"{label} exited ({proc.returncode}) while waiting for "
                                     f"{what}\n{self.logs()}")
            if ready():
                return
            time.sleep(0.2)
        raise SlurmError(f"no {what} after {START_TIMEOUT:g}s\n{self.logs()}")

    def _all_idle(self) -> bool:
        r = self._tool(["sinfo", "-h", "-N", "-o", "%N %t"], check=False)
        if r.returncode != 0:
            return False
        states = dict(line.split() for line in r.stdout.splitlines() if line.strip())
        return all(states.get(h) == "idle" for h in self.hosts)

    def logs(self) -> str:
        """The last lines of every daemon log and its captured output, for a failure message."""
        parts = [_tail(p) for p in self._logs]
        parts += [_tail(p, 5) for p in sorted(self.dir.glob("*.stdout"))]
        return "\n".join(parts)

    def stop(self) -> None:
        """SIGTERM every daemon's process group, wait a bounded time, then SIGKILL the group."""
        for _, proc in reversed(self._procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        for _, proc in reversed(self._procs):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=STOP_GRACE)
        self._procs.clear()
        # Batch jobs run under slurmstepd, which daemonizes out of slurmd's group: their
        # steps hold our spool directory, so anything still running from it is killed too.
        self._kill_strays()
        shutil.rmtree(self.sockets, ignore_errors=True)

    def _kill_strays(self) -> None:
        """Kill leftover slurmstepd (and their jobs) whose config is this cluster's."""
        me = str(self.conf).encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = (entry / "environ").read_bytes()
                cmd = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"SLURM_CONF=" + me in environ.split(b"\0") or me in cmd:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(entry.name), signal.SIGKILL)

    # -- jobs ------------------------------------------------------------------------------

    def _tool(self, argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(argv, env=self.env(), cwd=self.dir, capture_output=True, text=True,
                           timeout=TOOL_TIMEOUT, check=False)
        if check and r.returncode != 0:
            raise SlurmError(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()}"
                             f"\n{self.logs()}")
        return r

    def submit(self, hosts: list[str], name: str) -> str:
        """A batch job that sleeps on exactly ``hosts``; its job id."""
        r = self._tool([
            "sbatch", "--parsable", "-w", ",".join(hosts), "-N", str(len(hosts)), "-J", name,
            "-o", "/dev/null", "--wrap", "sleep 3600",
        ])
        return r.stdout.strip().split(";")[0]

    def cancel(self, job_id: str) -> None:
        self._tool(["scancel", job_id])

    def state(self, job_id: str) -> str | None:
        """The job's state as squeue prints it (RUNNING, PENDING...), None once it is gone."""
        r = self._tool(["squeue", "-h", "-j", job_id, "-o", "%T"], check=False)
        text = r.stdout.strip()
        return text or None

    def wait_running(self, job_id: str, timeout: float = 30.0) -> None:
        self._wait_state(job_id, timeout, lambda s: s == "RUNNING", "running")

    def wait_gone(self, job_id: str, timeout: float = 30.0) -> None:
        self._wait_state(job_id, timeout, lambda s: s is None or s in _ENDED, "gone")

    def _wait_state(
        self, job_id: str, timeout: float, ok: Callable[[str | None], bool], what: str
    ) -> None:
        deadline = time.monotonic() + timeout
        state: str | None = None
        while time.monotonic() < deadline:
            state = self.state(job_id)
            if ok(state):
                return
            time.sleep(0.2)
        raise SlurmError(f"job {job_id} not {what} after {timeout:g}s (state {state})"
                         f"\n{self.logs()}")


#: Job states squeue may still show for a moment after a job ended (MinJobAge).
_ENDED = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                    "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"})

