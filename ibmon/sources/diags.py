"""The ``diags`` source: infiniband-diags subprocesses, the portable reference path.

Topology comes from one ``ibnetdiscover -p --cache FILE`` run on the daemon's topology timer:
the text gives the ports and links, the libibnetdisc cache gives every port's raw PortInfo
(state, enabled/supported widths and speeds) for the max-common link rule. Counters come from
``perfquery -x -l <lid> <ports>``, one process per LID (a switch and all its ports, or one CA
port), plus ``perfquery -l`` when the port has no 64-bit error counters (CapMask2 bit 1).

Every command goes through an injectable ``CommandRunner``. The default one runs argv lists
(never a shell) in their own session, bounded by a semaphore, with a per-call timeout after
which the whole process group is SIGKILLed and reaped; the group is swept even after a normal
exit so no child survives (treydock/infiniband_exporter#38). A node that hangs or prints garbage
costs that node's counters for that poll, reported as SourceErrors, never the sweep.

Port state between discoveries: perfquery says nothing about state, so every ``state_interval``
seconds (default 30; 0 = every poll but the one right after a discovery, which just read every
state; None from the config = that default; the schedule is ``fabric.StateSchedule``) one extra
``ibnetdiscover --cache`` process for the whole fabric runs beside the poll's perfquerys, and
every known port takes its state, phys state and active width/speed from the cache's raw
PortInfo (the same decoding as discovery). One process per refresh, not one per node: ibsim and
real fabrics answer a discovery in about the time of a counter sweep, and a port that goes down
is seen within ``state_interval`` instead of the topology interval (5 min). Peers and links
still change only at discovery; a CA port that became unreachable (its only link is down) is
not in the cache and keeps its last state, its counters fail and are reported as SourceErrors.
The ``mad`` source refreshes state on every poll instead (one SMP per port in its MAD batch).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, Protocol

from ibmon.model import PortKey, Snapshot, SourceError, Topology
from ibmon.sources.fabric import FabricSource, FabricSourceConfig, FabricView
from ibmon.sources.localport import explain_open_failure, parse_ibstat, umad_access_problem
from ibmon.sources.parse import (
    CPI_CAP2_ADDL_EXT,
    CacheFabric,
    DiscoveredPort,
    PortCounterValues,
    parse_ibnd_cache,
    parse_ibnetdiscover_ports,
    parse_perfquery,
    parse_perfquery_blocks,
)

__all__ = [
    "CommandResult",
    "CommandRunner",
    "Config",
    "DiagsSource",
    "DiagsSourceConfig",
    "DiagsUnavailableError",
    "SubprocessRunner",
    "build",
    "classify",
]


class DiagsSourceConfig(FabricSourceConfig):
    """``type = "diags"``: the whole fabric via infiniband-diags processes."""

    type: Literal["diags"] = "diags"


Config = DiagsSourceConfig


def build(cfg: DiagsSourceConfig) -> DiagsSource:
    return DiagsSource.from_config(cfg)


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What one command did. ``rc`` is None when it was killed on timeout."""

    rc: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    duration: float = 0.0


class CommandRunner(Protocol):
    async def run(self, argv: list[str], timeout: float) -> CommandResult: ...


class DiagsUnavailableError(RuntimeError):
    """The diags source cannot work at all (tool missing, no permission): the whole poll fails.

    ``cause`` is ``absent``, ``permission`` or ``unknown`` when the local port could not be
    opened (see ``ibmon.sources.localport``), else None.
    """

    def __init__(self, message: str, cause: str | None = None) -> None:
        super().__init__(message)
        self.cause = cause


