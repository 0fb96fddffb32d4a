"""PortXmitWait counts become the fraction of time a port stalled, in each device's own unit.

The expected values here are written from NVIDIA's ibdiagnet manual ("Congestion Assessment on
InfiniBand Links": lost bytes per port = Counter x (Tick + 1), times the lane count on Switch-IB
class ASICs) and the IBA lane data rates, not from ``ibmon.infiniband.xmitwait``: a unit or rate bug
there cannot make these tests agree with it.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ibmon.detect.congestion import CongestionSettings
from ibmon.infiniband.linkspeed import SPEED_ORDER, WIDTH_LANES, effective_rate_bps
from ibmon.infiniband.model import PortIdentity, PortSample, Snapshot
from ibmon.infiniband.xmitwait import (
    DEFAULT_UNIT,
    WaitUnit,
    configured_unit,
    device_id_of_hca_type,
    family_of,
    parse_unit,
    unit_for,
)
from ibmon.runtime.pipeline import Pipeline
from ibmon.runtime.selfmetrics import SelfMetrics
from ibmon.sources.sysfs import SysfsSource, SysfsSourceConfig
from ibmon.track.tracker import Tracker
from tests.sysfs_tree import write_device, write_port

#: Per-lane data rates after line encoding, Gb/s: 8b/10b up to QDR, 64b/66b to EDR
#: (FDR10 10.3125 and FDR 14.0625 Gbaud x 64/66), HDR/NDR/XDR the data their PAM4 lanes carry.
LANE_GBPS = {"SDR": 2.0, "DDR": 4.0, "QDR": 8.0, "FDR10": 10.0, "FDR": 14.0625 * 64 / 66,
             "EDR": 25.0, "HDR": 50.0, "NDR": 100.0, "XDR": 200.0}
#: ibdiagnet's table: the Tick each family reports and whether its count is per lane.
FAMILIES = {"Quantum": (0xD2F0, 7, False), "Quantum-2": (0xD2F2, 7, False),
            "Switch-IB 2": (0xCF08, 31, True), "Switch-IB": (0xCB20, 31, True)}
COUNTS = 1_000_000
SECONDS = 10.0


def lost_bytes(counter: int, tick: int, lanes: int, per_lane: bool) -> int:
    """ibdiagnet: Counter*(tick+1), times #lanes where the hardware counts per lane."""
    return counter * (tick + 1) * (lanes if per_lane else 1)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("width", sorted(WIDTH_LANES, key=WIDTH_LANES.__getitem__))
@pytest.mark.parametrize("speed", SPEED_ORDER)
def test_every_family_width_and_generation_follows_the_vendor_formula(
        family: str, width: str, speed: str) -> None:
    device_id, tick, per_lane = FAMILIES[family]
    unit, flagged = unit_for(device_id, None)
    assert (unit.source, unit.family, flagged) == ("family", family, False)
    lanes = WIDTH_LANES[width]
    port_bytes_per_s = lanes * LANE_GBPS[speed] * 1e9 / 8
    expected = lost_bytes(COUNTS, tick, lanes, per_lane) / (port_bytes_per_s * SECONDS)
    ident = PortIdentity(guid="0x0000000000000001", port="1", xmit_wait=unit)
    tracker = Tracker()
    views = {}
    for t, value in ((0.0, 5), (SECONDS, 5 + COUNTS)):
        sample = PortSample(identity=ident, state=4, rate_bps=effective_rate_bps(width, speed),
                            active_width=width, active_speed=speed,
                            counters={"transmit_wait": value}, wide=frozenset({"transmit_wait"}))
        views = tracker.update(Snapshot("t", t, 1.7e9 + t, {ident.key: sample}))
    view = views[ident.key]
    assert view.xmit_wait_ratio == pytest.approx(expected, rel=1e-12)
    assert view.xmit_wait_seconds == pytest.approx(expected * SECONDS, rel=1e-12)


def test_the_tick_decides_where_the_family_is_unknown_and_an_odd_tick_is_flagged() -> None:
    assert unit_for(0x1234, 7) == (WaitUnit(8, False, "tick"), False)
    assert unit_for(None, 31) == (WaitUnit(32, True, "tick"), False)
    assert unit_for(None, 15) == (WaitUnit(16, True, "tick"), True)  # IBA: (Tick+1) per lane
    assert unit_for(None, None) == (DEFAULT_UNIT, False)
    assert unit_for(0xD2F2, 31)[0].family == "Quantum-2"  # the family wins over a Tick


def test_hca_type_is_the_pci_device_id_in_decimal() -> None:
    assert device_id_of_hca_type("MT4123") == 0x101B  # ConnectX-6
    assert device_id_of_hca_type("MT4129\n") == 0x1021  # ConnectX-7
    assert device_id_of_hca_type("I40IW") is None
    assert device_id_of_hca_type("") is None


def test_the_real_capture_devices_have_no_documented_family() -> None:
    root = Path(__file__).resolve().parents[3] / "shared" / "real-fixtures" / "procfs"
    hca_types = sorted(p.read_text().strip() for p in root.rglob("hca_type"))
    if not hca_types:
        pytest.skip("no real captures beside the project")
    # MT4099 ConnectX-3, MT4118 ConnectX-4 Lx VF: neither is in ibdiagnet's table
    assert hca_types == ["MT4099", "MT4118"]
    for text in hca_types:
        assert unit_for(device_id_of_hca_type(text), None)[0] == DEFAULT_UNIT


