"""ibmon's own health metrics, kept in a private prometheus_client registry.

These are few series, so the stock client is fine here; the port series (hundreds of thousands)
go through the fast renderer in ``exporters.prometheus`` instead.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.exposition import generate_latest

from ibmon import __version__

__all__ = ["MqttMetrics", "SelfMetrics"]

# ``_created`` series double the output and no alert or dashboard of ours uses them.
disable_created_metrics()  # type: ignore[no-untyped-call]

POLL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Stages range from microseconds (tracking one host's ports) to seconds (a fabric sweep).
STAGE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, *POLL_BUCKETS)


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
        self.mqtt: MqttMetrics | None = None

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
        return generate_latest(self.registry)


@dataclass(frozen=True, slots=True)
class MqttMetrics:
    """The MQTT publisher's series; exist only when ``[mqtt]`` is configured."""

    connected: Gauge
    published: Counter
    dropped: Counter