def _killpg(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


class SubprocessRunner:
    """asyncio subprocesses: own session, bounded concurrency, process-group kill on timeout."""

    def __init__(
        self,
        *,
        concurrency: int = 4,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> None:
        self._sem = asyncio.Semaphore(max(1, concurrency))
        self._env = dict(env) if env is not None else None
        self._cwd = cwd

    async def run(self, argv: list[str], timeout: float) -> CommandResult:
        async with self._sem:
            return await self._run(argv, timeout)

    async def _run(self, argv: list[str], timeout: float) -> CommandResult:
        start = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
                env=self._env,
                cwd=self._cwd,
            )
        except FileNotFoundError:
            return CommandResult(127, "", f"{argv[0]}: command not found", False, 0.0)
        except PermissionError as exc:
            return CommandResult(126, "", f"{argv[0]}: {exc}", False, 0.0)
        try:
            async with asyncio.timeout(timeout):
                out, err = await proc.communicate()
        except TimeoutError:
            _killpg(proc.pid)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            return CommandResult(None, "", "", True, time.monotonic() - start)
        except BaseException:
            _killpg(proc.pid)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(BaseException):
                await asyncio.shield(proc.wait())
            raise
        # A well-behaved tool leaves nothing behind; a misbehaving one must not either.
        _killpg(proc.pid)
        return CommandResult(
            proc.returncode,
            out.decode("utf-8", "replace"),
            err.decode("utf-8", "replace"),
            False,
            time.monotonic() - start,
        )


#: what libibmad/libibnetdisc print when the local umad port does not open
_OPEN_FAILED = re.compile(r"can't open (?:UMAD|MAD) port", re.IGNORECASE)
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

    timeout (we killed it), tool_missing, permission, crashed (killed by a signal), mad_timeout
    (the tool gave up on a MAD), no_such_lid, failed (any other non-zero exit).
    """
    if res.timed_out:
        return "timeout"
    if res.rc == 0:
        return None
    if res.rc == 127:
        return "tool_missing"
    if res.rc is not None and res.rc < 0:
        return "crashed"
    err = res.stderr.lower()
    if any(h in err for h in _PERM_HINTS):
        return "permission"
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
            return s[:200]
    return ""


@dataclass(slots=True)
class _Group:
    """Ports polled by one perfquery process: one LID, its port numbers."""

    lid: int
    keys: list[PortKey]


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
        discover_timeout: float = 300.0,
        ibnetdiscover: str = "ibnetdiscover",
        perfquery: str = "perfquery",
        ibstat: str = "ibstat",
        command_timeout: float | None = None,
        state_interval: float = 30.0,
        topology_interval: float = 300.0,
        unreachable_discoveries: int = 3,
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
        )
        self._runner: CommandRunner = runner or SubprocessRunner(concurrency=concurrency)
        # as infiniband-diags: no -P (or port 0) = libibumad picks the port (a switch: 0)
        self._ca, self._port = ca, port or None
        self._ca_args = (["-C", ca] if ca else []) + (["-P", str(port)] if port else [])
        self._timeout = timeout
        self._retries = retries
        self._discover_timeout = discover_timeout
        self._ibnetdiscover = ibnetdiscover
        self._perfquery = perfquery
        self._ibstat = ibstat
        self._command_timeout = command_timeout
        self._tmp = Path(tempfile.mkdtemp(prefix="ibmon-diags-"))
        self._groups: list[_Group] = []
        self._need_narrow: dict[int, bool] = {}

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
            state_interval=cfg.state_interval if cfg.state_interval is not None else 30.0,
            topology_interval=cfg.topology_interval,
            unreachable_discoveries=cfg.unreachable_discoveries,
        )

    # ----------------------------------------------------------------- per-command timeout

    @property
    def command_timeout(self) -> float:
        """Wall-clock budget of one perfquery: every MAD may time out and be retried."""
        if self._command_timeout is not None:
            return self._command_timeout
        return max(2.0, self._timeout * (self._retries + 1) * 4 + 1.0)

    # ----------------------------------------------------------------- discovery

    async def discover(self) -> Topology:
        started = time.monotonic()
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
        res = await self._runner.run(argv, self._discover_timeout)
        reason = classify(res)
        errors: list[SourceError] = []
        if reason is not None and _OPEN_FAILED.search(res.stderr):
            raise await self._open_failure(res)
        if reason in ("tool_missing", "permission"):
            raise DiagsUnavailableError(f"ibnetdiscover: {reason}: {_first_line(res.stderr)}")
        ports, stray = parse_ibnetdiscover_ports(res.stdout)
        if not ports:
            raise DiagsUnavailableError(
                f"ibnetdiscover found no ports ({reason or 'empty'}: {_first_line(res.stderr)})"
            )
        if reason is not None:
            errors.append(SourceError(reason, f"ibnetdiscover: {_first_line(res.stderr)}"))
        errors.extend(
            SourceError("parse_error", f"ibnetdiscover: {line[:200]}")
            for line in stray
            if "sim_connect" not in line
        )
        fab = None
        try:
            fab = parse_ibnd_cache(cache.read_bytes())
        except (OSError, ValueError) as exc:
            errors.append(SourceError("cache_unreadable", f"ibnetdiscover cache: {exc}"))
        view = self._view_from(ports, fab)
        topo = self._adopt(view, errors, started)
        assert self._view is not None  # the merged view: unreachable nodes are still asked
        self._groups = [_Group(lid, keys) for lid, keys in self._view.by_lid().items()]
        return topo

    async def _open_failure(self, res: CommandResult) -> DiagsUnavailableError:
        """Why ibnetdiscover could not open the local port, from what ``ibstat`` shows."""
        stat = await self._runner.run([self._ibstat], self._discover_timeout)
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

    def _view_from(self, ports: list[DiscoveredPort], fab: CacheFabric | None) -> FabricView:
        """The filtered, linked and sharded view of ``ibnetdiscover -p`` plus its cache."""
        if fab is not None:
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
            info = fab.ports.get((p.guid, p.port)) if fab is not None else None
            if info is not None:
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
        try:
            results = await asyncio.gather(*(self._poll_group(g) for g in self._groups))
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
        self._fill(snap, view, values)
        return snap

    async def _refresh_state(self, view: FabricView) -> list[SourceError]:
        """One ibnetdiscover for the whole fabric; apply its PortInfo to every known port."""
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
        res = await self._runner.run(argv, self._discover_timeout)
        reason = classify(res)
        try:
            fab = parse_ibnd_cache(cache.read_bytes())
        except (OSError, ValueError) as exc:
            why = reason or "cache_unreadable"
            return [SourceError(why, f"state refresh: {_first_line(res.stderr) or exc}")]
        for key in view.ports:
            info = fab.ports.get((key[0], int(key[1])))
            if info is not None:
                view.refresh_port(key, info)
        if reason is not None:  # partial discovery: what it reached is applied
            return [SourceError(reason, f"state refresh: {_first_line(res.stderr)}")]
        return []

    async def _bounded(self, argv: list[str]) -> CommandResult:
        """Run one command; a runner that never returns still costs only this command."""
        try:
            async with asyncio.timeout(self.command_timeout + 1.0):
                return await self._runner.run(argv, self.command_timeout)
        except TimeoutError:
            return CommandResult(None, "", "", True, self.command_timeout + 1.0)

    async def _poll_group(
        self, g: _Group
    ) -> tuple[dict[int, PortCounterValues], list[SourceError]]:
        ports = ",".join(k[1] for k in g.keys)
        base = [self._perfquery, *self._ca_args, "-t", str(int(self._timeout * 1000))]
        need_narrow = self._need_narrow.get(g.lid, True)
        cmds = [[*base, "-x", "-l", str(g.lid), ports]]
        if need_narrow:
            cmds.append([*base, "-l", str(g.lid), ports])
        results = await asyncio.gather(*(self._bounded(c) for c in cmds))
        errors: list[SourceError] = []
        text = []
        for argv, res in zip(cmds, results, strict=True):
            reason = classify(res)
            if reason in ("tool_missing", "permission"):
                raise DiagsUnavailableError(f"perfquery: {reason}: {_first_line(res.stderr)}")
            if reason is not None:
                detail = f"lid {g.lid}: {' '.join(argv[-3:])}: {_first_line(res.stderr)}"
                errors.extend(SourceError(reason, detail, key) for key in g.keys)
                return {}, errors
            text.append(res.stdout)
        joined = "\n".join(text)
        values, stray = parse_perfquery(joined)
        wanted = {int(k[1]) for k in g.keys}
        if not wanted <= set(values) or stray:
            detail = f"lid {g.lid}: unexpected perfquery output ({len(stray)} stray lines)"
            missing = [k for k in g.keys if int(k[1]) not in values]
            errors.extend(SourceError("parse_error", detail, k) for k in (missing or g.keys[:1]))
            values = {p: v for p, v in values.items() if p in wanted}
        # Learn whether the 64-bit error copies exist, so later polls skip the narrow query.
        blocks, _ = parse_perfquery_blocks(text[0])
        caps2 = [b.cap_mask2 for b in blocks if b.kind == "extended" and b.cap_mask2 is not None]
        if caps2 and len(blocks) >= len(wanted):
            self._need_narrow[g.lid] = not all(c & CPI_CAP2_ADDL_EXT for c in caps2)
        return values, errors

    async def close(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)
