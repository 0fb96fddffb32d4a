"""``ibmon explain``: what a paged person types is resolved to one port, and the report says
what the API knows, made from the API's own answer (``port_detail_json``).

The command against a running daemon is tests/integration/test_api_diagnosis.py; these pin
the parts that take a particular fabric to show: a silent far end, a degraded link, a fault
carried by the far end, a port without detail counters, a BER of zero."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from exporters.ports import port_detail_json
from ibmon.cli.apiclient import ApiError
from ibmon.cli.explain import find_port, parse_port_spec, render_report
from ibmon.detect.base import Finding
from ibmon.detect.engine import ActiveCondition
from ibmon.detect.events import Event, PortRef
from ibmon.infiniband.model import LinkInfo, PortIdentity, PortView
from ibmon.state import FabricState

LEAF = "0x0002c90100000010"
HOST = "0x0002c90a00000007"


def test_what_a_person_types_is_one_port_spec() -> None:
    assert parse_port_spec("0002:c901:0000:0010/012") == ("guid", LEAF, "12")
    assert parse_port_spec('"leaf07" [12]') == ("desc", "leaf07", "12")
    assert parse_port_spec("leaf07[012]") == ("desc", "leaf07", "12")
    assert parse_port_spec("gpu031/mlx5_1") == ("ca", "gpu031", "mlx5_1")
    assert parse_port_spec(" gpu031 ") == ("name", "gpu031", "")
    assert parse_port_spec('"host042 mlx5_0"') == ("name", "host042 mlx5_0", "")
    for junk in ("leaf07[port 12]", "a/b/c", '"', ""):
        with pytest.raises(ValueError, match="is not GUID/PORT"):
            parse_port_spec(junk)


def test_a_host_and_device_name_one_ca_at_its_first_active_port() -> None:
    """As the diags tools pick a CA's port; two nodes with one name are refused by GUID."""
    nodes = [
        {"guid": "0xa", "node_desc": "gpu031 mlx5_0", "device": "mlx5_0",
         "ports": [{"port": "1", "state": 1}, {"port": "2", "state": 4}]},
        {"guid": "0xb", "node_desc": "gpu031 mlx5_1", "device": "mlx5_1",
         "ports": [{"port": "1", "state": 4}]},
        {"guid": "0xc", "node_desc": "spine01", "ports": [{"port": "1", "state": 4}]},
        {"guid": "0xd", "node_desc": "spine01", "ports": [{"port": "1", "state": 4}]},
    ]
    assert find_port("ca", "gpu031", "mlx5_0", nodes) == ("0xa", "2")
    assert find_port("ca", "gpu031", "mlx5_1", nodes) == ("0xb", "1")
    with pytest.raises(ApiError, match=r"names 2 nodes \(0xc, 0xd\): give GUID/PORT"):
        find_port("desc", "spine01", "1", nodes)


def test_a_name_alone_is_a_cas_first_active_port_and_never_a_guess() -> None:
    """What a paged person types first: ``ibmon explain gpu031``. A host with one CA, a CA's
    description or GUID: that CA's first active port. A host with several CAs, or a switch,
    is refused with what to type instead."""
    nodes = [
        {"guid": "0x000000000000000a", "node_desc": "gpu031 mlx5_0", "device": "mlx5_0",
         "node_type": "ca", "ports": [{"port": "1", "state": 1}, {"port": "2", "state": 4}]},
        {"guid": "0x000000000000000b", "node_desc": "gpu032 mlx5_0", "device": "mlx5_0",
         "node_type": "ca", "ports": [{"port": "1", "state": 4}]},
        {"guid": "0x000000000000000c", "node_desc": "gpu032 mlx5_1", "device": "mlx5_1",
         "node_type": "ca", "ports": [{"port": "1", "state": 4}]},
        {"guid": "0x000000000000000d", "node_desc": "leaf07", "node_type": "switch",
         "ports": [{"port": "1", "state": 4}]},
    ]

    def named(text: str) -> tuple[str, str]:
        return find_port(*parse_port_spec(text), nodes)

    assert named("gpu031") == ("0x000000000000000a", "2")
    assert named('"gpu031 mlx5_0"') == ("0x000000000000000a", "2")
    assert named("0xA") == ("0x000000000000000a", "2")
    assert named("gpu032 mlx5_1") == ("0x000000000000000c", "1")
    with pytest.raises(ApiError, match=r"'gpu032' has 2 CAs: name one \(gpu032/mlx5_0, "
                                       r"gpu032/mlx5_1\)"):
        named("gpu032")
    with pytest.raises(ApiError, match=r"'leaf07' is a switch: name its port \(\"leaf07\"\[N\]"):
        named("leaf07")
    with pytest.raises(ApiError, match="no node 'gpu099' in the daemon's fabric"):
        named("gpu099")


