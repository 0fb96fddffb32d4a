"""The simulated fabric's HCAs as a live ``/sys/class/infiniband`` tree, byte-for-byte in the
kernel's format, so the unmodified sysfs source (and node_exporter) read it like hardware.

Layout and formats follow ``drivers/infiniband/core/sysfs.c`` and the real trees in
``../shared/real-fixtures`` (mlx5 on a current kernel): ``node_guid`` as ``xxxx:xxxx:xxxx:xxxx``,
``state`` ``4: ACTIVE``, ``phys_state`` ``5: LinkUp``, ``rate`` ``100 Gb/sec (4X EDR)`` (the
signalling rate: ``40 Gb/sec (4X QDR)``, ``56 Gb/sec (4X FDR)``), ``lid``
in hex, ``counters/`` in plain decimal with data in 4-octet words, data and packet counters from
the 64-bit table (so the ``unicast_*``/``multicast_*`` files exist) and error counters from the
narrow one, ``port_xmit_wait`` included: the kernel reads it from PortCounters' 32-bit field, so
it pins at 2**32-1 where the model's own count (the PMA's 64-bit copy) goes on. ``hca_type`` is
``MT`` and the HCA's PCI device ID in decimal (``MT4123``, a ConnectX-6), as mlx5 writes it, so a
reader can tell what one PortXmitWait count means there.

Every file is replaced atomically (written under ``<out>/.ibmon-tmp`` and ``os.replace``d into
place, so no reader ever sees a partial value and no temporary name ever appears inside the
tree); files whose text did not change are not rewritten.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from ibmon.infiniband.counters import BY_NAME
from ibmon.infiniband.model import PhysState, PortState
from mocks.scenario import ScenarioPlayer, SimClock, build_fabric, load_scenario
from mocks.traffic import (
    BOARD_ID,
    COUNTER_NAMES,
    FW_VER,
    SM_LID,
    FabricModel,
    ca_device_names,
    hca_type,
)

__all__ = ["SysfsRenderer", "kernel_guid", "kernel_rate", "run_sysfs"]

# Per-lane signalling rate in units of 0.1 Gb/s and the name suffix, as the kernel's rate_show()
# prints them (drivers/infiniband/core/sysfs.c; ib_port_attr_to_speed_info in newer kernels).
# Current kernels name SDR too; older ones printed "10 Gb/sec (4X)".
_KERNEL_SPEED: dict[str, tuple[int, str]] = {
    "SDR": (25, " SDR"),
    "DDR": (50, " DDR"),
    "QDR": (100, " QDR"),
    "FDR10": (100, " FDR10"),
    "FDR": (140, " FDR"),
    "EDR": (250, " EDR"),
    "HDR": (500, " HDR"),
    "NDR": (1000, " NDR"),
    "XDR": (2000, " XDR"),
}
_STATE_NAMES = {s.value: s.name for s in PortState}
_PHYS_NAMES: dict[int, str] = {
    PhysState.SLEEP: "Sleep",
    PhysState.POLLING: "Polling",
    PhysState.DISABLED: "Disabled",
    PhysState.PORT_CONFIGURATION_TRAINING: "PortConfigurationTraining",
    PhysState.LINK_UP: "LinkUp",
    PhysState.LINK_ERROR_RECOVERY: "LinkErrorRecovery",
    PhysState.PHY_TEST: "Phy Test",
}
#: (catalogue name, sysfs file) for every counter a current mlx5 port shows.
_FILES: tuple[tuple[int, str], ...] = tuple(
    (i, BY_NAME[name].sysfs or "") for i, name in enumerate(COUNTER_NAMES) if BY_NAME[name].sysfs
)
_NO_CAP = (1 << 64) - 1
#: Where each file's value stops: ``port_xmit_wait`` is the PortCounters field (32 bits) in
#: every kernel; every other file shows the model's value (narrow ones already pinned by it).
_CAPS: dict[str, int] = {"port_xmit_wait": (1 << 32) - 1}
_CAP_MASK = 0x2651E848  # a ConnectX port's PortInfo.CapabilityMask
_TMP_DIR = ".ibmon-tmp"
_W_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)


def kernel_guid(guid: str) -> str:
    """``0x0002c90a00000010`` -> ``0002:c90a:0000:0010`` (node_guid / sys_image_guid)."""
    h = guid[2:]
    return ":".join(h[i:i + 4] for i in range(0, 16, 4))


def kernel_rate(width: str, speed: str) -> str:
    """The ``rate`` file's text, ``"%d%s Gb/sec (%dX%s)\n"`` without the newline:
    ``100 Gb/sec (4X EDR)``, ``40 Gb/sec (4X QDR)``, ``2.5 Gb/sec (1X SDR)``."""
    per_lane, suffix = _KERNEL_SPEED[speed]
    lanes = int(width.rstrip("X"))
    rate = per_lane * lanes
    half = ".5" if rate % 10 else ""
    return f"{rate // 10}{half} Gb/sec ({lanes}X{suffix})"


class SysfsRenderer:
    """Writes ``<out_dir>/class/infiniband/mlx5_<n>/...`` for the HCAs of ``model``.

    ``hosts`` limits the tree to some HCAs (GUIDs or node descriptions); device names stay the
    fabric-wide ``mlx5_<n>`` either way, so a partial tree names devices like the full one.
    """

    def __init__(
        self, model: FabricModel, out_dir: str | Path, *, hosts: Iterable[str] | None = None
    ) -> None:
        self.model = model
        self.out = Path(out_dir)
        self.class_dir = self.out / "class" / "infiniband"
        self._tmp = os.fspath(self.out / _TMP_DIR)
        self._written: dict[str, str] = {}
        self._seq = 0
        fabric = model.fabric
        wanted = set(hosts) if hosts is not None else None
        names = ca_device_names(fabric)
        self._ports: list[_PortFiles] = []
        for node in fabric.hosts():
            if wanted is not None and node.guid not in wanted and node.desc not in wanted:
                continue
            dev = names[node.guid]
            for port in range(1, node.nports + 1):
                i = model.index.get((node.guid, port))
                if i is None:
                    continue
                ddir = os.fspath(self.class_dir / dev)
                pdir = os.path.join(ddir, "ports", str(port))
                cdir = os.path.join(pdir, "counters")
                self._ports.append(_PortFiles(
                    device=dev, index=i, guid=node.guid, ddir=ddir, pdir=pdir,
                    counters=[(ci, os.path.join(cdir, f), _CAPS.get(f, _NO_CAP))
                              for ci, f in _FILES],
                ))

    @property
    def devices(self) -> list[str]:
        return [p.device for p in self._ports]

    def _write(self, path: str, text: str) -> None:
        if self._written.get(path) == text:
            return
        self._seq += 1
        tmp = f"{self._tmp}/{self._seq}"
        fd = os.open(tmp, _W_FLAGS, 0o644)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
        os.replace(tmp, path)
        self._written[path] = text

    def _static(self, pf: _PortFiles) -> None:
        os.makedirs(os.path.join(pf.pdir, "counters"), exist_ok=True)
        g = kernel_guid(pf.guid)
        for name, text in (
            ("node_type", "1: CA"),
            ("node_guid", g),
            ("sys_image_guid", g),
            ("fw_ver", FW_VER),
            # MT<decimal device ID>: what the sysfs source maps to a PortXmitWait unit
            ("hca_type", hca_type(self.model.fabric.nodes[pf.guid].device_id)),
            ("board_id", BOARD_ID),
            ("hw_rev", "0x0"),
        ):
            self._write(os.path.join(pf.ddir, name), text + "\n")
        for name, text in (
            ("link_layer", "InfiniBand"),
            ("lid_mask_count", "0"),
            ("sm_sl", "0"),
            ("cap_mask", f"0x{_CAP_MASK:08x}"),
        ):
            self._write(os.path.join(pf.pdir, name), text + "\n")
        pf.ready = True

    def render(self) -> None:
        """Bring every file up to the model's current state."""
        model = self.model
        nodes = model.fabric.nodes
        os.makedirs(self._tmp, exist_ok=True)
        write = self._write
        join = os.path.join
        for pf in self._ports:
            if not pf.ready:
                self._static(pf)
            node = nodes[pf.guid]
            i = pf.index
            li = model.link_index_of(i)
            state = model.state[i]
            phys = model.phys[i]
            write(join(pf.ddir, "node_desc"), node.desc[:64] + "\n")
            write(join(pf.pdir, "lid"), f"0x{node.lid:x}\n")
            write(join(pf.pdir, "sm_lid"), f"0x{SM_LID:x}\n")
            write(join(pf.pdir, "state"), f"{state}: {_STATE_NAMES.get(state, 'NOP')}\n")
            write(join(pf.pdir, "phys_state"), f"{phys}: {_PHYS_NAMES.get(phys, '<unknown>')}\n")
            write(join(pf.pdir, "rate"), kernel_rate(model.width[li], model.speed[li]) + "\n")
            vals = model.row(i)
            for ci, path, cap in pf.counters:
                v = vals[ci]
                write(path, f"{v if v < cap else cap}\n")


