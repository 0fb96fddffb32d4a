"""A reload (SIGHUP) adds, changes and drops the job source, and keeps polling throughout.

A real ``ibmon run`` on the simulated fabric's ``healthy`` scenario (no jobs of its own) and a
real Slurm: without ``[slurm]`` no job series exist; a reload that adds it brings the job
running on host001 (its rates from host001's port); one that points squeue somewhere wrong
makes the jobs unknown; one that drops the section removes every job series. Polls and port
totals carry on across all three (the totals watch checks every scrape).
"""

from __future__ import annotations

import signal
import textwrap
from pathlib import Path

import pytest

from tests.faults.daemonproc import DaemonProcess
from tests.faults.promise import Scrape, TotalsWatch
from tests.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.system


def _config(path: Path, tmp: Path, slurm: str) -> None:
    path.write_text(textwrap.dedent(f"""\
        [prometheus]
        listen = "127.0.0.1:0"
        [[sources]]
        type = "mock"
        scenario = "healthy"
        interval = "250ms"
        [state]
        path = "{tmp / 'state.json'}"
        """) + slurm)


def _polls(s: Scrape) -> float:
    return sum(v for (n, _), v in s.samples.items()
               if n == "ibmon_source_poll_duration_seconds_count")


def _job_series(s: Scrape) -> set[str]:
    return {n for (n, _), _ in s.samples.items() if n.startswith(("ibmon_job_", "ibmon_jobs_k"))}


def test_reloads_add_change_and_drop_the_job_source(tmp_path: Path) -> None:
    with SlurmCluster(["host001", "host002"], tmp_path / "slurm") as slurm:
        job = slurm.submit(["host001"], "reloaded")
        slurm.wait_running(job, timeout=60)
        config = tmp_path / "ibmon.toml"
        _config(config, tmp_path, "")
        d = DaemonProcess(tmp_path, config, TotalsWatch())
        try:
            d.start()
            s = d.scrape_until("two polls", lambda s: _polls(s) >= 2)
            assert not _job_series(s)

            _config(config, tmp_path, f'[slurm]\ninterval = "250ms"\n'
                                      f'slurm_conf = "{slurm.conf}"\n')
            d.signal(signal.SIGHUP)
            s = d.scrape_until("the job after the reload", lambda s: any(
                dict(lbl).get("job_id") == job
                for lbl in s.series("ibmon_job_transmit_bytes_per_second")), timeout=30)
            assert s.value("ibmon_jobs_known") == 1
            before = _polls(s)

            _config(config, tmp_path, '[slurm]\ninterval = "250ms"\nsqueue = "/nonexistent"\n')
            d.signal(signal.SIGHUP)
            s = d.scrape_until("jobs unknown", lambda s: s.value("ibmon_jobs_known") == 0
                               and (s.value("ibmon_jobs_query_errors_total",
                                            reason="missing") or 0) >= 1, timeout=30)
            assert not s.series("ibmon_job_info")

            _config(config, tmp_path, "")
            d.signal(signal.SIGHUP)
            s = d.scrape_until("no job series", lambda s: not (
                _job_series(s) - {"ibmon_jobs_query_errors_total"}), timeout=30)
            d.scrape_until("polls going on", lambda s: _polls(s) >= before + 8, timeout=30)
            assert s.value("ibmon_config_reloads_total", result="applied") == 3
            d.traceback_free()
            assert d.stop() == 0
        finally:
            d.cleanup()