@pytest.mark.parametrize("text", ["", "8", "0/port", "8/cable", "x/lane", "99999/port"])
def test_a_configured_unit_is_bytes_per_port_or_lane(text: str) -> None:
    with pytest.raises(ValueError, match="8/port"):
        parse_unit(text)
    with pytest.raises(ValueError, match="8/port"):
        SysfsSourceConfig(xmit_wait_units={"mlx5_*": text})


async def test_sysfs_units_come_from_the_config_then_the_family_then_the_default(
        tmp_path: Path) -> None:
    write_device(tmp_path, "mlx5_0", hca_type="MT4123\n")  # ConnectX-6
    write_port(tmp_path, "mlx5_0", 1)
    write_device(tmp_path, "mlx4_0", node_guid="0002:c903:00a1:b2c4", hca_type="MT4099\n")
    write_port(tmp_path, "mlx4_0", 1)
    write_device(tmp_path, "mlx5_1", node_guid="0002:c903:00a1:b2c5", hca_type="MT4125\n")
    write_port(tmp_path, "mlx5_1", 1)
    cfg = SysfsSourceConfig(root=tmp_path, xmit_wait_units={"mlx4_*": "32/lane"})
    from ibmon.sources.sysfs import build

    source = build(cfg)
    assert isinstance(source, SysfsSource)
    topo = await source.discover()
    units = {ident.device: ident.xmit_wait for ident in topo.ports.values()}
    assert units == {"mlx5_0": WaitUnit(8, False, "family", "ConnectX-6"),
                     "mlx4_0": WaitUnit(32, True, "config"),
                     "mlx5_1": WaitUnit(8, False, "family", "ConnectX-6 Dx")}
    await source.close()


HDR_BYTES_PER_S = 200e9 / 8  # 4X HDR: 50 Gb/s a lane after encoding


@pytest.mark.parametrize(("stalled", "congested"), [(0.001, False), (0.12, True)])
async def test_an_hdr_host_port_reads_its_stall_fraction_and_only_a_real_one_raises(
        tmp_path: Path, stalled: float, congested: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ConnectX-6 counts 8 bytes a count: a port stalled ``stalled`` of each second adds
    ``stalled x 25e9 / 8`` counts a second (0.1 %: 3.125e6; 12 %: 3.75e8)."""
    write_device(tmp_path, "mlx5_0", hca_type="MT4123\n")
    counters = {"port_xmit_wait": "1000\n"}
    pdir = write_port(tmp_path, "mlx5_0", 1, rate="200 Gb/sec (4X HDR)\n", counters=counters)
    now = [100.0]
    # the source's clock: one simulated second between polls
    monkeypatch.setattr("ibmon.sources.sysfs.time", SimpleNamespace(
        monotonic=lambda: now[0], time=lambda: 1.7e9 + now[0]))
    pipeline = Pipeline(SysfsSourceConfig(root=tmp_path, interval=1.0), metrics=SelfMetrics(),
                        clock=lambda: now[0], wall=lambda: 1.7e9 + now[0])
    from ibmon.sources.sysfs import build

    source = build(SysfsSourceConfig(root=tmp_path, interval=1.0))
    per_second = round(stalled * HDR_BYTES_PER_S / 8)
    value = 1000
    fired: list[str] = []
    sustain = CongestionSettings.model_validate({}).sustain
    for _ in range(sustain + 2):
        fired += [e.type for e in await pipeline.poll(source)]
        now[0] += 1.0
        value += per_second
        (pdir / "counters" / "port_xmit_wait").write_text(f"{value}\n")
    view = next(iter(pipeline.views.values()))
    assert view.xmit_wait_ratio == pytest.approx(stalled, rel=1e-6)
    assert ("congestion" in view.conditions) is congested
    assert ("congestion" in fired) is congested
    await source.close()


def test_tick_seconds_is_refused_with_one_line_naming_its_replacement(tmp_path: Path) -> None:
    config = tmp_path / "ibmon.toml"
    config.write_text("[detect]\ntick_seconds = 64e-9\n")
    proc = subprocess.run([sys.executable, "-m", "ibmon", "check-config", str(config)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "tick_seconds was removed" in lines[0] and "xmit_wait_units" in lines[0]


def test_a_per_lane_unit_needs_the_width() -> None:
    unit = WaitUnit(32, True, "family", "Switch-IB 2")
    assert unit.bytes_per_count("4X") == 128.0
    assert unit.bytes_per_count("") is None
    assert dataclasses.replace(unit, per_lane=False).bytes_per_count("") == 32.0


def test_every_switchx_device_id_is_switchx() -> None:
    """rdma-core's ``vendstat.c`` lists Switch-X as the inclusive range 0xc738-0xc73b."""
    assert [family_of(i) for i in range(0xC737, 0xC73D)] == [None] + [
        WaitUnit(32, True, "family", "SwitchX")] * 4 + [None]


def test_the_first_configured_glob_that_matches_decides() -> None:
    units = {"mlx5_*": parse_unit("8/port"), "mlx5_1": parse_unit("32/lane")}
    assert configured_unit("mlx5_1", units) == WaitUnit(8, False, "config")
    assert configured_unit("mlx4_0", units) is None
