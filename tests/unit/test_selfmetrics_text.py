"""The daemon's self metrics render exactly what prometheus_client's generate_latest writes.

Alert rules and dashboards were written against prometheus_client's output; ibmon renders its
self metrics itself (``ibmon.runtime.metrics``, which keeps prometheus_client and OpenSSL out of a
node daemon, and builds each series' prefix once). These tests hold the
daemon's real registry (every family it registers: sources, pipeline stages, events, state file,
reloads, loop lag, HTTP listener, MQTT, shards) to prometheus_client byte for byte, through
``tests/metrics_oracle.py``: the same definitions, the same operations on both, before and after
values move and new label sets appear (a stale prefix would show).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import generate_latest

from exporters.http import http_metrics
from ibmon.config import Settings
from ibmon.runtime.daemon import Daemon
from ibmon.runtime.selfmetrics import ONE_SHOT_FAMILIES, SelfMetrics
from ibmon.sources.mad import MadSourceConfig
from tests.metrics_oracle import Oracle


def _daemon_with_every_family() -> tuple[Daemon, Oracle]:
    daemon = Daemon(Settings())
    m = daemon.metrics
    m.enable_mqtt()
    m.describe_sources("main", [MadSourceConfig(shard="0/2")])
    http_metrics(m.registry)
    return daemon, Oracle(m.registry)


def _busy(oracle: Oracle) -> None:
    for source in ("sysfs", "fabric-a"):
        oracle.apply("ibmon_source_up", (source,), "set", 1)
        oracle.apply("ibmon_source_poll_duration_seconds", (source,), "observe", 0.0031)
        oracle.apply("ibmon_source_poll_errors", (source, "timeout"), "inc", 3)
        for stage in ("sample", "track", "detect", "publish"):
            oracle.apply("ibmon_pipeline_stage_seconds", (source, stage), "observe", 0.00042)
        oracle.apply("ibmon_source_last_success_timestamp_seconds", (source,), "set",
                     1_700_000_000.123)
        oracle.apply("ibmon_source_ports", (source,), "set", 16)
        oracle.apply("ibmon_source_stale_ports", (source,), "set", 0)
        oracle.apply("ibmon_source_unreachable_nodes", (source,), "set", 2)
    oracle.apply("ibmon_events", ("link_down", "critical"), "inc")
    oracle.apply("ibmon_events_dropped", ("mqtt",), "inc")
    oracle.apply("ibmon_state_file_errors", ("missing",), "inc")
    oracle.apply("ibmon_config_reloads", ("applied",), "inc")
    oracle.apply("ibmon_event_loop_lag_seconds", (), "observe", 0.0002)
    oracle.apply("ibmon_http_connections_closed", ("evicted",), "inc")
    oracle.apply("ibmon_http_bad_requests", (), "inc")
    oracle.apply("ibmon_mqtt_connected", (), "set", 1)
    oracle.apply("ibmon_mqtt_published", (), "inc", 12)


def test_the_daemons_registry_renders_like_generate_latest() -> None:
    daemon, oracle = _daemon_with_every_family()
    oracle.assert_same()  # as constructed: build info, reload results, listener reasons
    _busy(oracle)
    oracle.assert_same()
    assert daemon.metrics.render() == oracle.expected()
    # Again after values moved and a new label set appeared: the prefixes hold no values.
    oracle.apply("ibmon_source_poll_duration_seconds", ("sysfs",), "observe", 7.5)
    oracle.apply("ibmon_source_up", ("sysfs",), "set", 0)
    oracle.apply("ibmon_source_poll_errors", ("new-source", "garbage"), "inc", 1e20)
    oracle.apply("ibmon_source_last_success_timestamp_seconds", ("sysfs",), "set", float("nan"))
    oracle.apply("ibmon_source_stale_ports", ("sysfs",), "set", float("inf"))
    oracle.apply("ibmon_source_ports", ('a "quoted"\\ source\n',), "set", 1)
    oracle.assert_same()
    oracle.assert_same()  # a second render of the same state: same bytes


def test_every_family_the_daemon_registers_is_compared() -> None:
    daemon, oracle = _daemon_with_every_family()
    families = {f.name for f in daemon.metrics.registry.families()}
    assert {"ibmon_build_info", "ibmon_pipeline_stage_seconds", "ibmon_event_loop_lag_seconds",
            "ibmon_http_connections_closed", "ibmon_mqtt_dropped", "ibmon_shard_info",
            "ibmon_config_last_reload_successful", "ibmon_events_dropped"} <= families
    assert {m.name for m in oracle.theirs.collect()} == families


class _Only:
    """The families named, in registration order, out of a prometheus_client registry."""

    def __init__(self, registry: Any, names: tuple[str, ...]) -> None:
        self._registry, self._names = registry, names

    def collect(self) -> Iterator[Any]:
        return (m for m in self._registry.collect() if m.name in self._names)


def test_one_shot_output_is_generate_latest_of_its_families() -> None:
    m = SelfMetrics()
    m.describe_sources("main", [MadSourceConfig(shard="1/2")])
    oracle = Oracle(m.registry)
    _busy_sources_only(oracle)
    assert m.render_one_shot() == generate_latest(_Only(oracle.theirs, ONE_SHOT_FAMILIES))
    text = m.render_one_shot().decode()
    assert "ibmon_source_poll_duration_seconds" not in text
    assert "ibmon_shard_info{" in text


def _busy_sources_only(oracle: Oracle) -> None:
    oracle.apply("ibmon_source_up", ("main",), "set", 1)
    oracle.apply("ibmon_source_poll_duration_seconds", ("main",), "observe", 0.2)
    oracle.apply("ibmon_source_last_success_timestamp_seconds", ("main",), "set", 1.7e9)
    oracle.apply("ibmon_source_ports", ("main",), "set", 2394)
