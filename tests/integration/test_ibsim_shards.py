"""``shard = "K/N"`` on the real fabric sources: mad and diags against ibsim + opensm.

Two daemons of one fabric must together poll every port exactly once: a shard that keeps
another's ports double-counts them (two alerts, two series per port), one that drops ports
leaves them unwatched with nothing saying so. The fabric is written out here so the test can
pin the assignment literally: three switches, one host on each, and a two-port host ``dual``
cabled to two switches (it goes with the lower-GUID one, sw-b, both ports together). GUIDs
are chosen so that every rule matters: sw-b and sw-c fall in different shards, and each host's
own GUID hashes to the other shard than its switch's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from mocks.ibsim import IbSim
from tests.ibsim_fixtures import require_ibsim, run_diags, run_mad

pytestmark = pytest.mark.system

SW_A, SW_B, SW_C = "0x0002c90000000a00", "0x0002c90000000d00", "0x0002c90000000f00"
H1, H2, H3, DUAL = ("0x0002c90000001400", "0x0002c90000001100", "0x0002c90000001500",
                    "0x0002c90000001000")
ALL = {SW_A, SW_B, SW_C, H1, H2, H3, DUAL}
#: sha1 shard of each node for N = 2, written out (not computed by ibmon.sources.shard).
SHARDS_OF_2 = {
    0: {SW_B, H2, DUAL},
    1: {SW_A, SW_C, H1, H3},
}

NETFILE = """\
# three switches, a host on each, and host "dual" cabled to sw-b and sw-c
vendid=0x2c9
devid=0xc738
switchguid=0x0002c90000000a00(2c90000000a00)
Switch\t8 "S-0002c90000000a00"\t\t# "sw-a" base port 0 lid 0 lmc 0
[1]\t"S-0002c90000000d00"[1]\t\t# "sw-b" lid 0 4xEDR
[2]\t"S-0002c90000000f00"[1]\t\t# "sw-c" lid 0 4xEDR
[3]\t"H-0002c90000001400"[1](2c90000001401)\t\t# "h1" lid 0 4xEDR

vendid=0x2c9
devid=0xc738
switchguid=0x0002c90000000d00(2c90000000d00)
Switch\t8 "S-0002c90000000d00"\t\t# "sw-b" base port 0 lid 0 lmc 0
[1]\t"S-0002c90000000a00"[1]\t\t# "sw-a" lid 0 4xEDR
[2]\t"H-0002c90000001100"[1](2c90000001101)\t\t# "h2" lid 0 4xEDR
[3]\t"H-0002c90000001000"[1](2c90000001001)\t\t# "dual" lid 0 4xEDR

vendid=0x2c9
devid=0xc738
switchguid=0x0002c90000000f00(2c90000000f00)
Switch\t8 "S-0002c90000000f00"\t\t# "sw-c" base port 0 lid 0 lmc 0
[1]\t"S-0002c90000000a00"[2]\t\t# "sw-a" lid 0 4xEDR
[2]\t"H-0002c90000001500"[1](2c90000001501)\t\t# "h3" lid 0 4xEDR
[3]\t"H-0002c90000001000"[2](2c90000001002)\t\t# "dual" lid 0 4xEDR

vendid=0x2c9
devid=0x1017
caguid=0x0002c90000001400
Ca\t1 "H-0002c90000001400"\t\t# "h1"
[1](2c90000001401) \t"S-0002c90000000a00"[3]\t\t# lid 0 lmc 0 "sw-a" lid 0 4xEDR

vendid=0x2c9
devid=0x1017
caguid=0x0002c90000001100
Ca\t1 "H-0002c90000001100"\t\t# "h2"
[1](2c90000001101) \t"S-0002c90000000d00"[2]\t\t# lid 0 lmc 0 "sw-b" lid 0 4xEDR

vendid=0x2c9
devid=0x1017
caguid=0x0002c90000001500
Ca\t1 "H-0002c90000001500"\t\t# "h3"
[1](2c90000001501) \t"S-0002c90000000f00"[2]\t\t# lid 0 lmc 0 "sw-c" lid 0 4xEDR

vendid=0x2c9
devid=0x1017
caguid=0x0002c90000001000
Ca\t2 "H-0002c90000001000"\t\t# "dual"
[1](2c90000001001) \t"S-0002c90000000d00"[3]\t\t# lid 0 lmc 0 "sw-b" lid 0 4xEDR
[2](2c90000001002) \t"S-0002c90000000f00"[3]\t\t# lid 0 lmc 0 "sw-c" lid 0 4xEDR
"""


@pytest.fixture(scope="module")
def sim() -> Iterator[IbSim]:
    require_ibsim()
    with IbSim(NETFILE) as s:
        yield s


@pytest.fixture(autouse=True)
def _free_client_slots(sim: IbSim) -> Iterator[None]:
    sim.reap_clients()
    yield
    sim.reap_clients()


def _polled(out: dict[str, Any]) -> set[str]:
    """The ports one source sampled, as "guid/port"; its topology holds exactly the same."""
    (topo,) = out["topologies"]
    (snap,) = out["snapshots"]
    assert set(topo["ports"]) == set(snap["ports"])
    return set(snap["ports"])


def _mad(sim: IbSim, shard: str | None) -> set[str]:
    return _polled(run_mad(sim, ["discover", "sample"], shard=shard))


async def _diags(sim: IbSim, shard: str | None) -> set[str]:
    return _polled(await run_diags(sim, ["discover", "sample"], shard=shard))


def _check(whole: set[str], parts: dict[int, set[str]]) -> None:
    assert {key.split("/")[0] for key in whole} == ALL
    assert f"{DUAL}/1" in whole and f"{DUAL}/2" in whole
    for k, nodes in SHARDS_OF_2.items():
        assert {key.split("/")[0] for key in parts[k]} == nodes, k
    assert not parts[0] & parts[1]
    assert parts[0] | parts[1] == whole
    # the host cabled to two switches is polled whole by the shard of the lower-GUID switch
    assert {f"{DUAL}/1", f"{DUAL}/2"} <= parts[0]


def test_mad_shards_are_disjoint_and_cover_the_fabric(sim: IbSim) -> None:
    whole = _mad(sim, None)
    _check(whole, {k: _mad(sim, f"{k}/2") for k in (0, 1)})


async def test_diags_shards_are_disjoint_and_cover_the_fabric(sim: IbSim) -> None:
    whole = await _diags(sim, None)
    _check(whole, {k: await _diags(sim, f"{k}/2") for k in (0, 1)})
