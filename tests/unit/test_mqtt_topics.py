"""MQTT without a broker: topic building, the [mqtt] config surface and the bounded queue."""

from __future__ import annotations

import json

import pytest

from exporters.mqtt import MqttPublisher, Topics, port_state_payload
from ibmon.config import ConfigError, MqttConfig, load_settings
from ibmon.detect.events import EVENT_TYPES, Event
from ibmon.infiniband.model import PortIdentity, PortView
from ibmon.runtime.selfmetrics import SelfMetrics

GUID = "0x0002c90300a1b2c3"


def test_topics_are_built_from_validated_levels_only() -> None:
    t = Topics("site1/ibmon", "main")
    assert t.status == "site1/ibmon/main/status"
    assert t.port((GUID, "1")) == f"site1/ibmon/main/ports/{GUID}/1"
    assert t.event("port_down") == "site1/ibmon/main/events/port_down"
    assert t.event("a/#") == "site1/ibmon/main/events/other"
    for key in [("0x0002C90300A1B2C3", "1"), ("+", "1"), (GUID, "1/#"), (GUID, ""),
                (GUID, "1234"), (GUID + "\x00", "1")]:
        assert t.port(key) is None, key
    for prefix, fabric in [("a/+", "main"), ("#", "main"), ("/a", "main"), ("a", "x/y"),
                           ("a", "")]:
        with pytest.raises(ValueError, match="invalid"):
            Topics(prefix, fabric)


def test_every_event_type_has_its_own_topic() -> None:
    t = Topics("ibmon", "main")
    assert {t.event(k).rsplit("/", 1)[1] for k in EVENT_TYPES} == set(EVENT_TYPES)


def test_config_validates_topic_levels_and_has_no_password_key() -> None:
    cfg = load_settings(None, mqtt={"host": "broker.example", "keepalive": "15s"})
    assert cfg.mqtt is not None
    assert (cfg.mqtt.keepalive, cfg.mqtt.qos, cfg.mqtt.prefix) == (15.0, 1, "ibmon")
    assert load_settings(None).mqtt is None  # absent = MQTT off
    for bad in [{"prefix": "ibmon/#"}, {"prefix": "a/+/b"}, {"password": "hunter2"},
                {"qos": 3}, {"keepalive": "0s"}, {"queue_size": 0}, {"client_id": "a b"},
                {"password_file": "/etc/ibmon/mqtt.pw"}, {"tls": {"key_file": "/k.pem"}}]:
        with pytest.raises(ConfigError):
            load_settings(None, mqtt=bad)


def test_config_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IBMON_MQTT__HOST", "10.0.0.5")
    monkeypatch.setenv("IBMON_MQTT__PORT", "8883")
    cfg = load_settings(None)
    assert cfg.mqtt is not None
    assert (cfg.mqtt.host, cfg.mqtt.port) == ("10.0.0.5", 8883)


def _event(n: int) -> Event:
    return Event(time=Event.at(1_700_000_000 + n), fabric="main", type="discards",
                 status="firing", severity="warning", message=str(n))


def test_full_queue_drops_oldest_first_and_counts_it() -> None:
    metrics = SelfMetrics()
    pub = MqttPublisher(MqttConfig(queue_size=3), fabric="main", metrics=metrics)
    events = [_event(i) for i in range(5)]
    pub.submit_many(events)
    assert pub.queued == 3
    assert list(pub._queue) == events[2:]
    assert metrics.registry.get_sample_value("ibmon_mqtt_dropped_total") == 2
    assert metrics.registry.get_sample_value("ibmon_mqtt_connected") == 0


def test_port_state_payload_keeps_hostile_text_whole_in_its_printable_form() -> None:
    nasty = "a/+/#\x00" + "é" * 5000
    view = PortView(identity=PortIdentity(guid=GUID, port="1", node_desc=nasty), state=1,
                    phys_state=3, conditions=frozenset({"down", "flapping"}))
    doc = json.loads(port_state_payload(view, fabric="main", changed=0.0))
    assert doc["node_desc"] == "a/+/#\\x00" + "é" * 5000  # topic characters kept, NUL shown
    assert {k: doc[k] for k in ("state", "state_name", "phys_state", "phys_state_name")} == {
        "state": 1, "state_name": "DOWN", "phys_state": 3, "phys_state_name": "Disabled"}
    assert doc["conditions"] == ["down", "flapping"]
    assert doc["changed"] == "1970-01-01T00:00:00Z"
