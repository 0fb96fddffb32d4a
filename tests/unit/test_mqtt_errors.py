"""MQTT connection problems say what is wrong and where; lost events are one number."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

import aiomqtt
import pytest

from exporters.mqtt import MqttPublisher, TlsFileError, describe_connect_error, tls_context
from ibmon.config import MqttConfig, MqttTlsConfig
from ibmon.detect.events import EventBus
from ibmon.runtime.selfmetrics import SelfMetrics
from tests.integration.test_mqtt import event


def _wrapped(original: BaseException) -> aiomqtt.MqttError:
    """What aiomqtt raises: MqttError(str(exc)) from None, the original as __context__."""
    try:
        try:
            raise original
        except OSError as exc:
            raise aiomqtt.MqttError(str(exc)) from None
    except aiomqtt.MqttError as wrapped:
        return wrapped
    raise AssertionError("unreachable")


def test_a_reset_during_the_handshake_means_the_port_is_not_tls() -> None:
    exc = _wrapped(ConnectionResetError(104, "Connection reset by peer"))
    text = describe_connect_error(exc, tls=True, host="broker", port=1883,
                                  handshake_started=True)
    assert "TLS handshake with broker:1883 failed" in text
    assert "does not seem to speak TLS" in text
    # Without TLS, or before the TCP connection was up, a reset is only a reset.
    assert describe_connect_error(exc, tls=False, host="b", port=1) == str(exc)
    assert describe_connect_error(exc, tls=True, host="b", port=1) == str(exc)


def test_a_certificate_that_does_not_verify_points_at_the_ca_file() -> None:
    err = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate "
                                          "verify failed: self-signed certificate")
    text = describe_connect_error(_wrapped(err), tls=True, host="b", port=8883,
                                  handshake_started=True)
    assert "does not verify" in text and "mqtt.tls.ca_file" in text


def test_tls_files_are_named_when_they_cannot_be_used(tmp_path: Path) -> None:
    missing = tmp_path / "missing.pem"
    with pytest.raises(TlsFileError, match=f"mqtt.tls.ca_file {missing}: No such file"):
        tls_context(MqttTlsConfig(ca_file=missing))
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(TlsFileError, match=f"mqtt.tls.ca_file {garbage}: not usable"):
        tls_context(MqttTlsConfig(ca_file=garbage))
    with pytest.raises(TlsFileError, match=f"mqtt.tls.cert_file/key_file {garbage} \\+ "):
        tls_context(MqttTlsConfig(cert_file=garbage, key_file=missing))
    assert tls_context(None) is None
    ctx = tls_context(MqttTlsConfig(verify=False))
    assert ctx is not None and ctx.verify_mode == ssl.CERT_NONE


async def test_events_lost_inside_the_publisher_count_for_its_consumer() -> None:
    dropped: list[str] = []
    bus = EventBus(on_drop=dropped.append)
    metrics = SelfMetrics()
    pub = MqttPublisher(MqttConfig(queue_size=2), fabric="main", metrics=metrics)
    sub = bus.subscribe("mqtt", maxsize=10)
    pub._feed = sub  # what consume() records when the daemon feeds it
    pub.submit_many([event("congestion", n=i) for i in range(5)])
    assert dropped == ["mqtt"] * 3
    assert sub.dropped == 3 == bus.dropped["mqtt"]
    assert metrics.registry.get_sample_value("ibmon_mqtt_dropped_total") == 3
    await pub.stop()  # the two still queued are lost too, and counted in both
    assert dropped == ["mqtt"] * 5
    assert metrics.registry.get_sample_value("ibmon_mqtt_dropped_total") == 5


def test_a_failed_handshake_closes_its_socket_at_once() -> None:
    """paho drops the socket of a failed handshake unclosed; ibmon's context must close it
    there and then, not leave the descriptor to the garbage collector (which would warn)."""
    ctx = tls_context(MqttTlsConfig(verify=False))
    assert ctx is not None
    server = socket.create_server(("127.0.0.1", 0))
    with server, socket.create_connection(server.getsockname()) as tcp:
        peer, _ = server.accept()
        peer.sendall(b"not TLS at all\r\n\r\n")  # not a ServerHello: the handshake fails
        peer.close()
        sock = ctx.wrap_socket(tcp, do_handshake_on_connect=False)
        with pytest.raises((ssl.SSLError, ConnectionError)):
            sock.do_handshake()
        assert sock.fileno() == -1  # closed, by the failed handshake itself
