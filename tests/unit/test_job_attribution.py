"""Which jobs a port's link carries (``ibmon.jobs.attribute``), on hand-built fabrics.

The real-component version (ibsim + opensm + Slurm + ``ibmon run``, ibtracert as the oracle) is
tests/integration/test_jobs_ibsim_slurm.py; these pin each rule on its own: host links by node
description (either end), shared and unmatched hosts, rates summed over a job's ports, the
leaf-span fallback, routes from forwarding tables, congestion roots, unknown jobs, the cap.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from types import MappingProxyType, SimpleNamespace

import pytest
import structlog

from ibmon.detect.events import Event, PortRef
from ibmon.infiniband.model import PortKey, PortView
from ibmon.jobs import watch
from ibmon.jobs.attribute import REINDEX_SECONDS, Attributor, host_name
from ibmon.jobs.model import Job, JobTable
from ibmon.jobs.routes import RouteIndex
from ibmon.jobs.slurm import SlurmConfig
from ibmon.jobs.watch import JobMetrics, JobWatcher
from ibmon.runtime.metrics import Registry
from ibmon.state import FabricState
from mocks.topology import fat_tree
from tests import job_outputs_state as small
from tests.route_tables import dmodk_tables, port_views


def _state(ports: dict[PortKey, PortView]) -> FabricState:
    base = FabricState(generated=1.0, ports=MappingProxyType(ports))
    return dataclasses.replace(base, conditions=small.active(base))


def _event(key: PortKey, kind: str = "port_down") -> Event:
    return Event(time=Event.at(1.0), fabric="main", type=kind,  # type: ignore[arg-type]
                 status="firing", severity="warning", port=PortRef(guid=key[0], port=key[1]))


def test_host_names_are_the_first_word_of_the_node_description() -> None:
    assert host_name("gpu031 mlx5_0") == "gpu031"
    assert host_name("GPU031.cluster.example mlx5_1") == "gpu031"
    assert host_name("   ") == ""


def test_a_host_link_names_the_jobs_of_its_host_at_either_end() -> None:
    table = JobTable.of(small.JOBS, fetched=1.0)
    attr = Attributor()
    view = attr.view(_state(small.ports()), table, {})
    assert [(link.job.id, link.how) for link in view.port_jobs[small.DOWN_PORT]] == [
        ("101", "host")]
    host01 = (small.HOSTS["host01"], "1")
    assert [link.job.id for link in attr.jobs_on(host01)] == ["101"]
    host02 = (small.HOSTS["host02"], "1")
    assert [link.job.id for link in attr.jobs_on(host02)] == ["101", "102"]
    assert view.shared == {"host02"}
    assert view.unmatched == {"host99"}
    assert view.affected["101"] == {"port_down"}
    assert view.host_ports["host01"] == (host01,)
    # rates: the sum over the job's hosts' HCA ports (1e8 / 2e8 each in this fabric)
    assert view.rates["101"] == (2e8, 4e8)
    assert view.rates["103"] == (1e8, 2e8)


def test_host_pattern_picks_the_host_out_of_another_description_style() -> None:
    ports = {k: dataclasses.replace(v, identity=dataclasses.replace(
        v.identity, node_desc=f"HCA-1 on {v.identity.node_desc.split()[0]}"))
        if v.identity.node_type == "ca" else v for k, v in small.ports().items()}
    table = JobTable.of(small.JOBS, fetched=1.0)
    plain = Attributor().view(_state(ports), table, {})
    assert plain.unmatched == {"host01", "host02", "host03", "host99"}
    cfg = SlurmConfig(host_pattern=r" on (?P<host>\S+)$")
    view = Attributor(cfg).view(_state(ports), table, {})
    assert view.unmatched == {"host99"}
    assert [link.job.id for link in view.port_jobs[small.DOWN_PORT]] == ["101"]


def _two_level() -> tuple[dict[PortKey, PortView], dict[str, bytes]]:
    fabric = fat_tree(levels=2, radix=4, leaves=4, hosts_per_leaf=2)
    views = port_views(fabric)
    for key, v in views.items():
        node = fabric.nodes[key[0]]
        views[key] = dataclasses.replace(v, identity=dataclasses.replace(
            v.identity, node_desc=node.desc), rates={"transmit_data": 1.0, "receive_data": 2.0})
    return views, dmodk_tables(fabric)


def _guid(views: dict[PortKey, PortView], desc: str) -> str:
    return next(k[0] for k, v in views.items() if v.identity.node_desc == desc)


def _uplink(views: dict[PortKey, PortView], leaf: str) -> PortKey:
    """A port of switch ``leaf`` cabled to another switch."""
    guid = _guid(views, leaf)
    return next(k for k, v in views.items() if k[0] == guid and v.link is not None
                and views[(v.link.remote_guid, v.link.remote_port)].identity.node_type
                == "switch")


def test_without_tables_a_leaf_uplink_names_the_jobs_spanning_its_leaf() -> None:
    views, _ = _two_level()
    uplink = _uplink(views, "leaf01")
    table = JobTable.of([Job("1", hosts=("host001", "host003")),   # leaf01 and leaf02
                         Job("2", hosts=("host001", "host002")),   # leaf01 only
                         Job("3", hosts=("host005", "host007"))],  # leaf03 and leaf04
                        fetched=1.0)
    attr = Attributor()
    view = attr.view(_state(views), table, {})
    assert view.routing == "leaf_span"
    assert [(link.job.id, link.how) for link in attr.jobs_on(uplink)] == [("1", "leaf_span")]
    far = views[uplink].link
    assert far is not None  # from the spine's end the leaf end decides alike
    assert [link.job.id for link in attr.jobs_on((far.remote_guid, far.remote_port))] == ["1"]
    # the state's view answers alike for this quiet link (no condition: not in ``port_jobs``),
    # and for its own jobs still once the next state's jobs are others
    assert [(link.job.id, link.how) for link in view.on_link([uplink])] == [("1", "leaf_span")]
    later = JobTable.of([Job("4", hosts=("host001", "host003"))], fetched=2.0)
    attr.view(_state(views), later, {})
    assert [link.job.id for link in attr.jobs_on(uplink)] == ["4"]
    assert [link.job.id for link in view.on_link([uplink])] == ["1"]


def test_with_tables_an_inter_switch_link_names_the_jobs_routed_over_it() -> None:
    views, tables = _two_level()
    table = JobTable.of([Job("1", hosts=("host001", "host003")),
                         Job("2", hosts=("host001", "host002")),
                         Job("3", hosts=("host005", "host007"))], fetched=1.0)
    attr = Attributor()
    view = attr.view(_state(views), table, tables)
    assert view.routing == "tables"
    index = RouteIndex.build(tables, views)
    leaf01, leaf02 = _guid(views, "leaf01"), _guid(views, "leaf02")
    named: dict[PortKey, set[str]] = {}
    for key, v in views.items():
        if v.identity.node_type != "switch" or v.link is None:
            continue
        far = (v.link.remote_guid, v.link.remote_port)
        if views[far].identity.node_type != "switch":
            continue
        ids = {link.job.id for link in attr.jobs_on(key)}
        pairs = index.leaf_pairs(key) | index.leaf_pairs(far)
        want = {"1"} if {(leaf01, leaf02), (leaf02, leaf01)} & pairs else set()
        want |= {"3"} if any(leaf01 not in p and leaf02 not in p for p in pairs) else set()
        assert ids == want, key
        named[key] = ids
    assert any("1" in ids for ids in named.values())
    assert not any("2" in ids for ids in named.values())  # one leaf: never on an uplink


def test_a_congestion_victim_points_at_its_root_and_lists_the_roots_jobs_first() -> None:
    views, tables = _two_level()
    index = RouteIndex.build(tables, views)
    leaf02 = _guid(views, "leaf02")
    host003 = _guid(views, "host003 mlx5_0")
    root = next(k for k, v in views.items()
                if k[0] == leaf02 and v.link is not None and v.link.remote_guid == host003)
    victim = next(k for k, v in views.items() if v.identity.node_type == "switch"
                  and v.link is not None and v.link.remote_guid == leaf02
                  and root in index.downstream(k))
    views[root] = dataclasses.replace(views[root], conditions=frozenset({"congestion"}))
    views[victim] = dataclasses.replace(views[victim], conditions=frozenset({"congestion"}))
    # job "1" (host002, host004) crosses the victim's link too, but does not feed the root
    table = JobTable.of([Job("1", hosts=("host002", "host004")),
                         Job("2", hosts=("host001", "host003"))], fetched=1.0)
    attr = Attributor()
    attr.view(_state(views), table, tables)
    (event,) = attr.annotate([_event(victim, "congestion")])
    assert event.details["congestion_root"]["guid"] == root[0]
    assert event.details["congestion_root"]["port"] == root[1]
    assert [j["id"] for j in event.details["jobs"]] == ["2", "1"]
    (event,) = attr.annotate([_event(root, "congestion")])
    assert "congestion_root" not in event.details  # the root itself has none
    # the root belongs to the congestion: another event on the victim (its link went down)
    # names the link's jobs and no root
    (down,) = attr.annotate([_event(victim)])
    assert "congestion_root" not in down.details and down.details["jobs"]


def test_events_carry_capped_jobs_and_say_when_jobs_are_unknown() -> None:
    jobs = [Job(str(i), user="u", name=f"j{i}", hosts=("host02",)) for i in range(1, 6)]
    attr = Attributor(SlurmConfig(max_event_jobs=2))
    attr.view(_state(small.ports()), JobTable.of(jobs, fetched=1.0), {})
    host02 = (small.HOSTS["host02"], "1")
    (event,) = attr.annotate([_event(host02)])
    assert event.details["jobs"] == [{"id": "1", "user": "u", "name": "j1", "how": "host"},
                                     {"id": "2", "user": "u", "name": "j2", "how": "host"}]
    assert event.details["jobs_total"] == 5
    assert event.details["jobs_known"] is True
    unknown = JobTable(known=False, error="timeout")
    view = attr.view(_state(small.ports()), unknown, {})
    assert not view.port_jobs and not view.rates
    (event,) = attr.annotate([_event(host02)])
    assert event.details["jobs_known"] is False and event.details["jobs"] == []


def test_a_job_that_ends_leaves_the_view_and_the_events() -> None:
    attr = Attributor()
    attr.view(_state(small.ports()), JobTable.of(small.JOBS, fetched=1.0), {})
    view = attr.view(_state(small.ports()), JobTable.of(small.JOBS[1:], fetched=2.0), {})
    assert "101" not in view.rates and small.DOWN_PORT not in view.port_jobs
    (event,) = attr.annotate([_event(small.DOWN_PORT)])
    assert event.details["jobs"] == [] and event.details["jobs_total"] == 0


def test_the_fabric_index_follows_ports_tables_and_renamed_hosts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fabric index is rebuilt when the port count or the tables change, and at least every
    ``REINDEX_SECONDS`` otherwise; the running jobs' ports are taken again from the new index."""
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    table = JobTable.of(small.JOBS, fetched=1.0)
    no_tables: dict[str, bytes] = {}  # one object, as the daemon's tables between discoveries
    host01 = (small.HOSTS["host01"], "1")
    attr = Attributor()
    # host01's HCA port is not read yet: job 101 has host02's port only
    without = {k: v for k, v in small.ports().items() if k != host01}
    view = attr.view(_state(without), table, no_tables)
    assert "host01" not in view.host_ports and view.rates["101"] == (1e8, 2e8)
    # it answers (one port more), the jobs are the same: job 101 has both hosts' ports
    view = attr.view(_state(small.ports()), table, no_tables)
    assert view.host_ports["host01"] == (host01,) and view.rates["101"] == (2e8, 4e8)
    # host03 renamed in place (same ports, same tables): the old name until the next reindex
    renamed = {k: dataclasses.replace(v, identity=dataclasses.replace(
        v.identity, node_desc="host77 mlx5_0")) if v.identity.node_desc == "host03 mlx5_0"
        else v for k, v in small.ports().items()}
    clock[0] += REINDEX_SECONDS - 1
    assert attr.view(_state(renamed), table, no_tables).rates["103"] == (1e8, 2e8)
    clock[0] += 1
    view = attr.view(_state(renamed), table, no_tables)
    assert "103" not in view.rates and view.unmatched == {"host03", "host99"}
    # the same ports with tables read, then without: the routing follows the tables
    views, tables = _two_level()
    assert attr.view(_state(views), table, tables).routing == "tables"
    assert attr.view(_state(views), table, no_tables).routing == "leaf_span"


