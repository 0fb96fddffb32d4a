"""The MQTT publisher against a real Mosquitto: topics, retained state, outages, LWT, TLS.

Every test starts its own broker on a free loopback port with a generated config and stops it
in a ``finally``. Subscribers are aiomqtt clients, as an automation consumer would use.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path
from types import MappingProxyType

import pytest
from structlog.testing import capture_logs

from exporters.mqtt import MqttPublisher
from ibmon.cli.terminal import printable
from ibmon.config import MqttConfig, MqttTlsConfig, Settings, load_settings
from ibmon.detect.events import Event, EventBus, PortRef
from ibmon.infiniband.model import LinkInfo, PortIdentity, PortView, Snapshot
from ibmon.runtime.daemon import Daemon
from ibmon.runtime.selfmetrics import SelfMetrics
from ibmon.sources.sysfs import SysfsSourceConfig
from ibmon.state import FabricState
from tests.integration.test_mqtt_daemon import TickingSource, scrape
from tests.mqtt_broker import Collector, Mosquitto, make_tls, write_passwd
from tests.sysfs_tree import write_device, write_port
from tests.syspkg import require_binary

pytestmark = pytest.mark.system

GUID_A = "0x0002c90300a1b2c3"
GUID_B = "0x0002c90300a1b2c4"
STATUS = "ibmon/main/status"
FAST = {"backoff_min": 0.05, "backoff_max": 0.2}


def view(guid: str, port: str = "1", *, node_desc: str = "host01 HCA-1", state: int = 4,
         conditions: frozenset[str] = frozenset()) -> PortView:
    ident = PortIdentity(guid=guid, port=port, device="mlx5_0", node_desc=node_desc, lid=18,
                         source="sysfs")
    return PortView(
        identity=ident, state=state, phys_state=5 if state == 4 else 2,
        rate_bytes_per_second=12.5e9, active_width="4X", active_speed="EDR",
        link=LinkInfo(remote_guid=GUID_B, remote_port="7", remote_node_desc="switch 1"),
        totals={"transmit_data": 4000}, rates={"transmit_data": 1.0}, conditions=conditions,
    )


def fabric(*views: PortView) -> FabricState:
    return FabricState(generated=time.time(), ports=MappingProxyType({v.key: v for v in views}))


def event(kind: str, guid: str = GUID_A, *, node_desc: str = "host01 HCA-1", n: int = 0,
          status: str = "firing") -> Event:
    return Event.model_validate({
        "time": Event.at(1_700_000_000 + n), "fabric": "main", "type": kind, "status": status,
        "severity": "critical" if kind == "port_down" else "warning",
        "port": PortRef(guid=guid, port="1", node_desc=node_desc, device="mlx5_0", lid=18),
        "value": float(n), "threshold": 1.0, "details": {"n": n}, "message": f"event {n}",
    })


def metric(metrics: SelfMetrics, name: str) -> float:
    value = metrics.registry.get_sample_value(name)
    assert value is not None, f"{name} not exported"
    return value


async def until(pred: object, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if callable(pred) and pred():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


async def test_events_retained_state_and_status(broker: Mosquitto) -> None:
    metrics = SelfMetrics()
    pub = MqttPublisher(MqttConfig(port=broker.port), fabric="main", metrics=metrics, **FAST)
    bus = EventBus()
    # fed as the daemon feeds it: its own bus subscription, read by its ``consume``
    feed = asyncio.create_task(pub.consume(bus.subscribe(pub.name, maxsize=100)))
    port_a = "ibmon/main/ports/0x0002c90300a1b2c3/1"
    port_b = "ibmon/main/ports/0x0002c90300a1b2c4/2"
    sent = [event("port_down", n=1), event("congestion", n=2),
            event("port_down", n=3, status="resolved")]
    try:
        async with Collector(broker.port, "ibmon/main/events/#").running() as live:
            await pub.start()
            pub.publish_state(fabric(view(GUID_A), view(GUID_B, "2", state=1,
                                                        conditions=frozenset({"down"}))))
            await until(lambda: pub.connected)
            assert metric(metrics, "ibmon_mqtt_connected") == 1
            bus.publish_many(sent)
            await live.wait_for(lambda: len(live.messages) >= 3)
            await asyncio.sleep(0.2)  # nothing else may follow
        assert [t for t, _, _ in live.messages] == [
            "ibmon/main/events/port_down", "ibmon/main/events/congestion",
            "ibmon/main/events/port_down",
        ]
        assert [Event.model_validate_json(p) for _, p, _ in live.messages] == sent

        # A subscriber arriving later gets the retained status and each port's state, no events.
        async with Collector(broker.port, "ibmon/main/#").running() as late:
            await late.wait_for(lambda: len(late.messages) >= 3)
            await asyncio.sleep(0.2)
        assert sorted(t for t, _, _ in late.messages) == sorted([STATUS, port_a, port_b])
        assert all(retained for _, _, retained in late.messages)
        assert late.on(STATUS) == [b"online"]
        a = json.loads(late.on(port_a)[0])
        assert (a["guid"], a["port"], a["state"], a["conditions"]) == (GUID_A, "1", 4, [])
        assert (a["state_name"], a["phys_state_name"]) == ("ACTIVE", "LinkUp")
        assert (a["node_desc"], a["peer"]["guid"], a["fabric"]) == ("host01 HCA-1", GUID_B, "main")
        b = json.loads(late.on(port_b)[0])
        assert (b["state"], b["phys_state"], b["conditions"]) == (1, 2, ["down"])
        assert (b["state_name"], b["phys_state_name"]) == ("DOWN", "Polling")

        # Same state again: nothing is republished. A change: only the changed port; a port
        # that disappears is cleared with an empty retained message.
        async with Collector(broker.port, "ibmon/main/ports/#").running() as watch:
            await watch.wait_for(lambda: len(watch.messages) == 2)
            before = metric(metrics, "ibmon_mqtt_published_total")
            busier = view(GUID_A)
            busier.rates["transmit_data"] = 9e9  # rates are not state
            pub.publish_state(fabric(busier, view(GUID_B, "2", state=1,
                                                  conditions=frozenset({"down"}))))
            await asyncio.sleep(0.3)
            assert len(watch.messages) == 2
            assert metric(metrics, "ibmon_mqtt_published_total") == before
            pub.publish_state(fabric(view(GUID_A, conditions=frozenset({"congestion"}))))
            await watch.wait_for(lambda: len(watch.messages) == 4)
            await asyncio.sleep(0.2)
        changed = {t: p for t, p, _ in watch.messages[2:]}
        assert set(changed) == {port_a, port_b}
        assert json.loads(changed[port_a])["conditions"] == ["congestion"]
        assert changed[port_b] == b""

        before = metric(metrics, "ibmon_mqtt_published_total")
        await pub.stop()
        assert metric(metrics, "ibmon_mqtt_published_total") == before + 1  # our own "offline"
        assert metric(metrics, "ibmon_mqtt_connected") == 0
        async with Collector(broker.port, "ibmon/main/#").running() as after:
            await after.wait_for(lambda: len(after.messages) >= 2)
            await asyncio.sleep(0.2)
        assert sorted(t for t, _, _ in after.messages) == sorted([STATUS, port_a])
        assert after.on(STATUS) == [b"offline"]
    finally:
        feed.cancel()
        await pub.stop()


async def test_retained_state_follows_every_field_it_shows(broker: Mosquitto) -> None:
    """Each field of a port's retained state is republished when it alone changes (the
    physical state of a port that stays down, the peer's description, the speed it trained
    at...), and a port that left (cleared) and came back unchanged is published again, not
    taken for already sent."""
    pub = MqttPublisher(MqttConfig(port=broker.port), fabric="main", metrics=SelfMetrics(),
                        **FAST)
    topic = "ibmon/main/ports/0x0002c90300a1b2c3/1"
    down = view(GUID_A, state=1)  # phys_state POLLING
    assert down.link is not None
    ident = down.identity
    # each step changes one field: (what changes, the JSON field that shows it, its value)
    changes: list[tuple[dict[str, object], str, object]] = [
        ({"phys_state": 3}, "phys_state_name", "Disabled"),
        ({"link": dataclasses.replace(down.link, remote_node_desc="switch 2")},
         "peer.node_desc", "switch 2"),
        ({"link": dataclasses.replace(down.link, remote_node_desc="switch 2", remote_port="8")},
         "peer.port", "8"),
        ({"state": 4, "phys_state": 5}, "state_name", "ACTIVE"),
        ({"active_speed": "HDR"}, "active_speed", "HDR"),
        ({"active_width": "2X"}, "active_width", "2X"),
        ({"rate_bytes_per_second": 3.125e9}, "rate_bytes_per_second", 3.125e9),
        ({"identity": dataclasses.replace(ident, node_desc="host01 HCA-2")}, "node_desc",
         "host01 HCA-2"),
        ({"identity": dataclasses.replace(ident, node_desc="host01 HCA-2", lid=19)}, "lid", 19),
        ({"conditions": frozenset({"degraded"})}, "conditions", ["degraded"]),
    ]
    states, current = [down], down
    for fields, _, _ in changes:
        current = dataclasses.replace(current, **fields)  # type: ignore[arg-type]
        states.append(current)
    try:
        async with Collector(broker.port, "ibmon/main/ports/#").running() as watch:
            await pub.start()
            steps = [*map(fabric, states[:3]), fabric(), *map(fabric, states[2:])]
            for n, state in enumerate(steps, start=1):
                pub.publish_state(state)
                await watch.wait_for(lambda n=n: len(watch.messages) >= n)
            await asyncio.sleep(0.2)  # nothing else may follow
        got = [p for t, p, _ in watch.messages if t == topic]
        assert len(got) == len(watch.messages) == len(steps)
        docs = [json.loads(p) if p else {} for p in got]
        for doc in docs:
            doc.pop("changed", None)
        assert docs[3] == {}  # cleared; then the same state again is published again
        assert docs[4] == docs[2]
        del docs[3:5]
        for (_, field, value), doc in zip(changes, docs[1:], strict=True):
            assert (doc["peer"][field[5:]] if field.startswith("peer.") else doc[field]) == value
    finally:
        await pub.stop()


async def test_broker_down_at_start_then_events_delivered(tmp_path: Path) -> None:
    mosq = Mosquitto(require_binary("mosquitto"), tmp_path / "broker", persistence=True)
    sub = Collector(mosq.port, "ibmon/main/events/#", identifier="ops-bot", clean_session=False)
    metrics = SelfMetrics()
    pub = MqttPublisher(MqttConfig(port=mosq.port), fabric="main", metrics=metrics, **FAST)
    try:
        mosq.start()  # register the bot's persistent subscription, then take the broker away
        async with sub.running():
            pass
        mosq.stop()
        await pub.start()
        sent = [event("link_flapping", n=i) for i in range(3)]
        pub.submit_many(sent)
        await asyncio.sleep(0.5)  # several reconnect attempts fail meanwhile
        assert not pub.connected
        assert pub.queued == 3
        assert metric(metrics, "ibmon_mqtt_connected") == 0
        mosq.start()
        await until(lambda: pub.connected and pub.queued == 0)
        async with sub.running():
            await sub.wait_for(lambda: len(sub.messages) >= 3)
            await asyncio.sleep(0.2)
        assert [Event.model_validate_json(p) for _, p, _ in sub.messages] == sent
        assert metric(metrics, "ibmon_mqtt_dropped_total") == 0
    finally:
        await pub.stop()
        mosq.stop()


async def test_reconnects_back_off_within_bounds_start_over_and_restore_the_state(
    tmp_path: Path,
) -> None:
    """While the broker is away the retries back off up to ``backoff_max``; a session that
    came up starts the backoff over, so a broker restart is retried at once; the restarted
    broker (no persistence: it lost every retained message) gets each port's state again; and
    the session keeps the configured keepalive (how soon the broker declares ibmon dead)."""
    mosq = Mosquitto(require_binary("mosquitto"), tmp_path / "broker")
    pub = MqttPublisher(MqttConfig(port=mosq.port, keepalive=7, client_id="ibmon-backoff"),
                        fabric="main", metrics=SelfMetrics(), **FAST)
    port_a = "ibmon/main/ports/0x0002c90300a1b2c3/1"
    try:
        with capture_logs() as logs:
            await pub.start()
            pub.publish_state(fabric(view(GUID_A)))
            await asyncio.sleep(1.0)  # five or more attempts fail meanwhile
            mosq.start()
            await until(lambda: pub.connected)
            mosq.stop()
            await until(lambda: not pub.connected)
            mosq.start()
            await until(lambda: pub.connected)
        failed = [e["retry_in"] for e in logs if e["event"] == "mqtt_connect_failed"]
        assert len(failed) >= 5
        assert max(failed) <= FAST["backoff_max"]
        assert max(failed) > FAST["backoff_min"]  # it did back off
        (lost,) = [e["retry_in"] for e in logs if e["event"] == "mqtt_disconnected"]
        assert lost <= FAST["backoff_min"]
        async with Collector(mosq.port, "ibmon/main/#").running() as late:
            await late.wait_for(lambda: late.on(port_a))
        assert json.loads(late.on(port_a)[0])["guid"] == GUID_A
        assert "as ibmon-backoff (p2, c1, k7)" in mosq.log_path.read_text()
    finally:
        await pub.stop()
        mosq.stop()


async def test_outage_keeps_newest_events_in_order_and_counts_drops(tmp_path: Path) -> None:
    mosq = Mosquitto(require_binary("mosquitto"), tmp_path / "broker", persistence=True)
    sub = Collector(mosq.port, "ibmon/main/events/#", identifier="ops-bot", clean_session=False)
    metrics = SelfMetrics()
    cfg = MqttConfig(port=mosq.port, queue_size=5)
    pub = MqttPublisher(cfg, fabric="main", metrics=metrics, **FAST)
    try:
        mosq.start()
        await pub.start()
        await until(lambda: pub.connected)
        first = event("high_ber", n=0)
        async with sub.running():
            pub.submit(first)
            await sub.wait_for(lambda: len(sub.messages) == 1)
        mosq.stop()
        await until(lambda: not pub.connected)
        during = [event("receive_errors", n=i) for i in range(1, 13)]
        for e in during:  # one event per "poll" while the broker is away
            pub.submit(e)
            await asyncio.sleep(0.02)
        assert pub.queued == 5
        assert metric(metrics, "ibmon_mqtt_dropped_total") == 7
        mosq.start()
        await until(lambda: pub.connected and pub.queued == 0)
        async with sub.running():
            await sub.wait_for(lambda: len(sub.messages) >= 6)
            await asyncio.sleep(0.3)
        got = [Event.model_validate_json(p) for _, p, _ in sub.messages]
        assert got == [first, *during[-5:]]  # each once, in order, oldest dropped first
        assert metric(metrics, "ibmon_mqtt_dropped_total") == len(during) - 5
    finally:
        await pub.stop()
        mosq.stop()


@pytest.mark.parametrize(("queue_size", "dropped"), [(1000, 0), (120, 30)])
async def test_a_broker_lost_mid_batch_resends_that_batch_first(
    tmp_path: Path, queue_size: int, dropped: int
) -> None:
    """Events sent but not acknowledged when the broker dies go back to the front of the
    queue, ahead of those submitted after them: after the reconnect each arrives once, in
    order. When they no longer all fit in ``queue_size`` the oldest are dropped, and counted."""
    mosq = Mosquitto(require_binary("mosquitto"), tmp_path / "broker", persistence=True)
    sub = Collector(mosq.port, "ibmon/main/events/#", identifier="ops-bot", clean_session=False)
    metrics = SelfMetrics()
    pub = MqttPublisher(MqttConfig(port=mosq.port, queue_size=queue_size), fabric="main",
                        metrics=metrics, **FAST)
    try:
        mosq.start()
        async with sub.running():
            pass  # the subscriber's session; the broker keeps its events while it is away
        mosq.stop()  # saved in the persistence file, which every later start loads
        mosq.start()
        await pub.start()
        await until(lambda: pub.connected)
        assert mosq.proc is not None
        os.killpg(mosq.proc.pid, signal.SIGSTOP)  # takes publishes, acknowledges none
        sent = [event("receive_errors", n=i) for i in range(150)]
        pub.submit_many(sent[:100])
        await until(lambda: pub.queued == 0)  # one batch of 100, in flight
        pub.submit_many(sent[100:])
        await asyncio.sleep(0.2)
        assert pub.queued == 50  # behind the batch, which is still unacknowledged
        os.killpg(mosq.proc.pid, signal.SIGKILL)
        mosq.proc.wait()
        mosq.proc = None
        await until(lambda: not pub.connected)
        assert pub.queued == 150 - dropped
        assert metric(metrics, "ibmon_mqtt_dropped_total") == dropped
        mosq.start()
        await until(lambda: pub.connected and pub.queued == 0)
        async with sub.running():
            await sub.wait_for(lambda: len(sub.messages) >= 150 - dropped)
            await asyncio.sleep(0.3)
        got = [Event.model_validate_json(p) for _, p, _ in sub.messages]
        assert got == sent[dropped:]
        assert metric(metrics, "ibmon_mqtt_dropped_total") == dropped
    finally:
        await pub.stop()
        mosq.stop()


def _daemon_config(tmp_path: Path, mqtt_port: int) -> Path:
    root = tmp_path / "sys"
    write_device(root, "mlx5_0")
    write_port(root, "mlx5_0", 1)
    cfg = tmp_path / "ibmon.toml"
    cfg.write_text(
        'fabric = "main"\n'
        '[prometheus]\nlisten = "127.0.0.1:0"\n'
        f'[[sources]]\ntype = "sysfs"\nroot = "{root}"\ninterval = "200ms"\n'
        f'[mqtt]\nhost = "127.0.0.1"\nport = {mqtt_port}\nkeepalive = "1s"\n'
        'client_id = "ibmon-under-test"\n'
        f'[state]\npath = "{tmp_path / "state.json"}"\n'
    )
    return cfg


async def test_daemon_publishes_scenario_events_and_kill_9_leaves_last_will(
    broker: Mosquitto, tmp_path: Path
) -> None:
    cfg = _daemon_config(tmp_path, broker.port)
    port_topic = "ibmon/main/ports/0x0002c90300a1b2c3/1"
    async with Collector(broker.port, "ibmon/main/#").running() as sub:
        proc = subprocess.Popen(  # noqa: ASYNC220 - returns at once; the test is the wait
            [sys.executable, "-m", "ibmon", "run", "--config", str(cfg)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
        )
        try:
            await sub.wait_for(lambda: sub.on(STATUS) == [b"online"] and sub.on(port_topic),
                               within=20)
            state = json.loads(sub.on(port_topic)[0])
            assert (state["state_name"], state["node_desc"]) == ("ACTIVE", "host01 HCA-1")
            # Scenario: the cable is pulled. The detector's event and the new retained state
            # both reach the broker.
            port_dir = tmp_path / "sys/class/infiniband/mlx5_0/ports/1"
            (port_dir / "phys_state").write_text("2: Polling\n")
            (port_dir / "state").write_text("1: DOWN\n")
            down_topic = "ibmon/main/events/port_down"
            await sub.wait_for(lambda: sub.on(down_topic) and len(sub.on(port_topic)) >= 2,
                               within=20)
            down = Event.model_validate_json(sub.on(down_topic)[0])
            assert down.summary() == ("port_down", GUID_A, "1", "firing", "critical")
            assert (down.fabric, down.port and down.port.node_desc) == ("main", "host01 HCA-1")
            state = json.loads(sub.on(port_topic)[-1])
            assert (state["state_name"], state["phys_state_name"]) == ("DOWN", "Polling")
            assert "down" in state["conditions"]
            os.killpg(proc.pid, signal.SIGKILL)
            killed = time.monotonic()
            await sub.wait_for(lambda: sub.on(STATUS)[-1:] == [b"offline"], within=10)
            assert time.monotonic() - killed < 5  # 1.5 x keepalive, plus slack
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            _, err = proc.communicate(timeout=10)
    assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
    async with Collector(broker.port, STATUS).running() as late:
        await late.wait_for(lambda: late.messages)
    assert late.messages == [(STATUS, b"offline", True)]


async def test_a_reload_that_adds_mqtt_publishes_at_once_and_one_that_drops_it_says_offline(
    broker: Mosquitto,
) -> None:
    """SIGHUP with ``[mqtt]`` added: every port's state is on the broker at once, not after
    the next poll ends (a reload restarts polling, and a large fabric's first poll after it
    takes a while: here it never ends); with ``[mqtt]`` gone again: ibmon says ``offline``."""

    class SlowAfterTheFirst(TickingSource):
        async def sample(self) -> Snapshot:
            if self.polls:
                await asyncio.Event().wait()
            return await super().sample()

    source = SlowAfterTheFirst("local")
    wanted: dict[str, object] | None = None

    def config() -> Settings:
        src = SysfsSourceConfig(name="local", interval=3600)
        return load_settings(None, prometheus={"listen": "127.0.0.1:0"},
                             sources=[src.model_dump()], mqtt=wanted)

    daemon = Daemon(config(), reload_settings=config, source_factory=lambda cfg: source)
    run = asyncio.create_task(daemon.run())
    port = "ibmon/main/ports/0x0002c90300a1b2c3/1"
    try:
        await daemon.ready.wait()
        def applied() -> float:
            value = daemon.metrics.registry.get_sample_value(
                "ibmon_config_reloads_total", {"result": "applied"})
            return value or 0.0

        def feeds() -> list[str]:  # the bus subscriptions of MQTT publishers
            return [s.name for s in daemon.bus.subscriptions if s.name == "mqtt"]

        async with Collector(broker.port, "ibmon/main/#").running() as sub:
            wanted = {"port": broker.port}
            daemon.reload()
            await sub.wait_for(lambda: sub.on(port) and sub.on(STATUS) == [b"online"])
            assert feeds() == ["mqtt"]
            wanted = {"port": broker.port, "qos": 0}  # changed: the publisher is replaced
            daemon.reload()
            await until(lambda: applied() == 2)
            assert feeds() == ["mqtt"]  # the old publisher's feed went with it
            wanted = None
            daemon.reload()
            await sub.wait_for(lambda: sub.on(STATUS)[-1:] == [b"offline"])
            await until(lambda: applied() == 3)
            assert feeds() == []
        assert daemon.exporter is not None
        assert "ibmon_mqtt_connected 0.0" in await asyncio.to_thread(
            scrape, daemon.exporter.port)
    finally:
        daemon.stop()
        await run


async def test_tls_with_client_cert_and_password_file(tmp_path: Path) -> None:
    require_binary("mosquitto_passwd")
    require_binary("openssl")
    tls = make_tls(tmp_path / "tls")
    secret = "s3cret pass-phrase"
    mosq = Mosquitto(
        require_binary("mosquitto"), tmp_path / "broker", tls=tls,
        passwd=write_passwd(tmp_path / "broker.passwd", "ibmon", secret),
    )
    good_pw = tmp_path / "mqtt.password"
    good_pw.write_text(secret + "\n")
    bad_pw = tmp_path / "wrong.password"
    bad_pw.write_text("not-the-password\n")
    tls_cfg = MqttTlsConfig(ca_file=tls.ca, cert_file=tls.client_cert, key_file=tls.client_key)
    good = MqttPublisher(
        MqttConfig(port=mosq.port, tls=tls_cfg, username="ibmon", password_file=good_pw),
        fabric="main", metrics=SelfMetrics(), **FAST,
    )
    wrong_password = MqttPublisher(
        MqttConfig(port=mosq.port, tls=tls_cfg, username="ibmon", password_file=bad_pw),
        fabric="main", metrics=SelfMetrics(), **FAST,
    )
    ctx = ssl.create_default_context(cafile=str(tls.ca))
    ctx.load_cert_chain(str(tls.client_cert), str(tls.client_key))
    sub = Collector(mosq.port, "ibmon/main/#", client_kwargs={
        "tls_context": ctx, "username": "ibmon", "password": secret,
    })
    sent = event("link_integrity", n=7)
    try:
        mosq.start()
        with capture_logs() as logs:
            await wrong_password.start()
            async with sub.running():
                await good.start()
                await until(lambda: good.connected)
                good.submit(sent)
                await sub.wait_for(lambda: sub.on("ibmon/main/events/link_integrity"))
            await asyncio.sleep(0.3)
            assert not wrong_password.connected
        assert Event.model_validate_json(sub.on("ibmon/main/events/link_integrity")[0]) == sent
        failures = [e for e in logs if e["event"] == "mqtt_connect_failed"]
        assert failures, logs
        assert secret not in repr(logs)
        assert "not-the-password" not in repr(logs)
    finally:
        for pub in (good, wrong_password):
            await pub.stop()
        mosq.stop()


# paho-mqtt 2.2 drops the SSLSocket of a failed handshake without closing it
# (Client._ssl_wrap_socket); ibmon's context closes it itself (exporters/mqtt.py), so no
# ResourceWarning may reach the test (warnings are errors).
async def test_tls_verifies_the_broker_by_default(tmp_path: Path) -> None:
    require_binary("openssl")
    tls = make_tls(tmp_path / "tls")
    mosq = Mosquitto(require_binary("mosquitto"), tmp_path / "broker", tls=tls)
    no_ca = MqttTlsConfig(cert_file=tls.client_cert, key_file=tls.client_key)
    untrusted = MqttPublisher(MqttConfig(port=mosq.port, tls=no_ca), fabric="main",
                              metrics=SelfMetrics(), **FAST)
    trusted = MqttPublisher(
        MqttConfig(port=mosq.port, tls=no_ca.model_copy(update={"ca_file": tls.ca})),
        fabric="main", metrics=SelfMetrics(), **FAST,
    )
    try:
        mosq.start()
        with capture_logs() as logs:
            await untrusted.start()
            await trusted.start()
            await until(lambda: trusted.connected)
            await asyncio.sleep(0.3)
        assert not untrusted.connected  # the test CA is not in the system trust store
        assert any("CERTIFICATE_VERIFY_FAILED" in str(e.get("error")) for e in logs), logs
    finally:
        await untrusted.stop()
        await trusted.stop()
        mosq.stop()


HOSTILE = ["+", "#", "a/b/#", "x\x00y", "ibmon/main/status", "é" + "Z" * 10_240, "\u202e$(id)"]


async def test_hostile_node_descriptions_never_change_a_topic(broker: Mosquitto) -> None:
    pub = MqttPublisher(MqttConfig(port=broker.port), fabric="main", metrics=SelfMetrics(),
                        **FAST)
    guids = [f"0x0002c90300a1b2{i:02x}" for i in range(len(HOSTILE))]
    views = [view(g, node_desc=d) for g, d in zip(guids, HOSTILE, strict=True)]
    bad_key = PortView(identity=PortIdentity(guid="+/#", port="1/+", node_desc="evil"))
    events = [event("discards", g, node_desc=d, n=i)
              for i, (g, d) in enumerate(zip(guids, HOSTILE, strict=True))]
    try:
        async with Collector(broker.port, "#").running() as sub:
            await pub.start()
            pub.publish_state(FabricState(
                generated=time.time(),
                ports=MappingProxyType({**{v.key: v for v in views}, ("+/#", "1/+"): bad_key}),
            ))
            pub.submit_many(events)
            n = 1 + len(views) + len(events)
            await sub.wait_for(lambda: len(sub.messages) >= n)
            await asyncio.sleep(0.3)
        topics = [t for t, _, _ in sub.messages]
        expected = {STATUS, "ibmon/main/events/discards",
                    *(f"ibmon/main/ports/{g}/1" for g in guids)}
        assert set(topics) == expected
        assert len(topics) == n
        states = {t: json.loads(p) for t, p, _ in sub.messages if "/ports/" in t}
        # whole, in the one printable form every output shows
        shown = [printable(d) for d in HOSTILE]
        assert [states[f"ibmon/main/ports/{g}/1"]["node_desc"] for g in guids] == shown
        got = [Event.model_validate_json(p) for t, p, _ in sub.messages if "/events/" in t]
        assert got == events
        assert [e.port.node_desc for e in got if e.port] == HOSTILE
    finally:
        await pub.stop()


async def test_broker_going_away_never_stops_the_daemon(broker: Mosquitto) -> None:
    source = TickingSource("local")
    settings = load_settings(
        None, prometheus={"listen": "127.0.0.1:0"},
        sources=[SysfsSourceConfig(name="local", interval=0.05).model_dump()],
        mqtt={"port": broker.port, "keepalive": "1s"},
    )
    daemon = Daemon(settings, source_factory=lambda cfg: source)

    def connected() -> float | None:
        return daemon.metrics.registry.get_sample_value("ibmon_mqtt_connected")

    task = asyncio.create_task(daemon.run())
    try:
        await daemon.ready.wait()
        assert daemon.exporter is not None
        await until(lambda: connected() == 1)
        broker.stop()
        polls = source.polls
        await until(lambda: connected() == 0)
        await until(lambda: source.polls >= polls + 20)
        body = await asyncio.to_thread(scrape, daemon.exporter.port)
        assert "ibmon_mqtt_connected 0.0" in body
        assert 'ibmon_source_up{source="local"} 1.0' in body
        broker.start()
        await until(lambda: connected() == 1, within=20)
        async with Collector(broker.port, "ibmon/main/ports/#").running() as sub:
            await sub.wait_for(lambda: sub.messages)  # state resent to the restarted broker
        assert json.loads(sub.messages[0][1])["guid"] == "0x0002c90300a1b2c3"
    finally:
        daemon.stop()
        await asyncio.wait_for(task, 10)


async def test_graceful_stop_flushes_queued_events_then_goes_offline(broker: Mosquitto) -> None:
    metrics = SelfMetrics()
    pub = MqttPublisher(MqttConfig(port=broker.port), fabric="main", metrics=metrics, **FAST)
    sent = [event("counter_reset", n=i) for i in range(300)]
    async with Collector(broker.port, "ibmon/main/#").running() as sub:
        await pub.start()
        await until(lambda: pub.connected)
        pub.submit_many(sent)
        started = time.monotonic()
        await pub.stop()
        assert time.monotonic() - started < 5
        await sub.wait_for(lambda: sub.on(STATUS)[-1:] == [b"offline"])
    got = [Event.model_validate_json(p) for t, p, _ in sub.messages if "/events/" in t]
    assert got == sent
    assert [t for t, _, _ in sub.messages][-1] == STATUS  # offline comes after the last event
    assert metric(metrics, "ibmon_mqtt_dropped_total") == 0


async def test_a_backlog_longer_than_the_flush_timeout_still_ends_offline(
    broker: Mosquitto,
) -> None:
    """Stopping with more queued than ``flush_timeout`` delivers: the rest is counted as lost,
    and ibmon still says ``offline`` itself (a session cut off mid-flush would disconnect
    cleanly, which discards the Last Will and leaves the retained ``online`` behind)."""
    metrics = SelfMetrics()
    pub = MqttPublisher(MqttConfig(port=broker.port, queue_size=50_000), fabric="main",
                        metrics=metrics, flush_timeout=0.05, **FAST)
    async with Collector(broker.port, STATUS).running() as sub:
        await pub.start()
        await until(lambda: pub.connected)
        await sub.wait_for(lambda: sub.on(STATUS) == [b"online"])
        pub.submit_many(event("counter_reset", n=i) for i in range(20_000))
        await pub.stop()
        await sub.wait_for(lambda: sub.on(STATUS)[-1:] == [b"offline"])
    delivered = metric(metrics, "ibmon_mqtt_published_total") - 2  # online and offline
    assert 0 < metric(metrics, "ibmon_mqtt_dropped_total") == 20_000 - delivered


async def test_stop_is_bounded_and_still_says_offline_when_the_broker_hangs(
    broker: Mosquitto,
) -> None:
    pub = MqttPublisher(MqttConfig(port=broker.port), fabric="main", metrics=SelfMetrics(),
                        flush_timeout=1.0, **FAST)
    await pub.start()
    await until(lambda: pub.connected)
    assert broker.proc is not None
    os.kill(broker.proc.pid, signal.SIGSTOP)  # accepts bytes, acknowledges nothing
    try:
        pub.submit_many([event("congestion", n=i) for i in range(50)])
        started = time.monotonic()
        await pub.stop()
        assert time.monotonic() - started < 1.0 + 2 * 2.0 + 1.0
    finally:
        os.kill(broker.proc.pid, signal.SIGCONT)
    async with Collector(broker.port, STATUS).running() as late:
        await late.wait_for(lambda: late.messages)
    assert late.messages == [(STATUS, b"offline", True)]
