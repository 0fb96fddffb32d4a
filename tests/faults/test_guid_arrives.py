"""A device first seen without a GUID (an SR-IOV VF, a hot-plugged HCA: ``node_guid`` reads
0000:0000:0000:0000) gets its real GUID later: its port's series move to the real GUID at once,
their totals carried over, and a restart continues them instead of starting again from the
hardware's value. A real daemon on a sysfs tree, stopped and started as an operator would."""

from __future__ import annotations

from pathlib import Path

from ibmon.sources.sysfs import synthetic_guid
from tests.faults.daemonproc import DaemonProcess
from tests.faults.promise import Scrape, TotalsWatch
from tests.faults.test_state import TX, Tree, config, polls
from tests.sysfs_tree import class_dir, write_file

REAL = "0x0002c90300a1b2c3"


def test_a_guid_that_arrives_later_moves_the_series_and_keeps_the_totals(tmp_path: Path) -> None:
    tree = Tree(tmp_path / "sys")
    guid_file = class_dir(tree.root) / "mlx5_0" / "node_guid"
    write_file(guid_file, "0000:0000:0000:0000\n")
    tree.set(port_xmit_data=1000)
    fake = synthetic_guid("mlx5_0")
    watch = TotalsWatch()
    daemon = DaemonProcess(tmp_path, config(tmp_path, tree, state=tmp_path / "state.json"),
                           watch)

    def tx(s: Scrape, guid: str) -> float | None:
        return s.value(TX, guid=guid, port="1")

    try:
        daemon.start()
        daemon.scrape_until("the synthetic key", lambda s: tx(s, fake) == 4000)
        tree.set(port_xmit_data=1500)  # 2,000 bytes more
        daemon.scrape_until("the growth", lambda s: tx(s, fake) == 6000)
        # a reset (a driver reload), so the total is no longer the hardware's value x 4: a
        # total carried over and one started again from the hardware differ from here on
        tree.set(port_xmit_data=100)
        daemon.scrape_until("the reset counted", lambda s: tx(s, fake) == 6400)
        write_file(guid_file, "0002:c903:00a1:b2c3\n")
        tree.set(port_xmit_data=200)
        moved = daemon.scrape_until("the real GUID", lambda s: tx(s, REAL) is not None)
        assert tx(moved, fake) is None  # no second series of the same port
        assert tx(moved, REAL) in (6400, 6800)  # carried over, not 800 from the hardware
        daemon.scrape_until("the total carried over", lambda s: tx(s, REAL) == 6800)
        start = polls(moved)
        daemon.scrape_until("more polls", lambda s: polls(s) >= start + 2)
        assert daemon.stop() == 0
        tree.set(port_xmit_data=300)
        daemon.start()
        again = daemon.scrape_until("a poll after the restart", lambda s: polls(s) >= 2)
        assert tx(again, REAL) == 7200  # continued, not 300 x 4 from the hardware
        assert daemon.stop() == 0
        daemon.traceback_free()
    finally:
        daemon.cleanup()
