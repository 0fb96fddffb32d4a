"""The harness frees ibsim client slots of dead tools only, never a live tool's.

ibsim frees a slot by number ("X <slot>"). A client that exits cleanly frees its own slot, and
a new tool may take it at once: a reaper that listed the slots, then found the old pid gone,
would free the new tool's slot and cut it off ("umad2sim_write: cannot write", seen as a whole
poll failing in tests/faults/test_tools.py on a loaded machine). Checked against scripted
console answers: the race cannot be timed on the real simulator.
"""

from __future__ import annotations

import os
import subprocess
import sys

from mocks.ibsim import IbSim


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


class Scripted(IbSim):
    """An IbSim whose console answers "Attached" from a script and records the rest."""

    def __init__(self, listings: list[list[tuple[int, int]]]) -> None:
        super().__init__("")
        self.listings = listings
        self.sent: list[str] = []

    def console(self, cmd: str | object, timeout: float = 30.0) -> str:
        assert isinstance(cmd, str)
        if cmd == "Attached":
            slots = self.listings.pop(0)
            return "\n".join(f"Client {s}: pid {p} connected at \"S1\" port 0x1, lid 1, qp 0"
                             for s, p in slots)
        self.sent.append(cmd)
        return ""


def test_a_dead_clients_slot_is_freed() -> None:
    gone = dead_pid()
    sim = Scripted([[(3, gone), (4, os.getpid())], [(3, gone), (4, os.getpid())]])
    assert sim.reap_clients() == 1
    assert sim.sent == ["X 3"]


def test_a_slot_taken_by_a_new_tool_since_the_listing_is_left_alone() -> None:
    """The first listing shows a client that has since exited cleanly (its pid is gone) and
    a new tool holds its slot by the second: nothing is freed."""
    sim = Scripted([[(3, dead_pid())], [(3, os.getpid())]])
    assert sim.reap_clients() == 0
    assert sim.sent == []


def test_live_clients_cost_one_listing() -> None:
    sim = Scripted([[(0, os.getpid()), (1, os.getppid())]])
    assert sim.reap_clients() == 0
    assert sim.sent == [] and sim.listings == []


def test_a_slot_not_seen_dead_in_the_first_listing_waits_for_the_next_round() -> None:
    """Slot 5's tool attached and died between the listings: freed next time, not now."""
    gone = dead_pid()
    sim = Scripted([[(3, gone)], [(3, gone), (5, dead_pid())]])
    assert sim.reap_clients() == 1
    assert sim.sent == ["X 3"]
