"""Choosing the local MAD port as libibumad does, and saying why it would not open."""

from __future__ import annotations

import errno

import pytest

from ibmon.sources.localport import (
    LocalCA,
    LocalPort,
    choose_port,
    explain_open_failure,
    parse_ibstat,
)

SWITCH = LocalCA("ibsim0", True, {0: LocalPort(0, 4, 5, "IB")})
HCA = LocalCA("mlx5_0", False, {
    1: LocalPort(1, 1, 2),  # Down / Polling
    2: LocalPort(2, 4, 5),  # Active
})
ROCE = LocalCA("mlx5_1", False, {1: LocalPort(1, 4, 5, "Ethernet")})
DISABLED = LocalCA("mlx5_2", False, {1: LocalPort(1, 1, 3)})
# port 1 trained but not yet Active (Init/LinkUp), port 2 Active
TRAINED = LocalCA("mlx5_3", False, {1: LocalPort(1, 2, 5), 2: LocalPort(2, 4, 5)})
# port 1 trained but not yet Active, port 2 looking for a peer
WAITING = LocalCA("mlx5_4", False, {1: LocalPort(1, 2, 5), 2: LocalPort(2, 1, 2)})


@pytest.mark.parametrize(
    ("ca", "port", "named", "expected"),
    [
        (SWITCH, None, True, 0),  # a switch: its management port 0
        (SWITCH, 1, False, 0),  # searched for (no CA named): libibumad still takes 0
        (SWITCH, 1, True, None),  # named with port 1: used as given, and there is none
        (HCA, None, True, 2),  # first Active port, not the first port
        (HCA, 1, True, 1),  # named + port: as given (it exists)
        (HCA, 1, False, 1),  # searched: a down port that is not Disabled is acceptable
        (HCA, 3, True, None),
        (ROCE, None, True, 1),  # no IB port up: fall back to the first not Disabled
        (ROCE, 1, False, None),  # an explicit port must be InfiniBand
        (DISABLED, None, True, None),
        (DISABLED, 1, False, None),  # searched: a Disabled port that is not Active is refused
        (TRAINED, None, True, 2),  # "any": an Active port before a LinkUp one
        (WAITING, None, True, 1),  # no Active port: the first LinkUp one
    ],
)
def test_choose_port_mirrors_libibumad(
    ca: LocalCA, port: int | None, named: bool, expected: int | None
) -> None:
    assert choose_port(ca, port, named=named) == expected


def _one_line(text: str) -> str:
    assert "\n" not in text
    return text


def test_no_device_is_absence() -> None:
    f = explain_open_failure([], None, None)
    assert f.cause == "absent"
    assert "no InfiniBand device on this host" in _one_line(f.message)
    assert "any active port (port 0)" in f.message


def test_unknown_ca_lists_the_cas() -> None:
    f = explain_open_failure([SWITCH, HCA], "mlx9_0", None)
    assert f.cause == "absent"
    assert "no CA named 'mlx9_0'" in f.message
    assert "CAs here: ibsim0, mlx5_0" in f.message


def test_port_1_on_a_switch_names_port_0() -> None:
    f = explain_open_failure([SWITCH], "ibsim0", 1)
    assert f.cause == "absent"
    msg = _one_line(f.message)
    assert "CA ibsim0, port 1" in msg  # what was tried
    assert "ibsim0 is a switch: its only port is 0" in msg
    assert "0 (switch management port, ACTIVE)" in msg  # what it has
    assert "leave port unset" in msg


def test_missing_port_on_an_hca_lists_its_ports() -> None:
    f = explain_open_failure([HCA], "mlx5_0", 3)
    assert f.cause == "absent"
    assert "mlx5_0 has no port 3" in f.message
    assert "1 (DOWN/Polling), 2 (ACTIVE)" in f.message


def test_no_usable_port() -> None:
    f = explain_open_failure([DISABLED], None, None)
    assert f.cause == "absent"
    assert "no InfiniBand port that is up" in f.message
    assert "1 (DOWN/Disabled)" in f.message


