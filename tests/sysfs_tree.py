"""Write small ``/sys/class/infiniband`` trees for tests, laid out as the kernel lays them out.

Values given as ``int`` are written as the kernel writes them (decimal plus newline); ``str``
values are written verbatim, so tests can produce missing newlines, blank lines and garbage.
Passing ``None`` for an attribute leaves its file out.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "FULL_COUNTERS",
    "class_dir",
    "write_device",
    "write_file",
    "write_port",
]

Value = int | str

#: Every ``counters/`` file an mlx5 port on a current kernel has (extended-width table).
FULL_COUNTERS: dict[str, int] = {
    "VL15_dropped": 0,
    "excessive_buffer_overrun_errors": 0,
    "link_downed": 1,
    "link_error_recovery": 2,
    "local_link_integrity_errors": 0,
    "multicast_rcv_packets": 3,
    "multicast_xmit_packets": 4,
    "port_rcv_constraint_errors": 0,
    "port_rcv_data": 1000,
    "port_rcv_errors": 5,
    "port_rcv_packets": 100,
    "port_rcv_remote_physical_errors": 0,
    "port_rcv_switch_relay_errors": 0,
    "port_xmit_constraint_errors": 0,
    "port_xmit_data": 2000,
    "port_xmit_discards": 6,
    "port_xmit_packets": 200,
    "port_xmit_wait": 7,
    "symbol_error": 8,
    "unicast_rcv_packets": 97,
    "unicast_xmit_packets": 196,
}


def class_dir(root: Path) -> Path:
    return root / "class" / "infiniband"


def write_file(path: Path, value: Value) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{value}\n" if isinstance(value, int) else value)
    return path


def _write_all(directory: Path, values: Mapping[str, Value] | None) -> None:
    if values is None:
        return
    directory.mkdir(parents=True, exist_ok=True)
    for name, value in values.items():
        write_file(directory / name, value)


def write_device(
    root: Path,
    device: str,
    *,
    node_guid: str | None = "0002:c903:00a1:b2c3",
    node_desc: str | None = "host01 HCA-1",
    node_type: str | None = "1: CA\n",
    fw_ver: str | None = "20.31.1014\n",
    hca_type: str | None = "MT4123\n",
    board_id: str | None = "MT_0000000223\n",
    hw_counters: Mapping[str, Value] | None = None,
) -> Path:
    """One device directory; its ports come from ``write_port``."""
    ddir = class_dir(root) / device
    ddir.mkdir(parents=True, exist_ok=True)
    attrs = {
        "node_guid": None if node_guid is None else f"{node_guid}\n",
        "node_desc": None if node_desc is None else f"{node_desc}\n",
        "node_type": node_type,
        "fw_ver": fw_ver,
        "hca_type": hca_type,
        "board_id": board_id,
    }
    for name, text in attrs.items():
        if text is not None:
            write_file(ddir / name, text)
    _write_all(ddir / "hw_counters", hw_counters)
    (ddir / "ports").mkdir(exist_ok=True)
    return ddir


def write_port(
    root: Path,
    device: str,
    port: int,
    *,
    counters: Mapping[str, Value] | None = None,
    counters_ext: Mapping[str, Value] | None = None,
    hw_counters: Mapping[str, Value] | None = None,
    lid: str | None = "0x12\n",
    sm_lid: str | None = "0x1\n",
    state: str | None = "4: ACTIVE\n",
    phys_state: str | None = "5: LinkUp\n",
    rate: str | None = "100 Gb/sec (4X EDR)\n",
    link_layer: str | None = "InfiniBand\n",
) -> Path:
    """One port directory; ``counters=None`` writes ``FULL_COUNTERS``, ``{}`` writes none."""
    pdir = class_dir(root) / device / "ports" / str(port)
    pdir.mkdir(parents=True, exist_ok=True)
    attrs = {
        "lid": lid,
        "sm_lid": sm_lid,
        "state": state,
        "phys_state": phys_state,
        "rate": rate,
        "link_layer": link_layer,
    }
    for name, text in attrs.items():
        if text is not None:
            write_file(pdir / name, text)
    _write_all(pdir / "counters", FULL_COUNTERS if counters is None else counters)
    _write_all(pdir / "counters_ext", counters_ext)
    _write_all(pdir / "hw_counters", hw_counters)
    return pdir
