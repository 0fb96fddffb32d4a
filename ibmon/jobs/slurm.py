"""The Slurm job source: ``squeue --json`` read into the running jobs and the hosts they run on.

squeue's output is untrusted: a job's name and partition are whatever a user typed, and the
tool itself may be missing, failing, hanging or print something that is not its JSON. So the
command runs through the diags runner (argv, timeout, process-group kill, capped output), every
string is bounded and made printable, and a failure never raises out of ``fetch``: it returns a
``JobTable`` that says the jobs are unknown and why, and the log says it once per change.

Two JSON shapes are read: Slurm 21.08/22.05 (``job_state`` a string, numbers plain) and 23.02+
(``job_state`` a list of flags, numbers as ``{"set", "infinite", "number"}``). Host lists such
as ``gpu[001-004,007]`` are expanded by python-hostlist, whose size limit bounds the expansion.
squeue 22.05 ignores ``--states`` when printing JSON, so pending and finished jobs arrive too
and only running ones are kept here.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final

import hostlist  # type: ignore[import-untyped]
import structlog
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from ibmon.cli.terminal import printable
from ibmon.jobs.model import Job, JobTable

if TYPE_CHECKING:
    from ibmon.sources.diags import CommandResult, CommandRunner

__all__ = [
    "MAX_OUTPUT",
    "MAX_TEXT",
    "SlurmConfig",
    "SlurmJobs",
    "SlurmOutputError",
    "parse_squeue",
]

log = structlog.get_logger(__name__)

#: Longest user, job name, partition or host name kept (a longer one is cut, or for a host,
#: refused): label values and terminal text stay small whatever a user names a job.
MAX_TEXT: Final = 256
#: Most squeue output read: 22.05 prints every job (pending too) at a few kB each, so this is
#: some 30,000 jobs; past it squeue is stopped and the jobs are unknown (``too_large``).
MAX_OUTPUT: Final = 128 << 20
#: Longest stderr excerpt put in a log line.
_DETAIL: Final = 200


def _duration(value: Any) -> float:
    """The config's duration rule (``10s``, ``500ms``...), imported when a value is read:
    ``ibmon.config`` imports this module for ``Settings.slurm``, so not at import time."""
    from ibmon.config import parse_duration

    return parse_duration(value)


Duration = Annotated[float, BeforeValidator(_duration)]


class SlurmConfig(BaseModel):
    """``[slurm]``: absent means no job source. squeue is asked every ``interval``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    interval: Duration = 30.0
    timeout: Duration = 10.0
    #: squeue's path, or its name looked up on PATH.
    squeue: str = Field(default="squeue", min_length=1, max_length=4096)
    #: Given to squeue as ``SLURM_CONF`` (a cluster whose config is not /etc/slurm/slurm.conf).
    slurm_conf: Path | None = None
    #: A regular expression with a named group ``host``: it picks a job's host name out of a
    #: node description when the description does not start with the host name.
    host_pattern: str | None = Field(default=None, max_length=1024)
    #: Jobs listed by name in one event's details; the rest are only counted.
    max_event_jobs: int = Field(default=20, ge=1, le=1000)

    @field_validator("host_pattern")
    @classmethod
    def _check_pattern(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            compiled = re.compile(v)
        except re.error as exc:
            raise ValueError(f"host_pattern is not a regular expression: {exc}") from None
        if "host" not in compiled.groupindex:
            raise ValueError("host_pattern needs a named group (?P<host>...) for the host name")
        return v


class SlurmOutputError(ValueError):
    """squeue printed something that is not its JSON job list."""


class _BadJobError(ValueError):
    """One job entry is malformed: that job is skipped, the others are kept."""


def _number(value: Any) -> int | float | None:
    """A plain JSON number (21.08/22.05) or 23.02's ``{"set", "infinite", "number"}``; None
    when unset or infinite."""
    if isinstance(value, Mapping):
        if not value.get("set", False) or value.get("infinite", False):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def _int(value: Any) -> int | None:
    n = _number(value)
    if n is None or not math.isfinite(n) or n < 0 or n != int(n):
        return None
    return int(n)


def _text(value: Any) -> str:
    """An untrusted string bounded and made safe for labels and terminals; "" if not a string."""
    if not isinstance(value, str):
        return ""
    return printable(value[: MAX_TEXT * 4])[:MAX_TEXT]


def _running(state: Any) -> bool:
    if isinstance(state, str):
        return state == "RUNNING"
    if isinstance(state, list):
        return "RUNNING" in state
    raise _BadJobError(f"job_state is a {type(state).__name__}")


def _job_id(entry: Mapping[str, Any]) -> str:
    """``<id>``, ``<array job>_<task>`` for an array task, as squeue itself prints them."""
    job_id = _int(entry.get("job_id"))
    if job_id is None:
        raise _BadJobError("no job_id")
    array_job, task = _int(entry.get("array_job_id")), _int(entry.get("array_task_id"))
    if array_job and task is not None:
        return f"{array_job}_{task}"
    return str(job_id)


def _hosts(nodes: Any) -> tuple[str, ...]:
    if not isinstance(nodes, str):
        raise _BadJobError("nodes is not a host list")
    if not nodes:
        return ()
    try:
        names = hostlist.expand_hostlist(nodes)
    except hostlist.BadHostlist as exc:
        raise _BadJobError(f"bad host list: {exc}") from None
    for name in names:
        if not name or len(name) > MAX_TEXT or not name.isprintable() or name.isspace():
            raise _BadJobError("a host name is empty, too long or not printable")
    return tuple(sorted(set(names)))


def _job(entry: Any) -> Job | None:
    """The job, or None when it is not running; ``_BadJobError`` when the entry is malformed."""
    if not isinstance(entry, Mapping):
        raise _BadJobError(f"a job is a {type(entry).__name__}")
    if not _running(entry.get("job_state")):
        return None
    job_id = _job_id(entry)
    start = _number(entry.get("start_time"))
    return Job(
        id=job_id,
        user=_text(entry.get("user_name")),
        name=_text(entry.get("name")),
        partition=_text(entry.get("partition")),
        state="RUNNING",
        start=float(start) if start else None,
        hosts=_hosts(entry.get("nodes")),
    )


def _parse(text: str) -> tuple[list[Job], list[str]]:
    """The running jobs, and why each skipped entry was skipped."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise SlurmOutputError(f"not JSON: {str(exc)[:_DETAIL]}") from None
    if not isinstance(doc, Mapping) or not isinstance(doc.get("jobs"), list):
        raise SlurmOutputError("no jobs list: not squeue --json output")
    jobs: list[Job] = []
    skipped: list[str] = []
    for entry in doc["jobs"]:
        try:
            job = _job(entry)
        except _BadJobError as exc:
            skipped.append(str(exc))
            continue
        if job is not None:
            jobs.append(job)
    return jobs, skipped


def parse_squeue(text: str) -> list[Job]:
    """The running jobs in ``squeue --json`` output (Slurm 21.08 to 24.x shapes).

    Raises ``SlurmOutputError`` when the text is not that output at all; a single malformed
    job entry is skipped (``SlurmJobs`` logs it) and costs only that job.
    """
    return _parse(text)[0]


#: Why the jobs are unknown, as ``JobTable.error`` and the ``reason`` label say it.
_MISSING, _FAILED, _TIMEOUT, _JUNK, _TOO_LARGE = "missing", "failed", "timeout", "junk", "too_large"


class SlurmJobs:
    """Asks squeue for the running jobs; each ``fetch`` returns a fresh ``JobTable``.

    A failure of any kind is a table with ``known`` False and ``error`` the reason (missing,
    failed, timeout, junk, too_large), never an exception: the poll that reads jobs goes on
    and says the jobs are unknown. The reason is logged when it changes and once on recovery,
    so a squeue that fails every 30 s for a week writes one line, not twenty thousand.
    """

    def __init__(
        self,
        cfg: SlurmConfig,
        runner: CommandRunner | None = None,
        *,
        max_output: int = MAX_OUTPUT,
    ) -> None:
        self.cfg = cfg
        if runner is None:
            from ibmon.sources.diags import SubprocessRunner

            env = None
            if cfg.slurm_conf is not None:
                env = {**os.environ, "SLURM_CONF": str(cfg.slurm_conf)}
            runner = SubprocessRunner(concurrency=1, env=env)
        self.runner = runner
        self.max_output = max_output
        self._argv = [cfg.squeue, "--json"]
        self._reason: str | None = None  # the failure last logged; None while it works
        self._skipping = False  # whether the last good answer had malformed jobs (logged)

    async def fetch(self) -> JobTable:
        """The running jobs now, or why they are unknown."""
        try:
            result = await self.runner.run(self._argv, self.cfg.timeout, self.max_output)
        except Exception as exc:  # a runner bug must not stop the poll
            return self._failed(_FAILED, f"{type(exc).__name__}: {exc}")
        fetched = time.time()
        reason = self._reason_of(result)
        if reason is not None:
            return self._failed(reason, _first_line(result.stderr), fetched)
        try:
            # in a thread: 10,000 jobs' JSON takes a tenth of a second or more to read, which
            # the event loop (scrapes, the API) must not wait for
            jobs, skipped = await asyncio.to_thread(_parse, result.stdout)
        except SlurmOutputError as exc:
            return self._failed(_JUNK, str(exc), fetched)
        self._report_skipped(skipped)
        if self._reason is not None:
            log.info("slurm_query_recovered", was=self._reason, jobs=len(jobs))
            self._reason = None
        return JobTable.of(jobs, fetched=fetched)

    @staticmethod
    def _reason_of(result: CommandResult) -> str | None:
        if result.too_large:
            return _TOO_LARGE
        if result.timed_out:
            return _TIMEOUT
        if result.rc in (126, 127):  # not found, not executable (the runner's codes and sh's)
            return _MISSING
        if result.rc != 0:
            return _FAILED
        return None

    def _failed(self, reason: str, detail: str, fetched: float | None = None) -> JobTable:
        if reason != self._reason:
            log.warning(
                "slurm_query_failed",
                reason=reason,
                squeue=printable(self.cfg.squeue),
                detail=printable(detail[:_DETAIL]),
                timeout=self.cfg.timeout,
            )
            self._reason = reason
        return JobTable(known=False, error=reason, fetched=time.time() if fetched is None
                        else fetched)

    def _report_skipped(self, skipped: list[str]) -> None:
        if skipped and not self._skipping:
            log.warning("slurm_jobs_skipped", count=len(skipped),
                        first=printable(skipped[0][:_DETAIL]))
        self._skipping = bool(skipped)

    async def close(self) -> None:
        """Let a cancelled squeue's clean-up finish (the runner bounds it)."""
        aclose = getattr(self.runner, "aclose", None)
        if aclose is not None:
            await aclose()


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""