def test_tables_missing_a_switch_fall_back_to_leaf_spans() -> None:
    """A route through a switch whose table was not read ends there: with any switch's table
    missing, inter-switch links are named by leaf spans, not by half-followed routes."""
    views, tables = _two_level()
    spine = _guid(views, "spine01")
    partial = {g: t for g, t in tables.items() if g != spine}
    table = JobTable.of([Job("1", hosts=("host001", "host003"))], fetched=1.0)
    attr = Attributor()
    assert attr.view(_state(views), table, partial).routing == "leaf_span"
    assert attr.view(_state(views), table, tables).routing == "tables"


def test_a_job_has_no_rate_until_one_of_its_ports_has_one() -> None:
    """On the first poll no port has a rate: the jobs have none either (absent, not 0 B/s, which
    a dashboard would draw as an idle job)."""
    first = {k: dataclasses.replace(v, rates={}) for k, v in small.ports().items()}
    table = JobTable.of(small.JOBS, fetched=1.0)
    attr = Attributor()
    assert attr.view(_state(first), table, {}).rates == {}
    assert attr.view(_state(small.ports()), table, {}).rates["101"] == (2e8, 4e8)


def test_a_link_names_the_jobs_routed_over_it_in_either_direction() -> None:
    """Routes need not come back the way they went: with one host a leaf, leaf01 -> leaf02
    crosses spine01 while leaf02 -> leaf01 crosses spine03. The link leaf02 / spine01 carries
    the job's traffic only towards leaf02, and is still its link, asked from either end."""
    fabric = fat_tree(levels=2, radix=4, leaves=4, hosts_per_leaf=1)
    views = port_views(fabric)
    for key, v in views.items():
        views[key] = dataclasses.replace(v, identity=dataclasses.replace(
            v.identity, node_desc=fabric.nodes[key[0]].desc))
    tables = dmodk_tables(fabric)
    index = RouteIndex.build(tables, views)
    leaf02, spine01 = _guid(views, "leaf02"), _guid(views, "spine01")
    up = next(k for k, v in views.items() if k[0] == leaf02 and v.link is not None
              and v.link.remote_guid == spine01)
    link = views[up].link
    assert link is not None
    down = (link.remote_guid, link.remote_port)
    assert not index.leaf_pairs(up) and index.leaf_pairs(down)  # one direction only
    attr = Attributor()
    attr.view(_state(views), JobTable.of([Job("1", hosts=("host001", "host002"))],
                                         fetched=1.0), tables)
    assert [(link.job.id, link.how) for link in attr.jobs_on(up)] == [("1", "route")]
    assert [link.job.id for link in attr.jobs_on(down)] == ["1"]


