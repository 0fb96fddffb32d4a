"""Fault matrix, state and restarts: never lose or invent a count.

Each test runs real ``python -m ibmon run`` processes on a sysfs tree the test edits, kills them
with a real ``kill -9`` where that is the fault, and checks every scrape of every run with one
``TotalsWatch``: no port total may ever go down, across restarts. Each also checks that the
daemon kept polling, reported the fault in a log line an operator can act on, left no process
behind and printed no traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.faults.daemonproc import DaemonProcess, wait_until
from tests.faults.promise import Scrape, TotalsWatch
from tests.sysfs_tree import FULL_COUNTERS, write_device, write_file, write_port

GUID = "0x0002c90300a1b2c3"
PORT = {"guid": GUID, "port": "1"}
TX = "ibmon_port_transmit_data_bytes_total"
HW = "ibmon_port_hw_stat_total"
RESETS = "ibmon_port_resets_total"
POLL = "100ms"


class Tree:
    """One HCA port under ``root`` whose counter files the test rewrites between polls."""

    def __init__(self, root: Path) -> None:
        self.root = root
        write_device(root, "mlx5_0")
        self.port = write_port(root, "mlx5_0", 1, hw_counters={"out_of_buffer": 0})

    def set(self, **values: int) -> None:
        """``port_xmit_data=..``, ``symbol_error=..`` (counters/) or ``out_of_buffer=..``."""
        for name, value in values.items():
            sub = "counters" if name in FULL_COUNTERS else "hw_counters"
            write_file(self.port / sub / name, value)


def config(tmp: Path, tree: Tree, *, state: Path, extra: str = "") -> Path:
    """Periodic saves once an hour: within a test, only the saves a fault triggers happen."""
    cfg = tmp / "ibmon.toml"
    cfg.write_text(
        '[prometheus]\nlisten = "127.0.0.1:0"\n'
        f'[[sources]]\ntype = "sysfs"\nname = "node"\nroot = "{tree.root}"\ninterval = "{POLL}"\n'
        f'[state]\npath = "{state}"\nsave_interval = "1h"\n{extra}'
    )
    return cfg


def polls(s: Scrape) -> float:
    return s.value("ibmon_source_poll_duration_seconds_count", source="node") or 0.0


def temporaries(state: Path) -> list[str]:
    return sorted(p.name for p in state.parent.glob(f".{state.name}.*.tmp"))


def test_kill9_after_a_reset_loses_no_count_and_no_reset(tmp_path: Path) -> None:
    """A reset, growth past the last saved raw value, kill -9 before any periodic save.

    Before the fix the restart took the old baseline (1,000) for the truth: 1,400 looked like
    growth of 400 and the total fell from 9,600 to 5,600 bytes (hw_counters: 2,500 to 1,500),
    and the reset was forgotten. Now the poll that sees a reset saves before the next poll.
    """
    tree = Tree(tmp_path / "sys")
    tree.set(port_xmit_data=1000, out_of_buffer=1000)
    state = tmp_path / "state.json"
    watch = TotalsWatch()
    daemon = DaemonProcess(tmp_path, config(tmp_path, tree, state=state), watch)
    try:
        # Run 1 saves the baseline at a clean stop: raw 1,000 = 4,000 bytes.
        daemon.start()
        daemon.scrape_until("the baseline", lambda s: s.value(TX, **PORT) == 4000)
        assert daemon.stop() == 0

        # Run 2: the counters are reset, then grow past 1,000; kill -9 at once.
        daemon.start()
        daemon.scrape_until("a poll after the restart", lambda s: polls(s) >= 2)
        tree.set(port_xmit_data=100, out_of_buffer=100)
        daemon.scrape_until(
            "the reset to be counted",
            lambda s: s.value(RESETS, counter="transmit_data", **PORT) == 1
            and s.value(HW, stat="out_of_buffer", **PORT) == 1100,
        )
        tree.set(port_xmit_data=1400, out_of_buffer=1500)
        before = daemon.scrape_until(
            "the growth after the reset",
            lambda s: s.value(TX, **PORT) == 4000 + 400 + 1300 * 4
            and s.value(HW, stat="out_of_buffer", **PORT) == 2500,
        )
        daemon.kill9()  # the worst moment: the growth is one poll old, no periodic save ran

        # Run 3 resumes from what run 2 saved after the reset: nothing lost, nothing invented.
        daemon.start()
        after = daemon.scrape_until("a poll after the kill", lambda s: polls(s) >= 2)
        for s in (before, after):
            assert s.value(TX, **PORT) == 9600
            assert s.value(HW, stat="out_of_buffer", **PORT) == 2500
            assert s.value(RESETS, counter="transmit_data", **PORT) == 1
        assert after.value("ibmon_source_up", source="node") == 1
        assert daemon.events("state_restored", run=3)
        assert daemon.stop() == 0
    finally:
        daemon.cleanup()
    assert temporaries(state) == []
    daemon.traceback_free()
    assert watch.scrapes > 6


def test_saturation_is_saved_before_the_next_poll(tmp_path: Path) -> None:
    """Saturation: a narrow counter pinned at its maximum is written to the state file
    at once, not at ``save_interval`` (an hour here), also when no detector announces it (the
    event-triggered save used to be the only one)."""
    tree = Tree(tmp_path / "sys")
    state = tmp_path / "state.json"
    watch = TotalsWatch()
    quiet = "[detect.counter_saturated]\nenabled = false\n"
    daemon = DaemonProcess(tmp_path, config(tmp_path, tree, state=state, extra=quiet), watch)

    def saved_saturated() -> list[str]:
        try:
            doc = json.loads(state.read_text())
        except (OSError, ValueError):
            return []
        ports = doc["sources"]["node"]["tracker"]["ports"]
        return [name for p in ports for name in p["saturated"]]

    try:
        daemon.start()
        daemon.scrape_until("a poll", lambda s: polls(s) >= 2)
        tree.set(VL15_dropped=65535)  # 16 bits, and no detector watches it
        daemon.scrape_until(
            "the saturation", lambda s: s.value("ibmon_port_saturated", counter="vl15_dropped",
                                                **PORT) == 1)
        wait_until("the saturation in the state file",
                   lambda: saved_saturated() == ["vl15_dropped"])
        daemon.kill9()
        daemon.start()
        after = daemon.scrape_until("a poll after the kill", lambda s: polls(s) >= 2)
        assert after.value("ibmon_port_saturated", counter="vl15_dropped", **PORT) == 1
        assert after.value("ibmon_port_vl15_dropped_total", **PORT) == 65535
        assert daemon.stop() == 0
    finally:
        daemon.cleanup()
    daemon.traceback_free()


def test_deeply_nested_state_is_moved_aside_once_and_startup_goes_on(tmp_path: Path) -> None:
    """Deeply nested JSON crashed every start with RecursionError and stayed in place."""
    tree = Tree(tmp_path / "sys")
    state = tmp_path / "state.json"
    nested = b'{"version": 1, "sources": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    state.write_bytes(nested)
    watch = TotalsWatch()
    daemon = DaemonProcess(tmp_path, config(tmp_path, tree, state=state), watch)
    try:
        daemon.start()
        up = daemon.scrape_until("a poll", lambda s: polls(s) >= 2)
        assert up.value("ibmon_state_file_errors_total", reason="corrupt") == 1
        (problem,) = daemon.events("state_file_problem", run=1)
        assert problem["reason"] == "corrupt" and "nested" in problem["detail"]
        assert problem["consequence"].startswith(f"moved aside to {state}.corrupt")
        assert Path(f"{state}.corrupt").read_bytes() == nested  # the evidence is kept
        assert daemon.stop() == 0
        daemon.start()  # the next start reads the good file the stop wrote: no crash loop
        again = daemon.scrape_until("a poll", lambda s: polls(s) >= 1)
        assert again.value("ibmon_state_file_errors_total", reason="corrupt") is None
        assert daemon.events("state_restored", run=2)
        assert daemon.stop() == 0
    finally:
        daemon.cleanup()
    daemon.traceback_free()


def test_fifo_at_the_state_path_neither_hangs_startup_nor_is_replaced(tmp_path: Path) -> None:
    """A FIFO at the state path blocked startup forever, deaf to SIGTERM."""
    tree = Tree(tmp_path / "sys")
    state = tmp_path / "state.json"
    os.mkfifo(state)
    watch = TotalsWatch()
    daemon = DaemonProcess(tmp_path, config(tmp_path, tree, state=state), watch)
    try:
        daemon.start()
        up = daemon.scrape_until("a poll", lambda s: polls(s) >= 2)
        assert up.value("ibmon_state_file_errors_total", reason="not_a_file") == 1
        assert up.value("ibmon_source_up", source="node") == 1
        (problem,) = daemon.events("state_file_problem")
        assert "FIFO" in problem["detail"]
        assert problem["consequence"] == (
            "starting without saved state; saves are refused until it is removed")
        assert daemon.stop() == 0  # SIGTERM works; the save at stop is refused, and says so
        (refused,) = daemon.events("state_file_problem")[1:]
        assert refused["reason"] == "save_failed" and "not replacing it" in refused["detail"]
        assert "starting without saved state" not in refused["consequence"]
    finally:
        daemon.cleanup()
    assert state.is_fifo()  # someone's FIFO is not ours to replace
    daemon.traceback_free()


def test_temporaries_of_interrupted_saves_are_removed_at_start(tmp_path: Path) -> None:
    """Kill -9 during a save left ``.state.json.<pid>.tmp`` that nothing removed.

    The leftover is made as a save leaves it (a partial document named after a process that
    no longer runs); a live process's temporary (a save in progress) is left alone.
    """
    tree = Tree(tmp_path / "sys")
    state = tmp_path / "state.json"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead_pid = int(gone.stdout)
    stale = tmp_path / f".state.json.{dead_pid}.tmp"
    stale.write_bytes(b'{"version":1,"saved_at":17000')
    live = tmp_path / f".state.json.{os.getpid()}.tmp"  # this test process is alive
    live.write_bytes(b"{")
    watch = TotalsWatch()
    daemon = DaemonProcess(tmp_path, config(tmp_path, tree, state=state), watch)
    try:
        daemon.start()
        daemon.scrape_until("a poll", lambda s: polls(s) >= 1)
        (removed,) = daemon.events("state_temporaries_removed")
        assert removed["files"] == [str(stale)]
        assert not stale.exists() and live.exists()
        assert daemon.stop() == 0
    finally:
        daemon.cleanup()
    assert temporaries(state) == [live.name]
    daemon.traceback_free()


def test_a_failed_save_says_what_happens_and_polling_goes_on(tmp_path: Path) -> None:
    """A failed save logged "starting without saved state; the file will be replaced"."""
    tree = Tree(tmp_path / "sys")
    tree.set(port_xmit_data=1000)
    home = tmp_path / "state"
    home.mkdir()
    state = home / "state.json"
    watch = TotalsWatch()
    daemon = DaemonProcess(tmp_path, config(tmp_path, tree, state=state), watch)
    try:
        daemon.start()
        daemon.scrape_until("a poll", lambda s: polls(s) >= 2)
        for leftover in home.iterdir():
            leftover.unlink()
        home.rmdir()
        home.write_text("not a directory")  # the state directory is gone: saves must fail
        tree.set(port_xmit_data=10)  # a reset: saved at once, so the failure shows at once
        failing = daemon.scrape_until(
            "the failed save",
            lambda s: (s.value("ibmon_state_file_errors_total", reason="save_failed") or 0) >= 1)
        (failed,) = daemon.events("state_file_problem")
        assert failed["reason"] == "save_failed" and str(state) in failed["detail"]
        assert "starting without saved state" not in failed["consequence"]
        assert "kept in memory" in failed["consequence"]
        later = daemon.scrape_until("polls after the failure",
                                    lambda s: polls(s) >= polls(failing) + 3)
        assert later.value("ibmon_source_up", source="node") == 1
        tree.set(port_xmit_data=5)  # another reset, another failed save: counted, logged once
        daemon.scrape_until("the second failed save", lambda s: failed_saves(s) >= 2)
        assert len(daemon.events("state_file_problem")) == 1
        home.unlink()
        home.mkdir()  # the directory is back: the next save works
        tree.set(port_xmit_data=3)
        daemon.scrape_until("a save that works", lambda s: state.exists())
        state.unlink()
        home.rmdir()
        home.write_text("not a directory")  # failing again after a save worked: logged again
        tree.set(port_xmit_data=1)
        daemon.scrape_until("the third failed save", lambda s: failed_saves(s) >= 3)
        assert len(daemon.events("state_file_problem")) == 2
        home.unlink()
        home.mkdir()  # the save at stop works
        assert daemon.stop() == 0
    finally:
        daemon.cleanup()
    assert json.loads(state.read_text())["sources"]["node"]["tracker"]["ports"][0]["resets"] == {
        "transmit_data": 4}
    daemon.traceback_free()


def failed_saves(s: Scrape) -> float:
    return s.value("ibmon_state_file_errors_total", reason="save_failed") or 0.0
