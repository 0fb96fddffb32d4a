"""The fabric sources open their local port as infiniband-diags do, on ibsim + opensm.

ibsim attaches a client at the first node of its net file, a switch here (its management port
0, like a managed switch or an SM node on a switch), or at the node ``SIM_HOST`` names, an HCA
here. With no port configured, ``mad`` and ``diags`` must work at both, with or without a CA
name; an explicit port the CA does not have fails with a message that names the CA, the port
tried, the ports the CA has and the cause.

The same fabric has one HCA per link generation and width ibsim can express, and the ``sysfs``
source, reading the simulated HCAs' sysfs tree (``mocks/sysfs.py``), must report the same data
rate for each HCA port as the ``mad`` source does from PortInfo.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ibmon.sources.diags import DiagsSource, DiagsUnavailableError, SubprocessRunner
from ibmon.sources.sysfs import SysfsSource
from mocks.ibsim import IbSim
from mocks.sysfs import SysfsRenderer
from mocks.topology import Fabric, Link, Node, to_ibsim_netfile
from mocks.traffic import FabricModel
from tests.ibsim_fixtures import REPO, run_diags, run_mad, sim_for
from tests.syspkg import require_binary

pytestmark = pytest.mark.system

#: One HCA per (width, speed); ibsim 0.10 has no NDR/XDR (test_link_rates covers them) and
#: FDR10 is a vendor extension PortInfo cannot show (the fabric sources report it as QDR).
SPECS = [
    ("1X", "SDR"), ("4X", "SDR"), ("4X", "DDR"), ("12X", "DDR"), ("4X", "QDR"), ("8X", "QDR"),
    ("4X", "FDR"), ("1X", "EDR"), ("4X", "EDR"), ("12X", "EDR"), ("2X", "HDR"), ("4X", "HDR"),
]
SWITCH = Node("0x0002c90100000010", "switch", "leaf01", 36, 1)
HCAS = [Node(f"0x0002c90a{i:07x}0", "ca", f"host{i:02d} mlx5_0", 1, 10 + i)
        for i in range(1, len(SPECS) + 1)]
FAB = Fabric(
    {n.guid: n for n in (SWITCH, *HCAS)},
    [Link((SWITCH.guid, i), (h.guid, 1), w, s)
     for i, (h, (w, s)) in enumerate(zip(HCAS, SPECS, strict=True), start=1)],
)
ATTACH_HCA = HCAS[4]  # 4X QDR


@pytest.fixture(scope="module")
def sim() -> Iterator[IbSim]:
    yield from sim_for(to_ibsim_netfile(FAB))


@pytest.fixture(params=["switch", "hca"])
def attach(request: pytest.FixtureRequest, sim: IbSim,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Where the tools attach: ibsim's default (the first node, the switch) or an HCA."""
    if request.param == "hca":
        monkeypatch.setitem(sim.env, "SIM_HOST", "H-" + ATTACH_HCA.guid[2:])
    sim.reap_clients()
    yield request.param
    sim.reap_clients()


def _strip(ports: dict[str, Any]) -> dict[str, Any]:
    return {k: {**v, "source": ""} for k, v in ports.items()}


@pytest.mark.parametrize("ca", [None, "ibsim0"])
async def test_no_port_works_at_a_switch_and_at_an_hca(
    sim: IbSim, attach: str, ca: str | None
) -> None:
    mad = run_mad(sim, ["discover", "sample"], ca=ca)
    diags = await run_diags(sim, ["discover", "sample"], ca=ca)
    mt, dt = mad["topologies"][0], diags["topologies"][0]
    assert _strip(mt["ports"]) == _strip(dt["ports"])
    assert mt["links"] == dt["links"]
    for out in (mad, diags):
        snap = out["snapshots"][0]
        assert snap["errors"] == []
        for h in HCAS:
            p = snap["ports"][f"{h.guid}/1"]
            assert p["state"] == 4 and p["counters"], (attach, h.desc)
        assert f"{SWITCH.guid}/1" in snap["ports"]


_MAD_ERROR_CHILD = textwrap.dedent(
    """
    import asyncio, json, sys
    from pydantic import TypeAdapter
    from ibmon.config import SourceConfig
    from ibmon.sources.registry import build_source

    async def main():
        cfg = TypeAdapter(SourceConfig).validate_python(json.loads(sys.argv[1]))
        src = build_source(cfg)
        try:
            topo = await src.discover()
            return {"ports": len(topo.ports)}
        except Exception as exc:
            return {"error": type(exc).__name__, "cause": getattr(exc, "cause", None),
                    "message": str(exc)}
        finally:
            await src.close()

    print(json.dumps(asyncio.run(main())))
    """
)