def test_the_jobs_on_a_link_come_most_routes_first() -> None:
    """A link's jobs are ordered by how many of their (source leaf, destination leaf) routes
    cross it, the most first: the job that loses most when the link fails leads the list (and
    the event's capped ``jobs``)."""
    views, tables = _two_level()
    index = RouteIndex.build(tables, views)
    wide = Job("9", hosts=("host001", "host003", "host005", "host007"))  # all four leaves
    narrow = Job("10", hosts=("host001", "host003"))  # leaf01 and leaf02
    attr = Attributor()
    attr.view(_state(views), JobTable.of([narrow, wide], fetched=1.0), tables)
    leaves = {name: _guid(views, name) for name in ("leaf01", "leaf02")}
    pair = (leaves["leaf01"], leaves["leaf02"])
    checked = 0
    for key, v in views.items():
        if v.identity.node_type != "switch" or v.link is None:
            continue
        far = (v.link.remote_guid, v.link.remote_port)
        pairs = index.leaf_pairs(key) | index.leaf_pairs(far)
        if views[far].identity.node_type == "switch" and pair in pairs and len(pairs) > 2:
            assert [link.job.id for link in attr.jobs_on(key)] == ["9", "10"], key
            checked += 1
    assert checked


def test_without_tables_the_jobs_on_an_uplink_come_most_hosts_under_its_leaf_first() -> None:
    views, _ = _two_level()
    uplink = _uplink(views, "leaf01")
    table = JobTable.of([Job("9", hosts=("host001", "host003")),               # 1 under leaf01
                         Job("10", hosts=("host001", "host002", "host005"))],  # 2 under leaf01
                        fetched=1.0)
    attr = Attributor()
    attr.view(_state(views), table, {})
    assert [(link.job.id, link.how) for link in attr.jobs_on(uplink)] == [
        ("10", "leaf_span"), ("9", "leaf_span")]
    # a tie goes by job id as Slurm numbers them: 9 before 10
    attr.view(_state(views), JobTable.of([Job("10", hosts=("host001", "host003")),
                                          Job("9", hosts=("host002", "host005"))],
                                         fetched=2.0), {})
    assert [link.job.id for link in attr.jobs_on(uplink)] == ["9", "10"]