def _view(guid: str, port: str, desc: str, node_type: str, far: tuple[str, str, str],
          **fields: object) -> PortView:
    ident = PortIdentity(guid=guid, port=port, node_desc=desc, node_type=node_type, lid=3)
    link = LinkInfo(remote_guid=far[0], remote_port=far[1], remote_node_desc=far[2],
                    active_width="1X", active_speed="HDR", max_width="4X", max_speed="HDR")
    return PortView(identity=ident, state=4, phys_state=5, rate_bytes_per_second=6.25e9,
                    link=link, **fields)  # type: ignore[arg-type]


def test_the_report_says_what_only_an_odd_link_shows() -> None:
    leaf = _view(LEAF, "12", "leaf07", "switch", (HOST, "1", "gpu031 mlx5_0"),
                 symbol_error_ber=0.0, utilization_tx=0.5,
                 totals={"receive_errors": 40})
    host = _view(HOST, "1", "gpu031 mlx5_0", "ca", (LEAF, "12", "leaf07"), stale=True)
    finding = Finding("warning", 4.0, 1.0, "leaf07 port 12 ... runs at 1X of 4X",
                      {"cause": "physical", "action": "Reseat the cable"})
    carried = ActiveCondition("link_degraded", (HOST, "1"), finding, 1.7e9, host.identity,
                              None)
    state = FabricState(generated=1.7e9, ports=MappingProxyType({leaf.key: leaf,
                                                                 host.key: host}))
    detail = port_detail_json(state, leaf.key, [carried], [])
    assert detail is not None
    report = render_report(detail)
    assert "state: ACTIVE; far end: ACTIVE (stale: did not answer the last poll)" in report
    assert "link: 1X HDR (best both ends support: 4X HDR) DEGRADED" in report
    assert "link_degraded warning, firing since" in report and "(carried by the far end)" in report
    assert "here: receive errors 40 (no detail counters on this port)" in report
    assert "BER 0 " in report and "tx 50.0 %" in report and "rx -" in report


def test_the_report_ends_with_the_newest_ten_events() -> None:
    """The API gives up to 50 events of both ends; the report shows the last ten, the newest
    last, so what just happened is at the bottom of the terminal."""
    leaf = _view(LEAF, "12", "leaf07", "switch", (HOST, "1", "gpu031 mlx5_0"))
    state = FabricState(generated=1.7e9, ports=MappingProxyType({leaf.key: leaf}))
    events = [Event(time=Event.at(1.7e9 + i), fabric="main", type="counter_reset",
                    status="firing", severity="info", port=PortRef(guid=LEAF, port="12"),
                    message=f"reset number {i}") for i in range(1, 13)]
    detail = port_detail_json(state, leaf.key, [], events)
    assert detail is not None
    shown = [ln for ln in render_report(detail).splitlines() if "reset number" in ln]
    assert [ln.rsplit(" ", 1)[1] for ln in shown] == [str(i) for i in range(3, 13)]
    # the time as every other time in the report: UTC, said so
    assert shown[0].startswith("  2023-11-14 22:13:23 UTC firing info counter_reset: ")
