"""Every source reports the data rate after line encoding, from linkspeed.port_rate_bps.

sysfs prints the signalling rate (``40 Gb/sec (4X QDR)``); the sysfs source must turn it into
the same data rate the fabric sources compute from PortInfo, for every generation and width.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ibmon.infiniband.linkspeed import (
    LANE_EFFECTIVE_GBPS,
    SPEED_ORDER,
    WIDTH_LANES,
    active_width,
    effective_rate_bps,
    port_rate_bps,
    width_names,
)
from ibmon.infiniband.model import PortIdentity
from ibmon.sources.fabric import FabricPort, make_sample
from ibmon.sources.sysfs import SysfsSource
from mocks.sysfs import kernel_rate
from tests.sysfs_tree import write_device, write_port

#: 4X data rates in Gb/s as vendors state them (8b/10b to QDR, 64b/66b to EDR; HDR, NDR, XDR:
#: 4 x 50G, 100G, 200G PAM4 lanes, their FEC inside the signalling rate).
DATA_4X = {"SDR": 8, "DDR": 16, "QDR": 32, "FDR10": 40, "FDR": 4 * 14.0625 * 64 / 66, "EDR": 100,
           "HDR": 200, "NDR": 400, "XDR": 800}
#: What the kernel prints for 4X (rate_show, deci-Gb/s per lane x lanes).
SYSFS_4X = {"SDR": "10 Gb/sec (4X SDR)", "DDR": "20 Gb/sec (4X DDR)",
            "QDR": "40 Gb/sec (4X QDR)", "FDR10": "40 Gb/sec (4X FDR10)",
            "FDR": "56 Gb/sec (4X FDR)", "EDR": "100 Gb/sec (4X EDR)",
            "HDR": "200 Gb/sec (4X HDR)", "NDR": "400 Gb/sec (4X NDR)",
            "XDR": "800 Gb/sec (4X XDR)"}


def test_tables_cover_every_generation() -> None:
    assert tuple(DATA_4X) == SPEED_ORDER == tuple(LANE_EFFECTIVE_GBPS)
    for speed, gbps in DATA_4X.items():
        assert effective_rate_bps("4X", speed) == gbps * 1e9
        assert kernel_rate("4X", speed) == SYSFS_4X[speed]


@pytest.mark.parametrize("width", list(WIDTH_LANES))
@pytest.mark.parametrize("speed", SPEED_ORDER)
async def test_sysfs_reports_the_data_rate(tmp_path: Path, width: str, speed: str) -> None:
    write_device(tmp_path, "mlx5_0")
    write_port(tmp_path, "mlx5_0", 1, rate=kernel_rate(width, speed) + "\n")
    snap = await SysfsSource(root=tmp_path).sample()
    (p,) = snap.ports.values()
    assert snap.errors == []
    assert (p.active_width, p.active_speed) == (width, speed)
    expected = WIDTH_LANES[width] * DATA_4X[speed] / 4 * 1e9
    assert p.rate_bps == pytest.approx(expected, rel=1e-12)
    # and the fabric sources compute the very same number from the same width and speed
    fp = FabricPort(identity=PortIdentity(guid=p.key[0], port="1"), lid=1, state=4,
                    active_width=width, active_speed=speed)
    assert make_sample(fp, None).rate_bps == p.rate_bps


@pytest.mark.parametrize(
    ("text", "bps"),
    [
        ("10 Gb/sec (1X FDR10)", 10e9),  # 10GbE
        ("25 Gb/sec (1X EDR)", 25e9),  # 25GbE
        ("40 Gb/sec (4X FDR10)", 40e9),  # 40GbE
        ("50 Gb/sec (2X EDR)", 50e9),  # 50GbE
        ("100 Gb/sec (4X EDR)", 100e9),  # 100GbE
        ("200 Gb/sec (4X HDR)", 200e9),  # 200GbE
        ("2.5 Gb/sec (1X SDR)", 2.5e9),  # 1GbE: the kernel's smallest pair
    ],
)
async def test_roce_rate_is_the_ethernet_rate(tmp_path: Path, text: str, bps: float) -> None:
    """On an Ethernet link layer the printed number is the MAC rate, already a data rate."""
    write_device(tmp_path, "mlx5_0")
    write_port(tmp_path, "mlx5_0", 1, rate=text + "\n", link_layer="Ethernet\n")
    snap = await SysfsSource(root=tmp_path).sample()
    (p,) = snap.ports.values()
    assert p.rate_bps == bps


def test_port_rate_rules() -> None:
    assert port_rate_bps("4X", "QDR") == 32e9
    assert port_rate_bps("4X", "QDR", link_layer="Ethernet", reported_bps=40e9) == 40e9
    assert port_rate_bps("4X", "QDR", link_layer="Ethernet", reported_bps=None) is None
    assert port_rate_bps("4X", "") is None  # speed unknown: no rate rather than a wrong one
    assert port_rate_bps("", "EDR") is None


def test_width_codes_are_portinfos() -> None:
    """LinkWidth bits as rdma-core's libibmad ``dump.c`` names them: 1 1X, 2 4X, 4 8X, 8 12X,
    16 2X (IBA 1.4: HDR's 2X ports)."""
    assert [active_width(c) for c in (1, 2, 4, 8, 16, 3, 0)] == [
        "1X", "4X", "8X", "12X", "2X", "", ""]
    assert width_names(0x1F) == ["1X", "2X", "4X", "8X", "12X"]
    assert effective_rate_bps("2X", "HDR") == 100e9


def test_rates_take_widths_and_speeds_as_tools_print_them() -> None:
    """ibnetdiscover prints ``4x``; the rate does not depend on the case."""
    assert effective_rate_bps("4x", "edr") == effective_rate_bps("4X", "EDR") == 100e9
