"""ibmon's own health metrics, kept in a private ``ibmon.runtime.metrics`` registry.

These are few series (``ibmon.runtime.metrics`` renders them, byte for byte as prometheus_client
would, without importing it); the port series (hundreds of thousands) go through the columnar
renderer in ``exporters.prometheus`` instead.
"""

from __future__ import annotations

import importlib.util
import platform
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from ibmon import __version__
from ibmon.runtime.metrics import Counter, Gauge, Histogram, Registry

__all__ = ["ONE_SHOT_FAMILIES", "MqttMetrics", "SelfMetrics", "ShardMetrics"]

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
#: IbmonDataStale fires) and how much of it (ports, stale ports, unreachable nodes, shards);
#: which devices (``ibmon_device_info``) comes with the port families. ``ibmon scan`` adds the
#: one counter that matters to a textfile's reader, ``ibmon_source_poll_errors_total``, when
#: the scan met read problems.
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
_ONE_SHOT: Final = frozenset(ONE_SHOT_FAMILIES)


def backends() -> tuple[str, str]:
    """Which optional backend each part would use, found without importing any of them (a
    node's daemon never loads numpy): python-isal, numpy."""
    def found(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            return False

    return "isal" if found("isal") else "zlib", "yes" if found("numpy") else "no"


class SelfMetrics:
    """The ``ibmon_source_*``, ``ibmon_pipeline_*``, ``ibmon_events_total`` and
    ``ibmon_build_info`` series."""

    def __init__(self) -> None:
        self.registry = Registry()
        r = self.registry
        self.build_info = Gauge(
            "ibmon_build_info",
            "ibmon version, Python runtime and the optional backends installed (isal or zlib:"
            " deflate; numpy yes or no, for polls of fabrics); always 1.",
            ["version", "python", "deflate", "numpy"], registry=r,
        )
        self.build_info.labels(__version__, platform.python_version(), *backends()).set(1)
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
        """Every family, as prometheus_client's ``generate_latest`` would write it (without
        ``_created`` series)."""
        return self.registry.render()

    def render_one_shot(self) -> bytes:
        """Only ``ONE_SHOT_FAMILIES``, in registration order (byte-stable for golden files)."""
        return self.registry.render(only=_ONE_SHOT)


def _shard_of(shard: str | None) -> tuple[int, int]:
    """``"K/N"`` as (K, N); None (not sharded) is shard 0 of 1. The config validated it."""
    if not shard:
        return 0, 1
    k, n = shard.split("/")
    return int(k), int(n)


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
