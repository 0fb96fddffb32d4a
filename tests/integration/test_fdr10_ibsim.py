"""FDR10 links through both fabric sources, against what ibnetdiscover prints for the same
ibsim fabric.

FDR10 (Mellanox, ConnectX-3/SwitchX era) is in no PortInfo: the port reports QDR there and FDR10
in the vendor ExtendedPortInfo, which ibsim answers and libibnetdisc asks of listed Mellanox
devices only. A SwitchX with three hosts: ``fdr10`` (ConnectX-3, FDR10), ``qdr`` (ConnectX-3,
QDR) and ``other`` (a device rdma-core does not ask, cabled FDR10 in the net file): the tools
print that link FDR10 at the switch and QDR at the host, and so must ibmon. Each port's speed
must be the one ibnetdiscover prints, and its rate the data rate of that speed (4X FDR10
40 Gb/s, not QDR's 32), on the poll right after discovery and on polls that refresh the state.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from ibmon.infiniband.linkspeed import effective_rate_bps
from mocks.ibsim import IbSim
from mocks.topology import fat_tree, to_ibsim_netfile
from tests.ibsim_fixtures import require_ibsim, run_diags, run_mad

pytestmark = pytest.mark.system

SW, FDR10, QDR, OTHER = ("0x0002c90000000a00", "0x0002c90000001400", "0x0002c90000001100",
                         "0x0002c90000001200")


def _ca(guid: str, desc: str, devid: int, sw_port: int, speed: str) -> str:
    short = guid[2:].lstrip("0")
    return f"""
vendid=0x2c9
devid=0x{devid:x}
caguid={guid}
Ca\t1 "H-{guid[2:]}"\t\t# "{desc}"
[1]({int(short, 16) + 1:x}) \t"S-{SW[2:]}"[{sw_port}]\t\t# lid 0 lmc 0 "sw" lid 0 4x{speed}
"""


NETFILE = f"""\
vendid=0x2c9
devid=0xc738
switchguid={SW}({SW[2:].lstrip("0")})
Switch\t4 "S-{SW[2:]}"\t\t# "sw" base port 0 lid 0 lmc 0
[1]\t"H-{FDR10[2:]}"[1]({int(FDR10, 16) + 1:x})\t\t# "fdr10" lid 0 4xFDR10
[2]\t"H-{QDR[2:]}"[1]({int(QDR, 16) + 1:x})\t\t# "qdr" lid 0 4xQDR
[3]\t"H-{OTHER[2:]}"[1]({int(OTHER, 16) + 1:x})\t\t# "other" lid 0 4xFDR10
""" + _ca(FDR10, "fdr10", 0x1003, 1, "FDR10") + _ca(QDR, "qdr", 0x1003, 2, "QDR") + _ca(
    OTHER, "other", 0x1000, 3, "FDR10")

#: ibnetdiscover -p: type, LID, port, GUID (a CA's port GUID), width, speed.
_LINE = re.compile(r"^(?:SW|CA)\s+\d+\s+(\d+)\s+(0x[0-9a-f]+)\s+(\d+)x\s+(\S+) - ", re.M)


@pytest.fixture(scope="module")
def sim() -> Iterator[IbSim]:
    require_ibsim()
    with IbSim(NETFILE) as s:
        yield s


def printed_speeds(sim: IbSim) -> dict[str, str]:
    """Every connected port's speed as ibnetdiscover prints it, by ibmon's port key."""
    out = subprocess.run(["ibnetdiscover", "-p"], env=sim.tool_env(), cwd=sim.workdir,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    speeds = {}
    for port, guid, _width, speed in _LINE.findall(out):
        node = guid if guid == SW else f"0x{int(guid, 16) - 1:016x}"  # -p: a CA's port GUID
        speeds[f"{node}/{port}"] = speed
    return speeds


def check_poll(snapshot: dict[str, Any], expected: dict[str, str]) -> None:
    ports = {k: v for k, v in snapshot["ports"].items() if v["link"] is not None}
    assert set(ports) == set(expected)
    for key, port in ports.items():
        speed = expected[key]
        assert (port["active_speed"], port["link"]["active_speed"]) == (speed, speed), key
        assert port["rate_bps"] == effective_rate_bps("4X", speed), key
        # the best both ends can be shown to do: FDR10 only where both ends say so
        far = expected[f"{port['link']['remote_guid']}/{port['link']['remote_port']}"]
        assert port["link"]["max_speed"] == (speed if far == speed else "QDR"), key


def test_the_tools_see_fdr10_where_the_net_file_and_the_devices_say(sim: IbSim) -> None:
    speeds = printed_speeds(sim)
    assert speeds == {f"{SW}/1": "FDR10", f"{FDR10}/1": "FDR10", f"{SW}/2": "QDR",
                      f"{QDR}/1": "QDR", f"{SW}/3": "FDR10", f"{OTHER}/1": "QDR"}


def test_mad_reads_fdr10_at_discovery_and_on_every_poll(sim: IbSim) -> None:
    expected = printed_speeds(sim)
    res = run_mad(sim, ["discover", "sample", "sample", "sample"])
    for snap in res["snapshots"]:  # the first from the discovery's reads, the rest refreshed
        check_poll(snap, expected)
        assert snap["errors"] == []


def test_diags_keeps_fdr10_through_state_refreshes(sim: IbSim) -> None:
    """The diags cache has no ExtendedPortInfo: FDR10 comes from ibnetdiscover's text at
    discovery and holds through refreshes while the link stays up at QDR."""
    expected = printed_speeds(sim)
    res = asyncio.run(run_diags(sim, ["discover", "sample", "sample", "sample"],
                                state_interval=0))
    for snap in res["snapshots"]:
        check_poll(snap, expected)
        assert snap["errors"] == []


def test_the_simulators_fdr10_links_read_the_same_through_ibsim() -> None:
    """Our simulated fabric (``mocks``) cabled FDR10 to its hosts: its HCAs and leaves are
    devices rdma-core asks, so the ``mad`` source reads every link at the speed and rate the
    simulator itself reports."""
    require_ibsim()
    fabric = fat_tree(levels=2, radix=4, leaves=2, hosts_per_leaf=2,
                      host_link=("4X", "FDR10"), leaf_link=("4X", "EDR"))
    with IbSim(to_ibsim_netfile(fabric)) as s:
        snap = run_mad(s, ["discover", "sample", "sample"])["snapshots"][-1]
    seen = {k: (p["active_speed"], p["rate_bps"]) for k, p in snap["ports"].items()
            if p["link"] is not None}
    want = {f"{g}/{p}": (lk.speed, lk.rate_bps) for lk in fabric.links for g, p in (lk.a, lk.b)}
    assert seen == want
    assert {s for s, _ in seen.values()} == {"FDR10", "EDR"}