async def test_a_job_source_bug_is_logged_once_a_while_and_counted_every_time() -> None:
    """A fetch that raises (a bug, not a scheduler problem) leaves jobs unknown with reason
    ``bug`` on every query, and its traceback in the log once, not once a query."""
    async def broken() -> JobTable:
        raise RuntimeError("a bug")

    registry = Registry()
    watcher = JobWatcher(broken, 30.0, JobMetrics(registry))
    with structlog.testing.capture_logs() as logs:
        for _ in range(3):
            table = await watcher.refresh()
            assert (table.known, table.error) == (False, "bug")
    assert [x["event"] for x in logs] == ["jobs_query_bug"]
    assert registry.get_sample_value("ibmon_jobs_query_errors_total", {"reason": "bug"}) == 3


async def test_the_job_watcher_keeps_its_cadence_whatever_a_query_takes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Queries start every ``interval``: a query that took 5 s of a 30 s interval is
    followed by 25 s of sleep, not 30."""
    clock = [100.0]
    slept: list[float] = []

    async def slow() -> JobTable:
        clock[0] += 5.0
        return JobTable(known=True, fetched=clock[0])

    async def sleep(delay: float) -> None:
        slept.append(delay)
        if len(slept) == 2:
            raise asyncio.CancelledError

    # the watcher's own clock and sleep, not the event loop's
    monkeypatch.setattr(watch, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr(watch, "asyncio", SimpleNamespace(
        sleep=sleep, shield=asyncio.shield, CancelledError=asyncio.CancelledError))
    with pytest.raises(asyncio.CancelledError):
        await JobWatcher(slow, 30.0, JobMetrics(Registry())).run()
    assert slept == [25.0, 25.0]


async def test_the_job_watcher_reports_each_query_as_it_went() -> None:
    """A query that worked sets the last-success time; one that failed counts its reason and
    makes the jobs unknown (never the last good table, now stale); the watcher's end closes
    the source."""
    answers = [JobTable(known=True, fetched=1000.0), JobTable(known=False, error="timeout"),
               JobTable(known=False, error=None)]
    closed: list[bool] = []

    async def fetch() -> JobTable:
        return answers.pop(0)

    async def close() -> None:
        closed.append(True)

    registry = Registry()
    watcher = JobWatcher(fetch, 30.0, JobMetrics(registry), close=close)

    def errors(reason: str) -> float | None:
        return registry.get_sample_value("ibmon_jobs_query_errors_total", {"reason": reason})

    assert (await watcher.refresh()).known and watcher.table.known
    assert registry.get_sample_value("ibmon_jobs_last_success_timestamp_seconds") == 1000.0
    assert (await watcher.refresh()).error == "timeout" and not watcher.table.known
    assert (errors("timeout"), errors("failed")) == (1, 0)
    await watcher.refresh()  # no reason given: counted as failed
    assert (errors("timeout"), errors("failed")) == (1, 1)
    assert registry.get_sample_value("ibmon_jobs_last_success_timestamp_seconds") == 1000.0
    task = asyncio.create_task(JobWatcher(fetch, 30.0, JobMetrics(Registry()), close=close).run())
    answers.append(JobTable(known=True, fetched=2000.0))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert closed == [True]
