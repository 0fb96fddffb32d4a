"""The ``diags`` source: infiniband-diags subprocesses, the portable reference path.

Topology comes from one ``ibnetdiscover -p --cache FILE`` run on the daemon's topology timer:
the text gives the ports and links, the libibnetdisc cache gives every port's raw PortInfo
(state, enabled/supported widths and speeds) for the max-common link rule. Counters come from
``perfquery -x -l <lid> <ports>``, one process per LID (a switch and all its ports, or one CA
port), plus ``perfquery -l`` when the port has no 64-bit error counters (CapMask2 bit 1).
Error and discard details come from ``perfquery -e -E <lid> <port>`` (PortRcvErrorDetails) and
``-D`` (PortXmitDiscardDetails), one process per port and attribute (perfquery reads one port
of them per run), only as ``fabric.DetailReads`` says: for a port whose PortRcvErrors or
PortXmitDiscards moved in this poll (run right after the counters), a baseline for a port new
to the source, a read that failed last poll. A healthy fabric's poll runs not one process more.
``-e`` makes perfquery print the MAD status, which tells a port that does not support the
attribute (error status: not asked again until the next discovery) from one that did not answer.

Every command goes through an injectable ``CommandRunner``. The default one runs argv lists
(never a shell) in their own session and kill scope (``ibmon.sources.procscope``: nothing a
tool starts outlives its command, not even a grandchild that left the session), bounded by a
semaphore, with a per-call timeout and a cap on what is read from the tool. A node that hangs
or prints garbage costs that node's counters for that poll, reported as SourceErrors, never the
sweep: output is parsed strictly (``ibmon.sources.parse``) and refused whole when it is not
exactly what the tool prints.

Timeouts come from the poll's own limit (``ibmon.runtime.polltime``, P = max(5 x interval, 10 s)),
so one hung command is cut off before the poll is: a perfquery may take ``command_timeout``
(default P/4), a discovery or state refresh ``max(P/4, 3P/4 - command_timeout)`` (default P/2).
A poll with a discovery and one hung node then ends within P/2 + P/4 plus the sweep. The first
discovery, with no topology to keep polling, may take 0.9 P; a fabric whose discovery needs more
than the discovery budget needs a longer interval (its timeout says so).

A node whose perfquery timed out is taken off the poll's path: waiting ``command_timeout`` for it
in every poll would hold the whole fabric to its pace (at a 1 s interval, 3 polls in 12 s instead
of 10 in 10 s). Its counter query runs again in the background, one at a time (``_Probe``), and
each poll while it is out reports every one of its ports as a ``timeout`` SourceError with no
values (stale, never hidden), and plans no detail read for them. When a background query ends
with anything but a timeout (an answer, or a fast failure that the normal query will report),
the node is read in that same poll as before; its background answer is not booked, since it was
taken at another time than the poll's.

Discovery keeps the last good topology. An ibnetdiscover that fails (non-zero exit, killed on
timeout, output over the cap), whose text or cache is not exactly the format, whose text and
cache disagree (output cut short), or that finds fewer than half the nodes of the last accepted
discovery (``SHRINK_LIMIT``: a failing local port or SM, not a fabric that lost half its nodes
in one topology interval) is rejected whole: the previous topology stays and polling goes on;
one ``discovery_rejected`` error is counted and one line logged with the cause and a sample. A
shrink seen on ``SHRINK_CONFIRMATIONS`` discoveries in a row is real and accepted. With no
previous topology (the first discovery), a rejected discovery fails the poll.

What one PortXmitWait count stands for (``fabric.WaitUnits``) is decided by each discovery: the
cache's NodeInfo gives every node's vendor and device ID, and a documented ASIC family decides.
For the other nodes the Tick decides, read with ``perfquery -c <lid> <port>`` (PortSamplesControl,
on a node's first port with a LID) once per *model* (vendor and device ID): the Tick is the
ASIC's (ibdiagnet keys it by device family), so the first Tick a model answers is booked on
every port of its nodes, and a fabric of 2,000 ConnectX-5 HCAs (no documented unit) costs one
or two processes a discovery, not 2,000 (on ibsim each costs about 0.3 s of attaching). At most
``TICK_READS_PER_MODEL`` nodes of a model are asked, so one dead node does not cost its model
the Tick; a node without a device ID is a model of its own; no port at the master SM's LID is
asked (``fabric.WaitUnits``). The reads run beside each other
like the counter queries, within one command timeout; a PMA that drops or refuses the Get
(ibsim has no handler for it) leaves the ports with their last Tick's unit or the default, and
costs no error; a tool that fails otherwise or prints junk costs a SourceError of the asked
node's port, never the discovery.

Port state between discoveries: perfquery says nothing about state, so every ``state_interval``
seconds (default 30; 0 = every poll but the one right after a discovery, which just read every
state; None from the config = that default; the schedule is ``fabric.StateSchedule``) one extra
``ibnetdiscover --cache`` process for the whole fabric runs beside the poll's perfquerys, and
every known port takes its state, phys state and active width/speed from the cache's raw
PortInfo (the same decoding as discovery; FDR10, which the cache does not hold, is kept from
the discovery's text while the link stays up at QDR). One process per refresh, not one per
node: ibsim and real fabrics answer a discovery in about the time of a counter sweep, and a
port that goes down is seen within ``state_interval`` instead of the topology interval (5 min).
A refresh that fails applies nothing. Peers and links still change only at discovery; a CA
port that became unreachable (its only link is down) is not in the cache and keeps its last
state, its counters fail and are reported as SourceErrors. The ``mad`` source refreshes state
on every poll instead (one SMP per port in its MAD batch).

Forwarding tables (``Topology.forwarding``): each discovery runs ``ibroute -n <lid>`` for every
switch in the cache, beside the Tick reads and bounded like them (the runner's concurrency,
one command timeout each, a wait for a free slot included: on a fabric of thousands of switches
the last may end as timeouts, each its own SourceError); ``-n`` keeps ibroute
from asking every destination's NodeInfo, NodeDescription and PortInfo. A switch whose ibroute
fails, is cut off or prints anything but its table (``parse.ibroute``, strictly) is left out of
the tables with a SourceError; the discovery goes on (and the routes keep that switch's previous
table: ``ibmon.jobs.routes.ForwardingTables``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final, Literal, Protocol, TypeVar

import structlog
from pydantic import field_validator, model_validator

from ibmon.config import Duration
from ibmon.infiniband.linkspeed import FDR10_BIT
from ibmon.infiniband.model import PortKey, Snapshot, SourceError, Topology
from ibmon.runtime.polltime import poll_timeout
from ibmon.sources.fabric import (
    DETAIL_BASELINES_PER_POLL,
    DetailRead,
    FabricSource,
    FabricSourceConfig,
    FabricView,
    TickOutcome,
    WaitUnits,
)
from ibmon.sources.localport import explain_open_failure, parse_ibstat, umad_access_problem
from ibmon.sources.parse import (
    CPI_CAP2_ADDL_EXT,
    CacheFabric,
    DiscoveredPort,
    NodeInfo,
    ParseError,
    PerfBlock,
    PortCounterValues,
    counters_from_blocks,
    expect_blocks,
    parse_ibnd_cache,
    parse_ibnetdiscover_ports,
    parse_perfquery_blocks,
    parse_perfquery_details,
    parse_perfquery_tick,
)
from ibmon.sources.parse.errors import sample as quote
from ibmon.sources.parse.ibroute import parse_ibroute
from ibmon.sources.procscope import SCOPES, ProcStat, become_subreaper, wait_exit

__all__ = [
    "COMMAND_SHARE",
    "DISCOVERY_MAX_OUTPUT",
    "PERFQUERY_MAX_OUTPUT",
    "SHRINK_CONFIRMATIONS",
    "SHRINK_LIMIT",
    "TICK_READS_PER_MODEL",
    "Budget",
    "CommandResult",
    "CommandRunner",
    "Config",
    "DiagsSource",
    "DiagsSourceConfig",
    "DiagsUnavailableError",
    "SubprocessRunner",
    "budget_for",
    "build",
    "classify",
]

_T = TypeVar("_T")

log = structlog.get_logger("ibmon.sources.diags")

#: Default per-command timeout as a share of the poll timeout.
COMMAND_SHARE: Final = 0.25
#: What is read from a tool at most: a perfquery of the largest switch prints about 100 KiB,
#: ibnetdiscover -p about 150 bytes a port (64 MiB: over 400,000 ports). A tool that prints more
#: is stopped and its output refused (``output_too_large``).
PERFQUERY_MAX_OUTPUT: Final = 4 << 20
DISCOVERY_MAX_OUTPUT: Final = 64 << 20
STDERR_MAX_OUTPUT: Final = 64 << 10
DEFAULT_MAX_OUTPUT: Final = PERFQUERY_MAX_OUTPUT
#: After the tool exits, how long its pipes may stay open (its leftovers are killed first).
EOF_GRACE: Final = 1.0
#: The longest a command's clean-up can take after its timeout (reaping, leftovers, pipes).
CLEANUP_MAX: Final = 3 * EOF_GRACE
#: A discovery with fewer nodes than this share of the last accepted one is implausible...
SHRINK_LIMIT: Final = 0.5
#: ...until this many discoveries in a row agree that the fabric did shrink.
SHRINK_CONFIRMATIONS: Final = 3
#: Share of the poll timeout the first discovery may take (there is no sweep to protect yet).
FIRST_DISCOVERY_SHARE: Final = 0.9
#: Upper bound of a configured command timeout.
MAX_COMMAND_TIMEOUT: Final = 3600.0
#: Nodes of one model (vendor and device ID) whose Tick a discovery asks at most: the first
#: Tick answered stands for the model, the second node covers a first that does not answer.
TICK_READS_PER_MODEL: Final = 2


@dataclass(frozen=True, slots=True)
class Budget:
    """How a diags poll splits the poll timeout: ``poll`` (the pipeline's limit), ``command``
    (one perfquery), ``discovery`` (one ibnetdiscover, discovery or state refresh)."""

    poll: float
    command: float
    discovery: float

    @property
    def fits(self) -> bool:
        """Whether one hung command still leaves half the poll for discovery and the sweep."""
        return self.command <= self.poll / 2


def budget_for(interval: float, command_timeout: float | None = None) -> Budget:
    """The timeouts of a diags source polled every ``interval`` seconds (module docstring)."""
    poll = poll_timeout(interval)
    command = command_timeout if command_timeout is not None else poll * COMMAND_SHARE
    discovery = max(poll / 4, poll * 3 / 4 - command)
    return Budget(poll=poll, command=command, discovery=discovery)


class DiagsSourceConfig(FabricSourceConfig):
    """``type = "diags"``: the whole fabric via infiniband-diags processes."""

    type: Literal["diags"] = "diags"
    #: wall-clock limit of one perfquery (one node); None = a quarter of the poll timeout
    command_timeout: Duration | None = None
    #: run ``ibroute`` per switch at discovery (``Topology.forwarding``: job attribution by
    #: route); on by default with a ``[slurm]``
    #: section (``Settings``); off, attribution falls back to leaf spans
    forwarding_tables: bool = False

    @field_validator("command_timeout")
    @classmethod
    def _check_command_timeout(cls, v: float | None) -> float | None:
        if v is not None and not (math.isfinite(v) and v <= MAX_COMMAND_TIMEOUT):
            raise ValueError(f"command_timeout must be at most {MAX_COMMAND_TIMEOUT:.0f}s")
        return v

    @model_validator(mode="after")
    def _warn_when_it_cannot_fit(self) -> DiagsSourceConfig:
        """Say at load time when one hung node would still cost the whole poll."""
        for problem in self.budget_problems():
            log.warning("diags_command_timeout", source=self.label, problem=problem)
        return self

    @property
    def budget(self) -> Budget:
        return budget_for(self.interval, self.command_timeout)

    def budget_problems(self) -> list[str]:
        """Why the configured timeouts defeat "a hung node costs only that node" (or [])."""
        b = self.budget
        problems = []
        if not b.fits:
            problems.append(
                f"command_timeout {b.command:g}s is over half the {b.poll:g}s poll timeout "
                f"(5 x interval, at least 10s): one hung node can fail the whole poll; "
                f"use at most {b.poll / 2:g}s or a longer interval"
            )
        if b.command < self.timeout:
            problems.append(
                f"command_timeout {b.command:g}s is shorter than one MAD timeout "
                f"({self.timeout:g}s): a slow node is killed before it can answer"
            )
        return problems


Config = DiagsSourceConfig


def build(cfg: DiagsSourceConfig) -> DiagsSource:
    return DiagsSource.from_config(cfg)


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What one command did. ``rc`` is None when it was killed on timeout.

    ``too_large``: it printed more than the runner reads and was stopped; ``strays``: how many
    processes it left behind (killed once it was over).
    """

    rc: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    duration: float = 0.0
    too_large: bool = False
    strays: int = 0


class CommandRunner(Protocol):
    async def run(
        self, argv: list[str], timeout: float, max_output: int = DEFAULT_MAX_OUTPUT
    ) -> CommandResult: ...


class DiagsUnavailableError(RuntimeError):
    """The diags source cannot work at all (tool missing, no permission): the whole poll fails.

    ``cause`` is ``absent``, ``permission`` or ``unknown`` when the local port could not be
    opened (see ``ibmon.sources.localport``), else None.
    """

    def __init__(self, message: str, cause: str | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class _Capped:
    """Reads one pipe up to ``limit`` bytes; past it, calls ``overflow`` (stop the tool)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()
        self.overflowed = False

    async def pump(
        self, stream: asyncio.StreamReader | None, overflow: Callable[[], None]
    ) -> None:
        if stream is None:
            return
        while chunk := await stream.read(65536):
            room = self.limit - len(self.data)
            if len(chunk) > room:
                self.data += chunk[:room]
                self.overflowed = True
                overflow()
                return
            self.data += chunk


class SubprocessRunner:
    """asyncio subprocesses: own session and kill scope, bounded concurrency, capped output.

    ``adopt_orphans`` makes this process a child subreaper on first use (see
    ``ibmon.sources.procscope``), so a tool's leftovers are found however they detached.
    """

    def __init__(
        self,
        *,
        concurrency: int = 4,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        adopt_orphans: bool = True,
    ) -> None:
        self._sem = asyncio.Semaphore(max(1, concurrency))
        self._env = dict(env) if env is not None else None
        self._cwd = cwd
        self._adopt = adopt_orphans
        self._stray_log: dict[str, tuple[float, int]] = {}
        self._cleanups: set[asyncio.Future[list[ProcStat]]] = set()

    async def run(
        self, argv: list[str], timeout: float, max_output: int = DEFAULT_MAX_OUTPUT
    ) -> CommandResult:
        async with self._sem:
            return await self._run(argv, timeout, max_output)

    async def _run(self, argv: list[str], timeout: float, max_output: int) -> CommandResult:
        if self._adopt:
            become_subreaper()
        start = time.monotonic()
        token = SCOPES.open()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
                env=SCOPES.env(token, self._env),
                cwd=self._cwd,
            )
        except FileNotFoundError:
            SCOPES.discard(token)
            return CommandResult(127, "", f"{argv[0]}: command not found")
        except OSError as exc:  # permission, not executable, bad interpreter
            SCOPES.discard(token)
            return CommandResult(126, "", f"{argv[0]}: {exc.strerror or exc}")
        out, err = _Capped(max_output), _Capped(STDERR_MAX_OUTPUT)
        exited = False

        def stop() -> None:
            if not exited and proc.returncode is None:
                SCOPES.stop(proc.pid)

        readers = [
            asyncio.ensure_future(out.pump(proc.stdout, stop)),
            asyncio.ensure_future(err.pump(proc.stderr, stop)),
        ]
        timed_out = False
        left: list[ProcStat] | None = None
        try:
            async with asyncio.timeout(timeout):
                # Not proc.wait(): it also waits for the pipes, which a leftover holds open.
                await wait_exit(proc.pid, lambda: proc.returncode is not None)
                exited = True
                # The tool is gone; whatever still holds its pipes is a leftover of it.
                left = await SCOPES.close(token, proc.pid)
                await asyncio.wait(readers, timeout=EOF_GRACE)
        except TimeoutError:
            timed_out = True
        finally:
            stop()
            # The clean-up runs to its end even when this command is cancelled (a poll's
            # deadline, a shutdown): a tool is never left unreaped nor its pipes open.
            cleanup = asyncio.ensure_future(self._finish(proc, token, readers, left is None))
            self._cleanups.add(cleanup)
            cleanup.add_done_callback(self._cleanups.discard)
            more = await asyncio.shield(cleanup)
        left = (left or []) + more
        if left:
            self._report_strays(argv[0], left)
        return CommandResult(
            None if timed_out else proc.returncode,
            out.data.decode("utf-8", "replace"),
            err.data.decode("utf-8", "replace"),
            timed_out,
            time.monotonic() - start,
            too_large=out.overflowed or err.overflowed,
            strays=len(left),
        )

    @staticmethod
    async def _finish(
        proc: asyncio.subprocess.Process,
        token: str,
        readers: Sequence[asyncio.Future[None]],
        close_scope: bool,
    ) -> list[ProcStat]:
        """After a command, whatever happened: the tool reaped, its scope closed, its readers
        and pipes closed (a stray we could not find may still hold them)."""
        left: list[ProcStat] = []
        transport = getattr(proc, "_transport", None)
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(EOF_GRACE):
                    await wait_exit(proc.pid, lambda: proc.returncode is not None)
            if close_scope:
                left = await SCOPES.close(token, proc.pid)
        finally:
            for reader in readers:
                reader.cancel()
            if transport is not None:
                transport.close()
        await asyncio.gather(*readers, return_exceptions=True)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(EOF_GRACE):
                await asyncio.shield(proc.wait())
        return left

    async def aclose(self) -> None:
        """Let the clean-ups of cancelled commands finish (bounded: each is)."""
        if self._cleanups:
            await asyncio.wait(set(self._cleanups), timeout=CLEANUP_MAX)

    def _report_strays(self, tool: str, left: Sequence[ProcStat]) -> None:
        """One warning per tool and minute: a tool that always misbehaves must not flood."""
        name = os.path.basename(tool)
        now = time.monotonic()
        last, suppressed = self._stray_log.get(name, (-math.inf, 0))
        if now - last < 60.0:
            self._stray_log[name] = (last, suppressed + 1)
            return
        self._stray_log[name] = (now, 0)
        log.warning(
            "tool_left_processes",
            tool=name,
            killed=len(left),
            processes=[quote(st.comm, 32) for st in left[:5]],
            similar_since_last=suppressed,
        )


#: what libibmad/libibnetdisc print when the local umad port does not open
_OPEN_FAILED = re.compile(r"can't open (?:UMAD|MAD) port", re.IGNORECASE)
#: what libibmad prints (with ``-e``) when the PMA answered with an error status
_MAD_STATUS = re.compile(r"MAD completed with error status (0x[0-9a-fA-F]+)")
_MAD_TIMEOUT_HINTS = ("timed out", "timeout", "_do_madrpc failed", "mad_rpc")
_NO_LID_HINTS = (
    "can't resolve",
    "unable to resolve",
    "invalid lid",
    "no such",
    "bad lid",
    "can't find",
    "not found in",
)
_PERM_HINTS = (
    "permission denied",
    "can't open umad",
    "operation not permitted",
    "can't open",
    "eacces",
)


def classify(res: CommandResult) -> str | None:
    """None when the command succeeded, else the ``reason`` of its SourceError.

    timeout (we killed it), output_too_large (it printed more than is read; we stopped it),
    tool_missing, permission, crashed (killed by a signal), mad_status (the MAD was answered
    with an error status; printed only with ``-e``), mad_timeout (the tool gave up on a MAD),
    no_such_lid, failed (any other non-zero exit).
    """
    if res.timed_out:
        return "timeout"
    if res.too_large:
        return "output_too_large"
    if res.rc == 0:
        return None
    if res.rc == 127:
        return "tool_missing"
    if res.rc is not None and res.rc < 0:
        return "crashed"
    err = res.stderr.lower()
    if any(h in err for h in _PERM_HINTS):
        return "permission"
    if _MAD_STATUS.search(res.stderr):  # before the timeout hints: libibmad's "mad_rpc: ..."
        return "mad_status"
    if any(h in err for h in _MAD_TIMEOUT_HINTS):
        return "mad_timeout"
    if any(h in err for h in _NO_LID_HINTS):
        return "no_such_lid"
    if res.rc == 126:
        return "permission"
    return "failed"


def _first_line(text: str) -> str:
    for line in text.splitlines():
        s = line.strip()
        if s and "sim_connect" not in s:
            return quote(s, 200)
    return ""


@dataclass(slots=True)
class _Group:
    """Ports polled by one perfquery process: one LID, its port numbers."""

    lid: int
    keys: list[PortKey]


@dataclass(frozen=True, slots=True)
class _Probe:
    """A timed-out node's counter query re-run off the poll's path: one at a time per node,
    bounded by the command timeout, so a node that stays hung costs one process, not a poll."""

    argv: list[str]
    task: asyncio.Task[CommandResult]


class _RejectedError(Exception):
    """A discovery that must not replace the topology: ``cause`` and a one-line ``detail``."""

    def __init__(self, cause: str, detail: str) -> None:
        super().__init__(f"{cause}: {detail}")
        self.cause = cause
        self.detail = detail


def _check_complete(ports: list[DiscoveredPort], fab: CacheFabric) -> None:
    """The text and the cache of one ibnetdiscover run describe the same fabric.

    Both come from the same libibnetdisc fabric, so every node is in both and the text has a
    line for every port in the cache but switch port 0. A text cut short at a line boundary
    parses cleanly; this is what catches it.
    """
    own = fab.owner
    text_ports = {(own.get(p.guid, p.guid), p.port) for p in ports}
    cache_ports = {k for k in fab.ports if k[1] != 0}
    text_nodes = {k[0] for k in text_ports}
    if text_nodes != set(fab.nodes):
        lost = len(set(fab.nodes) - text_nodes)
        raise _RejectedError(
            "incomplete",
            f"the text lacks {lost} of the {len(fab.nodes)} nodes in the cache (cut short?)",
        )
    if text_ports != cache_ports:
        missing = sorted(cache_ports - text_ports)
        extra = sorted(text_ports - cache_ports)
        guid, port = (missing or extra)[0]
        raise _RejectedError(
            "incomplete",
            f"text and cache disagree on ports (text lacks {len(missing)}, cache lacks "
            f"{len(extra)}; e.g. {guid} port {port})",
        )


class DiagsSource(FabricSource):
    """Fabric-wide source over ibnetdiscover + perfquery (see module docstring)."""

    def __init__(
        self,
        *,
        name: str = "diags",
        runner: CommandRunner | None = None,
        ca: str | None = None,
        port: int | None = None,
        timeout: float = 1.0,
        retries: int = 2,
        concurrency: int = 8,
        include: Sequence[str] = (),
        exclude: Sequence[str] = (),
        shard: str | None = None,
        node_name_map: str | os.PathLike[str] | None = None,
        interval: float = 10.0,
        discover_timeout: float | None = None,
        ibnetdiscover: str = "ibnetdiscover",
        perfquery: str = "perfquery",
        ibstat: str = "ibstat",
        ibroute: str = "ibroute",
        forwarding_tables: bool = False,
        command_timeout: float | None = None,
        state_interval: float = 30.0,
        topology_interval: float = 300.0,
        unreachable_discoveries: int = 3,
        details: bool = True,
        detail_baselines_per_poll: int = DETAIL_BASELINES_PER_POLL,
    ) -> None:
        super().__init__(
            name=name,
            include=include,
            exclude=exclude,
            shard=shard,
            node_name_map=node_name_map,
            state_interval=state_interval,
            topology_interval=topology_interval,
            unreachable_discoveries=unreachable_discoveries,
            details=details,
            detail_baselines_per_poll=detail_baselines_per_poll,
        )
        self._runner: CommandRunner = runner or SubprocessRunner(concurrency=concurrency)
        # as infiniband-diags: no -P (or port 0) = libibumad picks the port (a switch: 0)
        self._ca, self._port = ca, port or None
        self._ca_args = (["-C", ca] if ca else []) + (["-P", str(port)] if port else [])
        self._timeout = timeout
        self._retries = retries
        b = budget_for(interval, command_timeout)
        if discover_timeout is not None:
            b = replace(b, discovery=discover_timeout)
        self.budget = b
        self._ibnetdiscover = ibnetdiscover
        self._perfquery = perfquery
        self._ibstat = ibstat
        self._ibroute = ibroute
        #: run ibroute per switch at discovery (``Topology.forwarding``)
        self._tables = forwarding_tables
        self._tmp = Path(tempfile.mkdtemp(prefix="ibmon-diags-"))
        self._groups: list[_Group] = []
        self._need_narrow: dict[int, bool] = {}
        #: nodes of the last accepted discovery (before filters), and implausible ones in a row
        self._good_nodes = 0
        self._shrinks = 0
        #: nodes (by LID) whose perfquery timed out: their query re-run in the background
        self._probes: dict[int, _Probe] = {}

    @classmethod
    def from_config(cls, cfg: DiagsSourceConfig) -> DiagsSource:
        return cls(
            name=cfg.label,
            ca=cfg.ca,
            port=cfg.port,
            timeout=cfg.timeout,
            retries=cfg.retries,
            concurrency=cfg.concurrency,
            include=cfg.include,
            exclude=cfg.exclude,
            shard=cfg.shard,
            interval=cfg.interval,
            command_timeout=cfg.command_timeout,
            state_interval=cfg.state_interval if cfg.state_interval is not None else 30.0,
            topology_interval=cfg.topology_interval,
            unreachable_discoveries=cfg.unreachable_discoveries,
            forwarding_tables=cfg.forwarding_tables,
        )

    # ----------------------------------------------------------------- per-command timeout

    @property
    def command_timeout(self) -> float:
        """Wall-clock budget of one perfquery (``budget``: a quarter of the poll by default)."""
        return self.budget.command

    # ----------------------------------------------------------------- discovery

    async def discover(self) -> Topology:
        started = time.monotonic()
        errors: list[SourceError] = []
        try:
            ports, fab = await self._discover_once(errors)
            self._judge_size(len(fab.nodes))
        except _RejectedError as rejected:
            return self._keep_topology(rejected, errors)
        view = self._view_from(ports, fab)
        infos = {guid: node.info for guid, node in fab.nodes.items()}
        devices = {guid: info.device_id for guid, info in infos.items()}
        sm_lids = {pi.sm_lid for pi in fab.ports.values()}
        outcomes, tables = await asyncio.gather(
            self._read_ticks(view, infos, errors, sm_lids), self._read_tables(fab, errors))
        errors += self.wait_units.decide(self.name, view, devices, outcomes)
        self._good_nodes, self._shrinks = len(fab.nodes), 0
        topo = self._adopt(view, errors, started, reached=len(fab.nodes))
        topo.forwarding = tables
        assert self._view is not None  # the merged view: unreachable nodes are still asked
        self._groups = [_Group(lid, keys) for lid, keys in self._view.by_lid().items()]
        return topo

    async def _discover_once(
        self, errors: list[SourceError]
    ) -> tuple[list[DiscoveredPort], CacheFabric]:
        """One ibnetdiscover run, read strictly; _RejectedError when it cannot be the topology."""
        cache = self._tmp / "fabric.cache"
        with contextlib.suppress(FileNotFoundError):
            cache.unlink()
        argv = [
            self._ibnetdiscover,
            *self._ca_args,
            "-t",
            str(int(self._timeout * 1000)),
            "-p",
            "--cache",
            str(cache),
        ]
        # With no topology yet there is no sweep to protect: the first discovery may take
        # nearly the whole poll (that poll then fails; the next one polls what it found).
        first = self._view is None
        limit = self.budget.poll * FIRST_DISCOVERY_SHARE if first else self.budget.discovery
        res = await self._runner.run(argv, limit, DISCOVERY_MAX_OUTPUT)
        if res.strays:
            errors.append(SourceError("stray_process", f"ibnetdiscover left {res.strays}"))
        reason = classify(res)
        if reason is not None and _OPEN_FAILED.search(res.stderr):
            raise await self._open_failure(res)
        if reason in ("tool_missing", "permission"):
            raise DiagsUnavailableError(f"ibnetdiscover: {reason}: {_first_line(res.stderr)}")
        if reason == "timeout":
            raise _RejectedError(reason, f"ibnetdiscover took over {limit:g}s (the discovery "
                                 "budget, from the poll timeout: a longer interval raises it)")
        if reason is not None:
            raise _RejectedError(reason, _first_line(res.stderr) or f"exit status {res.rc}")
        try:
            ports = parse_ibnetdiscover_ports(res.stdout)
        except ParseError as exc:
            raise _RejectedError("parse_error", str(exc)) from None
        if not ports:
            raise _RejectedError("empty", "ibnetdiscover printed no ports")
        try:
            fab = parse_ibnd_cache(cache.read_bytes())
        except (OSError, ParseError) as exc:
            raise _RejectedError("cache_unreadable", str(exc)) from None
        _check_complete(ports, fab)
        return ports, fab

    async def _read_ticks(
        self,
        view: FabricView,
        nodes: Mapping[str, NodeInfo],
        errors: list[SourceError],
        sm_lids: Container[int] = (),
    ) -> dict[PortKey, TickOutcome]:
        """PortSamplesControl.Tick of the nodes in ``view`` whose device ID is no documented
        family (module docstring): one ``perfquery -c`` per node, on its lowest-numbered port
        with a LID, for at most ``TICK_READS_PER_MODEL`` nodes of each model (vendor and
        device ID; a node without a device ID is a model of its own). The first Tick a model
        answers is booked on all its nodes' ports; a read that gave none is booked on the
        asked node's ports only. Each read is bounded like a counter query (``_bounded``: a
        wait for a free runner slot counts): one that ends on that bound is a "timeout" error
        of the node's port, which then has the fallback unit."""
        by_node: dict[str, list[PortKey]] = {}
        for key in view.ports:
            info = nodes.get(key[0])
            if WaitUnits.needs_tick(info.device_id if info is not None else None):
                by_node.setdefault(key[0], []).append(key)
        models: dict[tuple[int, int] | str, list[str]] = {}
        for guid in sorted(by_node):
            info = nodes.get(guid)
            model: tuple[int, int] | str = (
                (info.vendor_id, info.device_id) if info is not None and info.device_id else guid
            )
            models.setdefault(model, []).append(guid)
        asked: list[tuple[list[str], str, int, int]] = []  # (model's nodes, node, lid, port)
        for guids in models.values():
            tries = 0
            for guid in guids:
                # never at a subnet manager's LID (``fabric.WaitUnits``: ibsim would hand
                # the Get to opensm, which exits)
                with_lid = [k for k in by_node[guid]
                            if view.ports[k].lid and view.ports[k].lid not in sm_lids]
                if not with_lid or tries == TICK_READS_PER_MODEL:
                    continue
                first = min(with_lid, key=lambda k: int(k[1]))
                lid = view.ports[first].lid
                assert lid is not None
                asked.append((guids, guid, lid, int(first[1])))
                tries += 1
        if not asked:
            return {}
        tasks = [asyncio.ensure_future(self._read_tick(lid, port, errors))
                 for _guids, _guid, lid, port in asked]
        done = await self._all_within_discovery(tasks)
        out: dict[PortKey, TickOutcome] = {}
        answered: set[int] = set()  # models (by id of their node list) that gave a Tick
        for (guids, guid, _lid, _port), task in zip(asked, tasks, strict=True):
            got: TickOutcome = (
                task.result() if task in done
                else ("unread", "no answer within the discovery's command timeout")
            )
            if isinstance(got, int):
                if id(guids) not in answered:
                    answered.add(id(guids))
                    for other in guids:
                        for key in by_node[other]:
                            was = out.get(key)
                            if isinstance(was, tuple) and was[0] != "unread":
                                # the model's Tick stands, the broken read is still reported
                                errors.append(SourceError(
                                    was[0], f"{key[0]} port {key[1]}: PortSamplesControl: "
                                    f"{was[1]}", key))
                            out[key] = got
            elif id(guids) not in answered:
                for key in by_node[guid]:
                    out[key] = got
        return out

    async def _all_within_discovery(
        self, tasks: list[asyncio.Task[_T]]
    ) -> set[asyncio.Task[_T]]:
        """The reads of ``tasks`` done within the discovery's bound. Each read has a bound of
        its own (``_bounded``, a wait for a free runner slot included), a second shorter than
        this one, so a hung or long-queued read ends as its own timeout; this bound is the
        backstop, and every read is cancelled with the discovery: none outlives it. A read that
        raised is a bug, raised here."""
        try:
            done, _late = await asyncio.wait(tasks, timeout=self.command_timeout + 2.0)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        bugs = [exc for task in done if (exc := task.exception()) is not None]
        if bugs:
            raise bugs[0]
        return done

    async def _read_tables(self, fab: CacheFabric, errors: list[SourceError]) -> dict[str, bytes]:
        """Every switch's LinearForwardingTable by ``ibroute -n <lid>`` (module docstring):
        switch node GUID -> egress port per LID; the switches that failed are left out."""
        if not self._tables:
            return {}
        asked: list[tuple[str, int, int]] = []  # (guid, lid, ports)
        for guid, node in sorted(fab.nodes.items()):
            if node.node_type != "switch":
                continue
            lid = fab.port_lids.get((guid, 0)) or next(
                (fab.port_lids[(guid, p)] for p in range(1, node.num_ports + 1)
                 if fab.port_lids.get((guid, p))), 0)
            if lid:
                asked.append((guid, lid, node.num_ports))
        if not asked:
            return {}
        tasks = [asyncio.ensure_future(self._read_table(guid, lid, n, errors))
                 for guid, lid, n in asked]
        done = await self._all_within_discovery(tasks)
        late = set(tasks) - done
        if late:
            errors.append(SourceError(
                "timeout", f"ibroute: {len(late)} of {len(asked)} switches' forwarding tables "
                "not read within the discovery's command timeout"))
        out: dict[str, bytes] = {}
        for (guid, _lid, _n), task in zip(asked, tasks, strict=True):
            if task in done and (table := task.result()) is not None:
                out[guid] = table
        return out

    async def _read_table(
        self, guid: str, lid: int, num_ports: int, errors: list[SourceError]
    ) -> bytes | None:
        """One ``ibroute -n <lid>``: the switch's table, or None (its SourceError booked)."""
        argv = [self._ibroute, *self._ca_args, "-t", str(int(self._timeout * 1000)), "-n",
                str(lid)]
        res = await self._bounded(argv)
        if res.strays:
            errors.append(SourceError("stray_process", f"lid {lid}: ibroute left {res.strays}"))
        reason = classify(res)
        if reason is not None:
            errors.append(SourceError(reason, f"{guid}: ibroute {lid}: "
                                      f"{_first_line(res.stderr) or f'exit status {res.rc}'}"))
            return None
        try:
            got = parse_ibroute(res.stdout, lid=lid, num_ports=num_ports)
        except ParseError as exc:
            errors.append(SourceError("parse_error", f"{guid}: ibroute {lid}: {exc}"))
            return None
        if got.guid != guid:
            errors.append(SourceError("parse_error", f"{guid}: ibroute {lid} printed the table "
                                      f"of {got.guid} (LIDs moved since the discovery)"))
            return None
        return got.table

    async def _read_tick(self, lid: int, port: int, errors: list[SourceError]) -> TickOutcome:
        """One ``perfquery -e -c <lid> <port>``: the Tick, or why there is none ("unread" when
        the PMA dropped or refused the Get; ``-e`` prints a refusal's MAD status)."""
        argv = [self._perfquery, *self._ca_args, "-t", str(int(self._timeout * 1000)), "-e",
                "-c", str(lid), str(port)]
        res = await self._bounded(argv)
        if res.strays:
            errors.append(SourceError("stray_process", f"lid {lid}: perfquery -c left "
                                      f"{res.strays}"))
        reason = classify(res)
        why = f"perfquery -c {lid} {port}: {_first_line(res.stderr) or f'exit status {res.rc}'}"
        if reason in ("mad_timeout", "mad_status"):
            return ("unread", why)
        if reason is not None:
            return (reason, why)
        try:
            return parse_perfquery_tick(res.stdout, lid=lid, port=port)
        except ParseError as exc:
            return ("parse_error", f"perfquery -c {lid} {port}: {exc}")

    def _judge_size(self, nodes: int) -> None:
        """Far fewer nodes than last time is implausible, until it keeps being so."""
        if nodes >= self._good_nodes * SHRINK_LIMIT:
            return
        self._shrinks += 1
        if self._shrinks >= SHRINK_CONFIRMATIONS:
            log.warning(
                "fabric_shrank", source=self.name, nodes=nodes, before=self._good_nodes,
                discoveries=self._shrinks,
            )
            return
        raise _RejectedError(
            "implausible",
            f"{nodes} nodes where the last accepted discovery had {self._good_nodes} "
            f"({self._shrinks} of {SHRINK_CONFIRMATIONS} needed to accept a shrink)",
        )

    def _keep_topology(self, rejected: _RejectedError, errors: list[SourceError]) -> Topology:
        """A rejected discovery: keep polling the last good view, say so once."""
        if self._view is None:
            raise DiagsUnavailableError(
                f"ibnetdiscover: no topology yet and this discovery was rejected "
                f"({rejected.cause}: {rejected.detail})"
            )
        log.warning(
            "discovery_rejected",
            source=self.name,
            cause=rejected.cause,
            detail=rejected.detail,
            kept_ports=len(self._view.ports),
        )
        errors.append(
            SourceError("discovery_rejected", f"{rejected.cause}: {rejected.detail}")
        )
        self._discover_errors = errors
        return self._view.topology()

    async def _open_failure(self, res: CommandResult) -> DiagsUnavailableError:
        """Why ibnetdiscover could not open the local port, from what ``ibstat`` shows."""
        stat = await self._runner.run([self._ibstat], self.budget.command)
        if classify(stat) is not None:
            return DiagsUnavailableError(
                f"ibnetdiscover: cannot open the local MAD port: {_first_line(res.stderr)} "
                f"(ibstat could not list the local CAs: {classify(stat)})"
            )
        failure = explain_open_failure(
            parse_ibstat(stat.stdout),
            self._ca,
            self._port,
            access_problem=umad_access_problem(),
        )
        return DiagsUnavailableError(f"ibnetdiscover: {failure.message}", failure.cause)

    def _view_from(self, ports: list[DiscoveredPort], fab: CacheFabric) -> FabricView:
        """The filtered, linked and sharded view of ``ibnetdiscover -p`` plus its cache."""
        # -p prints CA *port* GUIDs; the cache knows which node owns each port.
        own = fab.owner
        ports = [
            replace(
                p,
                guid=own.get(p.guid, p.guid),
                remote_guid=own.get(p.remote_guid, p.remote_guid) if p.remote_guid else None,
            )
            for p in ports
        ]
        view = FabricView(source=self.name)
        for p in ports:
            if not self._filter.keep(p.guid, p.desc):
                continue
            key, fp = view.add(
                p.guid, p.port, desc=self._desc(p.guid, p.desc), node_type=p.node_type, lid=p.lid
            )
            fp.active_width, fp.active_speed = p.width, p.speed
            if p.remote_guid is not None and p.remote_port is not None:
                fp.remote = (p.remote_guid, p.remote_port)
            info = fab.ports.get((p.guid, p.port))
            if info is not None:
                if p.speed == "FDR10":  # only the text has it: the cache keeps no vendor attribute
                    info = info._replace(mlnx_speed_supported=FDR10_BIT,
                                         mlnx_speed_enabled=FDR10_BIT, mlnx_speed_active=FDR10_BIT)
                view.apply_port_info(key, info)
        peer_desc = {
            p.remote_guid: self._desc(p.remote_guid, p.remote_desc or "")
            for p in ports
            if p.remote_guid is not None
        }
        return self._finish(view, peer_desc)

    # ----------------------------------------------------------------- counters

    async def sample(self) -> Snapshot:
        view, discover_errors, refresh = await self._prepare_sample()
        snap = Snapshot(source=self.name, monotonic=time.monotonic(), wall=time.time())
        snap.errors.extend(discover_errors)
        state_task = asyncio.ensure_future(self._refresh_state(view)) if refresh else None
        details = self.details
        lids = {g.lid for g in self._groups}
        for lid in [lid for lid in self._probes if lid not in lids]:
            self._probes.pop(lid).task.cancel()
        out = {g.lid for g in self._groups if self._still_hung(g.lid)}
        # baselines and owed re-reads are known now: they run beside the counter queries
        early = details.planned(k for g in self._groups if g.lid not in out for k in g.keys)
        try:
            results, early_out = await asyncio.gather(
                asyncio.gather(*(self._poll_group(g, g.lid in out) for g in self._groups)),
                asyncio.gather(*(self._read_details(view, r) for r in early)),
            )
        except BaseException:
            if state_task is not None:
                state_task.cancel()
                with contextlib.suppress(BaseException):
                    await state_task
            raise
        if state_task is not None:
            snap.errors.extend(await state_task)
        values: dict[PortKey, PortCounterValues] = {}
        for group, (by_port, errors) in zip(self._groups, results, strict=True):
            snap.errors.extend(errors)
            for key in group.keys:
                port_values = by_port.get(int(key[1]))
                if port_values is not None:
                    values[key] = port_values
        self._record_details(early, early_out, values, snap.errors)
        late = details.moved(values, set(early))
        late_out = await asyncio.gather(*(self._read_details(view, r) for r in late))
        self._record_details(late, late_out, values, snap.errors)
        details.fill(values)
        details.report_learned(self.name)
        self._fill(snap, view, values)
        return snap

    async def _read_details(
        self, view: FabricView, read: DetailRead
    ) -> dict[str, int] | SourceError:
        """One ``perfquery -e -E|-D <lid> <port>``: the values, or why there are none (a
        SourceError whose reason ``mad_status`` means the PMA refused the attribute)."""
        key, attr = read
        lid = view.ports[key].lid
        flag = "-E" if attr == "PortRcvErrorDetails" else "-D"
        argv = [self._perfquery, *self._ca_args, "-t", str(int(self._timeout * 1000)), "-e",
                flag, str(lid), key[1]]
        where = f"lid {lid}: perfquery {flag} {lid} {key[1]}"
        res = await self._bounded(argv)
        reason = classify(res)
        if reason in ("tool_missing", "permission"):
            raise DiagsUnavailableError(f"perfquery: {reason}: {_first_line(res.stderr)}")
        if reason == "mad_status" and f"cannot query {attr}" not in res.stdout:
            reason = "failed"  # an error status, but not to this attribute's Get
        if reason is not None:
            return SourceError(reason, f"{where}: {_first_line(res.stderr)}", key)
        try:
            return parse_perfquery_details(res.stdout, attribute=attr, lid=lid, port=int(key[1]))
        except ParseError as exc:
            return SourceError("parse_error", f"{where}: {exc}", key)

    def _record_details(
        self,
        reads: Sequence[DetailRead],
        outcomes: Sequence[dict[str, int] | SourceError],
        answered: Mapping[PortKey, PortCounterValues],
        errors: list[SourceError],
    ) -> None:
        """Book detail reads: values, a refusal (unsupported), or a miss (owed, reported)."""
        details = self.details
        for read, got in zip(reads, outcomes, strict=True):
            if not isinstance(got, SourceError):
                details.answered(read, got)
            elif got.reason == "mad_status":
                details.refused(read)
            else:
                details.missed(read, port_answered=read[0] in answered)
                errors.append(got)

    async def _refresh_state(self, view: FabricView) -> list[SourceError]:
        """One ibnetdiscover for the whole fabric; apply its PortInfo to every known port.

        All or nothing: a refresh that failed, or whose cache is not exactly the format,
        applies no state at all (one error says why).
        """
        cache = self._tmp / "state.cache"
        with contextlib.suppress(FileNotFoundError):
            cache.unlink()
        argv = [
            self._ibnetdiscover,
            *self._ca_args,
            "-t",
            str(int(self._timeout * 1000)),
            "--cache",
            str(cache),
        ]
        res = await self._runner.run(argv, self.budget.discovery, DISCOVERY_MAX_OUTPUT)
        errors = []
        if res.strays:
            errors.append(SourceError("stray_process", f"state refresh left {res.strays}"))
        reason = classify(res)
        if reason is not None:
            why = _first_line(res.stderr) or f"exit status {res.rc}"
            return [*errors, SourceError(reason, f"state refresh: {why}")]
        try:
            fab = parse_ibnd_cache(cache.read_bytes())
        except (OSError, ParseError) as exc:
            return [*errors, SourceError("cache_unreadable", f"state refresh: {exc}")]
        for key in view.ports:
            info = fab.ports.get((key[0], int(key[1])))
            if info is not None:
                view.refresh_port(key, info)
        return errors

    async def _bounded(self, argv: list[str]) -> CommandResult:
        """Run one command; a runner that never returns still costs only this command."""
        limit = self.command_timeout
        try:
            async with asyncio.timeout(limit + 1.0):
                return await self._runner.run(argv, limit, PERFQUERY_MAX_OUTPUT)
        except TimeoutError:  # the runner's own clean-up goes on in the background
            return CommandResult(None, "", "", True, limit + 1.0)

    def _still_hung(self, lid: int) -> bool:
        """Whether the node at ``lid`` stays off this poll's path: its background query is
        still running, or ended in another timeout (then the next one starts now)."""
        probe = self._probes.get(lid)
        if probe is None:
            return False
        if not probe.task.done():
            return True
        del self._probes[lid]
        task = probe.task
        if task.cancelled() or task.exception() is not None or classify(task.result()) != "timeout":
            return False
        self._probe(lid, probe.argv)
        return True

    def _probe(self, lid: int, argv: list[str]) -> None:
        """Run the timed-out node's counter query in the background (``_Probe``)."""
        self._probes[lid] = _Probe(argv, asyncio.ensure_future(self._bounded(argv)))

    async def _poll_group(
        self, g: _Group, hung: bool = False
    ) -> tuple[dict[int, PortCounterValues], list[SourceError]]:
        """One node's counters: all of them, or none with one reason per port. A ``hung``
        node (its query timed out and is re-run in the background) is not asked here."""
        if hung:
            why = (f"lid {g.lid}: no answer since a perfquery timed out; "
                   "asked again in the background")
            return {}, [SourceError("timeout", why, key) for key in g.keys]
        ports = ",".join(k[1] for k in g.keys)
        wanted = [int(k[1]) for k in g.keys]
        base = [self._perfquery, *self._ca_args, "-t", str(int(self._timeout * 1000))]
        need_narrow = self._need_narrow.get(g.lid, True)
        cmds = [("extended", [*base, "-x", "-l", str(g.lid), ports])]
        if need_narrow:
            cmds.append(("counters", [*base, "-l", str(g.lid), ports]))
        results = await asyncio.gather(*(self._bounded(c) for _kind, c in cmds))
        if any(classify(res) == "timeout" for res in results) and g.lid not in self._probes:
            self._probe(g.lid, cmds[0][1])
        errors: list[SourceError] = []
        blocks: list[PerfBlock] = []
        for (kind, argv), res in zip(cmds, results, strict=True):
            if res.strays:
                errors.append(SourceError("stray_process", f"lid {g.lid}: perfquery left "
                                          f"{res.strays}"))
            reason = classify(res)
            if reason in ("tool_missing", "permission"):
                raise DiagsUnavailableError(f"perfquery: {reason}: {_first_line(res.stderr)}")
            detail = f"lid {g.lid}: {' '.join(argv[-3:])}"
            if reason is not None:
                errors.extend(
                    SourceError(reason, f"{detail}: {_first_line(res.stderr)}", key)
                    for key in g.keys
                )
                return {}, errors
            try:
                got = parse_perfquery_blocks(res.stdout)
                expect_blocks(got, kind=kind, lid=g.lid, ports=wanted)
            except ParseError as exc:
                errors.extend(SourceError("parse_error", f"{detail}: {exc}", k) for k in g.keys)
                return {}, errors
            blocks += got
        # Learn whether the 64-bit error copies exist, so later polls skip the narrow query.
        masks = [b.cap_mask2 for b in blocks if b.kind == "extended"]
        known = [m for m in masks if m is not None]
        if masks and len(known) == len(masks):
            self._need_narrow[g.lid] = not all(m & CPI_CAP2_ADDL_EXT for m in known)
        return counters_from_blocks(blocks), errors

    async def close(self) -> None:
        probes = [p.task for p in self._probes.values()]
        self._probes.clear()
        for task in probes:
            task.cancel()
        await asyncio.gather(*probes, return_exceptions=True)
        if isinstance(self._runner, SubprocessRunner):
            await self._runner.aclose()
        shutil.rmtree(self._tmp, ignore_errors=True)
        await SCOPES.sweep()
