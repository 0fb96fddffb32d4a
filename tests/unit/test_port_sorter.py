"""``PortSorter`` (the exporter's port order, worked out once per set of ports) lists exactly
what ``in_port_order`` lists, call after call, as ports come, go, move and change values."""

from __future__ import annotations

import random

from ibmon.model import PortIdentity, PortKey, PortView, replaced
from ibmon.state import PortSorter, in_port_order


def _views(idents: list[PortIdentity], value: float) -> dict[PortKey, PortView]:
    return {i.key: PortView(identity=i, utilization_tx=value) for i in idents}


def test_the_sorter_lists_what_in_port_order_lists_as_the_fabric_changes() -> None:
    rnd = random.Random(12)
    # ports "1".."12" on a few GUIDs: "2" before "10" (by length, then text)
    idents = [PortIdentity(f"0x{g:016x}", str(p)) for g in (3, 1, 2) for p in range(1, 13)]
    sorter = PortSorter()
    for step in range(40):
        if step % 5 == 1:
            rnd.shuffle(idents)  # the same ports, listed in another order
        elif step % 5 == 2:
            idents.append(PortIdentity(f"0x{rnd.randrange(1, 9):016x}", str(100 + step)))
        elif step % 5 == 3:
            del idents[rnd.randrange(len(idents))]
        elif step % 5 == 4:  # a port's identity object replaced by an equal one
            i = rnd.randrange(len(idents))
            idents[i] = PortIdentity(idents[i].guid, idents[i].port)
        ports = _views(idents, float(step))  # new views every call, as every poll
        got = sorter(ports)
        want = in_port_order(ports.values())
        assert [id(v) for v in got] == [id(v) for v in want], step
        assert all(v.utilization_tx == float(step) for v in got)


def test_ports_already_in_order_come_back_as_listed_and_a_copy_never_aliases() -> None:
    idents = [PortIdentity(f"0x{g:016x}", str(p)) for g in (1, 2) for p in (1, 2, 10)]
    sorter = PortSorter()
    ports = _views(idents, 1.0)
    first = sorter(ports)
    assert first == list(ports.values())
    changed = {k: replaced(v, utilization_tx=2.0) for k, v in ports.items()}
    assert [v.utilization_tx for v in sorter(changed)] == [2.0] * len(idents)
    assert [v.utilization_tx for v in first] == [1.0] * len(idents)  # the last call's list
