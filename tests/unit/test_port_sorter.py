"""``PortSorter`` (the exporter's port order, worked out once per set of ports) lists exactly
what ``in_port_order`` lists, call after call, as ports come, go, move and change values."""

from __future__ import annotations

import random
import tracemalloc

from ibmon.infiniband.model import PortIdentity, PortKey, PortView, replaced
from ibmon.state import PortSorter, in_port_order, order_text, port_order


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


def test_what_the_sorter_keeps_between_calls_is_a_few_bytes_a_port() -> None:
    """The identities (a pointer a port) and, for ports listed out of order (a real fabric's
    discovery order), their positions as 32-bit numbers: not an int object a port (4.3 MB
    at 118,400 ports)."""
    idents = [PortIdentity(f"0x{g:016x}", str(p)) for g in range(2000) for p in range(1, 11)]
    random.Random(3).shuffle(idents)
    ports = _views(idents, 0.0)
    sorter = PortSorter()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        assert sorter(ports) == in_port_order(ports.values())
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 24 * len(idents), kept


def test_order_text_sorts_as_port_order_even_for_odd_identities() -> None:
    """The sort key the lists are made with (one string, ``order_text``) orders every pair as
    the spec (``port_order``, a tuple) does: GUIDs that are the start of others, ports of
    any length and text (untrusted: never parsed), characters below and above ASCII."""
    rnd = random.Random(7)
    guids = ["0x0000000000000001", "0x00000000000000010", "0x1", "0x", "0x0001", "0xff",
             "0x000000000000000a", "0x0000000000000001\u00e9"]
    ports = ["1", "2", "10", "9", "01", "", "a", "10a", " 1", "\u00e92", "99999999999", "1\x01"]
    idents = [PortIdentity(g, p) for g in guids for p in ports]
    for _ in range(20):
        rnd.shuffle(idents)
        views = [PortView(identity=i) for i in idents]
        by_text = sorted(views, key=order_text)
        assert [v.identity for v in by_text] == [v.identity for v in sorted(views, key=port_order)]
    assert in_port_order(views) == sorted(views, key=port_order)
