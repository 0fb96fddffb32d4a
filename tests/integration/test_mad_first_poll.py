"""The ``mad`` source's first poll after a discovery reuses what the discovery read (ibsim).

The discovery's sweep reads every port's PortInfo, and its last batch reads every port's
counters (after the ClassPortInfo Gets, while the view is being built), so the poll that directly
follows it (the daemon samples right after each discovery) sends neither again: only the detail
baselines. The saved MADs must not change what is reported, and a poll that comes later than
``DISCOVERY_STATE_FRESH`` after the discovery reads everything itself.
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
import asyncio, json, sys, time
from ibmon.sources.mad import MadSource

async def main(wait):
    src = MadSource()
    out = []
    try:
        topo = await src.discover()
        out.append({"mads": src.last_sweep_mads, "ports": len(topo.ports),
                    "returned": time.monotonic()})
        await asyncio.sleep(wait)
        for _ in range(2):
            snap = await src.sample()
            out.append({
                "mads": src.last_sweep_mads,
                "detail_mads": src.last_detail_mads,
                "monotonic": snap.monotonic,
                "errors": len(snap.errors),
                "state": {f"{g}/{p}": [s.state, s.phys_state, s.active_width, s.active_speed]
                          for (g, p), s in snap.ports.items()},
                "counters": {f"{g}/{p}": dict(s.counters.items())
                             for (g, p), s in snap.ports.items()},
                "wide": {f"{g}/{p}": sorted(s.wide) for (g, p), s in snap.ports.items()},
                "lids": len({s.identity.lid for s in snap.ports.values() if s.identity.lid}),
            })
    finally:
        await src.close()
    print(json.dumps(out))

asyncio.run(main(float(sys.argv[1])))
"""


@pytest.fixture(scope="module")
def sim() -> Iterator[IbSim]:
    require_ibsim()
    with IbSim(to_ibsim_netfile(fabric_for_ports(60))) as s:
        yield s


def _run(sim: IbSim, wait: float = 0.0) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = run_child(sim, _CHILD, str(wait))
    return out


def test_first_poll_after_discovery_reuses_its_reads_and_reports_the_same(sim: IbSim) -> None:
    disc, first, second = _run(sim)
    ports = disc["ports"]
    assert first["errors"] == second["errors"] == 0
    assert len(first["state"]) == ports
    # the sweep's state is what a PortInfo per port says one poll later
    assert first["state"] == second["state"]
    states = [v[0] for v in first["state"].values()]
    assert set(states) <= {1, 4} and states.count(4) > len(states) // 2  # Active or unplugged
    # the same ports have counters, 64-bit the same ones, and no counter is higher in the
    # first poll than in the next one (ibsim counts the MADs themselves); the next poll has
    # more detail counters (the baselines are spread over the first polls)
    assert first["counters"].keys() == second["counters"].keys()
    assert sum(1 for c in first["counters"].values() if c) > ports // 2
    for key, counters in first["counters"].items():
        assert counters.keys() <= second["counters"][key].keys(), key
        assert all(v <= second["counters"][key][n] for n, v in counters.items()), key
    assert first["wide"] == second["wide"]
    # the first poll sends only the detail baselines, and is stamped when the discovery read
    # its counters; later polls: the counter Gets plus one PortInfo per port
    assert first["mads"] == first["detail_mads"] > 0
    assert first["monotonic"] < disc["returned"] < second["monotonic"]
    pma = second["mads"] - second["detail_mads"] - ports
    assert pma >= ports
    # the discovery: the DR sweep, a ClassPortInfo per LID and the first poll's counter Gets
    assert disc["mads"] > pma + first["lids"]


def test_a_poll_long_after_the_discovery_reads_everything_itself(sim: IbSim) -> None:
    now = _run(sim)
    disc, late, second = _run(sim, wait=1.2)  # > DISCOVERY_STATE_FRESH
    ports = disc["ports"]
    pma = second["mads"] - second["detail_mads"] - ports
    # like any later poll: the counter Gets and a PortInfo per port
    assert late["mads"] - late["detail_mads"] == pma + ports
    assert late["monotonic"] > disc["returned"]
    # what the discovery read decodes to what a poll's own Gets do
    assert late["errors"] == now[1]["errors"] == 0
    assert late["state"] == now[1]["state"]
    assert late["wide"] == now[1]["wide"]
    assert {k: sorted(v) for k, v in late["counters"].items()} == {
        k: sorted(v) for k, v in now[1]["counters"].items()
    }
