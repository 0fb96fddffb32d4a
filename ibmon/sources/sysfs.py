"""Node-local source: the ports of this host's RDMA devices, read from ``/sys/class/infiniband``.

Real sysfs trees are messy (docs/infiniband.md section 2), so every file costs at most its value:
a bad file becomes one ``SourceError`` in the snapshot and one log line per (path, reason), never
an exception, a lost port or a lost device. Reasons:

``no_pma``      the driver has no performance-management agent (``N/A (no PMA)``, iWARP)
``einval``      read() failed with EINVAL (ConnectX-7 in switch mode, node_exporter#3265)
``eacces``      EACCES / EPERM
``missing``     the file was listed at discovery and is gone now (ENOENT; ENODEV or ESTALE from
                a file kept open whose device was removed); or ``node_guid`` is absent
``empty``       nothing but whitespace
``garbage``     not a non-negative decimal integer (or not a parsable state / lid)
``bad_rate``    ``rate`` text that is not ``<n> Gb/sec (<width> <speed>)``
``unsupported`` EOPNOTSUPP; ``io`` any other OSError
``unassigned`` / ``duplicate``  ``node_guid`` is all zeros / already used by another device

Decisions a user can rely on:

- Device ``include`` / ``exclude`` globs are applied to the names in ``class/infiniband`` before
  any file (or sub-directory) of a device is opened: on some NVIDIA hosts merely reading counters
  triggers firmware errors (procfs PR#854).
- A device without a usable ``node_guid`` (missing, unreadable, all zeros or shared with another
  device) still gets a stable key: ``0x`` + the first 16 hex digits of
  ``sha1("sysfs:" + device name)``. The problem is reported once per discovery, not every poll.
- ``rate`` (kernel ``rate_show``: ``"%d%s Gb/sec (%dX%s)"``, the *signalling* rate) gives
  width and speed: ``40 Gb/sec (4X QDR)`` is ``4X``/``QDR``; ``10 Gb/sec (4X)`` (kernels before
  the SDR name was printed) is ``4X``/``SDR`` when the number is 2.5 Gb/s per lane.
  ``rate_bps`` is the *data* rate from ``linkspeed.port_rate_bps``, the same function every
  source uses: 4X QDR is 32e9 bits/s, 4X FDR 54.5e9, 4X EDR 100e9; on a RoCE/iWARP port (link
  layer Ethernet) the printed number itself (the Ethernet MAC rate). A rate of zero (``0
  GB/sec``: no cable, procfs#361) is valid and means "no rate" (``None``), not an error.
- Counter width: the kernel fills ``counters/port_{xmit,rcv}_{data,packets}`` from the 64-bit
  PortCountersExtended table exactly when the device advertises extended width, and only then
  does it create the ``unicast_*`` / ``multicast_*`` files. So their presence marks the data and
  packet counters as ``wide``. A value above the catalogue's narrow maximum also marks a counter
  wide (it cannot have come from the narrow field). Legacy ``counters_ext/`` (mlx4, kernels before
  4.5) values are 64-bit and preferred over the same counter in ``counters/``; if the legacy file
  is unreadable the ``counters/`` value is kept.
- ``hw_counters/`` of each port are read generically (name -> int). Entries that are settings or
  levels rather than counts (``lifespan``, the kernel's cache lifetime in milliseconds, and
  driver levels such as bnxt_re's ``active_*``/``watermark_*``:
  ``ibmon.infiniband.counters.is_hw_gauge``) go to ``PortSample.hw_gauges``, the rest to
  ``hw_counters``. Device-level ``hw_counters/`` are not read yet (``PortSample`` has no place for
  them).
- Files read on every poll are kept open and re-read with one ``pread`` at offset 0 (sysfs
  regenerates an attribute's text on a read from the start; ``Documentation/filesystems/sysfs.rst``
  tells readers to seek to 0 and re-read), instead of open + read + close: a third of the system
  calls, which is most of a node-local poll's CPU. Only on a real sysfs mount (``keep_open``
  unset: ``/proc/self/mountinfo`` says the tree is ``sysfs``): a copied or simulated tree whose
  files are *replaced* (``ibmon sim sysfs`` renames new files into place) would be read stale
  through an old descriptor. ``keep_open = true`` forces it for trees updated in place (the
  benchmarks), ``false`` turns it off. Descriptors are bounded by a quarter of the soft open-file
  limit (``LimitNOFILE``; 16 HCAs need about 920, the systemd unit allows 8192): files beyond the
  budget are opened per read as before, and running out of descriptors (EMFILE) closes half of
  the kept ones and shrinks the budget. A file gone under its descriptor (ENODEV, ENOENT,
  ESTALE) is opened afresh in the same read (a device re-added under the same name reads its new
  files; one really gone is ``missing``); any other failing read closes its descriptor and the
  next poll opens the path again. A device or port that appears or vanishes re-discovers, which
  closes every descriptor of the old plan (``_KeptFiles`` has the details).
- ``node_type`` ``2`` is a switch, ``3`` a router; every other type (CA, RNIC, usNIC) is ``ca``.
- Directory listings are cached at discovery; each poll only lists ``class/infiniband`` and
  ``stat``s each device's ``ports/`` (its inode and link count, which counts its port
  directories) to notice a device or port that appeared or vanished, and re-discovers then: one
  system call per device instead of the five of a listing. Where
  the file system keeps no such count (btrfs, overlayfs) ``ports/`` is listed every poll, and
  everywhere every ``LIST_PORTS_EVERY`` polls.
  Identity files (``node_guid``, ``fw_ver``, ``link_layer``...) are read at discovery;
  ``node_desc``, ``lid``, ``sm_lid``, ``state``, ``phys_state`` and ``rate`` on every poll.
- A file that was never there (``hca_type`` on hfi1, ``node_desc`` in a capture, ``rate``...) is
  not an error: its value is empty / None. ``no_pma`` is logged at info level (a property of
  the hardware), every other reason at warning.
- No device at all (or no ``class/infiniband``) gives an empty ``Snapshot``, not an exception,
  and one ``sysfs_no_devices`` warning until a device has been seen again; the CLI asks
  ``has_devices(root)`` to decide whether sysfs is the default source.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import fnmatch
import hashlib
import os
import re
import resource
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

import structlog
from pydantic import Field, field_validator

from ibmon.cli.terminal import printable
from ibmon.config import Duration, SourceConfigBase
from ibmon.infiniband.counters import BY_NAME, BY_SYSFS, BY_SYSFS_EXT, EXTENDED, is_hw_gauge
from ibmon.infiniband.linkspeed import LANE_SIGNAL_GBPS, WIDTH_LANES, port_rate_bps
from ibmon.infiniband.model import (
    PortIdentity,
    PortKey,
    PortSample,
    Snapshot,
    SourceError,
    Topology,
    normalize_guid,
)
from ibmon.infiniband.xmitwait import (
    DEFAULT_UNIT,
    WaitUnit,
    configured_unit,
    device_id_of_hca_type,
    family_of,
    parse_unit,
)
from ibmon.sources.parse.sysfs_values import parse_counter, parse_lid_value

__all__ = [
    "Config",
    "SysfsSource",
    "SysfsSourceConfig",
    "build",
    "has_devices",
    "on_sysfs",
    "open_sysfs",
    "parse_enum_prefix",
    "parse_lid",
    "parse_node_type",
    "parse_rate",
    "pread_sysfs",
    "read_sysfs",
    "synthetic_guid",
]

log = structlog.get_logger(__name__)

_CLASS_DIR = ("class", "infiniband")
_READ_SIZE = 4096
_O_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)

#: Counters the kernel takes from PortCountersExtended when the device has extended width.
_EXT_TABLE_COUNTERS = EXTENDED
#: Files that exist in ``counters/`` only when the kernel chose the extended-width table.
_EXT_TABLE_MARKERS = frozenset(
    BY_NAME[n].sysfs or ""
    for n in (
        "unicast_transmit_packets",
        "unicast_receive_packets",
        "multicast_transmit_packets",
        "multicast_receive_packets",
    )
)
_NODE_TYPES = {2: "switch", 3: "router"}
_RATE_RE = re.compile(
    r"^(?P<num>\d+(?:\.\d+)?)\s*G[bB](?:/sec|/s|ps)(?:\s*\((?P<detail>[^)]*)\))?$"
)
_WIDTH_RE = re.compile(r"^\d+X$")
_ZERO_GUID = "0x" + "0" * 16
#: Kept-open descriptors stay below this fraction of the soft open-file limit.
KEEP_OPEN_SHARE = 0.25
#: Every this many polls each device's ``ports/`` is listed rather than stat'ed (a safety net
#: for a tree whose port set changed without changing the directory's link count).
LIST_PORTS_EVERY = 60


def open_sysfs(path: str) -> int:
    """Open an attribute read-only (close-on-exec).

    Module-level on purpose: tests replace it to simulate running out of descriptors."""
    return os.open(path, _O_FLAGS)


def read_sysfs(path: str) -> bytes:
    """Read an attribute with a single read(), as sysfs expects.

    Module-level on purpose: tests replace it to simulate EINVAL / EACCES, which plain files
    cannot produce for root.
    """
    fd = open_sysfs(path)
    try:
        return os.read(fd, _READ_SIZE)
    finally:
        os.close(fd)


def pread_sysfs(fd: int) -> bytes:
    """Re-read an attribute kept open: one ``pread`` at offset 0, which regenerates its text.

    Module-level on purpose, like ``read_sysfs``: tests replace it to fail a kept file.
    """
    return os.pread(fd, _READ_SIZE, 0)


def on_sysfs(path: str, mountinfo: str = "/proc/self/mountinfo") -> bool:
    """Whether ``path`` lies on a ``sysfs`` mount (the longest mount point above it in
    ``mountinfo``); False when that cannot be told."""
    try:
        real = os.path.realpath(path)
        with open(mountinfo, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return False
    best, fstype = "", ""
    for line in lines:
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        point = fields[4].replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, fstype = point, line.split(" - ", 1)[1].split()[0]
    return fstype == "sysfs"


def _keep_open_budget() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 16
    return int(soft * KEEP_OPEN_SHARE)


#: A kept descriptor whose file is gone: the device was removed (ENODEV from sysfs), the
#: attribute unlinked (ENOENT), or the file replaced under a network/overlay mount (ESTALE).
_GONE = frozenset({errno.ENODEV, errno.ENOENT, errno.ESTALE})
_NO_FDS = frozenset({errno.EMFILE, errno.ENFILE})


class _KeptFiles:
    """Descriptors of the files read every poll, re-read with ``pread_sysfs``.

    What a failing read does, so a kept descriptor never reads differently from open + read:

    - the file is gone under its descriptor (``_GONE``): the path is opened afresh at once and
      read through the new descriptor. A device removed and re-added under the same name between
      two polls (the layout check sees nothing) reads its new files in the same poll; a device
      really gone fails that open (``ENOENT``: ``missing``);
    - any other error (EINVAL, EIO from the driver): the descriptor is closed and the error
      raised; the next poll opens the path again, as open + read would;
    - no descriptor to be had (EMFILE/ENFILE while opening one to keep): the process needs its
      descriptors for sockets, so half of the kept ones are closed, the budget shrinks to what
      is left, and this file is read with open + read + close. Beyond the budget every file is.

    Not thread-safe on its own: the source uses it under its lock.
    """

    __slots__ = ("budget", "fds")

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.fds: dict[str, int] = {}

    def read(self, path: str) -> bytes:
        fd = self.fds.get(path)
        if fd is None:
            if len(self.fds) >= self.budget:
                return read_sysfs(path)
            try:
                fd = open_sysfs(path)
            except OSError as exc:
                if exc.errno not in _NO_FDS:
                    raise
                self._shrink()
                return read_sysfs(path)
            self.fds[path] = fd
        try:
            return pread_sysfs(fd)
        except OSError as exc:
            del self.fds[path]
            os.close(fd)
            if exc.errno not in _GONE:
                raise
        fd = open_sysfs(path)  # gone under the old descriptor: the path may hold a new file
        try:
            raw = pread_sysfs(fd)
        except OSError:
            os.close(fd)
            raise
        self.fds[path] = fd
        return raw

    def _shrink(self) -> None:
        keep = len(self.fds) // 2
        self.budget = keep
        for path in list(self.fds)[keep:]:
            os.close(self.fds.pop(path))

    def close(self) -> None:
        fds, self.fds = self.fds, {}
        for fd in fds.values():
            os.close(fd)


def has_devices(root: str | Path = "/sys") -> bool:
    """Whether ``<root>/class/infiniband`` lists any device (the CLI's default-source choice)."""
    try:
        return bool(os.listdir(os.path.join(os.fspath(root), *_CLASS_DIR)))
    except OSError:
        return False


def _renamed(old: _Plan, new: _Plan) -> dict[PortKey, PortKey]:
    """Ports of a device that was keyed by a synthetic GUID and has a real one now: their
    old key -> their new one (the tracker moves their totals along)."""
    guids = {dev.name: dev.guid for dev in new.devices}
    out: dict[PortKey, PortKey] = {}
    for dev in old.devices:
        guid = guids.get(dev.name)
        if dev.synthetic and guid is not None and guid != dev.guid:
            out.update({p.key: (guid, p.key[1]) for p in dev.ports})
    return out


def synthetic_guid(device: str) -> str:
    """A stable key for a device that has no usable node GUID."""
    return "0x" + hashlib.sha1(f"sysfs:{device}".encode(), usedforsecurity=False).hexdigest()[:16]


def parse_enum_prefix(text: str) -> int | None:
    """``4: ACTIVE`` -> 4 (also ``4: ACTIVE`` in ``phys_state``, as a real mlx5 prints)."""
    head = text.strip().split(":", 1)[0].strip()
    return int(head) if head.isdecimal() else None


def parse_node_type(text: str) -> str | None:
    """``1: CA`` -> ``ca``, ``2: switch`` -> ``switch``, ``3: router`` -> ``router``."""
    number = parse_enum_prefix(text)
    if number is None:
        return None
    return _NODE_TYPES.get(number, "ca")


def parse_lid(text: str) -> int | None:
    """The kernel prints LIDs in hex (``0x12``); bare digits are taken as decimal."""
    return parse_lid_value(text)


def parse_rate(text: str) -> tuple[float | None, str, str] | None:
    """``40 Gb/sec (4X QDR)`` -> ``(40e9, "4X", "QDR")``: the printed (signalling) rate in
    bits/s, the width and the speed; None when the text is unparsable.

    ``10 Gb/sec (4X)``, what kernels printed for SDR before naming it, gives speed ``SDR`` (2.5
    Gb/s per lane; any other number keeps the speed unknown). A zero rate (``0 GB/sec``, no
    cable) is valid and gives ``(None, width, speed)``. The data rate is ``port_rate_bps``'s.
    """
    m = _RATE_RE.match(text.strip())
    if m is None:
        return None
    width = ""
    speed: list[str] = []
    for part in (m.group("detail") or "").split():
        if not width and _WIDTH_RE.match(part):
            width = part
        else:
            speed.append(part)
    gbps = float(m.group("num"))
    lanes = WIDTH_LANES.get(width)
    if not speed and lanes and gbps == LANE_SIGNAL_GBPS["SDR"] * lanes:
        speed = ["SDR"]
    return (gbps * 1e9 if gbps > 0 else None), width, " ".join(speed)


def _oserror_reason(exc: OSError) -> str:
    code = exc.errno
    if code == errno.EINVAL:
        return "einval"
    if code in (errno.EACCES, errno.EPERM):
        return "eacces"
    if code in (errno.ENOENT, errno.ENOTDIR, errno.ENODEV, errno.ESTALE):
        return "missing"
    if code in (errno.EOPNOTSUPP, errno.ENOTSUP):
        return "unsupported"
    return "io"


def _text_reason(stripped: bytes) -> str:
    if not stripped:
        return "empty"
    if stripped.startswith(b"N/A"):
        return "no_pma"
    return "garbage"


def _quiet(path: str | None, parse: Callable[[str], int | None]) -> int | None:
    """A parsed value or None, without reporting: for discovery-time previews only."""
    if path is None:
        return None
    try:
        return parse(read_sysfs(path).decode("ascii", "replace"))
    except OSError:
        return None


def _dir_stat(path: str) -> tuple[int, int] | None:
    """A directory's (inode, link count) when its link count counts its sub-directories.

    The count is 2 + sub-directories on sysfs (kernfs keeps it), tmpfs, ext4 and xfs, so a
    port directory that appears or vanishes changes it, and a device registered again gets a
    new inode. Below 2 the file system does not keep it (btrfs, overlayfs merged directories):
    None, and the directory is listed every poll. Gone: (0, 0), which differs from any real one.
    """
    try:
        st = os.stat(path)
    except OSError:
        return (0, 0)
    return (st.st_ino, st.st_nlink) if st.st_nlink >= 2 else None


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


@dataclass(slots=True)
class _Port:
    """What to read for one port, decided once at discovery."""

    key: PortKey
    device: str
    port: str
    # (catalogue name, path, narrow maximum, wide whenever read)
    counters: list[tuple[str, str, int, bool]]
    hw: list[tuple[str, str]]  # (name, path) of hw_counters/ entries that count
    hw_gauges: list[tuple[str, str]]  # ... and of those that are settings or levels
    lid: str | None
    sm_lid: str | None
    state: str | None
    phys_state: str | None
    rate: str | None
    identity: PortIdentity


@dataclass(slots=True)
class _Device:
    name: str
    guid: str
    node_desc_path: str | None
    node_desc: str
    ports: list[_Port] = field(default_factory=list)
    port_names: frozenset[str] = frozenset()
    #: ``ports/``'s (inode, link count) when it was listed; None: it must be listed every poll.
    ports_stat: tuple[int, int] | None = None
    #: The GUID is ``synthetic_guid``'s (no usable ``node_guid`` at discovery): re-read every
    #: poll, so a GUID assigned later (SR-IOV VF, hot-plug) takes over at once.
    synthetic: bool = False


@dataclass(slots=True)
class _Plan:
    devices: list[_Device]
    names: frozenset[str]


class SysfsSourceConfig(SourceConfigBase):
    """``type = "sysfs"``: this host's ports. Devices are chosen by name globs."""

    type: Literal["sysfs"] = "sysfs"
    fabric_scale: ClassVar[bool] = False
    interval: Duration = 1.0
    root: Path = Path("/sys")
    include: list[str] = Field(default_factory=list)
    exclude: list[str] = Field(default_factory=list)
    #: Re-read per-poll files through descriptors kept open; unset: only on a sysfs mount.
    keep_open: bool | None = None
    #: What one ``port_xmit_wait`` count stands for, by device name glob (first match wins):
    #: ``{"mlx4_*" = "32/lane"}``. Without one, the device family (``hca_type``) decides,
    #: else the default of 8 bytes per port (``ibmon.infiniband.xmitwait``).
    xmit_wait_units: dict[str, str] = Field(default_factory=dict)

    @field_validator("xmit_wait_units")
    @classmethod
    def _check_units(cls, v: dict[str, str]) -> dict[str, str]:
        for pattern, text in v.items():
            if not pattern:
                raise ValueError("a device glob must not be empty")
            parse_unit(text)
        return v


Config = SysfsSourceConfig


def build(cfg: SysfsSourceConfig) -> SysfsSource:
    return SysfsSource(root=cfg.root, include=cfg.include, exclude=cfg.exclude, name=cfg.label,
                       keep_open=cfg.keep_open,
                       xmit_wait_units={g: parse_unit(t) for g, t in cfg.xmit_wait_units.items()})


class SysfsSource:
    """Polls ``<root>/class/infiniband``; see the module docstring for every decision."""

    def __init__(
        self,
        *,
        root: str | Path = "/sys",
        include: Sequence[str] = (),
        exclude: Sequence[str] = (),
        name: str = "sysfs",
        keep_open: bool | None = None,
        xmit_wait_units: dict[str, WaitUnit] | None = None,
    ) -> None:
        """``keep_open``: see the module docstring (None: only when the tree is on sysfs).
        ``xmit_wait_units``: the configured PortXmitWait unit by device glob."""
        self.name = name
        self.xmit_wait_units = dict(xmit_wait_units or {})
        self.root = Path(root)
        self.include = tuple(include)
        self.exclude = tuple(exclude)
        self._class_dir = os.path.join(os.fspath(root), *_CLASS_DIR)
        self._plan: _Plan | None = None
        self._layout_checks = 0
        self._pending: list[SourceError] = []
        self._logged: set[tuple[str, str]] = set()
        self._unknown_logged: set[str] = set()
        self._lock = threading.Lock()
        self._keep_open = keep_open
        self._kept: _KeptFiles | None = None
        self._said_no_devices = False  # since a discovery last found a device

    # -- Source protocol -------------------------------------------------------------------

    async def discover(self) -> Topology:
        return await asyncio.to_thread(self._discover_sync)

    async def sample(self) -> Snapshot:
        return await asyncio.to_thread(self._sample_sync)

    async def close(self) -> None:
        with self._lock:
            self._plan = None
            self._pending = []
            self._close_kept()

    def _close_kept(self) -> None:
        if self._kept is not None:
            self._kept.close()
            self._kept = None

    def _reader(self) -> Callable[[str], bytes]:
        """How this poll reads a file: through the kept descriptors, or open-read-close."""
        return self._kept.read if self._kept is not None else read_sysfs

    # -- discovery ---------------------------------------------------------------------------

    def wanted(self, device: str) -> bool:
        """The include/exclude decision, made on the name alone."""
        if self.include and not any(fnmatch.fnmatchcase(device, g) for g in self.include):
            return False
        return not any(fnmatch.fnmatchcase(device, g) for g in self.exclude)

    def _device_names(self) -> frozenset[str]:
        return frozenset(d for d in _listdir(self._class_dir) if self.wanted(d))

    def _discover_sync(self) -> Topology:
        with self._lock:
            plan = self._build_plan()
            self._plan = plan
        topo = Topology(source=self.name)
        for dev in plan.devices:
            for p in dev.ports:
                topo.ports[p.key] = p.identity
        return topo

    def _build_plan(self) -> _Plan:
        self._pending = []  # only the latest discovery's problems are reported
        self._close_kept()  # a new plan reads new files (a device may have come back)
        keep = self._keep_open
        if keep is None:
            keep = on_sysfs(self._class_dir)
        if keep:
            self._kept = _KeptFiles(_keep_open_budget())
        names = self._device_names()
        if not names and not self._said_no_devices:
            # Not a failure (a filter may match nothing on purpose), but on a host that
            # should have an HCA it is the one clue why there are no ports: say it once.
            present = sorted(_listdir(self._class_dir))
            log.warning(
                "sysfs_no_devices", path=self._class_dir,
                reason=(f"include/exclude keep none of {', '.join(present)}" if present
                        else "no InfiniBand device (is its driver loaded?)"),
                consequence="no ports to poll until a device appears")
        self._said_no_devices = not names
        devices: list[_Device] = []
        used: set[str] = set()
        for name in sorted(names):
            devices.append(self._discover_device(name, used))
        return _Plan(devices=devices, names=names)

    def _discover_device(self, name: str, used: set[str]) -> _Device:
        ddir = os.path.join(self._class_dir, name)
        present = set(_listdir(ddir))

        def text(attr: str) -> str:
            raw = self._read(os.path.join(ddir, attr), None, self._pending, attr in present)
            return raw.decode("utf-8", "replace").strip() if raw is not None else ""

        guid = self._device_guid(name, ddir, present, used)
        used.add(guid)
        synthetic = guid == synthetic_guid(name)
        node_type_text = text("node_type")
        node_type = parse_node_type(node_type_text)
        if node_type_text and node_type is None:
            self._fail(self._pending, "garbage", os.path.join(ddir, "node_type"), None)
        desc_path = os.path.join(ddir, "node_desc") if "node_desc" in present else None
        dev = _Device(name=name, guid=guid, node_desc_path=desc_path, node_desc=text("node_desc"),
                      synthetic=synthetic)
        hca_type = text("hca_type")
        template = PortIdentity(
            guid=guid,
            port="",
            device=name,
            node_desc=dev.node_desc,
            node_type=node_type or "ca",
            source=self.name,
            fw_ver=text("fw_ver"),
            hca_type=hca_type,
            board_id=text("board_id"),
            xmit_wait=self._wait_unit(name, hca_type),
        )
        pdir = os.path.join(ddir, "ports")
        dev.ports_stat = _dir_stat(pdir)  # before the listing: a port added meanwhile shows
        port_names = [p for p in _listdir(pdir) if p.isdecimal()]
        dev.port_names = frozenset(port_names)
        for port in sorted(port_names, key=int):
            dev.ports.append(self._discover_port(os.path.join(pdir, port), template, port))
        return dev

    def _wait_unit(self, device: str, hca_type: str) -> WaitUnit:
        """What one ``port_xmit_wait`` count means on ``device``: the operator's word, else
        its family's (sysfs has no PortSamplesControl to ask), else the default."""
        return (configured_unit(device, self.xmit_wait_units)
                or family_of(device_id_of_hca_type(hca_type)) or DEFAULT_UNIT)

    def _discover_port(self, base: str, template: PortIdentity, port: str) -> _Port:
        attrs = set(_listdir(base))
        key = (template.guid, str(int(port)))

        def attr(a: str) -> str | None:
            return os.path.join(base, a) if a in attrs else None

        ll_raw = self._read(os.path.join(base, "link_layer"), key, self._pending,
                            "link_layer" in attrs)
        link_layer = ll_raw.decode("ascii", "replace").strip() if ll_raw else ""
        lid, sm_lid = attr("lid"), attr("sm_lid")
        hw_dir = os.path.join(base, "hw_counters")
        hw = [(h, os.path.join(hw_dir, h)) for h in sorted(_listdir(hw_dir))]
        identity = dataclasses.replace(
            template,
            port=key[1],
            link_layer=link_layer or "InfiniBand",
            # problems with these surface (once) in the next sample, which re-reads them
            lid=_quiet(lid, parse_lid),
            sm_lid=_quiet(sm_lid, parse_lid),
        )
        return _Port(
            key=key,
            device=template.device,
            port=key[1],
            counters=self._counter_plan(base),
            hw=[(h, path) for h, path in hw if not is_hw_gauge(h)],
            hw_gauges=[(h, path) for h, path in hw if is_hw_gauge(h)],
            lid=lid,
            sm_lid=sm_lid,
            state=attr("state"),
            phys_state=attr("phys_state"),
            rate=attr("rate"),
            identity=identity,
        )

    def _device_guid(self, name: str, ddir: str, present: set[str], used: set[str]) -> str:
        path = os.path.join(ddir, "node_guid")
        reason: str | None = None
        guid = ""
        if "node_guid" not in present:
            reason = "missing"
        else:
            try:
                raw = read_sysfs(path)
            except OSError as exc:
                reason = _oserror_reason(exc)
            else:
                try:
                    guid = normalize_guid(raw.decode("ascii", "replace"))
                except ValueError:
                    reason = _text_reason(raw.strip())
        if not reason and guid == _ZERO_GUID:
            reason = "unassigned"
        elif not reason and guid in used:
            reason = "duplicate"
        if reason:
            self._fail(self._pending, reason, path, None)
            guid = synthetic_guid(name)
        return guid

    def _counter_plan(self, base: str) -> list[tuple[str, str, int, bool]]:
        plan: list[tuple[str, str, int, bool]] = []
        cdir = os.path.join(base, "counters")
        files = sorted(_listdir(cdir))
        ext_table = not _EXT_TABLE_MARKERS.isdisjoint(files)
        for f in files:
            spec = BY_SYSFS.get(f)
            if spec is None:
                self._unknown(os.path.join(cdir, f))
                continue
            wide = ext_table and spec.name in _EXT_TABLE_COUNTERS
            plan.append((spec.name, os.path.join(cdir, f), spec.max_value, wide))
        edir = os.path.join(base, "counters_ext")
        for f in sorted(_listdir(edir)):  # after counters/: a legacy 64-bit value wins
            spec = BY_SYSFS_EXT.get(f)
            if spec is None:
                self._unknown(os.path.join(edir, f))
                continue
            plan.append((spec.name, os.path.join(edir, f), spec.max_value, True))
        return plan

    def _unknown(self, path: str) -> None:
        if path not in self._unknown_logged:
            self._unknown_logged.add(path)
            log.debug("sysfs_counter_unknown", path=path)

    # -- sampling ------------------------------------------------------------------------------

    def _layout_changed(self, plan: _Plan) -> bool:
        if self._device_names() != plan.names:
            return True
        if any(dev.synthetic and self._guid_arrived(dev, plan) for dev in plan.devices):
            return True
        self._layout_checks += 1
        listing = self._layout_checks % LIST_PORTS_EVERY == 0
        for dev in plan.devices:
            pdir = os.path.join(self._class_dir, dev.name, "ports")
            if not listing and dev.ports_stat is not None:
                if _dir_stat(pdir) != dev.ports_stat:
                    return True
            elif frozenset(p for p in _listdir(pdir) if p.isdecimal()) != dev.port_names:
                return True
        return False

    def _guid_arrived(self, dev: _Device, plan: _Plan) -> bool:
        """Whether a device keyed by a synthetic GUID now has a real one of its own."""
        try:
            guid = normalize_guid(read_sysfs(os.path.join(self._class_dir, dev.name, "node_guid"))
                                  .decode("ascii", "replace"))
        except (OSError, ValueError):
            return False
        return guid != _ZERO_GUID and all(d.guid != guid for d in plan.devices)

    def _sample_sync(self) -> Snapshot:
        with self._lock:
            plan = self._plan
            renamed: dict[PortKey, PortKey] = {}
            if plan is None or self._layout_changed(plan):
                old, plan = plan, self._build_plan()
                self._plan = plan
                if old is not None:
                    renamed = _renamed(old, plan)
            errors, self._pending = self._pending, []
            snap = Snapshot(source=self.name, monotonic=time.monotonic(), wall=time.time(),
                            errors=errors, renamed=renamed)
            read = self._reader()
            for dev in plan.devices:
                if dev.node_desc_path is not None:
                    raw = self._read(dev.node_desc_path, None, errors, True, read)
                    if raw is not None:
                        dev.node_desc = printable(raw.decode("utf-8", "replace").strip())
                for p in dev.ports:
                    snap.ports[p.key] = self._sample_port(p, dev.node_desc, errors, read)
            return snap

    def _sample_port(
        self, p: _Port, node_desc: str, errors: list[SourceError], rd: Callable[[str], bytes]
    ) -> PortSample:
        key = p.key
        values: dict[str, int] = {}
        wide: set[str] = set()
        for cname, path, narrow_max, always_wide in p.counters:
            try:
                raw = rd(path)
            except OSError as exc:
                self._fail(errors, _oserror_reason(exc), path, key)
                continue
            v = parse_counter(raw)
            if v is not None:
                values[cname] = v
                if always_wide or v > narrow_max:
                    wide.add(cname)
            else:
                self._fail(errors, _text_reason(raw.strip()), path, key)
        hw = self._read_hw(p.hw, key, errors, rd)
        hw_gauges = self._read_hw(p.hw_gauges, key, errors, rd) if p.hw_gauges else {}

        lid = self._parsed(p.lid, key, errors, parse_lid, rd)
        sm_lid = self._parsed(p.sm_lid, key, errors, parse_lid, rd)
        ident = p.identity
        if ident.lid != lid or ident.sm_lid != sm_lid or ident.node_desc != node_desc:
            ident = p.identity = dataclasses.replace(ident, node_desc=node_desc, lid=lid,
                                                     sm_lid=sm_lid)
        sample = PortSample(
            identity=ident,
            state=self._parsed(p.state, key, errors, parse_enum_prefix, rd),
            phys_state=self._parsed(p.phys_state, key, errors, parse_enum_prefix, rd),
            counters=values,
            wide=frozenset(wide),
            hw_counters=hw,
            hw_gauges=hw_gauges,
        )
        if p.rate is not None:
            rate_raw = self._read(p.rate, key, errors, True, rd)
            if rate_raw is not None:
                rate = parse_rate(rate_raw.decode("ascii", "replace"))
                if rate is None:
                    self._fail(errors, "bad_rate", p.rate, key)
                else:
                    reported, sample.active_width, sample.active_speed = rate
                    sample.rate_bps = port_rate_bps(
                        sample.active_width,
                        sample.active_speed,
                        link_layer=ident.link_layer,
                        reported_bps=reported,
                    )
        return sample

    # -- file helpers ---------------------------------------------------------------------------

    def _read(
        self,
        path: str,
        key: PortKey | None,
        errors: list[SourceError],
        listed: bool,
        read: Callable[[str], bytes] | None = None,
    ) -> bytes | None:
        """The raw bytes, or None after recording why not. Unlisted files are simply absent.

        ``read`` is the poll's reader (``_reader``); discovery reads with ``read_sysfs``."""
        if not listed:
            return None
        try:
            return (read or read_sysfs)(path)
        except OSError as exc:
            self._fail(errors, _oserror_reason(exc), path, key)
            return None

    def _read_hw(
        self,
        files: list[tuple[str, str]],
        key: PortKey,
        errors: list[SourceError],
        read: Callable[[str], bytes],
    ) -> dict[str, int]:
        """``hw_counters/`` entries as name -> int; a bad file costs only its own value."""
        out: dict[str, int] = {}
        for name, path in files:
            try:
                raw = read(path)
            except OSError as exc:
                self._fail(errors, _oserror_reason(exc), path, key)
                continue
            v = parse_counter(raw)
            if v is not None:
                out[name] = v
            else:
                self._fail(errors, _text_reason(raw.strip()), path, key)
        return out

    def _parsed(
        self,
        path: str | None,
        key: PortKey,
        errors: list[SourceError],
        parse: Callable[[str], int | None],
        read: Callable[[str], bytes],
    ) -> int | None:
        if path is None:
            return None
        raw = self._read(path, key, errors, True, read)
        if raw is None:
            return None
        text = raw.decode("ascii", "replace")
        value = parse(text)
        if value is None:
            self._fail(errors, _text_reason(raw.strip()), path, key)
        return value

    def _fail(
        self, errors: list[SourceError], reason: str, path: str, key: PortKey | None
    ) -> None:
        errors.append(SourceError(reason, path, key))
        if (path, reason) not in self._logged:
            self._logged.add((path, reason))
            # A device without a PMA is a property of the hardware, not a fault.
            emit = log.info if reason == "no_pma" else log.warning
            emit("sysfs_value_unreadable", path=path, reason=reason,
                 guid=key[0] if key else None, port=key[1] if key else None)

