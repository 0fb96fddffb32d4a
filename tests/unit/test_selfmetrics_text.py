"""The self-metrics text renderer writes exactly what prometheus_client's generate_latest does.

``SelfMetrics.render`` runs on every scrape, so it caches each family's head and each series'
prefix instead of formatting them again (issue 12, target 1). These tests hold the two outputs
together byte for byte: on the daemon's real registry, on label values that need escaping, and
across changes (new label sets, moved values) so a stale cache would show.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.exposition import generate_latest

from ibmon.selfmetrics import POLL_BUCKETS, SelfMetrics, TextRenderer


def _busy_self_metrics() -> SelfMetrics:
    m = SelfMetrics()
    m.enable_mqtt()
    for source in ("sysfs", "fabric-a"):
        m.source_up.labels(source).set(1)
        m.poll_duration.labels(source).observe(0.0031)
        m.poll_errors.labels(source, "timeout").inc(3)
        for stage in ("sample", "track", "detect", "publish"):
            m.stage_seconds.labels(source, stage).observe(0.00042)
        m.last_success.labels(source).set(1_700_000_000.123)
        m.source_ports.labels(source).set(16)
        m.stale_ports.labels(source).set(0)
        m.unreachable_nodes.labels(source).set(2)
    m.events.labels("link_down", "critical").inc()
    return m


def test_the_daemons_registry_renders_like_generate_latest() -> None:
    m = _busy_self_metrics()
    assert m.render() == generate_latest(m.registry)
    # Again after values moved and a new label set appeared: the caches hold no values.
    m.poll_duration.labels("sysfs").observe(7.5)
    m.source_up.labels("sysfs").set(0)
    m.poll_errors.labels("new-source", "garbage").inc(1e20)
    m.last_success.labels("sysfs").set(float("nan"))
    m.stale_ports.labels("sysfs").set(float("inf"))
    assert m.render() == generate_latest(m.registry)
    assert m.render() == generate_latest(m.registry)  # cached prefixes, same bytes


@settings(max_examples=200, deadline=None)
@given(
    labels=st.lists(st.text(min_size=0, max_size=12), min_size=1, max_size=5),
    values=st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=5),
    doc=st.text(max_size=30),
)
def test_escaping_and_values_match_generate_latest(
    labels: list[str], values: list[float], doc: str
) -> None:
    r = CollectorRegistry()
    g = Gauge("ibmon_test_gauge", doc or "help", ["name", "b"], registry=r)
    c = Counter("ibmon_test", "counter\\with\nescapes", ["name"], registry=r)
    h = Histogram("ibmon_test_seconds", "h", ["name"], buckets=POLL_BUCKETS, registry=r)
    renderer = TextRenderer()
    for i, label in enumerate(labels):
        value = values[i % len(values)]
        g.labels(label, str(i)).set(value)
        c.labels(label).inc(abs(value) if value == value and abs(value) != float("inf") else 1)
        if value == value:
            h.labels(label).observe(value)
        assert renderer.render(r) == generate_latest(r)


def test_unusual_families_fall_back_to_generate_latest() -> None:
    r = CollectorRegistry()
    Info("ibmon_test_build", "an info family", registry=r).info({"version": "1"})
    Gauge("ibmon_plain", "g", registry=r).set(2)
    assert TextRenderer().render(r) == generate_latest(r)
