"""The sysfs source on real captured trees and on trees that break one file at a time."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from ibmon.cli.scan import run_scan
from ibmon.config import load_settings
from ibmon.infiniband.model import GUID_RE, PortSample, Snapshot
from ibmon.infiniband.xmitwait import parse_unit
from ibmon.sources import Source
from ibmon.sources import sysfs as sysfs_mod
from ibmon.sources.sysfs import (
    SysfsSource,
    SysfsSourceConfig,
    has_devices,
    parse_enum_prefix,
    parse_lid,
    parse_node_type,
    parse_rate,
    synthetic_guid,
)
from tests.fixtures import real_fixture
from tests.sysfs_tree import FULL_COUNTERS, class_dir, write_device, write_file, write_port

#: Real sysfs captures under ../shared/real-fixtures (tests.fixtures finds them).
REAL_TREES = {
    "procfs": "procfs/testdata/fixtures.ttar.d/fixtures/sys",
    "node_exporter": "node_exporter/collector/fixtures/sys.ttar.d/sys",
}
KNOWN_REASONS = {
    "no_pma", "einval", "eacces", "missing", "empty", "garbage", "bad_rate",
    "unsupported", "io", "unassigned", "duplicate",
}
GUID = "0x0002c90300a1b2c3"


def real_tree(name: str) -> Path:
    """A captured sysfs root: skips locally when the captures are absent, fails in CI."""
    return real_fixture(REAL_TREES[name])


async def sample(root: Path, **kw: object) -> Snapshot:
    src = SysfsSource(root=root, **kw)  # type: ignore[arg-type]
    return await src.sample()


def port(snap: Snapshot, device: str, number: str) -> PortSample:
    found = [p for p in snap.ports.values() if p.identity.device == device and p.key[1] == number]
    assert len(found) == 1, sorted(snap.ports)
    return found[0]


def reasons_for(snap: Snapshot, needle: str) -> list[str]:
    return [e.reason for e in snap.errors if needle in e.detail]


# -- real captures ---------------------------------------------------------------------------


@pytest.mark.parametrize("tree", sorted(REAL_TREES))
async def test_every_real_port_is_sampled(tree: str) -> None:
    root = real_tree(tree)
    snap = await sample(root)
    dirs = sorted(
        (d.name, p.name) for d in class_dir(root).iterdir() for p in (d / "ports").iterdir()
    )
    assert sorted((p.identity.device, p.key[1]) for p in snap.ports.values()) == dirs
    assert snap.source == "sysfs"
    for key, p in snap.ports.items():
        assert GUID_RE.match(key[0])
        assert p.identity.source == "sysfs"
        assert p.state == 4
        assert p.rate_bps is not None
    assert {e.reason for e in snap.errors} <= KNOWN_REASONS


@pytest.mark.parametrize(
    ("tree", "firing"),
    [("procfs", []),
     # its PortXmitWait reads 2^32 - 1 (the legacy counters_ext test below): really pinned
     ("node_exporter", [("counter_saturated", "mlx4_0", "1")])],
)
async def test_a_real_host_raises_only_what_its_counters_show(
    tree: str, firing: list[tuple[str, str, str]]
) -> None:
    """What ``ibmon scan`` reports for a captured host. The node_exporter capture has an iWARP
    NIC (i40iw, 10 Gb/s, listed as InfiniBand) beside a QDR mlx4: each adapter model is its
    own majority, so the NIC is no degraded link."""
    scan = await run_scan(SysfsSourceConfig(root=real_tree(tree)), load_settings(None),
                          interval=0.0)
    assert len(scan.state.ports) >= 3
    views = scan.state.ports
    assert sorted((c.type, views[c.key].identity.device, c.key[1])
                  for c in scan.conditions) == firing


async def test_real_mlx5_values_and_identity() -> None:
    snap = await sample(real_tree("procfs"))
    p = port(snap, "mlx5_0", "1")
    # node_guid has no trailing newline in this capture
    assert p.key == ("0x0a7fbc1245efd23b", "1")
    assert p.counters["transmit_data"] == 2880761508848
    assert p.counters["receive_data"] == 18126345378
    assert p.counters["unicast_transmit_packets"] == 10907922116
    assert p.counters["transmit_wait"] == 0
    # unicast/multicast files exist, so the kernel used the extended table for data and packets
    assert {"transmit_data", "receive_data", "transmit_packets", "receive_packets"} <= p.wide
    assert "symbol_errors" not in p.wide
    assert p.state == 4
    assert p.phys_state == 4  # this capture really has "4: ACTIVE" in phys_state
    assert (p.rate_bps, p.active_width, p.active_speed) == (25e9, "1X", "EDR")
    assert p.identity.fw_ver == "14.28.2006"
    assert p.identity.hca_type == "MT4118"
    assert p.identity.board_id == "SM_2001000001034"
    assert p.identity.link_layer == "InfiniBand"
    assert p.identity.node_type == "ca"
    assert p.hw_counters["rx_read_requests"] == 175528982
    assert p.hw_counters["req_cqe_error"] == 3481
    assert "lifespan" not in p.hw_counters  # a cache setting in ms, not a counter
    assert p.hw_gauges == {"lifespan": 10}  # ... reported as it is instead
    assert len(p.hw_counters) == 24


async def test_real_mlx4_without_guid_gets_stable_key_and_one_error() -> None:
    root = real_tree("procfs")
    src = SysfsSource(root=root)
    first = await src.sample()
    p1, p2 = port(first, "mlx4_0", "1"), port(first, "mlx4_0", "2")
    assert p1.key == (synthetic_guid("mlx4_0"), "1")
    assert p2.key[0] == p1.key[0]
    assert reasons_for(first, "mlx4_0/node_guid") == ["missing"]
    assert p1.counters["transmit_wait"] == 3599
    assert p2.counters["transmit_wait"] == 3846
    # above 2**32 -1: cannot be the narrow field; below: taken as narrow
    assert p1.counters["transmit_data"] == 26509113295
    assert "transmit_data" in p1.wide
    assert p1.counters["receive_data"] == 2221223609
    assert "receive_data" not in p1.wide
    assert p2.identity.link_layer == "InfiniBand"  # file ends with an extra blank line
    second = await src.sample()
    assert reasons_for(second, "node_guid") == []  # reported once per discovery
    assert second.ports.keys() == first.ports.keys()
    hfi = port(first, "hfi1_0", "1")
    assert hfi.identity.hca_type == ""  # absent file is not an error
    assert reasons_for(first, "hfi1_0/hca_type") == []
    assert (hfi.rate_bps, hfi.active_width, hfi.active_speed) == (100e9, "4X", "EDR")


async def test_real_mlx4_legacy_counters_ext_and_saturated_wait() -> None:
    snap = await sample(real_tree("node_exporter"))
    p = port(snap, "mlx4_0", "1")
    assert p.counters["transmit_wait"] == 4294967295
    assert "transmit_wait" not in p.wide  # saturated narrow counter, the tracker must see it
    assert p.counters["transmit_discards"] == 5
    # counters_ext/port_rcv_packets_64 (0) wins over counters/port_rcv_packets (6825908347)
    assert p.counters["receive_packets"] == 0
    assert p.counters["transmit_data"] == 3733440
    assert p.counters["unicast_receive_packets"] == 61148
    assert p.counters["multicast_transmit_packets"] == 16
    assert {"receive_packets", "transmit_data", "unicast_receive_packets"} <= p.wide
    assert reasons_for(snap, "port_rcv_discards") == []  # unknown file: ignored
    p2 = port(snap, "mlx4_0", "2")
    assert p2.counters["receive_data"] == 4631917  # from counters_ext, counters/ says 0
    # "40 Gb/sec (4X QDR)" is the signalling rate: 32 Gb/s of data after 8b/10b
    assert (p.rate_bps, p.active_width, p.active_speed) == (32e9, "4X", "QDR")


async def test_real_iwarp_without_pma_keeps_port() -> None:
    root = real_tree("node_exporter")
    snap = await sample(root)
    p = port(snap, "i40iw0", "1")
    assert p.counters == {}
    assert p.state == 4
    assert p.phys_state == 5
    # "10 Gb/sec (4X)" is how kernels printed 4X SDR before naming it; this capture says its
    # link layer is InfiniBand, so it is read as 4X SDR: 8 Gb/s of data after 8b/10b.
    assert (p.rate_bps, p.active_width, p.active_speed) == (8e9, "4X", "SDR")
    errs = [e for e in snap.errors if "i40iw0/ports/1/counters/" in e.detail]
    files = list((class_dir(root) / "i40iw0" / "ports" / "1" / "counters").iterdir())
    assert len(errs) == len(files) == 17
    assert {e.reason for e in errs} == {"no_pma"}
    assert {e.key for e in errs} == {p.key}


# -- parsers ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("100 Gb/sec (4X EDR)\n", (100e9, "4X", "EDR")),
        ("200 Gb/sec (4X HDR)", (200e9, "4X", "HDR")),
        ("2.5 Gb/sec (1X SDR)\n", (2.5e9, "1X", "SDR")),
        ("40 Gb/sec (4X FDR10)\n", (40e9, "4X", "FDR10")),
        ("10 Gb/sec (4X)\n", (10e9, "4X", "SDR")),  # kernels before the SDR name
        ("2.5 Gb/sec (1X)\n", (2.5e9, "1X", "SDR")),
        ("5 Gb/sec (1X)\n", (5e9, "1X", "")),  # no name and not SDR: speed unknown
        ("56 Gb/sec (4X FDR)\n", (56e9, "4X", "FDR")),
        ("0 GB/sec\n", (None, "", "")),
        ("25 Gb/sec (1X EDR)\n\n", (25e9, "1X", "EDR")),
        ("fast\n", None),
        ("", None),
        ("Gb/sec", None),
    ],
)
def test_parse_rate(text: str, expected: tuple[float | None, str, str] | None) -> None:
    assert parse_rate(text) == expected


def test_small_parsers() -> None:
    assert parse_enum_prefix("4: ACTIVE\n") == 4
    assert parse_enum_prefix("5: LinkUp") == 5
    assert parse_enum_prefix("ACTIVE") is None
    assert parse_enum_prefix("\u00b2: ACTIVE") is None  # a digit int() refuses: no exception
    assert parse_lid("0x12\n") == 18
    assert parse_lid("0xffff") == 65535
    assert parse_lid("7") == 7
    assert parse_lid("zz") is None
    assert parse_node_type("1: CA\n") == "ca"
    assert parse_node_type("2: switch") == "switch"
    assert parse_node_type("3: router") == "router"
    assert parse_node_type("4: RNIC") == "ca"
    assert parse_node_type("nonsense") is None


def test_synthetic_guid_is_stable_and_valid() -> None:
    assert synthetic_guid("mlx5_0") == synthetic_guid("mlx5_0")
    assert synthetic_guid("mlx5_0") != synthetic_guid("mlx5_1")
    assert GUID_RE.match(synthetic_guid("mlx5_0"))


# -- written trees: identity -------------------------------------------------------------------


async def test_identity_from_written_tree(tmp_path: Path) -> None:
    write_device(tmp_path, "mlx5_0", node_desc="leaf01 HCA-1", node_type="2: switch\n")
    write_port(tmp_path, "mlx5_0", 1, lid="0x1a\n", sm_lid="0x3\n")
    src = SysfsSource(root=tmp_path, name="local")
    assert isinstance(src, Source)
    topo = await src.discover()
    assert list(topo.ports) == [(GUID, "1")]
    assert (topo.ports[(GUID, "1")].lid, topo.ports[(GUID, "1")].node_type) == (0x1A, "switch")
    assert topo.source == "local"
    assert topo.links == {}
    snap = await src.sample()
    ident = snap.ports[(GUID, "1")].identity
    assert ident.lid == 0x1A
    assert ident.sm_lid == 3
    assert ident.node_desc == "leaf01 HCA-1"
    assert ident.node_type == "switch"
    assert ident.device == "mlx5_0"
    assert ident.source == "local"
    assert snap.errors == []
    # node_desc and lid are re-read every poll, each on its own
    write_file(class_dir(tmp_path) / "mlx5_0" / "node_desc", "renamed\n")
    ident2 = (await src.sample()).ports[(GUID, "1")].identity
    assert (ident2.node_desc, ident2.lid) == ("renamed", 0x1A)
    write_file(class_dir(tmp_path) / "mlx5_0" / "ports" / "1" / "lid", "0x2b\n")
    ident3 = (await src.sample()).ports[(GUID, "1")].identity
    assert (ident3.node_desc, ident3.lid) == ("renamed", 0x2B)


async def test_counters_and_hw_counters(tmp_path: Path) -> None:
    write_device(tmp_path, "mlx5_0", hw_counters={"dev_level": 99})
    write_port(tmp_path, "mlx5_0", 1,
               hw_counters={"out_of_buffer": 12, "np_cnp_sent": 3, "lifespan": 10,
                            "active_qps": 4, "watermark_qps": 9})
    snap = await sample(tmp_path)
    p = snap.ports[(GUID, "1")]
    assert p.counters == {
        "symbol_errors": 8, "link_error_recovery": 2, "link_downed": 1, "receive_errors": 5,
        "receive_remote_physical_errors": 0, "receive_switch_relay_errors": 0,
        "transmit_discards": 6, "transmit_constraint_errors": 0, "receive_constraint_errors": 0,
        "local_link_integrity_errors": 0, "excessive_buffer_overrun_errors": 0,
        "vl15_dropped": 0, "transmit_wait": 7, "transmit_data": 2000, "receive_data": 1000,
        "transmit_packets": 200, "receive_packets": 100, "unicast_transmit_packets": 196,
        "unicast_receive_packets": 97, "multicast_transmit_packets": 4,
        "multicast_receive_packets": 3,
    }
    assert len(p.counters) == len(FULL_COUNTERS)
    assert p.hw_counters == {"out_of_buffer": 12, "np_cnp_sent": 3}
    # a setting (the kernel's cache lifetime) and levels (bnxt_re) are not counts
    assert p.hw_gauges == {"lifespan": 10, "active_qps": 4, "watermark_qps": 9}
    assert (p.rate_bps, p.active_width, p.active_speed) == (100e9, "4X", "EDR")
    assert (p.state, p.phys_state) == (4, 5)


async def test_64bit_values_are_read_exactly(tmp_path: Path) -> None:
    """No float on the way: 2**64 - 1 and its neighbours are not float64 values, and the
    node_exporter oracle (float64) could not tell them apart."""
    write_device(tmp_path, "mlx5_0")
    write_port(tmp_path, "mlx5_0", 1, counters={
        **FULL_COUNTERS, "unicast_xmit_packets": 2**64 - 1, "unicast_rcv_packets": 2**64 - 2,
        "port_xmit_data": 2**53 + 1, "port_rcv_data": 2**62 - 1,
    }, hw_counters={"out_of_buffer": 2**64 - 3})
    p = (await sample(tmp_path)).ports[(GUID, "1")]
    assert p.counters["unicast_transmit_packets"] == 2**64 - 1
    assert p.counters["unicast_receive_packets"] == 2**64 - 2
    assert p.counters["transmit_data"] == 2**53 + 1
    assert p.counters["receive_data"] == 2**62 - 1
    assert p.hw_counters == {"out_of_buffer": 2**64 - 3}
    assert all(type(v) is int for v in (*p.counters.values(), *p.hw_counters.values()))


async def test_roce_port_is_read_the_same_way(tmp_path: Path) -> None:
    write_device(tmp_path, "mlx5_2", node_guid="b859:9f03:00d4:0e8a")
    write_port(tmp_path, "mlx5_2", 1, link_layer="Ethernet\n", lid="0x0\n",
               rate="25 Gb/sec (1X EDR)\n", hw_counters={"np_ecn_marked_roce_packets": 4})
    p = (await sample(tmp_path)).ports[("0xb8599f0300d40e8a", "1")]
    assert p.identity.link_layer == "Ethernet"
    assert p.counters["transmit_data"] == 2000
    assert p.hw_counters == {"np_ecn_marked_roce_packets": 4}


@pytest.mark.parametrize(
    ("guid_text", "reason"),
    [(None, "missing"), ("0000:0000:0000:0000", "unassigned"), ("not-a-guid", "garbage"),
     ("", "empty")],
)
async def test_unusable_guid_is_synthesized(
    tmp_path: Path, guid_text: str | None, reason: str
) -> None:
    write_device(tmp_path, "mlx5_0", node_guid=guid_text)
    write_port(tmp_path, "mlx5_0", 1)
    snap = await sample(tmp_path)
    assert list(snap.ports) == [(synthetic_guid("mlx5_0"), "1")]
    assert [(e.reason, e.key) for e in snap.errors] == [(reason, None)]
    assert snap.errors[0].detail.endswith("mlx5_0/node_guid")


async def test_duplicate_guid_does_not_merge_devices(tmp_path: Path) -> None:
    for dev in ("mlx5_0", "mlx5_1"):
        write_device(tmp_path, dev)
        write_port(tmp_path, dev, 1)
    snap = await sample(tmp_path)
    assert sorted(snap.ports) == sorted([(GUID, "1"), (synthetic_guid("mlx5_1"), "1")])
    assert reasons_for(snap, "mlx5_1/node_guid") == ["duplicate"]


# -- written trees: one bad file costs one value -----------------------------------------------


def counter_path(root: Path, name: str, device: str = "mlx5_0", sub: str = "counters") -> Path:
    return class_dir(root) / device / "ports" / "1" / sub / name


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("N/A (no PMA)\n", "no_pma"),
        ("", "empty"),
        ("\n\n", "empty"),
        ("12abc\n", "garbage"),
        ("-5\n", "garbage"),
        ("1_000\n", "garbage"),
        ("0x10\n", "garbage"),
    ],
)
async def test_bad_counter_text_costs_one_value(tmp_path: Path, content: str, reason: str) -> None:
    write_device(tmp_path, "mlx5_0")
    write_port(tmp_path, "mlx5_0", 1, counters={**FULL_COUNTERS, "symbol_error": content})
    snap = await sample(tmp_path)
    p = snap.ports[(GUID, "1")]
    assert "symbol_errors" not in p.counters
    assert len(p.counters) == len(FULL_COUNTERS) - 1
    assert [(e.reason, e.detail, e.key) for e in snap.errors] == [
        (reason, str(counter_path(tmp_path, "symbol_error")), (GUID, "1"))
    ]


@pytest.mark.parametrize("content", ["123", "123\n\n\n", "  123  \n", "123\r\n"])
async def test_whitespace_variants_parse(tmp_path: Path, content: str) -> None:
    write_device(tmp_path, "mlx5_0")
    write_port(tmp_path, "mlx5_0", 1, counters={"symbol_error": content})
    snap = await sample(tmp_path)
    assert snap.ports[(GUID, "1")].counters == {"symbol_errors": 123}
    assert snap.errors == []


def failing_reader(bad: dict[str, OSError]) -> Callable[[str], bytes]:
    real = sysfs_mod.read_sysfs

    def read(path: str) -> bytes:
        for suffix, exc in bad.items():
            if path.endswith(suffix):
                raise exc
        return real(path)

    return read


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (OSError(errno.EINVAL, "Invalid argument"), "einval"),
        (PermissionError(errno.EACCES, "Permission denied"), "eacces"),
        (PermissionError(errno.EPERM, "Operation not permitted"), "eacces"),
        (OSError(errno.EOPNOTSUPP, "Operation not supported"), "unsupported"),
        (OSError(errno.EIO, "Input/output error"), "io"),
        (OSError(errno.ENODEV, "No such device"), "missing"),  # the device is being removed
        (OSError(errno.ESTALE, "Stale file handle"), "missing"),
    ],
)
async def test_read_errors_cost_one_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exc: OSError, reason: str
) -> None:
    write_device(tmp_path, "mlx5_0")
    write_port(tmp_path, "mlx5_0", 1, hw_counters={"out_of_buffer": 1, "np_cnp_sent": 2})
    monkeypatch.setattr(sysfs_mod, "read_sysfs", failing_reader(
        {"counters/port_xmit_wait": exc, "hw_counters/np_cnp_sent": exc}))
    snap = await sample(tmp_path)
    p = snap.ports[(GUID, "1")]
    assert "transmit_wait" not in p.counters
    assert len(p.counters) == len(FULL_COUNTERS) - 1
    assert p.hw_counters == {"out_of_buffer": 1}
    assert sorted((e.reason, Path(e.detail).name) for e in snap.errors) == [
        (reason, "np_cnp_sent"), (reason, "port_xmit_wait")
    ]


async def test_directory_in_place_of_file_costs_one_value(tmp_path: Path) -> None:
    write_device(tmp_path, "mlx5_0")
    write_port(tmp_path, "mlx5_0", 1)
    path = counter_path(tmp_path, "link_downed")
    path.unlink()
    path.mkdir()
    snap = await sample(tmp_path)
    assert "link_downed" not in snap.ports[(GUID, "1")].counters
    assert [(e.reason, e.detail) for e in snap.errors] == [("io", str(path))]


async def test_file_gone_after_discovery_is_missing(tmp_path: Path) -> None:
    write_device(tmp_path, "mlx5_0")
    write_port(tmp_path, "mlx5_0", 1)
    src = SysfsSource(root=tmp_path)
    await src.discover()
    counter_path(tmp_path, "port_rcv_errors").unlink()
    (class_dir(tmp_path) / "mlx5_0" / "ports" / "1" / "rate").unlink()
    snap = await src.sample()
    p = snap.ports[(GUID, "1")]
    assert "receive_errors" not in p.counters
    assert p.rate_bps is None
    assert sorted((e.reason, Path(e.detail).name) for e in snap.errors) == [
        ("missing", "port_rcv_errors"), ("missing", "rate")
    ]


@pytest.mark.parametrize(
    ("rate", "expected", "errors"),
    [
        ("0 GB/sec\n", (None, "", ""), []),
        ("10 Gb/sec (4X)\n", (8e9, "4X", "SDR"), []),  # old kernels' 4X SDR: 8 Gb/s of data
        ("40 Gb/sec (4X QDR)\n", (32e9, "4X", "QDR"), []),  # signalling 40, data 32
        ("5 Gb/sec (1X)\n", (None, "1X", ""), []),  # speed unknown: no rate, not a guess
        ("unknown\n", (None, "", ""), ["bad_rate"]),
    ],
)
async def test_rate_file(
    tmp_path: Path, rate: str, expected: tuple[float | None, str, str], errors: list[str]
) -> None:
    write_device(tmp_path, "mlx5_0")
    write_port(tmp_path, "mlx5_0", 1, rate=rate)
    snap = await sample(tmp_path)
    p = snap.ports[(GUID, "1")]
    assert (p.rate_bps, p.active_width, p.active_speed) == expected
    assert [e.reason for e in snap.errors] == errors
    assert len(p.counters) == len(FULL_COUNTERS)


async def test_garbage_state_and_lid_cost_one_value(tmp_path: Path) -> None:
    write_device(tmp_path, "mlx5_0")
    write_port(tmp_path, "mlx5_0", 1, state="ACTIVE\n", lid="\n", phys_state="5: LinkUp")
    snap = await sample(tmp_path)
    p = snap.ports[(GUID, "1")]
    assert (p.state, p.phys_state, p.identity.lid) == (None, 5, None)
    assert sorted((e.reason, Path(e.detail).name) for e in snap.errors) == [
        ("empty", "lid"), ("garbage", "state")
    ]


async def test_garbage_node_type_is_reported_and_defaults_to_ca(tmp_path: Path) -> None:
    write_device(tmp_path, "mlx5_0", node_type="CA\n")
    write_port(tmp_path, "mlx5_0", 1)
    snap = await sample(tmp_path)
    assert snap.ports[(GUID, "1")].identity.node_type == "ca"
    assert [(e.reason, Path(e.detail).name) for e in snap.errors] == [("garbage", "node_type")]


async def test_absent_optional_files_are_not_errors(tmp_path: Path) -> None:
    write_device(tmp_path, "mlx5_0", node_desc=None, node_type=None, fw_ver=None,
                 hca_type=None, board_id=None)
    write_port(tmp_path, "mlx5_0", 1, lid=None, sm_lid=None, rate=None, link_layer=None,
               counters={})
    snap = await sample(tmp_path)
    p = snap.ports[(GUID, "1")]
    assert snap.errors == []
    assert (p.rate_bps, p.identity.lid, p.identity.node_type, p.identity.link_layer) == (
        None, None, "ca", "InfiniBand")
    assert p.counters == {}


async def test_each_problem_is_logged_once(tmp_path: Path) -> None:
    write_device(tmp_path, "mlx5_0")
    write_port(tmp_path, "mlx5_0", 1, counters={**FULL_COUNTERS, "symbol_error": "junk\n"})
    src = SysfsSource(root=tmp_path)
    with capture_logs() as logs:
        first = await src.sample()
        second = await src.sample()
    # every poll reports the value it could not read ...
    assert [e.reason for e in first.errors] == [e.reason for e in second.errors] == ["garbage"]
    # ... but the log says it once
    events = [e for e in logs if e["event"] == "sysfs_value_unreadable"]
    assert len(events) == 1
    assert events[0]["reason"] == "garbage"
    assert events[0]["path"] == str(counter_path(tmp_path, "symbol_error"))
    assert events[0]["log_level"] == "warning"


# -- width -----------------------------------------------------------------------------------


async def test_width_without_extended_table(tmp_path: Path) -> None:
    plain = {k: v for k, v in FULL_COUNTERS.items() if not k.startswith(("unicast", "multicast"))}
    plain |= {"port_xmit_data": 4294967295, "port_rcv_data": 5_000_000_000, "symbol_error": 70000}
    write_device(tmp_path, "mlx5_0")
    write_port(tmp_path, "mlx5_0", 1, counters=plain)
    p = (await sample(tmp_path)).ports[(GUID, "1")]
    assert p.counters["transmit_data"] == 4294967295
    assert p.wide == {"receive_data", "symbol_errors"}


async def test_counters_ext_preferred_and_fallback(tmp_path: Path) -> None:
    write_device(tmp_path, "mlx4_0")
    write_port(
        tmp_path, "mlx4_0", 1,
        counters={"port_xmit_data": 100, "port_rcv_data": 200, "port_xmit_packets": 7},
        counters_ext={"port_xmit_data_64": 2**40, "port_rcv_data_64": "garbage\n",
                      "port_unicast_xmit_packets": 5, "mystery_64": 1},
    )
    snap = await sample(tmp_path)
    p = snap.ports[(GUID, "1")]
    assert p.counters == {"transmit_data": 2**40, "receive_data": 200, "transmit_packets": 7,
                          "unicast_transmit_packets": 5}
    assert p.wide == {"transmit_data", "unicast_transmit_packets"}
    assert [(e.reason, Path(e.detail).name) for e in snap.errors] == [
        ("garbage", "port_rcv_data_64")]


# -- filters, discovery, lifecycle ---------------------------------------------------------------


@pytest.fixture
def recorded_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    paths: list[str] = []
    real = sysfs_mod.read_sysfs

    def read(path: str) -> bytes:
        paths.append(path)
        return real(path)

    monkeypatch.setattr(sysfs_mod, "read_sysfs", read)
    return paths


def write_poisoned_device(root: Path, device: str) -> None:
    """A device whose every file would produce an error if it were read."""
    write_device(root, device, node_guid="garbage", node_type="junk\n",
                 hw_counters={"x": "junk"})
    write_port(root, device, 1, counters=dict.fromkeys(FULL_COUNTERS, "junk\n"),
               state="junk\n", rate="junk\n", lid="junk\n", hw_counters={"y": "junk"})


@pytest.mark.parametrize(
    ("include", "exclude"),
    [(["mlx5_*"], ["mlx5_1"]), ([], ["mlx4_*", "mlx5_1"]), (["mlx5_0"], [])],
)
async def test_filters_read_no_file_of_an_excluded_device(
    tmp_path: Path, recorded_reads: list[str], include: list[str], exclude: list[str]
) -> None:
    write_device(tmp_path, "mlx5_0")
    write_port(tmp_path, "mlx5_0", 1)
    write_poisoned_device(tmp_path, "mlx5_1")
    write_poisoned_device(tmp_path, "mlx4_0")
    src = SysfsSource(root=tmp_path, include=include, exclude=exclude)
    await src.discover()
    snap = await src.sample()
    assert [p.identity.device for p in snap.ports.values()] == ["mlx5_0"]
    assert snap.errors == []
    assert recorded_reads
    assert not [p for p in recorded_reads if "/mlx5_1/" in p or "/mlx4_0/" in p]


async def test_devices_and_ports_appear_and_vanish(tmp_path: Path) -> None:
    src = SysfsSource(root=tmp_path)
    assert not has_devices(tmp_path)
    empty = await src.sample()
    assert (empty.ports, empty.errors) == ({}, [])
    write_device(tmp_path, "mlx5_0")
    write_port(tmp_path, "mlx5_0", 1)
    assert has_devices(tmp_path)
    assert list((await src.sample()).ports) == [(GUID, "1")]
    write_port(tmp_path, "mlx5_0", 2)
    write_device(tmp_path, "mlx5_1", node_guid="0002:c903:00a1:b2c4")
    write_port(tmp_path, "mlx5_1", 1)
    snap = await src.sample()
    assert sorted(snap.ports) == [(GUID, "1"), (GUID, "2"), ("0x0002c90300a1b2c4", "1")]
    assert snap.errors == []
    shutil.rmtree(class_dir(tmp_path) / "mlx5_0" / "ports" / "2")
    shutil.rmtree(class_dir(tmp_path) / "mlx5_1")
    snap = await src.sample()
    assert list(snap.ports) == [(GUID, "1")]
    assert snap.errors == []
    await src.close()
    assert list((await src.sample()).ports) == [(GUID, "1")]


async def test_ports_are_seen_without_a_link_count_and_by_the_periodic_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each poll stats ``ports/`` instead of listing it. Where the file system keeps no link
    count (btrfs, overlayfs) it is listed every poll; and a port set that changed without
    changing the count (only possible in a copied tree) is seen at the next periodic listing."""
    write_device(tmp_path, "mlx5_0")
    write_port(tmp_path, "mlx5_0", 1)
    write_port(tmp_path, "mlx5_0", 2)
    src = SysfsSource(root=tmp_path)
    assert sorted(p for _, p in (await src.sample()).ports) == ["1", "2"]
    ports = class_dir(tmp_path) / "mlx5_0" / "ports"
    shutil.rmtree(ports / "2")
    write_port(tmp_path, "mlx5_0", 3)  # same number of port directories, same inode
    monkeypatch.setattr(sysfs_mod, "LIST_PORTS_EVERY", 3)
    seen = [sorted(p for _, p in (await src.sample()).ports) for _ in range(3)]
    assert seen[-1] == ["1", "3"]  # the listing on the third check
    assert seen[0] != ["1", "3"]  # the stat alone could not tell (this is what the net is for)

    real_stat = os.stat

    def no_link_count(path: str, *args: Any, **kwargs: Any) -> os.stat_result:
        """A directory's stat on btrfs or overlayfs: a link count of 1, whatever it holds."""
        st = real_stat(path, *args, **kwargs)
        if str(path).endswith("/ports"):
            fields = list(st)
            fields[stat.ST_NLINK] = 1
            return os.stat_result(fields)
        return st

    no_count = SysfsSource(root=tmp_path)
    monkeypatch.setattr(os, "stat", no_link_count)
    assert sorted(p for _, p in (await no_count.sample()).ports) == ["1", "3"]
    write_port(tmp_path, "mlx5_0", 4)
    assert sorted(p for _, p in (await no_count.sample()).ports) == ["1", "3", "4"]
    await src.close()
    await no_count.close()


