"""node_exporter, run for real on the same sysfs tree, is the oracle for byte and packet totals.

On its first sample ibmon's totals are the hardware values (x4 for data), so they must equal what
node_exporter's infiniband collector exports for every port. Where a port has legacy
``counters_ext/`` files, ibmon prefers those 64-bit values and node_exporter exports them as
``node_infiniband_legacy_*``; the comparison uses that series then.

Values are compared as integers. node_exporter holds every value as a float64 and prints the
shortest text that parses back to it, so ``int(float(text))`` is exactly what it holds; ibmon's
totals are Python ints. Comparing floats would hide any error smaller than half a float64 step
(+-1024 near 2**64); the generated tree therefore uses values near 2**64 that float64 holds
exactly, so such an error shows.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ibmon.sources.sysfs import SysfsSource
from ibmon.track.tracker import Tracker
from tests.fixtures import real_fixture
from tests.node_exporter import http_get, running_node_exporter
from tests.sysfs_tree import FULL_COUNTERS, write_device, write_port

pytestmark = [pytest.mark.system, pytest.mark.node_sized]  # a node's HCAs, port by port

#: Real sysfs captures under ../shared/real-fixtures (tests.fixtures finds them).
REAL_TREES = {
    "procfs": "procfs/testdata/fixtures.ttar.d/fixtures/sys",
    "node_exporter": "node_exporter/collector/fixtures/sys.ttar.d/sys",
}

#: node_exporter series (without ``node_infiniband_``) -> ibmon counter.
NE_COUNTERS = {
    "port_data_transmitted_bytes_total": "transmit_data",
    "port_data_received_bytes_total": "receive_data",
    "port_packets_transmitted_total": "transmit_packets",
    "port_packets_received_total": "receive_packets",
    "unicast_packets_transmitted_total": "unicast_transmit_packets",
    "unicast_packets_received_total": "unicast_receive_packets",
    "multicast_packets_transmitted_total": "multicast_transmit_packets",
    "multicast_packets_received_total": "multicast_receive_packets",
}
NE_LEGACY = {
    "legacy_data_transmitted_bytes_total": "transmit_data",
    "legacy_data_received_bytes_total": "receive_data",
    "legacy_packets_transmitted_total": "transmit_packets",
    "legacy_packets_received_total": "receive_packets",
    "legacy_unicast_packets_transmitted_total": "unicast_transmit_packets",
    "legacy_unicast_packets_received_total": "unicast_receive_packets",
    "legacy_multicast_packets_transmitted_total": "multicast_transmit_packets",
    "legacy_multicast_packets_received_total": "multicast_receive_packets",
}

Values = dict[tuple[str, str], dict[str, int]]  # (device, port) -> ibmon counter -> value


@contextmanager
def node_exporter(sysfs: Path, log: Path) -> Iterator[str]:
    """A node_exporter with only the infiniband collector; yields its /metrics URL."""
    with running_node_exporter(
        [f"--path.sysfs={sysfs}", "--collector.disable-defaults", "--collector.infiniband"], log
    ) as url:
        yield url


def _exact(value: float) -> int:
    """The integer node_exporter's float64 holds (a counter is always a whole number).

    The parser returns an int for plain digits and a float for ``1.8446744073709548e+19``;
    both convert exactly.
    """
    if isinstance(value, int):
        return value
    assert value.is_integer(), value
    return int(value)


def node_exporter_values(text: str) -> Values:
    """Per port, the counters node_exporter exports; a legacy (counters_ext) series wins."""
    plain: Values = {}
    legacy: Values = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            short = s.name.removeprefix("node_infiniband_")
            key = (s.labels.get("device", ""), s.labels.get("port", ""))
            if short in NE_COUNTERS:
                plain.setdefault(key, {})[NE_COUNTERS[short]] = _exact(s.value)
            elif short in NE_LEGACY:
                legacy.setdefault(key, {})[NE_LEGACY[short]] = _exact(s.value)
    for key, values in legacy.items():
        plain.setdefault(key, {}).update(values)
    return plain


async def ibmon_values(sysfs: Path) -> Values:
    snap = await SysfsSource(root=sysfs).sample()
    views = Tracker().update(snap)
    wanted = set(NE_COUNTERS.values())
    out: Values = {}
    for view in views.values():
        totals = {k: v for k, v in view.totals.items() if k in wanted}
        if totals:
            out[(view.identity.device, view.key[1])] = totals
    return out


async def assert_same_totals(sysfs: Path, log: Path) -> int:
    with node_exporter(sysfs, log) as url:
        expected = node_exporter_values(http_get(url))
    got = await ibmon_values(sysfs)
    assert expected, "node_exporter exported no infiniband byte/packet counters"
    assert got.keys() == expected.keys()
    compared = 0
    for key, values in expected.items():
        for counter, value in values.items():
            ours = got[key].get(counter)
            assert type(ours) is int, (key, counter, ours)
            assert ours == value, f"{key} {counter}: ibmon {ours} != node_exporter {value}"
            compared += 1
    return compared


@pytest.mark.parametrize("tree", sorted(REAL_TREES))
async def test_real_tree_totals_match_node_exporter(tree: str, tmp_path: Path) -> None:
    root = real_fixture(REAL_TREES[tree])
    assert await assert_same_totals(root, tmp_path / "node_exporter.log") >= 8


def write_generated_tree(root: Path) -> None:
    """Several devices and ports with 64-bit values, a plain-table port and a legacy mlx4."""
    write_device(root, "mlx5_0", node_guid="0002:c903:00a1:0001")
    # Near 2**64 a float64 step is 2048. 2**64 - 4096 (x4 of the data value below) and
    # 2**64 - 4096 itself have an even float64 mantissa, so a value off by +-1024 rounds back to
    # them: only an integer comparison sees it. Every value here is exact in float64, so
    # node_exporter carries it unrounded.
    write_port(root, "mlx5_0", 1, counters={
        **FULL_COUNTERS,
        "port_xmit_data": 2**62 - 1024,  # x4 = 2**64 - 4096, still fits node_exporter's uint64
        "port_rcv_data": 123_456_789_012_345,  # x4 below 2**53
        "port_xmit_packets": 2**63 + 2048,
        "port_rcv_packets": 9_007_199_254_740_000,
        "unicast_xmit_packets": 2**64 - 4096,
        "unicast_rcv_packets": 4_294_967_296,
        "multicast_xmit_packets": 17,
        "multicast_rcv_packets": 0,
    })
    write_port(root, "mlx5_0", 2, counters={**FULL_COUNTERS, "port_xmit_data": 5_000_000_000})
    write_device(root, "mlx5_1", node_guid="0002:c903:00a1:0002")
    write_port(root, "mlx5_1", 1, link_layer="Ethernet\n", rate="25 Gb/sec (1X EDR)\n",
               counters={**FULL_COUNTERS, "port_rcv_data": 3_999_999_999_999})
    plain = {k: v for k, v in FULL_COUNTERS.items() if not k.startswith(("unicast", "multicast"))}
    write_device(root, "qib0", node_guid="0011:7500:0070:0003")
    write_port(root, "qib0", 1, counters={**plain, "port_xmit_data": 4294967295})
    write_device(root, "mlx4_0", node_guid=None)
    write_port(root, "mlx4_0", 1,
               counters={"port_xmit_data": 7, "port_rcv_data": 8, "port_xmit_packets": 9,
                         "port_rcv_packets": 10},
               counters_ext={"port_xmit_data_64": 2**50 + 3, "port_rcv_data_64": 2**40,
                             "port_xmit_packets_64": 2**45, "port_rcv_packets_64": 11,
                             "port_unicast_xmit_packets": 12, "port_unicast_rcv_packets": 13,
                             "port_multicast_xmit_packets": 14,
                             "port_multicast_rcv_packets": 15})


async def test_generated_tree_totals_match_node_exporter(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    write_generated_tree(root)
    compared = await assert_same_totals(root, tmp_path / "node_exporter.log")
    # 3 extended-table ports x 8 + 1 plain port x 4 + the legacy port x 8
    assert compared == 36
