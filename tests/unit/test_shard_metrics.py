"""``ibmon_shard_info`` / ``ibmon_source_shards``: what the shard-coverage alert counts."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from ibmon.config import load_settings
from ibmon.runtime.selfmetrics import ONE_SHOT_FAMILIES, SelfMetrics


def series(metrics: SelfMetrics, name: str) -> list[tuple[dict[str, str], float]]:
    return [
        (s.labels, s.value)
        for fam in text_string_to_metric_families(metrics.render().decode())
        for s in fam.samples
        if s.name == name
    ]


def sources(*tables: dict[str, object]) -> list[object]:
    return list(load_settings(None, sources=list(tables)).sources)


def test_each_fabric_source_names_its_shard_and_an_unsharded_one_is_0_of_1() -> None:
    m = SelfMetrics()
    m.describe_sources("east", sources({"type": "mad", "name": "fabric", "shard": "2/3"},
                                       {"type": "diags"}))
    assert sorted(series(m, "ibmon_shard_info"), key=str) == sorted([
        ({"fabric": "east", "source": "fabric", "shard": "2", "shards": "3"}, 1.0),
        ({"fabric": "east", "source": "diags", "shard": "0", "shards": "1"}, 1.0),
    ], key=str)
    assert sorted(series(m, "ibmon_source_shards"), key=str) == sorted([
        ({"fabric": "east", "source": "fabric"}, 3.0),
        ({"fabric": "east", "source": "diags"}, 1.0),
    ], key=str)


def test_node_local_sources_claim_no_shard_and_add_no_family() -> None:
    """Hundreds of sysfs daemons claiming shard 0 would hide a dead fabric collector."""
    m = SelfMetrics()
    m.describe_sources("main", sources({"type": "sysfs"}, {"type": "mock"}))
    text = m.render().decode()
    assert "ibmon_shard_info" not in text and "ibmon_source_shards" not in text


def test_describing_again_replaces_every_series() -> None:
    """A reload that re-shards or removes a source leaves no series claiming the old shard."""
    m = SelfMetrics()
    m.describe_sources("main", sources({"type": "mad", "name": "a", "shard": "0/2"},
                                       {"type": "diags", "name": "b", "shard": "1/2"}))
    m.describe_sources("main", sources({"type": "mad", "name": "a", "shard": "0/3"}))
    assert series(m, "ibmon_shard_info") == [
        ({"fabric": "main", "source": "a", "shard": "0", "shards": "3"}, 1.0)]
    assert series(m, "ibmon_source_shards") == [({"fabric": "main", "source": "a"}, 3.0)]
    m.describe_sources("main", sources({"type": "sysfs"}))
    assert series(m, "ibmon_shard_info") == [] and series(m, "ibmon_source_shards") == []


def test_one_shot_output_keeps_gauges_of_the_moment_and_drops_counters_and_histograms() -> None:
    m = SelfMetrics()
    m.describe_sources("main", sources({"type": "mad", "shard": "1/2"}))
    m.source_up.labels("mad").set(1)
    m.poll_duration.labels("mad").observe(0.5)
    m.poll_errors.labels("mad", "timeout").inc()
    m.events.labels("port_down", "critical").inc()
    names = [f.name for f in text_string_to_metric_families(m.render_one_shot().decode())]
    assert names == list(ONE_SHOT_FAMILIES)
    assert m.render_one_shot() == m.render_one_shot()  # byte-stable between renders
