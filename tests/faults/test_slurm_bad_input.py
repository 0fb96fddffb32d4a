"""A squeue that is missing, failing, hanging, printing junk or printing without end.

Each leaves the jobs unknown with the reason (never an exception, never a hang past the
timeout, never a process left behind) and is logged once however many polls it lasts, and
once more when squeue works again.
"""

from __future__ import annotations

import json
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from ibmon.jobs.model import UNKNOWN_JOBS, JobTable
from ibmon.jobs.slurm import SlurmConfig, SlurmJobs

GOOD = json.dumps({"jobs": [{"job_id": 5, "job_state": "RUNNING", "nodes": "n[1-2]",
                             "user_name": "bob", "name": "x", "partition": "p",
                             "start_time": 1700000000}]})


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def _events(logs: list[MutableMapping[str, Any]], name: str) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == name]


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie waiting for its reaper counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


async def _fetch_n(source: SlurmJobs, n: int) -> list[JobTable]:
    return [await source.fetch() for _ in range(n)]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (None, "missing"),
        ('echo "squeue: error: Unable to contact slurm controller" >&2\nexit 1\n', "failed"),
        ("echo 'squeue: unrecognized option --json'\n", "junk"),
        ('echo \'{"meta": {}, "jobs": {"1": 2}}\'\n', "junk"),
        ("head -c 3000000 /dev/zero\n", "too_large"),
    ],
)
async def test_bad_squeue_leaves_jobs_unknown_and_logs_once(
    tmp_path: Path, body: str | None, reason: str
) -> None:
    squeue = tmp_path / "squeue"
    if body is not None:
        _script(squeue, body)
    source = SlurmJobs(SlurmConfig(squeue=str(squeue), timeout=5.0), max_output=1 << 20)
    try:
        with capture_logs() as logs:
            tables = await _fetch_n(source, 3)
        for table in tables:
            assert table is not UNKNOWN_JOBS  # that one means "no job source"
            assert (table.known, table.error, dict(table.jobs)) == (False, reason, {})
            assert table.fetched > 0
        failed = _events(logs, "slurm_query_failed")
        assert [e["reason"] for e in failed] == [reason], logs

        _script(squeue, f"cat <<'EOF'\n{GOOD}\nEOF\n")
        with capture_logs() as logs:
            healed = await _fetch_n(source, 3)
        assert all(t.known and list(t.jobs) == ["5"] for t in healed)
        assert [(e["event"], e["was"]) for e in logs] == [("slurm_query_recovered", reason)]
    finally:
        await source.close()


async def test_hanging_squeue_is_killed_at_the_timeout(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    squeue = _script(tmp_path / "squeue",
                     f"sleep 300 &\necho $! > {pids}\necho $$ >> {pids}\nwait\n")
    source = SlurmJobs(SlurmConfig(squeue=str(squeue), timeout=1.0))
    try:
        with capture_logs() as logs:
            started = time.monotonic()
            table = await source.fetch()
            took = time.monotonic() - started
            again = await source.fetch()
        assert (table.known, table.error) == (False, "timeout")
        assert took < 1.0 + 1.5, took
        assert again.error == "timeout"
        assert [e["reason"] for e in _events(logs, "slurm_query_failed")] == ["timeout"]
        left = [int(p) for p in pids.read_text().split()]
        assert len(left) == 2 and not [p for p in left if _alive(p)], left
    finally:
        await source.close()


async def test_reason_change_is_logged_and_malformed_jobs_once(tmp_path: Path) -> None:
    squeue = _script(tmp_path / "squeue", "exit 1\n")
    source = SlurmJobs(SlurmConfig(squeue=str(squeue), timeout=5.0))
    bad_and_good = json.dumps({"jobs": [{"job_id": 6, "job_state": "RUNNING",
                                         "nodes": "n[9-"}, *json.loads(GOOD)["jobs"]]})
    try:
        with capture_logs() as logs:
            await source.fetch()
            _script(squeue, "echo junk\n")
            await source.fetch()
            await source.fetch()
            _script(squeue, f"cat <<'EOF'\n{bad_and_good}\nEOF\n")
            tables = await _fetch_n(source, 3)
        assert [(e["event"], e.get("reason")) for e in logs] == [
            ("slurm_query_failed", "failed"),
            ("slurm_query_failed", "junk"),
            ("slurm_jobs_skipped", None),
            ("slurm_query_recovered", None),
        ], logs
        assert all(t.known and list(t.jobs) == ["5"] for t in tables)
    finally:
        await source.close()

