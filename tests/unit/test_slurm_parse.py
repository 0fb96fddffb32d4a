"""``squeue --json`` read into running jobs, in the shapes Slurm 22.05 and 23.02+ print.

The 22.05 entry is a real one (trimmed) from the test cluster in tests/slurm_cluster.py; the
23.02 entry follows that release's OpenAPI (job_state a list, numbers as set/infinite/number).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from pydantic import ValidationError

from ibmon.config import Settings
from ibmon.jobs.model import Job
from ibmon.jobs.slurm import MAX_TEXT, SlurmConfig, SlurmOutputError, parse_squeue

#: A real Slurm 22.05.8 job entry (unneeded fields dropped).
JOB_2205: dict[str, Any] = {
    "account": "",
    "array_job_id": 0,
    "array_task_id": None,
    "batch_host": "host001",
    "cluster": "ibmontest",
    "job_id": 1,
    "job_resources": {"nodes": "host[001-002]", "allocated_hosts": 2},
    "job_state": "RUNNING",
    "name": "alpha",
    "nodes": "host[001-002]",
    "node_count": 2,
    "partition": "debug",
    "start_time": 1796432826,
    "submit_time": 1796432824,
    "user_id": 0,
    "user_name": "root",
}


def _n(value: int | None, *, infinite: bool = False) -> dict[str, Any]:
    return {"set": value is not None, "infinite": infinite, "number": value or 0}


#: A Slurm 23.02-style entry: an array task on a mixed host list.
JOB_2302: dict[str, Any] = {
    "array_job_id": _n(700),
    "array_task_id": _n(3),
    "job_id": _n(703),
    "job_resources": {"nodes": "gpu[001-004],gpu7"},
    "job_state": ["RUNNING"],
    "name": "llm-train",
    "nodes": "gpu[001-004],gpu7",
    "partition": "gpu",
    "start_time": _n(1700000000),
    "time_limit": _n(None, infinite=True),
    "user_name": "alice",
}


def _doc(*jobs: Any) -> str:
    return json.dumps({"meta": {}, "errors": [], "jobs": list(jobs)})


def test_slurm_2205_running_job() -> None:
    assert parse_squeue(_doc(JOB_2205)) == [
        Job(id="1", user="root", name="alpha", partition="debug", state="RUNNING",
            start=1796432826.0, hosts=("host001", "host002"))
    ]


def test_slurm_2302_array_task_with_wrapped_numbers() -> None:
    assert parse_squeue(_doc(JOB_2302)) == [
        Job(id="700_3", user="alice", name="llm-train", partition="gpu", state="RUNNING",
            start=1700000000.0,
            hosts=("gpu001", "gpu002", "gpu003", "gpu004", "gpu7"))
    ]


def test_array_task_in_2205_shape() -> None:
    job = dict(JOB_2205, job_id=42, array_job_id=40, array_task_id=2)
    assert [j.id for j in parse_squeue(_doc(job))] == ["40_2"]


def test_a_plain_job_is_its_id_whatever_half_of_the_array_fields_says() -> None:
    """squeue names an array task ``<array job>_<task>`` only when both are set; a plain job
    has array_job_id 0 and no task, and half of the pair is no array task either."""
    for array_job, task in ((0, 3), (40, None), (0, None), (_n(None), _n(2)), (_n(40), _n(None))):
        job = dict(JOB_2205, array_job_id=array_job, array_task_id=task)
        assert [j.id for j in parse_squeue(_doc(job))] == ["1"], (array_job, task)


def test_hosts_are_sorted_and_counted_once_and_a_zero_start_is_unknown() -> None:
    job = dict(JOB_2205, nodes="host002,host001,host002", start_time=0)
    (parsed,) = parse_squeue(_doc(job))
    assert parsed.hosts == ("host001", "host002")
    assert parsed.start is None


@pytest.mark.parametrize("state", ["PENDING", "COMPLETED", "CANCELLED", ["PENDING"],
                                   ["COMPLETED"], []])
def test_only_running_jobs(state: Any) -> None:
    other = dict(JOB_2205, job_id=2, job_state=state, nodes="")
    assert [j.id for j in parse_squeue(_doc(JOB_2205, other))] == ["1"]


def test_running_with_more_flags_in_2302() -> None:
    job = dict(JOB_2302, job_state=["RUNNING", "COMPLETING"])
    assert len(parse_squeue(_doc(job))) == 1


def test_unset_start_time_is_none() -> None:
    job = dict(JOB_2302, start_time=_n(None))
    assert parse_squeue(_doc(job))[0].start is None


def test_untrusted_text_is_bounded_and_printable() -> None:
    job = dict(JOB_2205, name="x\x1b]52;c;evil\x07" + "n" * 5000, user_name="\x1b[2Jroot",
               partition=["not", "a", "string"])
    (parsed,) = parse_squeue(_doc(job))
    assert len(parsed.name) <= MAX_TEXT and parsed.name.isprintable()
    assert "\x1b" not in parsed.user and parsed.user.endswith("root")
    assert parsed.partition == ""


@pytest.mark.parametrize(
    "broken",
    [
        "a string",
        dict(JOB_2205, job_id="1; rm -rf /"),
        dict(JOB_2205, job_id=None),
        dict(JOB_2205, job_id=True),  # JSON true is no number
        dict(JOB_2205, job_id=-3),
        dict(JOB_2205, job_id=1.5),
        dict(JOB_2302, job_id=_n(None)),  # 23.02: a number that is not set
        dict(JOB_2205, job_state=None),
        dict(JOB_2205, nodes="host[004-001"),
        dict(JOB_2205, nodes=["host001"]),
        dict(JOB_2205, nodes="node[1-999999999]"),
        dict(JOB_2205, nodes="h" * (MAX_TEXT + 1)),
    ],
)
def test_a_malformed_job_costs_only_itself(broken: Any) -> None:
    good = copy.deepcopy(JOB_2302)
    assert [j.id for j in parse_squeue(_doc(JOB_2205, broken, good))] == ["1", "700_3"]


@pytest.mark.parametrize(
    "text",
    ["", "squeue: error: Invalid user\n", "[]", '{"jobs": {}}', '{"meta": {}}', "null",
     "[" * 100_000, '{"jobs": [' + "{}" * 3],
)
def test_junk_raises(text: str) -> None:
    with pytest.raises(SlurmOutputError):
        parse_squeue(text)


def test_no_running_jobs_is_an_empty_list() -> None:
    assert parse_squeue(_doc()) == []


def test_config_section() -> None:
    cfg = Settings.model_validate({"slurm": {"interval": "1m", "timeout": "5s",
                                             "host_pattern": r"^(?P<host>\S+) mlx"}}).slurm
    assert cfg == SlurmConfig(interval=60.0, timeout=5.0, host_pattern=r"^(?P<host>\S+) mlx")
    assert Settings().slurm is None
    for bad in ({"host_pattern": "(unclosed"}, {"host_pattern": r"^(\S+)"},
                {"max_event_jobs": 0}, {"interval": "0s"}, {"restd_url": "http://x"}):
        with pytest.raises(ValidationError):
            SlurmConfig.model_validate(bad)
