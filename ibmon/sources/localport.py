"""The local CA port a fabric source sends its MADs from, and why it could not be opened.

Both fabric sources leave the choice to rdma-core's libibumad, as every infiniband-diags tool
does: the ``mad`` source passes (ca, port or 0) to ``mad_rpc_open_port``, the ``diags`` source
passes ``-C``/``-P`` only when configured. Port 0 means "any": libibumad's ``resolve_ca_port``
takes a switch's management port 0 (a switch exposes no other port to its own host: a managed
switch, an SM node on a switch, ibsim's default attach point), else the first InfiniBand port
that is Active, else the first in LinkUp, else the first that is not Disabled; without a CA
name it takes the first CA that has such a port. ``choose_port`` restates that rule so an error
can say which port was tried.

When opening fails, ``explain_open_failure`` turns what the host has (``LocalCA`` lists from
libibumad's ``umad_get_ca`` or ``ibstat``) into one line that names the CA, the port tried, the
ports the CA has, and whether the cause is absence (no such CA or port, not InfiniBand,
disabled) or permission (the ``/dev/infiniband/umad*`` node cannot be opened).
"""

from __future__ import annotations

import errno as errno_codes
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from ibmon.infiniband.model import PhysState, PortState, phys_state_name, state_label

__all__ = [
    "LocalCA",
    "LocalPort",
    "OpenFailure",
    "choose_port",
    "explain_open_failure",
    "parse_ibstat",
    "umad_access_problem",
]

_PERMISSION_ERRNOS = frozenset({errno_codes.EACCES, errno_codes.EPERM})


@dataclass(frozen=True, slots=True)
class LocalPort:
    number: int
    state: int  # PortInfo PortState: 1 Down .. 4 Active
    phys_state: int  # 3 Disabled, 5 LinkUp, ...
    link_layer: str = "InfiniBand"

    @property
    def infiniband(self) -> bool:
        return self.link_layer in ("InfiniBand", "IB")

    def describe(self, switch: bool) -> str:
        parts = [state_label(self.state, self.phys_state or None)]
        if not self.infiniband:
            parts.append(f"{self.link_layer}, not InfiniBand")
        what = "switch management port, " if switch and self.number == 0 else ""
        return f"{self.number} ({what}{', '.join(parts)})"


@dataclass(frozen=True, slots=True)
class LocalCA:
    name: str
    switch: bool
    ports: dict[int, LocalPort] = field(default_factory=dict)

    def describe_ports(self) -> str:
        if not self.ports:
            return "none"
        return ", ".join(self.ports[n].describe(self.switch) for n in sorted(self.ports))


@dataclass(frozen=True, slots=True)
class OpenFailure:
    """Why the port could not be opened: ``cause`` is ``absent``, ``permission`` or, when the
    host shows neither, ``unknown``."""

    cause: str
    message: str


def choose_port(ca: LocalCA, port: int | None, *, named: bool = True) -> int | None:
    """The port libibumad opens on ``ca`` for ``port`` (None/0 = any); None: none qualifies.

    Mirrors rdma-core's ``resolve_ca_name``/``resolve_ca_port``. A CA named together with a
    port is used as given: the port must exist (a switch has only port 0). Otherwise (``named``
    False: the CA is being searched for, or the port is "any") a switch always uses port 0; a
    requested port must exist and be InfiniBand, and is refused when Disabled and not Active;
    "any" picks the first Active InfiniBand port, else the first in LinkUp, else the first that
    is not Disabled.
    """
    if named and port:
        return port if port in ca.ports else None
    if ca.switch:
        return 0
    if port:
        p = ca.ports.get(port)
        if p is None or not p.infiniband:
            return None
        return port if p.state == PortState.ACTIVE or p.phys_state != PhysState.DISABLED else None
    ib = [ca.ports[n] for n in sorted(ca.ports) if ca.ports[n].infiniband]
    active = [p.number for p in ib if p.state == PortState.ACTIVE]
    linkup = [p.number for p in ib if p.phys_state == PhysState.LINK_UP]
    if active or linkup:
        return (active or linkup)[0]
    return next((n for n in sorted(ca.ports) if ca.ports[n].phys_state != PhysState.DISABLED), None)


def _tried(ca: str | None, port: int | None) -> str:
    where = f"CA {ca}" if ca else "the first CA with an active port"
    which = f"port {port}" if port else "any active port (port 0)"
    return f"{where}, {which}"