def _mad_config(sim: IbSim, **cfg: Any) -> dict[str, Any]:
    """Build a ``mad`` source from a config dict in a child under the simulator; discover."""
    out = subprocess.run(
        [sys.executable, "-c", _MAD_ERROR_CHILD, json.dumps({"type": "mad", **cfg})],
        env=sim.tool_env(), cwd=sim.workdir, capture_output=True, text=True, timeout=120,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    return result


def test_mad_config_without_port_opens_the_switch_port(sim: IbSim) -> None:
    """The config used to default port to 1, which a switch does not have."""
    sim.reap_clients()
    assert _mad_config(sim, ca="ibsim0")["ports"] >= 2 * len(HCAS)
    assert _mad_config(sim, ca="ibsim0", port=0)["ports"] >= 2 * len(HCAS)


def test_mad_wrong_port_on_a_switch_is_explained(sim: IbSim) -> None:
    sim.reap_clients()
    got = _mad_config(sim, ca="ibsim0", port=1)
    assert got["error"] == "MadError" and got["cause"] == "absent"
    msg = got["message"]
    assert "\n" not in msg
    assert "CA ibsim0, port 1" in msg  # the CA and the port tried
    assert "ibsim0 is a switch: its only port is 0" in msg
    assert "0 (switch management port, ACTIVE)" in msg  # the ports it has


def test_mad_wrong_port_on_an_hca_is_explained(
    sim: IbSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sim.env, "SIM_HOST", "H-" + ATTACH_HCA.guid[2:])
    sim.reap_clients()
    got = _mad_config(sim, ca="ibsim0", port=2)
    assert got["cause"] == "absent"
    assert "ibsim0 has no port 2" in got["message"]
    assert "ibsim0 ports: 1 (ACTIVE)" in got["message"]
    assert _mad_config(sim, ca="ibsim0", port=1)["ports"] >= 2 * len(HCAS)
    got = _mad_config(sim, ca="mlx5_7")
    assert "no CA named 'mlx5_7'" in got["message"] and "CAs here: ibsim0" in got["message"]


@pytest.mark.parametrize(
    ("at", "port", "expect"),
    [
        ("switch", 1, ["ibsim0 is a switch: its only port is 0", "0 (switch management port, "
                       "ACTIVE)"]),
        ("hca", 2, ["ibsim0 has no port 2", "ibsim0 ports: 1 (ACTIVE)"]),
    ],
)
async def test_diags_wrong_port_is_explained(
    sim: IbSim, monkeypatch: pytest.MonkeyPatch, at: str, port: int, expect: list[str]
) -> None:
    require_binary("ibstat")
    if at == "hca":
        monkeypatch.setitem(sim.env, "SIM_HOST", "H-" + ATTACH_HCA.guid[2:])
    sim.reap_clients()
    runner = SubprocessRunner(env=sim.tool_env(), cwd=sim.workdir)
    src = DiagsSource(runner=runner, ca="ibsim0", port=port)
    try:
        with pytest.raises(DiagsUnavailableError) as info:
            await src.discover()
    finally:
        await src.close()
    assert info.value.cause == "absent"
    msg = str(info.value)
    assert "\n" not in msg
    assert f"CA ibsim0, port {port}" in msg
    for text in expect:
        assert text in msg


@pytest.mark.parametrize("source", ["mad", "diags"])
@pytest.mark.parametrize("ca", [[], ["--ca", "ibsim0"]])
def test_scan_without_port(sim: IbSim, attach: str, source: str, ca: list[str]) -> None:
    """``ibmon scan --source mad|diags`` with no port, wherever the local CA sits."""
    env = sim.tool_env()
    env["PYTHONPATH"] = str(REPO)
    out = subprocess.run(
        [sys.executable, "-m", "ibmon", "scan", "--source", source, *ca,
         "--format", "json", "--interval", "0.2"],
        env=env, cwd=sim.workdir, capture_output=True, text=True, timeout=120, check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    ports = {f"{p['guid']}/{p['port']}": p for p in json.loads(out.stdout)["ports"]}
    assert all(ports[f"{h.guid}/1"]["state"] == 4 for h in HCAS)


async def test_sysfs_and_mad_report_the_same_rate(sim: IbSim, tmp_path: Path) -> None:
    """The same simulated links: the HCAs' sysfs tree (kernel rate format) and ibsim (mad)."""
    sim.reap_clients()
    mad = run_mad(sim, ["discover", "sample"])["snapshots"][0]["ports"]
    SysfsRenderer(FabricModel(FAB), tmp_path).render()
    assert (tmp_path / "class/infiniband/mlx5_4/ports/1/rate").read_text() \
        == "40 Gb/sec (4X QDR)\n"  # ATTACH_HCA's link, as the kernel prints it
    snap = await SysfsSource(root=tmp_path).sample()
    assert snap.errors == []
    seen = set()
    for h, (width, speed) in zip(HCAS, SPECS, strict=True):
        s, m = snap.ports[(h.guid, "1")], mad[f"{h.guid}/1"]
        assert (s.active_width, s.active_speed) == (m["active_width"], m["active_speed"]) \
            == (width, speed)
        assert s.rate_bps == m["rate_bps"], (width, speed)
        seen.add(s.rate_bps)
    assert 32e9 in seen and 4 * 14.0625e9 * 64 / 66 in seen  # 4X QDR, FDR: not 40, 56
