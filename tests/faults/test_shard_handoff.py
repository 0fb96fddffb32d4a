"""A host whose shard changes is handed off at once: never stale or unreachable on its old shard.

Two sharded daemons (``0/2`` and ``1/2``, real ``ibmon run`` processes) poll one ibsim fabric
(tests/shard_fabric.py, where the assignment is written out):
host ``dual`` is cabled to sw-b (shard 0) and sw-c (shard 1) and goes with the lower-GUID
switch, sw-b. When its link to sw-b is taken away (ibsim Unlink), the next discovery of either
shard finds it behind sw-c only, so it now belongs to shard 1. It is still in the whole
discovery: it did not become unreachable, it moved. Shard 0 must drop it at its next discovery:
no series for it, no stale port, no unreachable node, no event about it (the link going down
is an event about sw-b's port); shard 1 must have it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mocks.ibsim import IbSim
from tests.faults.ha_daemons import SimDaemon, wait_for
from tests.faults.promise import Scrape
from tests.ibsim_fixtures import require_ibsim
from tests.shard_fabric import DUAL, NETFILE, SW_B

pytestmark = pytest.mark.system

TOPOLOGY_INTERVAL = 3.0


@pytest.fixture
def sim() -> Iterator[IbSim]:
    require_ibsim()
    with IbSim(NETFILE) as s:
        yield s


def _source(kind: str, shard: str) -> str:
    # diags: two tools at a time per daemon, so that both daemons and opensm fit in ibsim's
    # ten client slots (a tool that finds none fails: "sim_ctl: ctl error")
    return (f'type = "{kind}"\nname = "fabric"\ninterval = "1s"\nshard = "{shard}"\n'
            f'topology_interval = "{TOPOLOGY_INTERVAL}s"\nunreachable_discoveries = 5\n'
            + ("concurrency = 2\n" if kind == "diags" else ""))


def _dual_series(s: Scrape) -> set[str]:
    """The port series of host dual, as "name{port}"."""
    return {f"{n}{{{dict(lbl).get('port')}}}" for (n, lbl), _ in s.samples.items()
            if n.startswith("ibmon_port_") and dict(lbl).get("guid") == DUAL}


def _has_dual(s: Scrape, port: str) -> bool:
    return s.value("ibmon_port_info", guid=DUAL, port=port) is not None


def _about_dual(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("port") and e["port"]["guid"] == DUAL]


@pytest.mark.parametrize("kind", ["mad", "diags"])
def test_a_host_handed_to_another_shard_leaves_its_old_shard_at_once(
    sim: IbSim, tmp_path: Path, kind: str
) -> None:
    old = SimDaemon(tmp_path, sim, "shard0", _source(kind, "0/2"))
    new = SimDaemon(tmp_path, sim, "shard1", _source(kind, "1/2"))
    try:
        for d in (old, new):
            d.start()
        old.until("host dual on its shard", lambda s: _has_dual(s, "1") and _has_dual(s, "2"))
        assert not _dual_series(new.until(
            "a first successful poll", lambda s: s.value("ibmon_source_up") == 1))
        sim.unlink(f"S-{SW_B[2:]}", 3)  # dual's port 1: now only sw-c is its switch
        moved = time.monotonic()

        def checked(s: Scrape) -> Scrape:
            # on the old shard, at every scrape: never unreachable (until its next discovery,
            # dual's port 1 is still the old shard's, and rightly stale: its link is gone)
            assert s.value("ibmon_source_unreachable_nodes") == 0, "dual called unreachable"
            return s

        # one discovery of each shard: within a topology_interval (plus a poll or two; kept
        # as unreachable, it would take 5 discoveries)
        old.until("the old shard to drop dual",
                  lambda s: not _dual_series(checked(s)), timeout=TOPOLOGY_INTERVAL + 3)
        dropped = time.monotonic() - moved
        new.until("the new shard to poll dual", lambda s: _has_dual(s, "2"),
                  timeout=TOPOLOGY_INTERVAL + 3)
        # and it stays so through more discoveries: no series, so no stale port either
        end = time.monotonic() + 3 * TOPOLOGY_INTERVAL + 2
        while time.monotonic() < end:
            assert not _dual_series(checked(old.scrape()))
            assert _has_dual(new.scrape(), "2")
            time.sleep(0.3)
        wait_for("the old shard's events", lambda: bool(old.events()))
        events_old = old.events()
        old.stop()
        new.stop()
    finally:
        old.kill()
        new.kill()
    assert dropped <= TOPOLOGY_INTERVAL + 3
    # the link's fault is sw-b's (its carrying end); nothing about the host that moved
    assert not _about_dual(events_old), _about_dual(events_old)
    assert [(e["type"], e["port"]["guid"], e["port"]["port"]) for e in events_old
            if e["status"] == "firing"] == [("port_down", SW_B, "3")]
