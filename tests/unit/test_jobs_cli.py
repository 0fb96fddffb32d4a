"""``ibmon jobs [ID]`` and the jobs part of ``ibmon explain``: the real ``ibmon`` command against
a real listener serving a hand-built state, as an operator runs them."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from exporters.api import ApiProvider, api_routes
from exporters.prometheus import PrometheusExporter
from ibmon.cli.jobs import render_jobs
from ibmon.jobs.model import Job
from ibmon.runtime.selfmetrics import SelfMetrics
from tests.job_outputs_state import HOSTS, JOBS, LEAF, jobs_view, state

IBMON = Path(sys.executable).with_name("ibmon")
#: A job name made to attack a terminal: a colour escape, a newline, a right-to-left override.
HOSTILE = "\x1b[31mowned\x1b[0m\nfake line \u202etxt.exe"


def ibmon(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(IBMON), *args], capture_output=True, text=True, timeout=60,
                          check=False)


@pytest.fixture
async def served() -> AsyncIterator[tuple[str, dict[str, Any]]]:
    jobs = (*JOBS[:2], Job("103", user="mallory", name=HOSTILE, partition="cpu",
                           hosts=("host03", "host99")))
    holder: dict[str, Any] = {"state": state(jobs_view(jobs))}
    provider = ApiProvider(state=lambda: holder["state"], events=lambda: [], ready=lambda: True)
    exporter = PrometheusExporter(listen="127.0.0.1:0", self_metrics=SelfMetrics())
    exporter.add_routes(api_routes(provider))
    async with exporter:
        yield f"http://127.0.0.1:{exporter.port}", holder


def assert_terminal_safe(out: str, *, whole: bool = True) -> None:
    """No control character reaches the terminal; each is shown as its escape (the table cuts
    long names, so the override at the end of the name shows only where it is printed whole)."""
    assert "\x1b" not in out and "\u202e" not in out
    assert "\\x1b[31mowned" in out
    assert "\\u202e" in out or not whole
    assert not any(line.startswith("fake line") for line in out.splitlines())


async def test_jobs_lists_running_jobs_safely(served: tuple[str, Any]) -> None:
    base, _ = served
    proc = await asyncio.to_thread(ibmon, "jobs", "--url", base)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    lines = out.splitlines()
    assert lines[0].startswith("3 running jobs (scheduler asked 2023-11-14 22:")
    assert "forwarding tables" in lines[0] and "1 job hosts match no port" in lines[0]
    assert lines[1].split() == ["JOBID", "USER", "NAME", "PARTITION", "HOSTS", "TX", "RX",
                                "CONDITIONS"]
    rows = {line.split()[0]: line for line in lines[2:5]}
    assert set(rows) == {"101", "102", "103"}
    assert "alice" in rows["101"] and "congestion,down" in rows["101"]
    assert "~1 GB/s" in rows["101"]  # shares host02 with 102: marked approximate
    assert "~" not in rows["103"].split("mallory")[1]  # 103 has its hosts to itself
    assert "3 GB/s" in rows["103"]
    assert "exact only on hosts a job has to itself" in out
    assert_terminal_safe(out, whole=False)


async def test_one_job_prints_hosts_ports_conditions_and_rates(served: tuple[str, Any]) -> None:
    base, _ = served
    proc = await asyncio.to_thread(ibmon, "jobs", "101", "--url", base)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith('job 101: train "llm"\\x0arun')  # its newline shown escaped
    assert "traffic: tx 1 GB/s, rx 2 GB/s (approximate: 1 of its hosts" in out
    assert "conditions on its links: congestion, down" in out
    assert "  host02 (shared with another job)" in out
    assert f"host01 mlx5_0 {HOSTS['host01']}/1: ok" in out
    assert f"leaf01 {LEAF}/1 (its host's link): down" in out
    assert f"leaf01 {LEAF}/10 (its traffic is routed over it): congestion" in out
    proc = await asyncio.to_thread(ibmon, "jobs", "103", "--url", base)
    assert proc.returncode == 0, proc.stderr
    assert "host99 (no port of the fabric matches it)" in proc.stdout
    assert_terminal_safe(proc.stdout)
    proc = await asyncio.to_thread(ibmon, "jobs", "103", "--url", base, "--format", "json")
    assert json.loads(proc.stdout)["job"]["name"] == HOSTILE


async def test_unknown_job_and_unknown_jobs_are_one_line(served: tuple[str, Any]) -> None:
    base, holder = served
    proc = await asyncio.to_thread(ibmon, "jobs", "4242", "--url", base)
    assert proc.returncode == 2
    assert "HTTP 404" in proc.stderr and "no running job 4242" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = await asyncio.to_thread(ibmon, "jobs", "1/../x", "--url", base)  # quoted, one segment
    assert proc.returncode == 2 and "HTTP 404" in proc.stderr
    holder["state"] = state(jobs_view(known=False, error="timeout"), generated=2e9)
    proc = await asyncio.to_thread(ibmon, "jobs", "--url", base)
    assert proc.returncode == 0
    assert proc.stdout == "jobs unknown: the scheduler could not be asked (timeout)\n"


async def test_explain_lists_the_jobs_on_the_link(served: tuple[str, Any]) -> None:
    base, _ = served
    proc = await asyncio.to_thread(ibmon, "explain", f"{LEAF}/10", "--url", base)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "jobs on this link (2):" in out
    assert "  101 alice train" in out and ": its traffic is routed over it" in out
    assert_terminal_safe(out)
    proc = await asyncio.to_thread(ibmon, "explain", "host01/mlx5_0", "--url", base)
    assert proc.returncode == 0, proc.stderr
    assert "jobs on this link (1):" in proc.stdout
    assert ": its host's link" in proc.stdout


def test_no_job_source_says_so() -> None:
    assert render_jobs({"known": False, "source": False}) == (
        "jobs unknown: this daemon has no job source (add a [slurm] section)\n")
