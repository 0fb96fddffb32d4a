"""The Slurm job source against a real Slurm 22.05: slurmctld, four slurmd, munge, squeue.

Jobs are placed on chosen hosts with sbatch, and what an operator relies on is checked through
the real ``squeue --json``: exactly the running jobs, with their hosts expanded, and a job that
ends is gone from the next fetch.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ibmon.jobs.slurm import SlurmConfig, SlurmJobs, parse_squeue
from tests.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.system

HOSTS = ["host001", "host002", "host003", "host004"]
#: The premise of the slurm_conf test: squeue finds no config of its own on this machine.
SYSTEM_CONF = Path("/etc/slurm/slurm.conf").exists()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    with SlurmCluster(HOSTS, tmp_path_factory.mktemp("slurm")) as c:
        yield c


def _source(cluster: SlurmCluster) -> SlurmJobs:
    return SlurmJobs(SlurmConfig(slurm_conf=cluster.conf, timeout=20.0))


async def test_fetch_lists_exactly_the_running_jobs(cluster: SlurmCluster) -> None:
    a = cluster.submit(["host001", "host002"], "alpha")
    b = cluster.submit(["host003", "host004"], "beta")
    cluster.wait_running(a, 30)
    cluster.wait_running(b, 30)
    source = _source(cluster)
    try:
        before = time.time()
        table = await source.fetch()
        assert table.known and table.error is None and table.fetched >= before
        assert sorted(table.jobs) == sorted([a, b])
        for job_id, name, hosts in ((a, "alpha", ("host001", "host002")),
                                    (b, "beta", ("host003", "host004"))):
            job = table.jobs[job_id]
            assert (job.user, job.name, job.partition, job.state, job.hosts) == (
                "root", name, "debug", "RUNNING", hosts)
            assert job.start is not None and abs(job.start - time.time()) < 120
        assert table.by_host() == {"host001": (a,), "host002": (a,),
                                   "host003": (b,), "host004": (b,)}

        cluster.cancel(a)
        cluster.wait_gone(a, 30)
        after = await source.fetch()
        assert after.known and sorted(after.jobs) == [b]
    finally:
        cluster.cancel(b)
        cluster.wait_gone(b, 30)
        await source.close()


def test_real_squeue_json_parses_to_the_submitted_job(cluster: SlurmCluster) -> None:
    """The parser reads what this Slurm really prints, pending jobs included (22.05 prints
    every job whatever ``--states`` says), and keeps only the running one."""
    run = cluster.submit(["host002"], "real")
    cluster.wait_running(run, 30)
    pending = cluster.submit(["host002"], "waits")  # one CPU per node: this one pends
    try:
        out = subprocess.run(["squeue", "--json"], env=cluster.env(), capture_output=True,
                             text=True, timeout=30, check=True).stdout
        assert f'"job_id": {pending}' in out  # it is in the output...
        jobs = parse_squeue(out)  # ...and not in the jobs
        assert [(j.id, j.name, j.user, j.partition, j.hosts) for j in jobs] == [
            (run, "real", "root", "debug", ("host002",))]
    finally:
        for job_id in (pending, run):
            cluster.cancel(job_id)
        cluster.wait_gone(run, 30)


async def test_slurm_conf_reaches_squeue(cluster: SlurmCluster) -> None:
    """Without ``slurm_conf`` squeue reads /etc/slurm/slurm.conf, which here is absent, so the
    configured path is what makes the query work."""
    assert not SYSTEM_CONF
    with_conf = _source(cluster)
    without = SlurmJobs(SlurmConfig(timeout=20.0))
    try:
        assert (await with_conf.fetch()).known
        assert (await without.fetch()).error == "failed"
    finally:
        await with_conf.close()
        await without.close()
