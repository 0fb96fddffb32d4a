"""One congested port of each PortXmitWait rule, through real ibsim and both fabric sources.

The simulated fabric gives every node a PCI device ID (``mocks.topology.DEVICE_IDS``) and the net
file hands it to ibsim (``devid=`` lines), so ibsim answers NodeInfo.DeviceID as the hardware
would; the model counts PortXmitWait in that family's unit and ``IbSimDriver`` pushes the counts
with PerformanceSet. ibmon's ``mad`` source (libibmad in a child process) and ``diags`` source
(perfquery and friends) must read the device ID, decide the unit by family, and the tracker must
then report the stall fraction the model was given:

- leaf01 port 5, a Quantum (0xd2f0): 8 bytes a count, per port;
- spine01 port 1, a Switch-IB 2 (0xcf08): 32 bytes a count per lane, 128 on its 4X link;
- host001's HCA, a ConnectX-6 (0x101b): 8 bytes a count, per port.

ibsim's PortXmitWait is the 32-bit field only, and an 8-byte-per-count port stalled 45 % at 4X
EDR adds 7e8 counts a second: the test polls two seconds, well before 2**32. The clock is
simulated: the model is stepped and pushed, then each source samples, and the snapshot is
stamped with the simulated time.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator

import pytest

from ibmon.infiniband.model import Snapshot
from ibmon.infiniband.xmitwait import WaitUnit, counts_for
from ibmon.track.tracker import Tracker
from mocks.ibsim import IbSim
from mocks.ibsim_driver import IbSimDriver, MadSourceProcess
from mocks.topology import Fabric, fat_tree, to_ibsim_netfile
from mocks.traffic import FabricModel
from tests.ibsim_fixtures import require_ibsim

pytestmark = pytest.mark.system

FAB: Fabric = fat_tree(levels=2, radix=8, leaves=2, hosts_per_leaf=4)
EDR_4X_BYTES = 100e9 / 8
#: (node description, port, the unit ibmon must decide, bytes a count at 4X, stall fraction)
CONGESTED = [
    ("leaf01", 5, WaitUnit(8, False, "family", "Quantum"), 8.0, 0.3),
    ("spine01", 1, WaitUnit(32, True, "family", "Switch-IB 2"), 128.0, 0.6),
    ("host001 mlx5_0", 1, WaitUnit(8, False, "family", "ConnectX-6"), 8.0, 0.45),
]
TIMES = (0.0, 1.0, 2.0)


@pytest.fixture(scope="module")
def sim() -> Iterator[IbSim]:
    require_ibsim()
    with IbSim(to_ibsim_netfile(FAB)) as s:
        yield s


def _model() -> tuple[FabricModel, list[tuple[str, int]], list[str]]:
    model = FabricModel(FAB, seed=4, load=0.2)
    keys = []
    for desc, port, _, _, fraction in CONGESTED:
        key = (FAB.node_by_desc(desc).guid, port)
        model.congest(key, wait_ratio=fraction, utilization=0.05)
        keys.append(key)
    nodes = sorted({k[0] for k in keys})
    return model, keys, nodes


def _check(name: str, ratios: dict[tuple[str, int], list[float | None]],
           units: dict[tuple[str, int], WaitUnit],
           deltas: dict[tuple[str, int], list[int]]) -> None:
    for (desc, port, unit, bpc, fraction) in CONGESTED:
        key = (FAB.node_by_desc(desc).guid, port)
        assert units[key] == unit, (name, desc, units[key])
        want = counts_for(fraction, bpc, EDR_4X_BYTES, 1.0)
        for d in deltas[key]:
            assert abs(d - want) <= 1.0, (name, desc, d, want)
        assert ratios[key][1:] == [pytest.approx(fraction, abs=1e-6)] * (len(TIMES) - 1), (
            name, desc, ratios[key])


def _run(sim: IbSim, sample_with: str) -> None:
    model, keys, nodes = _model()
    drv = IbSimDriver(sim, model, ports=[k for k in model.keys if k[0] in nodes],
                      resweep=False)

    async def run() -> tuple[dict[tuple[str, int], list[float | None]],
                             dict[tuple[str, int], WaitUnit],
                             dict[tuple[str, int], list[int]]]:
        if sample_with == "mad":
            src: object = MadSourceProcess(sim, include=nodes, timeout=0.5, retries=2)
        else:
            from ibmon.sources.diags import DiagsSource, SubprocessRunner

            src = DiagsSource(runner=SubprocessRunner(concurrency=4, env=sim.tool_env(),
                                                      cwd=sim.workdir), include=nodes)
        tracker = Tracker()
        ratios: dict[tuple[str, int], list[float | None]] = {k: [] for k in keys}
        units: dict[tuple[str, int], WaitUnit] = {}
        raw: dict[tuple[str, int], list[int]] = {k: [] for k in keys}
        try:
            await asyncio.to_thread(drv.step_to, TIMES[0])  # the fabric as discovery finds it
            await src.discover()  # type: ignore[attr-defined]
            for t in TIMES:
                await asyncio.to_thread(drv.step_to, t)
                real = await src.sample()  # type: ignore[attr-defined]
                assert real.errors == [], real.errors[:3]
                views = tracker.update(Snapshot(real.source, t, 1.7e9 + t, real.ports, []))
                for k in keys:
                    pk = (k[0], str(k[1]))
                    ratios[k].append(views[pk].xmit_wait_ratio)
                    units[k] = views[pk].identity.xmit_wait
                    raw[k].append(real.ports[pk].counters["transmit_wait"])
        finally:
            await src.close()  # type: ignore[attr-defined]
        return ratios, units, raw

    ratios, units, raw = asyncio.run(run())
    deltas = {k: [b - a for a, b in itertools.pairwise(v)] for k, v in raw.items()}
    _check(sample_with, ratios, units, deltas)
    # the counts ibsim answered are the model's, under 2**32 (ibsim's field is 32-bit)
    for k in keys:
        assert raw[k][-1] == model.value(k, "transmit_wait") < (1 << 32)


@pytest.mark.parametrize("sample_with", ["mad", "diags"])
def test_each_family_s_stall_fraction_through_ibsim(sim: IbSim, sample_with: str) -> None:
    sim.reap_clients()
    try:
        _run(sim, sample_with)
    finally:
        sim.reap_clients()
