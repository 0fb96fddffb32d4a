"""The ``mad`` source's first poll after a discovery reuses the sweep's port state (ibsim).

Every later poll asks each port for its PortInfo again; the first one does not need to, because
the sweep read every PortInfo moments before. The saved MADs must not change what is reported.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from mocks.ibsim import IbSim
from mocks.topology import fabric_for_ports, to_ibsim_netfile
from tests.ibsim_fixtures import require_ibsim, run_child

pytestmark = pytest.mark.system

_CHILD = r"""
import asyncio, json
from dataclasses import asdict
from ibmon.sources.mad import MadSource

async def main():
    src = MadSource()
    out = []
    try:
        topo = await src.discover()
        out.append({"mads": src.last_sweep_mads, "ports": len(topo.ports)})
        for _ in range(2):
            snap = await src.sample()
            out.append({
                "mads": src.last_sweep_mads,
                "errors": len(snap.errors),
                "state": {f"{g}/{p}": [s.state, s.phys_state, s.active_width, s.active_speed]
                          for (g, p), s in snap.ports.items()},
                "lids": len({s.identity.lid for s in snap.ports.values() if s.identity.lid}),
            })
    finally:
        await src.close()
    print(json.dumps(out))

asyncio.run(main())
"""


@pytest.fixture(scope="module")
def sim() -> Iterator[IbSim]:
    require_ibsim()
    with IbSim(to_ibsim_netfile(fabric_for_ports(60))) as s:
        yield s


def _run(sim: IbSim) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = run_child(sim, _CHILD)
    return out


def test_first_poll_after_discovery_skips_portinfo_and_reports_the_same(sim: IbSim) -> None:
    disc, first, second = _run(sim)
    ports = disc["ports"]
    assert first["errors"] == second["errors"] == 0
    assert len(first["state"]) == ports
    # the sweep's state is what a PortInfo per port says one poll later
    assert first["state"] == second["state"]
    states = [v[0] for v in first["state"].values()]
    assert set(states) <= {1, 4} and states.count(4) > len(states) // 2  # Active or unplugged
    # the discovery asks ClassPortInfo per LID (while it builds the view), so the first poll
    # sends the PMA Gets only; later polls: PMA + one PortInfo per port
    pma = second["mads"] - ports
    assert first["mads"] == pma
    assert pma >= ports
    assert disc["mads"] > first["lids"]  # the DR sweep, plus one ClassPortInfo per LID
