"""The sysfs source with per-poll files kept open (``keep_open``), as on a real sysfs mount.

A kept descriptor must never read differently from open + read + close: a device removed and
re-added, a file gone, a driver error, or a host short of descriptors each cost what they cost
without kept descriptors, and no descriptor leaks. Real sysfs errors are simulated by replacing
``pread_sysfs`` / ``open_sysfs`` (a tmp tree cannot produce ENODEV), the files themselves are
real.
"""

from __future__ import annotations

import errno
import os
import resource
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ibmon.infiniband.model import Snapshot
from ibmon.sources import sysfs as sysfs_mod
from ibmon.sources.sysfs import SysfsSource
from tests.fixtures import real_fixture
from tests.sysfs_tree import FULL_COUNTERS, class_dir, write_device, write_file, write_port

GUID = "0x0002c90300a1b2c3"
KEY = (GUID, "1")
HW = {"out_of_buffer": 1, "np_cnp_sent": 2, "lifespan": 10}
REAL_TREES = (
    "procfs/testdata/fixtures.ttar.d/fixtures/sys",
    "node_exporter/collector/fixtures/sys.ttar.d/sys",
)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def target(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


def counter(root: Path, name: str, sub: str = "counters") -> Path:
    return class_dir(root) / "mlx5_0" / "ports" / "1" / sub / name


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    write_device(tmp_path, "mlx5_0")
    write_port(tmp_path, "mlx5_0", 1, hw_counters=HW)
    return tmp_path


@pytest.fixture
def opens(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every path the source opens (kept or per read)."""
    paths: list[str] = []
    real = sysfs_mod.open_sysfs

    def record(path: str) -> int:
        paths.append(path)
        return real(path)

    monkeypatch.setattr(sysfs_mod, "open_sysfs", record)
    return paths


def fail_pread(
    monkeypatch: pytest.MonkeyPatch, fails: Callable[[int], OSError | None]
) -> None:
    real = sysfs_mod.pread_sysfs

    def pread(fd: int) -> bytes:
        exc = fails(fd)
        if exc is not None:
            raise exc
        return real(fd)

    monkeypatch.setattr(sysfs_mod, "pread_sysfs", pread)


def values(snap: Snapshot) -> dict[str, int]:
    return dict(snap.ports[KEY].counters)


def comparable(snap: Snapshot) -> object:
    return (
        {k: (p.identity, p.state, p.phys_state, p.counters, p.wide, p.hw_counters, p.hw_gauges,
             p.rate_bps, p.active_width, p.active_speed) for k, p in snap.ports.items()},
        sorted((e.reason, e.detail, e.key) for e in snap.errors),
    )


@pytest.fixture
def source(tree: Path) -> Iterator[SysfsSource]:
    src = SysfsSource(root=tree, keep_open=True)
    yield src
    if src._kept is not None:  # a failed test must not leak descriptors into the next
        src._kept.close()


@pytest.mark.parametrize("rel", REAL_TREES)
async def test_kept_descriptors_read_what_open_read_close_reads(rel: str) -> None:
    root = real_fixture(rel)
    kept, plain = SysfsSource(root=root, keep_open=True), SysfsSource(root=root, keep_open=False)
    for _ in range(2):  # the second poll reads through the descriptors the first one opened
        assert comparable(await kept.sample()) == comparable(await plain.sample())
    await kept.close()


async def test_a_poll_reopens_nothing_and_sees_new_values(
    source: SysfsSource, tree: Path, opens: list[str]
) -> None:
    first = await source.sample()
    assert first.errors == []
    opens.clear()
    write_file(counter(tree, "port_xmit_data"), 5000)  # in place, as sysfs regenerates
    write_file(counter(tree, "np_cnp_sent", "hw_counters"), 9)
    snap = await source.sample()
    assert opens == []
    assert values(snap)["transmit_data"] == 5000
    assert snap.ports[KEY].hw_counters["np_cnp_sent"] == 9
    assert snap.errors == []


async def test_a_device_readded_under_its_name_is_read_in_the_same_poll(
    source: SysfsSource, tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Removed and re-added between two polls: the layout looks the same, every old descriptor
    says ENODEV, the paths hold new files. The poll reads them, without a missing value."""
    await source.sample()
    new_fds: set[int] = set()
    real_open = sysfs_mod.open_sysfs

    def open_new(path: str) -> int:
        fd = real_open(path)
        new_fds.add(fd)
        return fd

    monkeypatch.setattr(sysfs_mod, "open_sysfs", open_new)
    fail_pread(monkeypatch, lambda fd: None if fd in new_fds else OSError(errno.ENODEV, "gone"))
    path = counter(tree, "port_rcv_errors")
    path.unlink()
    write_file(path, 77)  # a new inode, as a re-created attribute
    baseline = open_fds()
    snap = await source.sample()
    assert snap.errors == []
    assert values(snap)["receive_errors"] == 77
    assert len(values(snap)) == len(FULL_COUNTERS)
    assert open_fds() == baseline  # every old descriptor was closed as its new one opened


@pytest.mark.parametrize("code", [errno.ENODEV, errno.ENOENT, errno.ESTALE])
async def test_a_file_gone_under_its_descriptor_is_missing_then_read_again(
    source: SysfsSource, tree: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    await source.sample()
    path = counter(tree, "port_rcv_errors")
    path.unlink()
    fail_pread(monkeypatch, lambda fd: OSError(code, "gone")
               if target(fd).endswith("(deleted)") else None)
    snap = await source.sample()
    assert "receive_errors" not in values(snap)
    assert len(values(snap)) == len(FULL_COUNTERS) - 1
    assert [(e.reason, e.detail) for e in snap.errors] == [("missing", str(path))]
    write_file(path, 12)
    snap = await source.sample()
    assert (values(snap)["receive_errors"], snap.errors) == (12, [])


@pytest.mark.parametrize(
    ("code", "reason"), [(errno.EINVAL, "einval"), (errno.EIO, "io"), (errno.EACCES, "eacces")]
)
async def test_a_driver_error_costs_one_value_and_no_descriptor(
    source: SysfsSource, tree: Path, monkeypatch: pytest.MonkeyPatch, code: int, reason: str
) -> None:
    """EINVAL every poll (ConnectX-7 in switch mode) must not leak a descriptor per poll."""
    await source.sample()
    failing = {str(counter(tree, "port_xmit_wait")),
               str(counter(tree, "np_cnp_sent", "hw_counters"))}
    broken = True
    fail_pread(monkeypatch, lambda fd: OSError(code, "driver")
               if broken and target(fd) in failing else None)
    baseline = open_fds()
    for _ in range(4):
        snap = await source.sample()
        assert "transmit_wait" not in values(snap)
        assert "np_cnp_sent" not in snap.ports[KEY].hw_counters
        assert sorted((e.reason, Path(e.detail).name) for e in snap.errors) == [
            (reason, "np_cnp_sent"), (reason, "port_xmit_wait")
        ]
        assert open_fds() <= baseline
    broken = False
    snap = await source.sample()
    assert (values(snap)["transmit_wait"], snap.errors) == (FULL_COUNTERS["port_xmit_wait"], [])
    assert snap.ports[KEY].hw_counters["np_cnp_sent"] == HW["np_cnp_sent"]


async def test_kept_descriptors_stay_within_the_budget(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sysfs_mod, "_keep_open_budget", lambda: 7)
    src = SysfsSource(root=tree, keep_open=True)
    plain = SysfsSource(root=tree, keep_open=False)
    baseline = open_fds()
    for _ in range(3):
        assert comparable(await src.sample()) == comparable(await plain.sample())
        assert open_fds() - baseline == 7
    await src.close()
    assert open_fds() == baseline


async def test_out_of_descriptors_falls_back_and_gives_some_back(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EMFILE while opening a file to keep is not that file's error: it is read the old way,
    and half of the kept descriptors are given back to the process (its sockets need them)."""
    real_open = sysfs_mod.open_sysfs
    calls = -1  # armed after discovery, whose reads are not kept

    def open_once_short(path: str) -> int:
        nonlocal calls
        calls += 1 if calls >= 0 else 0
        if calls == 11:
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path)

    monkeypatch.setattr(sysfs_mod, "open_sysfs", open_once_short)
    src = SysfsSource(root=tree, keep_open=True)
    plain = SysfsSource(root=tree, keep_open=False)
    baseline = open_fds()
    await src.discover()
    calls = 0
    snap = await src.sample()
    assert snap.errors == []
    assert comparable(snap) == comparable(await plain.sample())
    assert open_fds() - baseline == 5  # 10 kept when the 11th open failed: 5 given back
    assert comparable(await src.sample()) == comparable(await plain.sample())
    assert open_fds() - baseline == 5
    await src.close()
    assert open_fds() == baseline


async def test_rediscovery_and_close_release_every_descriptor(
    source: SysfsSource, tree: Path
) -> None:
    baseline = open_fds()
    await source.sample()
    kept = open_fds() - baseline
    assert kept >= len(FULL_COUNTERS) + len(HW)
    write_device(tree, "mlx5_1", node_guid="0002:c903:00a1:b2c4")
    write_port(tree, "mlx5_1", 1, hw_counters=HW)
    snap = await source.sample()  # a new device: a new plan, the old descriptors closed
    assert len(snap.ports) == 2
    assert open_fds() - baseline == 2 * kept
    await source.close()
    assert open_fds() == baseline


_MOUNTINFO = """\
22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw
24 23 0:23 / /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw
23 22 0:22 / /sys rw,relatime - sysfs sysfs rw
30 22 8:17 / /sysroot rw,relatime - ext4 /dev/sdb1 rw
31 22 0:31 / /mnt/a\\040b rw,relatime - sysfs sysfs rw
32 22 0:32 / /mnt/copy rw,relatime - tmpfs tmpfs rw
"""


@pytest.mark.parametrize(("path", "expected"), [
    ("/sys/class/infiniband", True),
    ("/sys", True),
    ("/sys/fs/cgroup/x", False),  # the longest mount point above it decides, wherever listed
    ("/system/class/infiniband", False),  # a mount point is a whole path component
    ("/sysroot/class/infiniband", False),
    ("/mnt/a b/class/infiniband", True),  # mountinfo's octal escapes
    ("/mnt/copy/sys/class/infiniband", False),  # a copied tree: files may be replaced
    ("/home/x", False),
])
def test_only_a_tree_on_a_sysfs_mount_is_read_through_kept_descriptors(
    tmp_path: Path, path: str, expected: bool
) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(_MOUNTINFO)
    assert sysfs_mod.on_sysfs(path, str(mountinfo)) is expected


def test_where_the_mounts_cannot_be_read_nothing_is_kept_open(tmp_path: Path) -> None:
    assert sysfs_mod.on_sysfs("/sys/class/infiniband", str(tmp_path / "absent")) is False
    assert sysfs_mod.on_sysfs(str(tmp_path)) is False  # this machine's own: tmp is no sysfs


async def test_kept_descriptors_are_a_quarter_of_the_open_file_limit(tree: Path) -> None:
    """``LimitNOFILE`` of 200 keeps 50 descriptors, however many files a poll reads."""
    for port in (2, 3):
        write_port(tree, "mlx5_0", port, hw_counters=HW)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    src = SysfsSource(root=tree, keep_open=True)
    baseline = open_fds()
    resource.setrlimit(resource.RLIMIT_NOFILE, (200, hard))
    try:
        await src.discover()
        snap = await src.sample()
        assert snap.errors == []
        assert len(snap.ports) == 3
        assert open_fds() - baseline == 50
    finally:
        await src.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert open_fds() == baseline


async def test_a_file_that_cannot_be_opened_costs_its_value_not_the_kept_descriptors(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a process out of descriptors gives kept ones back; EACCES on one file is that
    file's error, every poll, and the other descriptors stay kept."""
    plain = SysfsSource(root=tree, keep_open=True)
    baseline = open_fds()
    await plain.sample()
    all_kept = open_fds() - baseline
    await plain.close()
    denied = str(counter(tree, "port_rcv_errors"))
    real_open = sysfs_mod.open_sysfs

    def open_denied(path: str) -> int:
        if path == denied:
            raise PermissionError(errno.EACCES, "Permission denied")
        return real_open(path)

    monkeypatch.setattr(sysfs_mod, "open_sysfs", open_denied)
    src = SysfsSource(root=tree, keep_open=True)
    for _ in range(3):
        snap = await src.sample()
        assert [(e.reason, e.detail) for e in snap.errors] == [("eacces", denied)]
        assert "receive_errors" not in values(snap)
        assert open_fds() - baseline == all_kept - 1
    await src.close()
