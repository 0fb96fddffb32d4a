"""ibmon's own health metrics, kept in a private prometheus_client registry.

These are few series, so the stock client is fine here; the port series (hundreds of thousands)
go through the fast renderer in ``exporters.prometheus`` instead.
"""

from __future__ import annotations

import platform
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

from ibmon import __version__

__all__ = ["ONE_SHOT_FAMILIES", "MqttMetrics", "SelfMetrics", "ShardMetrics", "TextRenderer"]

# ``_created`` series double the output and no alert or dashboard of ours uses them.
disable_created_metrics()  # type: ignore[no-untyped-call]

POLL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Stages range from microseconds (tracking one host's ports) to seconds (a fabric sweep).
STAGE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, *POLL_BUCKETS)

#: The self metrics a one-shot ``ibmon scan --format prom`` carries (a node_exporter textfile):
#: the gauges that describe the moment of the scan. Counters and histograms are left out: they
#: would start from zero in every run of a process that then exits, so Prometheus would read a
#: file rewritten every minute as a counter that never moves (or resets each time), and a
#: two-poll duration histogram says nothing about a daemon's health. What stays answers the
#: questions an operator asks of a textfile: did the source answer (``ibmon_source_up``), when
#: (``..._last_success_timestamp_seconds``, which also goes stale when the cron job stops, so
#: IbmonDataStale fires), and how much of it (ports, stale ports, unreachable nodes, shards).
ONE_SHOT_FAMILIES: Final = (
    "ibmon_build_info",
    "ibmon_source_up",
    "ibmon_source_last_success_timestamp_seconds",
    "ibmon_source_ports",
    "ibmon_source_stale_ports",
    "ibmon_source_unreachable_nodes",
    "ibmon_shard_info",
    "ibmon_source_shards",
)


