"""The job series on /metrics: what they say, escaped, in a stable order, bounded, gone with
the job, and nothing but ``ibmon_jobs_known 0`` while the scheduler cannot be asked."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path
from types import MappingProxyType

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporters.jobs import MAX_LABEL_JOBS, JobRenderer, jobs_label, render_jobs
from exporters.prometheus import PrometheusExporter, exposition
from ibmon.jobs.model import Job, JobLink, JobsView, JobTable
from ibmon.runtime.selfmetrics import SelfMetrics
from ibmon.state import FabricState
from tests.job_outputs_state import CONGESTED_PORT, JOBS, TRICKY_NAME, jobs_view, state
from tests.syspkg import require_binary


def samples(body: bytes) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> (labels, value) as Prometheus' own parser reads them."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(body.decode("utf-8")):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def job_lines(body: bytes) -> list[str]:
    return [line for line in body.decode().splitlines()
            if line.startswith(("ibmon_job", "ibmon_port_jobs"))]


def test_running_jobs_rates_sharing_and_conditions() -> None:
    got = samples(render_jobs(state(), "fab1"))
    assert got["ibmon_jobs_known"] == [({"fabric": "fab1"}, 1.0)]
    assert got["ibmon_job_hosts_unmatched"] == [({"fabric": "fab1"}, 1.0)]  # host99
    info = got["ibmon_job_info"]
    assert [labels["job_id"] for labels, _ in info] == ["101", "102", "103"]
    # the untrusted name comes back exactly, through Prometheus' own parser
    assert info[0] == ({"fabric": "fab1", "job_id": "101", "user": "alice", "name": TRICKY_NAME,
                        "partition": "gpu"}, 1.0)
    tx = {labels["job_id"]: v for labels, v in got["ibmon_job_transmit_bytes_per_second"]}
    rx = {labels["job_id"]: v for labels, v in got["ibmon_job_receive_bytes_per_second"]}
    assert tx == {"101": 1e9, "102": 2e9, "103": 3e9}
    assert rx == {"101": 2e9, "102": 4e9, "103": 6e9}
    shared = {labels["job_id"]: v for labels, v in got["ibmon_job_shared_hosts"]}
    assert shared == {"101": 1, "102": 1, "103": 0}  # host02 runs 101 and 102
    assert sorted((lb["job_id"], lb["condition"]) for lb, _ in got["ibmon_job_affected"]) == [
        ("101", "congestion"), ("101", "down"), ("103", "congestion")]
    ports = {(lb["guid"], lb["port"]): lb["jobs"] for lb, _ in got["ibmon_port_jobs_info"]}
    assert ports == {("0x0002c90300000101", "1"): "101",
                     ("0x0002c90300000101", "10"): "101,103"}


def test_help_says_rates_are_exact_only_on_hosts_a_job_has_to_itself() -> None:
    text = render_jobs(state(), "main").decode()
    for name in ("ibmon_job_transmit_bytes_per_second", "ibmon_job_receive_bytes_per_second"):
        help_line = next(line for line in text.splitlines()
                         if line.startswith(f"# HELP {name} "))
        assert "Exact only for a job that has its hosts to itself" in help_line
        assert "ibmon_job_shared_hosts" in help_line


def test_unknown_jobs_render_known_zero_and_no_job_series() -> None:
    body = render_jobs(state(jobs_view(known=False, error="timeout")), "main")
    assert samples(body) == {"ibmon_jobs_known": [({"fabric": "main"}, 0.0)]}


def test_a_daemon_without_a_job_source_renders_no_job_series() -> None:
    plain = FabricState(generated=1.0, ports=state().ports)  # jobs left at the default
    assert render_jobs(plain, "main") == b""
    assert b"ibmon_job" not in exposition(SelfMetrics(), plain)


def test_order_is_stable_whatever_order_the_scheduler_listed_jobs_in() -> None:
    forward = render_jobs(state(jobs_view(JOBS)), "main")
    backward = render_jobs(state(jobs_view(tuple(reversed(JOBS)))), "main")
    assert forward == backward
    # numeric ids in numeric order
    many = tuple(Job(str(i), hosts=("host01",)) for i in (10, 9, 100, 2))
    ids = [lb["job_id"] for lb, _ in samples(render_jobs(state(jobs_view(many)), "m"))[
        "ibmon_job_info"]]
    assert ids == ["2", "9", "10", "100"]


def test_port_jobs_label_is_capped_and_only_for_firing_ports() -> None:
    jobs = tuple(Job(str(1000 + i), hosts=("host03",)) for i in range(MAX_LABEL_JOBS + 5))
    base = jobs_view(jobs)
    links = tuple(JobLink(j, "route") for j in jobs)
    quiet = ("0x0002c90300000201", "1")  # the spine port: no condition fires there
    view = dataclasses.replace(base, port_jobs=MappingProxyType(
        {CONGESTED_PORT: links, quiet: links}))
    got = samples(render_jobs(state(view), "main"))["ibmon_port_jobs_info"]
    assert len(got) == 1
    labels, _ = got[0]
    assert (labels["guid"], labels["port"]) == CONGESTED_PORT
    ids = labels["jobs"].split(",")
    assert ids[:MAX_LABEL_JOBS] == [str(1000 + i) for i in range(MAX_LABEL_JOBS)]
    assert ids[MAX_LABEL_JOBS:] == ["+5"]


def test_the_jobs_label_names_each_job_once_and_counts_every_one_left_out() -> None:
    """A job on both ends of a link is one id; one job past the cap is ``+1``, not dropped."""
    jobs = [Job(str(i)) for i in range(1, MAX_LABEL_JOBS + 2)]
    twice = [JobLink(jobs[0], "host"), JobLink(jobs[1], "host"), JobLink(jobs[0], "host")]
    assert jobs_label(twice) == "1,2"
    over = jobs_label([JobLink(j, "route") for j in jobs])
    assert over.split(",")[-1] == "+1" and len(over.split(",")) == MAX_LABEL_JOBS + 1
    assert "+" not in jobs_label([JobLink(j, "route") for j in jobs[:MAX_LABEL_JOBS]])


def test_the_exporter_follows_a_host_that_becomes_shared_while_the_jobs_stay() -> None:
    """The job lines kept between states are kept only while both the jobs and the shared
    hosts are the same: a host matched to a second job (a renamed node description) changes
    ``ibmon_job_shared_hosts`` at once."""
    renderer = JobRenderer("main")
    view = jobs_view()
    shared = {labels["job_id"]: v for labels, v in
              samples(renderer.render(state(view)))["ibmon_job_shared_hosts"]}
    assert shared["103"] == 0
    more = dataclasses.replace(view, shared=view.shared | {"host03"})
    shared = {labels["job_id"]: v for labels, v in
              samples(renderer.render(state(more)))["ibmon_job_shared_hosts"]}
    assert shared["103"] == 1


def test_a_job_listed_on_a_port_but_no_longer_running_is_not_named() -> None:
    ended = Job("999", hosts=("host01",))
    base = jobs_view()
    view = dataclasses.replace(base, port_jobs=MappingProxyType(
        {CONGESTED_PORT: (JobLink(ended, "route"),)}),
        rates=MappingProxyType({**base.rates, "999": (1.0, 1.0)}),
        affected=MappingProxyType({**base.affected, "999": frozenset({"congestion"})}))
    body = render_jobs(state(view), "main")
    assert b'"999"' not in body
    assert b"ibmon_port_jobs_info" not in body


async def test_series_of_an_ended_job_are_gone_from_the_next_scrape() -> None:
    exporter = PrometheusExporter(listen="127.0.0.1:0", self_metrics=SelfMetrics(),
                                  fabric="main")
    async with exporter:
        url = f"http://127.0.0.1:{exporter.port}/metrics"
        exporter.publish_now(state())
        first = await _get(url)
        assert any('job_id="102"' in line for line in job_lines(first))
        exporter.publish_now(state(jobs_view(tuple(j for j in JOBS if j.id != "102")),
                                   generated=1_700_000_500.0))
        second = await _get(url)
    lines = job_lines(second)
    assert lines and not any('job_id="102"' in line for line in lines)
    assert any('job_id="101"' in line for line in lines)
    # the job block sits between the ports' _info families and their other families, and
    # the whole body is one valid exposition
    parsed = samples(second)
    assert parsed["ibmon_job_info"] and parsed["ibmon_port_info"] and parsed["ibmon_port_state"]


async def _get(url: str) -> bytes:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        assert resp.status == 200
        return await resp.read()


def test_the_worker_thread_fallback_renders_the_same_body() -> None:
    """A render that finds the cached renderer busy renders afresh: same series, jobs too."""
    exporter = PrometheusExporter(listen="127.0.0.1:0", self_metrics=SelfMetrics())
    s = state()
    cached = b"".join(_inflate(exporter._render(s, wait=True)))
    with exporter._compressor.lock:
        fresh = b"".join(_inflate(exporter._render(s, wait=False)))
    assert cached == fresh
    assert b"ibmon_job_info" in fresh


def _inflate(body: object) -> list[bytes]:
    from exporters.http import Deflated, inflate

    assert isinstance(body, Deflated)
    return list(inflate(body))


@pytest.mark.system
def test_promtool_accepts_the_exposition_with_jobs(tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    body = exposition(SelfMetrics(), state())
    proc = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()


def test_unknown_table_is_not_the_default_table() -> None:
    """A configured source that failed is told apart from no source at all."""
    failed = JobsView(table=JobTable(known=False, error="missing"))
    assert render_jobs(state(failed), "main").startswith(b"# HELP ibmon_jobs_known")
