"""Where the MAD engine addresses each MAD, read back from the umad buffer libibumad sends.

ibsim answers a MAD whatever its queue key, so a sweep on ibsim cannot tell a wrong one; a real
HCA drops a GMP whose Q_Key is not QP1's well-known one (libibmad mad.h
``IB_DEFAULT_QP1_QKEY`` 0x80010000, what perfquery sends). So the address ``umad_set_addr``
wrote is checked here, in the header of the
buffer (``struct ib_user_mad``: agent_id, status, timeout_ms, retries, length, then the
address: qpn, qkey, lid, all big-endian).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from mocks.ibsim import IbSim
from mocks.topology import fat_tree, to_ibsim_netfile
from tests.ibsim_fixtures import run_child, sim_for

pytestmark = pytest.mark.system

_CHILD = r"""
import json, struct
from ibmon.sources.libibmad import (
    ATTR_NODE_INFO, ATTR_PORT_COUNTERS_EXT, CLASS_PMA, CLASS_SMI, MadEngine, MadRequest)

requests = {
    "pma": MadRequest(CLASS_PMA, ATTR_PORT_COUNTERS_EXT, lid=7, port_select=1),
    "smp": MadRequest(CLASS_SMI, ATTR_NODE_INFO, lid=7),
    "directed": MadRequest(CLASS_SMI, ATTR_NODE_INFO, path=()),
    "pma again": MadRequest(CLASS_PMA, ATTR_PORT_COUNTERS_EXT, lid=9, port_select=1),
}
out = {}
with MadEngine(timeout=0.2, retries=0, window=1) as engine:
    for name, req in requests.items():
        answer = engine.run([req])[0]
        qpn, qkey, lid = struct.unpack_from(">IIH", engine._send_buf.raw, 20)
        out[name] = [qpn, qkey, lid]
        if name == "directed":
            out["directed answered"] = answer.data is not None
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def sim() -> Iterator[IbSim]:
    yield from sim_for(to_ibsim_netfile(fat_tree(levels=2, radix=4, leaves=2, hosts_per_leaf=1)))


def test_each_mad_class_goes_to_its_queue_pair_with_its_key(sim: IbSim) -> None:
    got: dict[str, Any] = run_child(sim, _CHILD)
    assert got == {
        "pma": [1, 0x80010000, 7],  # GSI: QP1, the well-known Q_Key, the port's LID
        "smp": [0, 0, 7],  # SMI: QP0, no Q_Key
        "directed": [0, 0, 0xFFFF],  # directed route: the permissive LID
        "directed answered": True,
        "pma again": [1, 0x80010000, 9],  # a new LID is a new address
    }
