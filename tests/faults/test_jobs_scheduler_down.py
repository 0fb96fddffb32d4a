"""A scheduler that cannot be asked costs the jobs, never a poll or a condition.

A real ``ibmon run`` polls the simulated fabric every 0.25 s while its ``[slurm]`` squeue is
missing, fails, prints junk or hangs (fake squeue scripts: a broken tool is the point). On
every scrape: polls keep their pace, ``ibmon_jobs_known`` is 0 and the failures are counted by
reason; the demo's faults still fire, their events saying the jobs are unknown; the failure is
logged once however often it repeats. Then squeue is mended: the jobs are known again, named
in events, and the recovery is logged once.
"""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.faults.daemonproc import DaemonProcess, wait_until
from tests.faults.promise import Scrape, TotalsWatch

BROKEN = {
    "missing": None,
    "failed": "echo 'squeue: error: Unable to contact slurm controller' >&2; exit 1",
    "junk": "echo '<html>502 Bad Gateway</html>'",
    "timeout": "sleep 30",
}
MENDED = json.dumps({"jobs": [{"job_id": 4242, "user_name": "erin", "name": "mended",
                               "partition": "gpu", "job_state": "RUNNING",
                               "start_time": 1, "nodes": "host[041-042]"}]})


def _script(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


def _polls(s: Scrape) -> float:
    return sum(v for (n, _), v in s.samples.items()
               if n == "ibmon_source_poll_duration_seconds_count")


def _events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("reason", list(BROKEN))
def test_a_broken_scheduler_leaves_jobs_unknown_and_polling_untouched(
    tmp_path: Path, reason: str
) -> None:
    squeue = tmp_path / "squeue"
    body = BROKEN[reason]
    if body is not None:
        _script(squeue, body)
    events = tmp_path / "events.jsonl"
    config = tmp_path / "ibmon.toml"
    config.write_text(textwrap.dedent(f"""\
        [prometheus]
        listen = "127.0.0.1:0"
        [[sources]]
        type = "mock"
        scenario = "demo"
        interval = "250ms"
        speed = 10.0
        [slurm]
        squeue = "{squeue}"
        interval = "500ms"
        timeout = "1s"
        [events]
        file = "{events}"
        [state]
        path = "{tmp_path / 'state.json'}"
        """))
    d = DaemonProcess(tmp_path, config, TotalsWatch())
    try:
        d.start()

        def unknown(s: Scrape) -> bool:
            assert s.value("ibmon_jobs_known") in (None, 0), "jobs known from a broken squeue"
            return (s.value("ibmon_jobs_query_errors_total", reason=reason) or 0) >= 2

        s0 = d.scrape_until(f"two {reason} queries", unknown, timeout=30)
        t0 = time.monotonic()
        # the demo's BER fault on host042 fires at 2 s: conditions do not wait for jobs
        wait_until("host042's high_ber event", lambda: any(
            e["type"] == "high_ber" for e in _events(events)), timeout=30)
        s1 = d.scrape_until("a few more polls", lambda s: unknown(s) and _polls(s) >= _polls(s0)
                            + 8, timeout=30)
        elapsed = time.monotonic() - t0
        assert _polls(s1) - _polls(s0) >= elapsed / 0.25 * 0.5, "polls slowed by the scheduler"
        ber = next(e for e in _events(events) if e["type"] == "high_ber")
        assert ber["details"]["jobs_known"] is False and ber["details"]["jobs"] == []
        assert len(d.events("slurm_query_failed")) == 1, d.log_text()

        _script(squeue, f"cat <<'EOF'\n{MENDED}\nEOF")
        mended = {"fabric": "main", "job_id": "4242", "user": "erin", "name": "mended",
                   "partition": "gpu"}
        d.scrape_until("the jobs known again", lambda s: s.value("ibmon_jobs_known") == 1
                       and [dict(lbl) for lbl in s.series("ibmon_job_info")] == [mended],
                       timeout=30)
        assert len(d.events("slurm_query_recovered")) == 1
        d.traceback_free()
        assert d.stop() == 0
    finally:
        d.cleanup()
