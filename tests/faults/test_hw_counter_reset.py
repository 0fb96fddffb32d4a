"""A driver hw_counter reset is a reset like any other: counted, announced, and the total holds.

A real ``python -m ibmon run`` on a sysfs tree: ``out_of_buffer`` (a driver counter in
``hw_counters/``) drops, as after a driver reload. The total must keep counting from where it
was, ``ibmon_port_resets_total{counter="hw:out_of_buffer"}`` must say it happened, and a
``counter_reset`` event must name it: without both, an operator sees a total that grew less than
the hardware's and no reason why.
"""

from __future__ import annotations

from pathlib import Path

from tests.faults.daemonproc import DaemonProcess
from tests.faults.promise import TotalsWatch
from tests.faults.test_state import HW, PORT, RESETS, Tree, config, polls


def test_a_driver_counter_reset_is_counted_and_announced(tmp_path: Path) -> None:
    tree = Tree(tmp_path / "sys")
    tree.set(out_of_buffer=1000)
    watch = TotalsWatch()
    daemon = DaemonProcess(tmp_path, config(tmp_path, tree, state=tmp_path / "state.json"),
                           watch)
    try:
        daemon.start()
        daemon.scrape_until("the baseline",
                            lambda s: s.value(HW, stat="out_of_buffer", **PORT) == 1000)
        tree.set(out_of_buffer=100)
        after = daemon.scrape_until(
            "the reset to be counted",
            lambda s: s.value(RESETS, counter="hw:out_of_buffer", **PORT) == 1)
        assert after.value(HW, stat="out_of_buffer", **PORT) == 1100  # 1,000 + 100 since
        start = polls(after)
        daemon.scrape_until("more polls", lambda s: polls(s) >= start + 3)
        resets = [e for e in daemon.events("event_firing") + daemon.events("event_resolved")
                  if e.get("type") == "counter_reset"]
        assert resets and "hw:out_of_buffer" in resets[0]["message"], daemon.log_text()
        assert daemon.stop() == 0
        daemon.traceback_free()
    finally:
        daemon.cleanup()
    assert watch.scrapes > 0
