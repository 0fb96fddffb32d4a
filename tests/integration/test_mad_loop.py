"""The MAD engine's two send/receive loops (the C module ``_madloop`` and the Python loop it
replaces) give the same answers on the simulator, through the real libibumad and umad2sim.

One batch mixes everything a sweep and a poll send: directed-route SMPs (good paths and a path
through an unplugged port), LID-routed SMPs, PMA Gets with PortSelect, an attribute the PMA
refuses, and LIDs nobody has (timeouts after their retries). Each loop runs it with the window
a poll uses and with a window of one, with and without streaming parts; every result (payload
bytes, error), the parts' sizes and order, and the sent / timed-out counts must agree.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ibmon.sources import libibmad
from mocks.ibsim import IbSim
from mocks.topology import fabric_for_ports, to_ibsim_netfile
from tests.ibsim_fixtures import require_ibsim, run_child

pytestmark = pytest.mark.system

_CHILD = r"""
import json, sys
from ibmon.sources.libibmad import (
    ATTR_NODE_INFO, ATTR_PORT_COUNTERS, ATTR_PORT_COUNTERS_EXT, ATTR_PORT_INFO, CLASS_PMA,
    CLASS_SMI, MadEngine, MadRequest,
)

loop, window, chunk = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
reqs = [MadRequest(CLASS_SMI, ATTR_NODE_INFO, path=())]
reqs += [MadRequest(CLASS_SMI, ATTR_NODE_INFO, path=(p,)) for p in range(1, 40)]  # some unplugged
reqs += [MadRequest(CLASS_SMI, ATTR_PORT_INFO, attr_mod=1, lid=lid) for lid in range(1, 30)]
reqs += [MadRequest(CLASS_SMI, ATTR_PORT_INFO, attr_mod=200, lid=1)]  # no such port: refused
smps = len(reqs)
for lid in range(1, 30):
    for attr in (ATTR_PORT_COUNTERS_EXT, ATTR_PORT_COUNTERS):
        reqs.append(MadRequest(CLASS_PMA, attr, lid=lid, port_select=1))
reqs += [MadRequest(CLASS_PMA, ATTR_PORT_COUNTERS, lid=1, port_select=200)]  # refused
reqs += [MadRequest(CLASS_PMA, ATTR_PORT_COUNTERS, lid=lid, port_select=1)  # nobody: timeouts
         for lid in (3000, 3001)]
with MadEngine(timeout=0.2, retries=1, window=window, loop=loop) as eng:
    parts = []
    emit = (lambda part: parts.append(part)) if chunk else None
    rest = eng.run_raw(reqs, emit, chunk or 512)
    typed = eng.run(reqs[:5])
    out = {"parts": [len(p) for p in parts], "sent": eng.sent, "timeouts": eng.timeouts,
           "results": [[d.hex() if d is not None else None, e]
                       for p in parts + [rest] for d, e in p],
           "typed": [type(r).__name__ for r in typed], "n": len(reqs), "smps": smps}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def sim() -> Iterator[IbSim]:
    require_ibsim()
    if libibmad.LOOP != "c":
        pytest.skip("the C module _madloop was not built (no C compiler at install)")
    with IbSim(to_ibsim_netfile(fabric_for_ports(60))) as s:
        yield s


def _run(sim: IbSim, loop: str, window: int, chunk: int) -> dict[str, Any]:
    out: dict[str, Any] = run_child(sim, _CHILD, loop, str(window), str(chunk))
    return out


def _comparable(results: list[list[Any]], smps: int) -> list[list[Any]]:
    """What of an answer is the fabric's: an SMP's 64 bytes of attribute data (ibsim leaves its
    own memory in the reserved bytes after them), a counter Get's PortSelect and CounterSelect
    (bytes 0-3: ibsim counts the MADs themselves, so the values move between runs)."""
    return [[d and d[:128], e] for d, e in results[:smps]] + [
        [d and d[:8], e] for d, e in results[smps:]
    ]


@pytest.mark.parametrize(("window", "chunk"), [(64, 0), (64, 7), (1, 16)])
def test_the_c_loop_answers_like_the_python_loop(sim: IbSim, window: int, chunk: int) -> None:
    c = _run(sim, "c", window, chunk)
    py = _run(sim, "python", window, chunk)
    assert c["n"] == py["n"] == len(c["results"]) == len(py["results"])
    assert c["smps"] == py["smps"]
    # the batch reaches every kind of outcome, else it proves less than it claims
    errors = [e for _d, e in c["results"]]
    assert errors.count(None) > 50
    assert errors[-2:] == ["timeout", "timeout"] and c["timeouts"] >= 2
    assert errors.count("status_0x001c") == 2
    assert _comparable(c["results"], c["smps"]) == _comparable(py["results"], py["smps"])
    assert (c["parts"], c["sent"], c["timeouts"]) == (py["parts"], py["sent"], py["timeouts"])
    assert c["sent"] > c["n"]  # the timeouts were sent again (retries=1)
    if chunk:
        assert c["parts"] and all(n >= chunk for n in c["parts"])
    assert c["typed"] == ["MadResult"] * 5