def explain_open_failure(
    cas: Sequence[LocalCA],
    ca: str | None,
    port: int | None,
    *,
    os_errno: int | None = None,
    access_problem: str | None = None,
) -> OpenFailure:
    """One line for an operator: what was tried, what the host has, absence or permission.

    ``os_errno`` is the errno the open left (EACCES/EPERM mean permission); ``access_problem``
    is a device node this process cannot open (``umad_access_problem``), checked when the CA
    and port look usable and something still refused the open.
    """
    head = f"cannot open a MAD port ({_tried(ca, port)})"
    fix_port = "leave port unset (first active port) or pick one of them"
    if not cas:
        return OpenFailure(
            "absent",
            f"{head}: no InfiniBand device on this host (absent: no /sys/class/infiniband "
            "entries; is the HCA driver loaded, e.g. mlx5_ib, and ib_umad?)",
        )
    by_name = {c.name: c for c in cas}
    if ca and ca not in by_name:
        return OpenFailure(
            "absent", f"{head}: no CA named {ca!r} (absent); CAs here: {', '.join(by_name)}"
        )
    targets = [by_name[ca]] if ca else list(cas)
    usable = [c for c in targets if choose_port(c, port, named=bool(ca)) is not None]
    if not usable:
        detail = "; ".join(f"{c.name} ports: {c.describe_ports()}" for c in targets)
        the_ca = targets[0] if len(targets) == 1 else None
        if the_ca is not None and port and the_ca.switch:
            why = f"{the_ca.name} is a switch: its only port is 0, the management port"
        elif the_ca is not None and port and port not in the_ca.ports:
            why = f"{the_ca.name} has no port {port}"
        elif the_ca is not None and port:
            why = f"{the_ca.name} port {port} cannot carry MADs"
        else:
            why = "no InfiniBand port that is up"
        return OpenFailure("absent", f"{head}: {why} (absent); {detail}; {fix_port}")
    chosen = usable[0]
    got = choose_port(chosen, port, named=bool(ca))
    detail = f"{chosen.name} port {got} looks usable ({chosen.describe_ports()})"
    if os_errno in _PERMISSION_ERRNOS or access_problem:
        what = access_problem or "the umad device"
        return OpenFailure(
            "permission",
            f"{head}: permission denied on {what} (permission); {detail}; run as root or give "
            "the ibmon user read/write access to /dev/infiniband/umad* (udev rule or group)",
        )
    if os_errno in (errno_codes.ENOENT, errno_codes.ENODEV, errno_codes.ENXIO):
        return OpenFailure(
            "absent",
            f"{head}: no umad device node for it (absent: {os.strerror(os_errno)}); {detail}; "
            "load ib_umad and check /dev/infiniband/umad*",
        )
    why = os.strerror(os_errno) if os_errno else "no error code"
    return OpenFailure(
        "unknown",
        f"{head}: {why} (neither absence nor a permission problem is evident); {detail}; "
        "check that ib_umad is loaded and /dev/infiniband/umad* is readable and writable",
    )


def umad_access_problem(dev_dir: str = "/dev/infiniband") -> str | None:
    """The first ``umad*`` device node this process cannot open read/write, if any."""
    try:
        names = sorted(n for n in os.listdir(dev_dir) if n.startswith("umad"))
    except OSError:
        return None
    for name in names:
        path = os.path.join(dev_dir, name)
        if not os.access(path, os.R_OK | os.W_OK):
            return path
    return None


# ---------------------------------------------------------------------------------------------
# ibstat (infiniband-diags): what the diags source sees of the local CAs

_IBSTAT_CA = re.compile(r"^(CA|Switch|Router)\s+'(?P<name>[^']*)'\s*$")
_IBSTAT_PORT = re.compile(r"^\s*Port\s+(?P<n>\d+):\s*$")
_IBSTAT_FIELD = re.compile(r"^\s*(?P<k>[A-Za-z ]+):\s*(?P<v>.*?)\s*$")
_IBSTAT_STATES = {"down": 1, "initializing": 2, "armed": 3, "active": 4, "active_defer": 5}
# ibstat's physical states are ``phys_state_name``'s (infiniband-diags ibstat.c: "LinkUp",
# "PhyTest", where sysfs says "Phy Test"); its port states are words of its own ("Initializing").
_IBSTAT_PHYS = {str(phys_state_name(p)).lower(): int(p) for p in PhysState if p}


def parse_ibstat(text: str) -> list[LocalCA]:
    """``ibstat`` output (every local CA with its ports) -> LocalCA list."""
    cas: list[LocalCA] = []
    ca: LocalCA | None = None
    port: dict[str, str] | None = None
    pnum = 0

    def close_port() -> None:
        if ca is not None and port is not None:
            layer = port.get("Link layer", "InfiniBand")
            ca.ports[pnum] = LocalPort(
                number=pnum,
                state=_IBSTAT_STATES.get(port.get("State", "").lower(), 0),
                phys_state=_IBSTAT_PHYS.get(port.get("Physical state", "").lower(), 0),
                link_layer="InfiniBand" if layer == "IB" else layer,
            )

    for line in text.splitlines():
        if m := _IBSTAT_CA.match(line):
            close_port()
            port = None
            ca = LocalCA(name=m.group("name"), switch=m.group(1) == "Switch")
            cas.append(ca)
        elif (m := _IBSTAT_PORT.match(line)) and ca is not None:
            close_port()
            pnum, port = int(m.group("n")), {}
        elif (m := _IBSTAT_FIELD.match(line)) and port is not None:
            port[m.group("k").strip()] = m.group("v")
    close_port()
    return cas