@pytest.mark.parametrize("code", [errno.EACCES, errno.EPERM])
def test_permission_from_errno(code: int) -> None:
    f = explain_open_failure([HCA], None, None, os_errno=code)
    assert f.cause == "permission"
    msg = _one_line(f.message)
    assert "permission denied" in msg
    assert "mlx5_0 port 2 looks usable" in msg
    assert "/dev/infiniband/umad*" in msg


def test_permission_from_device_node() -> None:
    f = explain_open_failure([HCA], "mlx5_0", 2, access_problem="/dev/infiniband/umad1")
    assert f.cause == "permission"
    assert "permission denied on /dev/infiniband/umad1" in f.message


def test_missing_device_node_is_absence() -> None:
    f = explain_open_failure([HCA], "mlx5_0", 2, os_errno=errno.ENOENT)
    assert f.cause == "absent"
    assert "no umad device node" in f.message


def test_neither_is_said() -> None:
    f = explain_open_failure([HCA], "mlx5_0", 2, os_errno=errno.EIO)
    assert f.cause == "unknown"
    assert "neither absence nor a permission problem is evident" in f.message


IBSTAT = """\
Switch 'ibsim0'
\tSwitch type: simulator
\tNumber of ports: 0
\tPort 0:
\t\tState: Active
\t\tPhysical state: LinkUp
\t\tRate: 10
\t\tLink layer: IB
CA 'mlx5_1'
\tCA type: MT4123
\tNumber of ports: 2
\tPort 1:
\t\tState: Down
\t\tPhysical state: Disabled
\t\tLink layer: InfiniBand
\tPort 2:
\t\tState: Active
\t\tPhysical state: LinkUp
\t\tLink layer: Ethernet
"""


def test_parse_ibstat() -> None:
    sw, ca = parse_ibstat(IBSTAT)
    assert sw == LocalCA("ibsim0", True, {0: LocalPort(0, 4, 5, "InfiniBand")})
    assert ca.name == "mlx5_1" and not ca.switch
    assert ca.ports[1] == LocalPort(1, 1, 3, "InfiniBand")
    assert ca.ports[2] == LocalPort(2, 4, 5, "Ethernet")
    assert parse_ibstat("") == []


def test_parse_ibstat_knows_every_state_as_ibstat_spells_it() -> None:
    """infiniband-diags' ibstat.c: ``port_state_str`` and ``port_phy_state_str``."""
    states = ["Down", "Initializing", "Armed", "Active"]
    phys = ["Sleep", "Polling", "Disabled", "PortConfigurationTraining", "LinkUp",
            "LinkErrorRecovery", "PhyTest"]
    text = "CA 'mlx5_0'\n" + "".join(
        f"\tPort {n}:\n\t\tState: {states[n % 4]}\n\t\tPhysical state: {p}\n"
        for n, p in enumerate(phys, start=1))
    (ca,) = parse_ibstat(text)
    assert [(ca.ports[n].state, ca.ports[n].phys_state) for n in sorted(ca.ports)] == [
        (2, 1), (3, 2), (4, 3), (1, 4), (2, 5), (3, 6), (4, 7)]
    assert ca.ports[2].describe(switch=False) == "2 (ARMED/Polling)"


def test_a_disabled_port_asked_for_without_a_ca_cannot_carry_mads() -> None:
    """The CA is searched for (none named): the port asked for must not be Disabled."""
    f = explain_open_failure([DISABLED], None, 1, os_errno=errno.EIO)
    assert f.cause == "absent"
    assert "mlx5_2 port 1 cannot carry MADs" in f.message


@pytest.mark.parametrize("code", [errno.ENOENT, errno.ENODEV, errno.ENXIO])
def test_a_missing_umad_node_is_absence(code: int) -> None:
    f = explain_open_failure([HCA], "mlx5_0", 2, os_errno=code)
    assert f.cause == "absent"
    assert "no umad device node for it" in f.message and "load ib_umad" in f.message


def test_a_port_without_a_physical_state_is_named_by_its_state_alone() -> None:
    """ibstat prints "???" for a physical state it has no word for: read as 0, shown as
    nothing rather than as a state called NOP."""
    assert LocalPort(1, 1, 0).describe(switch=False) == "1 (DOWN)"