async def test_sample_reads_off_the_event_loop(
    tmp_path: Path, recorded_reads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    write_device(tmp_path, "mlx5_0")
    write_port(tmp_path, "mlx5_0", 1)
    threads: set[int] = set()
    recorder = sysfs_mod.read_sysfs

    def read(path: str) -> bytes:
        threads.add(threading.get_ident())
        return recorder(path)

    monkeypatch.setattr(sysfs_mod, "read_sysfs", read)
    await SysfsSource(root=tmp_path).sample()
    assert threads
    assert threading.get_ident() not in threads


def test_has_devices_on_missing_root(tmp_path: Path) -> None:
    assert not has_devices(tmp_path / "nope")


def test_has_devices_on_a_real_tree() -> None:
    assert has_devices(real_tree("procfs"))


async def test_a_device_whose_guid_changes_is_a_new_device_not_a_rename(tmp_path: Path) -> None:
    """A card replaced under the same name (mlx5_0, a new node GUID) starts its own totals:
    only a device that had no GUID of its own hands its totals to the one it gets."""
    write_device(tmp_path, "mlx5_0")
    write_port(tmp_path, "mlx5_0", 1)
    src = SysfsSource(root=tmp_path)
    assert list((await src.sample()).ports) == [(GUID, "1")]
    # swapped between two polls, as a second card appears (one rediscovery sees both)
    write_file(class_dir(tmp_path) / "mlx5_0" / "node_guid", "0002:c903:00a1:ffff\n")
    write_device(tmp_path, "mlx5_1", node_guid="0002:c903:00a1:b2c4")
    write_port(tmp_path, "mlx5_1", 1)
    snap = await src.sample()
    assert sorted(snap.ports) == [("0x0002c90300a1b2c4", "1"), ("0x0002c90300a1ffff", "1")]
    assert snap.renamed == {}
    await src.close()


async def test_only_numbered_entries_of_ports_are_ports_in_numeric_order(tmp_path: Path) -> None:
    write_device(tmp_path, "mlx5_0")
    for number in (10, 2, 1):
        write_port(tmp_path, "mlx5_0", number)
    ports = class_dir(tmp_path) / "mlx5_0" / "ports"
    (ports / "lost+found").mkdir()
    write_file(ports / "README", "not a port\n")
    snap = await sample(tmp_path)
    assert [p for _, p in snap.ports] == ["1", "2", "10"]
    assert snap.errors == []


async def test_the_operators_wait_unit_wins_over_the_devices_family(tmp_path: Path) -> None:
    """``xmit_wait_units`` is for a device whose family is misread or mislabelled: it must
    override what ``hca_type`` says (MT4123, ConnectX-6: 8 bytes a port)."""
    write_device(tmp_path, "mlx5_0")
    write_port(tmp_path, "mlx5_0", 1)
    write_device(tmp_path, "mlx5_1", node_guid="0002:c903:00a1:b2c4")
    write_port(tmp_path, "mlx5_1", 1)
    snap = await sample(tmp_path, xmit_wait_units={"mlx5_0": parse_unit("32/lane")})
    configured = port(snap, "mlx5_0", "1").identity.xmit_wait
    assert (configured.bytes, configured.per_lane, configured.source) == (32, True, "config")
    family = port(snap, "mlx5_1", "1").identity.xmit_wait
    assert (family.bytes, family.per_lane, family.source, family.family) == (
        8, False, "family", "ConnectX-6")


async def test_a_guid_that_stays_zero_is_reported_once_not_every_poll(tmp_path: Path) -> None:
    write_device(tmp_path, "mlx5_0", node_guid="0000:0000:0000:0000\n")
    write_port(tmp_path, "mlx5_0", 1)
    src = SysfsSource(root=tmp_path)
    first = await src.sample()
    assert [e.reason for e in first.errors] == ["unassigned"]
    for _ in range(3):
        snap = await src.sample()
        assert snap.errors == []
        assert list(snap.ports) == list(first.ports) == [(synthetic_guid("mlx5_0"), "1")]
    await src.close()


async def test_a_new_subnet_manager_lid_is_seen_on_the_next_poll(tmp_path: Path) -> None:
    """``sm_lid`` changes when the master SM fails over: the port's identity follows."""
    write_device(tmp_path, "mlx5_0")
    write_port(tmp_path, "mlx5_0", 1, sm_lid="0x1\n")
    src = SysfsSource(root=tmp_path)
    assert (await src.sample()).ports[(GUID, "1")].identity.sm_lid == 1
    write_file(class_dir(tmp_path) / "mlx5_0" / "ports" / "1" / "sm_lid", "0x5\n")
    assert (await src.sample()).ports[(GUID, "1")].identity.sm_lid == 5
    await src.close()


async def test_a_device_without_a_pma_is_logged_as_information(tmp_path: Path) -> None:
    """``N/A (no PMA)`` is what the hardware is, not a fault: info, where a fault is a warning."""
    write_device(tmp_path, "mlx5_0")
    write_port(tmp_path, "mlx5_0", 1, counters={**FULL_COUNTERS,
                                                "port_xmit_wait": "N/A (no PMA)\n",
                                                "symbol_error": "junk\n"})
    with capture_logs() as logs:
        await sample(tmp_path)
    levels = {e["reason"]: e["log_level"] for e in logs if e["event"] == "sysfs_value_unreadable"}
    assert levels == {"no_pma": "info", "garbage": "warning"}


async def test_a_discovery_reports_only_its_own_problems(tmp_path: Path) -> None:
    write_device(tmp_path, "mlx5_0", node_type="CA\n")
    write_port(tmp_path, "mlx5_0", 1)
    src = SysfsSource(root=tmp_path)
    await src.discover()
    await src.discover()  # a second discovery before any poll: the same problem, once
    snap = await src.sample()
    assert [(e.reason, Path(e.detail).name) for e in snap.errors] == [("garbage", "node_type")]
    await src.close()


async def test_no_device_is_said_once_with_why(tmp_path: Path) -> None:
    """A host whose driver did not load has no ``class/infiniband`` entries: not a failure (a
    filter may match nothing on purpose), but the one clue why there are no ports, logged once
    until a device has been seen again; a filter that keeps nothing names what it left out."""
    src = SysfsSource(root=tmp_path)

    def said(logs: list[dict[str, Any]]) -> list[str]:
        return [e["reason"] for e in logs if e["event"] == "sysfs_no_devices"]

    with capture_logs() as logs:
        await src.discover()
        await src.discover()
    assert said(logs) == ["no InfiniBand device (is its driver loaded?)"]
    write_device(tmp_path, "mlx5_0")
    write_port(tmp_path, "mlx5_0", 1)
    with capture_logs() as logs:
        assert len((await src.discover()).ports) == 1
    assert said(logs) == []
    shutil.rmtree(class_dir(tmp_path) / "mlx5_0")
    with capture_logs() as logs:
        assert (await src.sample()).ports == {}  # the poll notices, and discovers again
        await src.sample()
    assert said(logs) == ["no InfiniBand device (is its driver loaded?)"]
    write_device(tmp_path, "mlx5_0")
    write_port(tmp_path, "mlx5_0", 1)
    with capture_logs() as logs:
        await SysfsSource(root=tmp_path, include=["mlx4_*"]).discover()
    assert said(logs) == ["include/exclude keep none of mlx5_0"]
