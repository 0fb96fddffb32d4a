"""The MAD engine on ibsim: where and how it sends each MAD, and what unanswered MADs cost.

ibsim answers a MAD whatever its queue key, and umad2sim ignores the kernel's timeout, so a
sweep on ibsim cannot tell a wrong one; a real HCA drops a GMP whose Q_Key is not QP1's
well-known one (libibmad mad.h ``IB_DEFAULT_QP1_QKEY`` 0x80010000, what perfquery sends), and
a real kernel ends a send at its timeout. So they are read back from the umad buffer
libibumad sent (``struct ib_user_mad``: agent_id, status, timeout_ms, retries, length, then the
address: qpn, qkey and lid, big-endian).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from mocks.ibsim import IbSim
from mocks.topology import fat_tree, to_ibsim_netfile
from tests.ibsim_fixtures import run_child, run_mad, sim_for

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
        raw = engine._send_buf.raw
        qpn, qkey, lid = struct.unpack_from(">IIH", raw, 20)
        out[name] = [qpn, qkey, lid]
        out[name + " timeout_ms, retries"] = list(struct.unpack_from("=II", raw, 8))
        if name == "directed":
            out["directed answered"] = answer.data is not None
print(json.dumps(out))
"""


FABRIC = fat_tree(levels=2, radix=4, leaves=2, hosts_per_leaf=2)


@pytest.fixture(scope="module")
def sim() -> Iterator[IbSim]:
    yield from sim_for(to_ibsim_netfile(FABRIC))


def test_each_mad_class_goes_to_its_queue_pair_with_its_key(sim: IbSim) -> None:
    got: dict[str, Any] = run_child(sim, _CHILD)
    # the kernel's own timeout for each send is the engine's (0.2 s), with no kernel retries:
    # the engine re-sends itself (umad2sim ignores both, so only the buffer shows them)
    assert {k: v for k, v in got.items() if k.endswith("retries")} == {
        f"{name} timeout_ms, retries": [200, 0]
        for name in ("pma", "smp", "directed", "pma again")}
    assert {k: v for k, v in got.items() if not k.endswith("retries")} == {
        "pma": [1, 0x80010000, 7],  # GSI: QP1, the well-known Q_Key, the port's LID
        "smp": [0, 0, 7],  # SMI: QP0, no Q_Key
        "directed": [0, 0, 0xFFFF],  # directed route: the permissive LID
        "directed answered": True,
        "pma again": [1, 0x80010000, 9],  # a new LID is a new address
    }


_UNANSWERED = r"""
import json, sys, time
from ibmon.sources.libibmad import ATTR_PORT_COUNTERS_EXT, CLASS_PMA, MadEngine, MadRequest

requests = [MadRequest(CLASS_PMA, ATTR_PORT_COUNTERS_EXT, lid=int(sys.argv[1]), port_select=1)
            for _ in range(32)]
with MadEngine(timeout=0.2, retries=1, window=64) as engine:
    print("ready", flush=True)
    sys.stdin.readline()
    start = time.monotonic()
    results = engine.run(requests)
    took = time.monotonic() - start
    print(json.dumps({"errors": sorted({str(r.error) for r in results}), "took": took}),
          flush=True)
"""


def test_unanswered_mads_time_out_together_not_one_after_another(sim: IbSim) -> None:
    """32 reads that nobody answers cost one timeout and one retry (0.4 s), as a sweep of a
    fabric with a dead switch must; sent one after another they would take 12.8 s. ibsim
    reports a MAD its ``Error`` command drops at once, so here the simulator is frozen
    (SIGSTOP) after the engine opened its port: nothing answers, and only the engine's own
    deadlines end the reads."""
    (found,) = run_mad(sim, ["discover"])["topologies"]
    lid = next(p["lid"] for p in found["ports"].values() if p["node_type"] == "ca")
    child = subprocess.Popen(
        [sys.executable, "-c", _UNANSWERED, str(lid)], env=sim.tool_env(), cwd=sim.workdir,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    out = child.stdout

    def line() -> str:
        """The child's next line, or the test fails (never hangs) within 30 s."""
        ready, _, _ = select.select([out], [], [], 30)
        assert ready, "the child said nothing for 30 s"
        return out.readline()

    ibsim = sim._ibsim.pid  # type: ignore[union-attr]
    try:
        assert line().strip() == "ready"
        os.killpg(ibsim, signal.SIGSTOP)
        child.stdin.write("go\n")
        child.stdin.flush()
        got = json.loads(line())
    finally:
        os.killpg(ibsim, signal.SIGCONT)
        try:
            child.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # what is asserted below was read already
            child.kill()
            child.communicate()
            sim.reap_clients()  # ibsim keeps a killed client's slot
    assert got["errors"] == ["timeout"]
    assert 0.35 < got["took"] < 2.0