@dataclass(slots=True)
class _PortFiles:
    device: str
    index: int
    guid: str
    ddir: str
    pdir: str
    counters: list[tuple[int, str, int]]  # (model column, file, the file's maximum)
    ready: bool = False


async def run_sysfs(
    out_dir: str | Path,
    scenario: str,
    *,
    speed: float = 1.0,
    hosts: int | None = None,
    seed: int | None = None,
    interval: float = 1.0,
    clock: Callable[[], float] | None = None,
    stop: asyncio.Event | None = None,
) -> SysfsRenderer:
    """Play ``scenario`` and re-render the tree every ``interval`` real seconds until ``stop``
    is set or the task is cancelled (Ctrl-C). Simulated time runs ``speed`` times faster."""
    sc = load_scenario(scenario)
    fabric = build_fabric(sc, hosts=hosts)
    model = FabricModel(fabric, seed=sc.seed if seed is None else seed, load=sc.load)
    player = ScenarioPlayer(sc, model)
    renderer = SysfsRenderer(model, out_dir)
    tick = clock or SimClock(speed)
    stop = stop or asyncio.Event()
    while True:
        player.run_until(tick())
        await asyncio.to_thread(renderer.render)
        try:
            async with asyncio.timeout(interval):
                await stop.wait()
        except TimeoutError:
            continue
        return renderer