class SelfMetrics:
    """The ``ibmon_source_*``, ``ibmon_pipeline_*``, ``ibmon_events_total`` and
    ``ibmon_build_info`` series."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.build_info = Gauge(
            "ibmon_build_info", "ibmon version and Python runtime; always 1.",
            ["version", "python"], registry=r,
        )
        self.build_info.labels(__version__, platform.python_version()).set(1)
        self.source_up = Gauge(
            "ibmon_source_up", "1 if the source's latest poll succeeded.", ["source"], registry=r
        )
        self.poll_duration = Histogram(
            "ibmon_source_poll_duration_seconds", "Wall time of one poll of a source.",
            ["source"], buckets=POLL_BUCKETS, registry=r,
        )
        self.poll_errors = Counter(
            "ibmon_source_poll_errors", "Values or polls a source could not read, by reason.",
            ["source", "reason"], registry=r,
        )
        self.stage_seconds = Histogram(
            "ibmon_pipeline_stage_seconds",
            "Wall time of one stage of a poll: sample (reading the source, discovery included"
            " when due), track, detect, publish.",
            ["source", "stage"], buckets=STAGE_BUCKETS, registry=r,
        )
        self.last_success = Gauge(
            "ibmon_source_last_success_timestamp_seconds",
            "Unix time of the source's latest successful poll.", ["source"], registry=r,
        )
        self.source_ports = Gauge(
            "ibmon_source_ports", "Ports the source reported in its latest poll.",
            ["source"], registry=r,
        )
        self.stale_ports = Gauge(
            "ibmon_source_stale_ports",
            "Ports kept at their last values because they did not answer the source's latest"
            " poll (ibmon_port_stale).",
            ["source"], registry=r,
        )
        self.unreachable_nodes = Gauge(
            "ibmon_source_unreachable_nodes",
            "Fabric nodes kept in the topology although they did not answer the latest"
            " discovery (a fabric source drops one after unreachable_discoveries misses).",
            ["source"], registry=r,
        )
        self.events = Counter(
            "ibmon_events", "Events emitted by the detectors.", ["type", "severity"], registry=r
        )
        self.shards: ShardMetrics | None = None
        self.mqtt: MqttMetrics | None = None
        self._text = TextRenderer()

    def describe_sources(self, fabric: str, sources: Iterable[Any]) -> None:
        """Set ``ibmon_shard_info`` and ``ibmon_source_shards`` for the configured sources.

        Called with the whole source list at start and after every reload, so a source that
        left or changed its shard leaves no series behind. Only fabric-wide sources (those with
        a ``shard`` setting) are described: node-local sysfs daemons, hundreds of them, would
        otherwise all claim shard 0 of the fabric and hide a dead fabric collector; and the two
        families exist only once a fabric source does (a sysfs daemon's output has neither).
        The config is read by duck typing, so a sysfs-only daemon never imports fabric modules.
        """
        fabric_sources = [c for c in sources if "shard" in type(c).model_fields]
        if fabric_sources and self.shards is None:
            r = self.registry
            self.shards = ShardMetrics(
                info=Gauge(
                    "ibmon_shard_info",
                    "Always 1; one series per fabric-wide source (mad, diags) naming the shard"
                    ' of the fabric it polls: shard "K" of shards "N" ("0" of "1" when the'
                    " source is not sharded).",
                    ["fabric", "source", "shard", "shards"], registry=r,
                ),
                count=Gauge(
                    "ibmon_source_shards",
                    "Number of shards the fabric-wide source's fabric is split into (N of its"
                    " shard K/N; 1 when not sharded), for comparing with the shards alive.",
                    ["fabric", "source"], registry=r,
                ),
            )
        if self.shards is None:
            return
        self.shards.info.clear()
        self.shards.count.clear()
        for cfg in fabric_sources:
            k, n = _shard_of(cfg.shard)
            self.shards.info.labels(fabric, cfg.label, str(k), str(n)).set(1)
            self.shards.count.labels(fabric, cfg.label).set(n)

    def enable_mqtt(self) -> MqttMetrics:
        """Create the ``ibmon_mqtt_*`` series on first use only.

        A daemon without ``[mqtt]`` must not export ``ibmon_mqtt_connected 0``: an alert on a
        disconnected broker would fire on every host that never had one.
        """
        if self.mqtt is None:
            r = self.registry
            self.mqtt = MqttMetrics(
                connected=Gauge(
                    "ibmon_mqtt_connected", "1 while ibmon is connected to the MQTT broker.",
                    registry=r,
                ),
                published=Counter(
                    "ibmon_mqtt_published",
                    "MQTT messages (events, port state, status) the broker accepted.",
                    registry=r,
                ),
                dropped=Counter(
                    "ibmon_mqtt_dropped",
                    "Events lost inside the MQTT publisher while waiting for the broker: queue"
                    " overflow while it was away, or still queued at shutdown. Part of"
                    ' ibmon_events_dropped_total{consumer="mqtt"}, which counts every event'
                    " MQTT lost.",
                    registry=r,
                ),
            )
        return self.mqtt

    def render(self) -> bytes:
        return self._text.render(self.registry)

    def render_one_shot(self) -> bytes:
        """Only ``ONE_SHOT_FAMILIES``, in registration order (byte-stable for golden files)."""
        return generate_latest(_Only(self.registry, ONE_SHOT_FAMILIES))


#: Prometheus text format families this renderer writes itself; any other type falls back.
_TYPES: Final = {"counter": "counter", "gauge": "gauge", "histogram": "histogram"}
_LEGACY_NAME: Final = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LEGACY_LABEL: Final = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_OM_ONLY: Final = ("_created", "_gsum", "_gcount")


def _escape_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


class TextRenderer:
    """``generate_latest`` for a registry of a few hundred series, at half its cost.

    Every scrape of a node daemon renders the self metrics, so their 0.9 ms per scrape was a
    tenth of ibmon's CPU per poll on a compute node (issue 12, target 1). The output is
    byte-identical to ``generate_latest`` (a test holds them together): the help/type head of
    each family and the ``name{labels} `` prefix of each series are built once and reused, so a
    scrape only formats the values. Anything this does not handle (other metric types, names
    that need escaping, timestamps, OpenMetrics-only samples) renders through
    ``generate_latest`` instead.
    """

    #: Cached series prefixes beyond this are dropped (label sets of self metrics are bounded;
    #: this only guards against a caller that labels by something unbounded).
    MAX_PREFIXES: Final = 10_000

    def __init__(self) -> None:
        self._heads: dict[tuple[str, str, str], str] = {}
        self._prefixes: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}

    def render(self, registry: CollectorRegistry) -> bytes:
        out: list[str] = []
        heads = self._heads
        prefixes = self._prefixes
        for metric in registry.collect():
            mtype = _TYPES.get(metric.type)
            if mtype is None or not _LEGACY_NAME.match(metric.name):
                return generate_latest(registry)
            key = (metric.name, mtype, metric.documentation)
            head = heads.get(key)
            if head is None:
                name = metric.name + "_total" if mtype == "counter" else metric.name
                doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
                head = heads[key] = f"# HELP {name} {doc}\n# TYPE {name} {mtype}\n"
            out.append(head)
            for sample in metric.samples:
                if sample.timestamp is not None or (
                    sample.name != metric.name
                    and sample.name.removeprefix(metric.name) in _OM_ONLY
                ):
                    return generate_latest(registry)
                labels = tuple(sample.labels.items())
                prefix = prefixes.get((sample.name, labels))
                if prefix is None:
                    if not _LEGACY_NAME.match(sample.name) or not all(
                        _LEGACY_LABEL.match(k) for k, _ in labels
                    ):
                        return generate_latest(registry)
                    if len(prefixes) >= self.MAX_PREFIXES:
                        prefixes.clear()
                    inner = ",".join(f'{k}="{_escape_value(v)}"' for k, v in sorted(labels))
                    prefix = f"{sample.name}{{{inner}}} " if inner else f"{sample.name} "
                    prefixes[(sample.name, labels)] = prefix
                out.append(prefix + floatToGoString(sample.value)  # type: ignore[no-untyped-call]
                           + "\n")
        return "".join(out).encode("utf-8")


def _shard_of(shard: str | None) -> tuple[int, int]:
    """``"K/N"`` as (K, N); None (not sharded) is shard 0 of 1. The config validated it."""
    if not shard:
        return 0, 1
    k, n = shard.split("/")
    return int(k), int(n)


class _Only:
    """A registry view with some families (prometheus_client's ``restricted_registry`` yields
    them in set order, which would make the output differ between runs)."""

    def __init__(self, registry: CollectorRegistry, names: Iterable[str]) -> None:
        self._registry = registry
        self._names = frozenset(names)

    def collect(self) -> Iterator[Metric]:
        return (m for m in self._registry.collect() if m.name in self._names)


@dataclass(frozen=True, slots=True)
class ShardMetrics:
    """Which shard each fabric-wide source polls; exist only when there is such a source."""

    info: Gauge
    count: Gauge


@dataclass(frozen=True, slots=True)
class MqttMetrics:
    """The MQTT publisher's series; exist only when ``[mqtt]`` is configured."""

    connected: Gauge
    published: Counter
    dropped: Counter
