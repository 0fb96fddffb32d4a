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
from tests.shard_fabric import ALL, DUAL, NETFILE, SHARDS_OF_2

pytestmark = pytest.mark.system


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
