"""The one port count that decides how a poll is done: ``OFFLOAD_PORTS``.

Below it a poll is node-sized (a compute node's few HCAs): everything runs on the event loop,
port by port, and nothing imports numpy, because a node-local daemon must stay within 40 MB
of RSS and numpy alone costs about 15 MB. At and above it the poll is fabric-sized: the
simulator steps, tracking and detection run in a worker thread (``ibmon.runtime.bulkwork``), so
scrapes never wait behind a poll, and the stages work in columns (the tracker's column
store, the detectors' column readers, the renderer's cached blocks), because port-by-port
Python costs 13.5 us a port in the tracker alone at 20,000 ports against 3.8 us in columns,
and a 100,000-port poll must be tracked, detected and published within a second.

Both sides give the same answers; only the cost differs. Read the threshold at call time
(``fabric_sized``, or ``sizes.OFFLOAD_PORTS``), never copy it into another module's constant:
tests move it with one ``monkeypatch.setattr(ibmon.runtime.sizes, "OFFLOAD_PORTS", 1)`` so a 20-port
test fabric runs the paths a 20,000-port one does.

This module imports nothing, so any module may read it without an import cycle.
"""

from __future__ import annotations

__all__ = ["OFFLOAD_PORTS", "fabric_sized"]

#: Polls of at least this many ports are fabric-sized (see the module's docstring).
OFFLOAD_PORTS = 200


def fabric_sized(ports: int) -> bool:
    """Whether a poll of ``ports`` ports is done the fabric's way (columns, off the loop)."""
    return ports >= OFFLOAD_PORTS
