"""The MAD worker on ibsim: a stop signal sent to the daemon's whole process group (Ctrl-C in a
terminal, SIGHUP when it closes, systemd's ``KillMode=control-group`` SIGTERM) does not end the
worker under a poll; the daemon decides when it ends, so a stop never shows as a failed poll."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from mocks.ibsim import IbSim
from mocks.topology import fat_tree, to_ibsim_netfile
from tests.ibsim_fixtures import run_child, sim_for

pytestmark = pytest.mark.system

_CHILD = r"""
import json, os, signal, time
from ibmon.sources.libibmad import ATTR_NODE_INFO, CLASS_SMI, MadRequest
from ibmon.sources.madworker import MadWorker

w = MadWorker(ca=None, port=0, timeout=1.0, retries=1, window=8)
try:
    assert w.wait_ready(30.0)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        os.kill(w.pid, sig)
    time.sleep(0.3)
    alive = w.alive
    answer = w.run([MadRequest(CLASS_SMI, ATTR_NODE_INFO, path=())])[0]
finally:
    w.close()
print(json.dumps({"alive": alive, "answered": answer.data is not None}))
"""


@pytest.fixture(scope="module")
def sim() -> Iterator[IbSim]:
    yield from sim_for(to_ibsim_netfile(fat_tree(levels=2, radix=4, leaves=2, hosts_per_leaf=1)))


def test_a_stop_signal_to_the_group_leaves_the_worker_answering(sim: IbSim) -> None:
    got: dict[str, Any] = run_child(sim, _CHILD)
    assert got == {"alive": True, "answered": True}
