"""An HA pair gives every event one id, whatever moment of its interval each daemon polls at.

Two identical ``ibmon run`` processes (same fabric, source name and interval) poll one ibsim
fabric, the second started so that its polls land 0.2 to 0.8 of an interval away from the
first's. The test takes inter-switch links down and up again (ibsim Unlink, ReLink plus an
opensm sweep: ``port_down`` firing and resolved on the carrying end, the other links of the
leaf keep every node reachable) and resets a counter (``counter_reset``), each at another
moment of the interval. A subscriber of both daemons drops the twin of an event by its id:
that only works if each event has the same id in both, which is what is asserted.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from mocks.ibsim import IbSim
from mocks.ibsim_driver import ibsim_node_id
from mocks.topology import Fabric, fat_tree, to_ibsim_netfile
from tests.faults.ha_daemons import SimDaemon, start_apart, wait_for
from tests.faults.promise import Scrape
from tests.ibsim_fixtures import require_ibsim

pytestmark = pytest.mark.system

FAB: Fabric = fat_tree(levels=2, radix=8, leaves=2, hosts_per_leaf=4)
LEAF = FAB.node_by_desc("leaf01")
HOST = FAB.node_by_desc("host005 mlx5_0")
INTERVAL = 1.0
SOURCE = (f'type = "mad"\nname = "fabric"\ninterval = "{INTERVAL}s"\n'
          'topology_interval = "1h"\n')


@pytest.fixture
def sim() -> Iterator[IbSim]:
    require_ibsim()
    with IbSim(to_ibsim_netfile(FAB)) as s:
        yield s


def _edges(d: SimDaemon) -> list[tuple[Any, ...]]:
    return [(e["type"], e["status"], e["severity"], e["port"]["guid"] if e["port"] else None,
             e["port"]["port"] if e["port"] else None) for e in d.events()]


def test_an_ha_pair_gives_each_event_the_same_id_at_any_phase(
    sim: IbSim, tmp_path: Path
) -> None:
    a = SimDaemon(tmp_path, sim, "a", SOURCE)
    b = SimDaemon(tmp_path, sim, "b", SOURCE)
    try:
        gap = start_apart(a, b, INTERVAL)
        base = len(a.events()), len(b.events())
        uplinks = [5, 6, 7]  # leaf01's ports 5-8 all go to the spine: one down leaves three

        def seen(n: int) -> bool:
            return all(len(d.events()) - k >= n for d, k in zip((a, b), base, strict=True))

        def resets(n: int) -> bool:
            return all(sum(e["type"] == "counter_reset" for e in d.events()) >= n
                       for d in (a, b))

        def total(s: Scrape) -> float:
            return s.value("ibmon_port_transmit_data_bytes_total", guid=HOST.guid) or 0

        def raised(floor: float, s: Scrape) -> bool:
            return total(s) >= floor

        for i, port in enumerate(uplinks):
            # each change at another moment of the interval
            time.sleep(0.1 + 0.29 * i)
            sim.unlink(ibsim_node_id(FAB, LEAF.guid), port)
            wait_for("both daemons to see the link down", partial(seen, 2 * i + 1))
            time.sleep(0.45 + 0.17 * i)
            sim.relink(ibsim_node_id(FAB, LEAF.guid), port)
            sim.resweep()
            wait_for("both daemons to see the link up again", partial(seen, 2 * i + 2))
        host = ibsim_node_id(FAB, HOST.guid)
        for i, value in enumerate((1_000_000, 2_000_000)):
            # the total so far already passes ``value`` after the first round: wait for this rise
            floors = [total(d.scrape()) + value for d in (a, b)]
            sim.set_counters(host, 1, {"PortCountersExtended.PortXmitData": value})
            for d, floor in zip((a, b), floors, strict=True):  # both read it before it goes to 0
                d.until("the raised counter", partial(raised, floor))
            time.sleep(0.23 + 0.31 * i)
            sim.set_counters(host, 1, {"PortCountersExtended.PortXmitData": 0})
            wait_for("both daemons to see the counter reset", partial(resets, i + 1))
        time.sleep(3 * INTERVAL)  # nothing more may come from either
        ev_a, ev_b = a.events(), b.events()
        a.scrape()
        b.scrape()
    finally:
        a.kill()
        b.kill()
    assert _edges(a) == _edges(b), "the two daemons saw different events"
    kinds = [(t, s) for t, s, *_ in _edges(a)]
    assert kinds.count(("port_down", "firing")) == len(uplinks)
    assert kinds.count(("port_down", "resolved")) == len(uplinks)
    assert kinds.count(("counter_reset", "firing")) == 2
    # Each daemon saw each event at its own moment, the gap apart...
    times = [(ea["time"], eb["time"]) for ea, eb in zip(ev_a, ev_b, strict=True)]
    assert gap >= 0.2 * INTERVAL and len(set(times)) == len(times)
    # ...and a subscriber of both gets each event twice with one id: the twin can be dropped.
    mismatched = [(ea["type"], ea["status"], ea["time"], eb["time"])
                  for ea, eb in zip(ev_a, ev_b, strict=True) if ea["id"] != eb["id"]]
    assert not mismatched, f"{len(mismatched)} of {len(ev_a)} events have two ids: {mismatched}"
    assert len({e["id"] for e in ev_a}) == len(ev_a)  # unique within one daemon
