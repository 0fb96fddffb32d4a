"""The simulator's PortXmitWait counts are in each device family's unit, so any stall fraction
put into it comes back from ``ibmon.infiniband.xmitwait.stall_fraction`` of the counts it produced.

A count is bytes the port could not send, device-defined: 8 bytes per port on Quantum-class
switches and ConnectX-6+ HCAs, 32 bytes per lane on Switch-IB / Switch-IB 2 / SwitchX. The
fabrics here are two nodes and one cable, built with the device ID and link under test, so every
example is a handful of ports and runs in microseconds; the counts are modest (seconds of one
link), yet large enough that the integer count's rounding (at most one count) is far below the
tolerance.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ibmon.infiniband.linkspeed import effective_rate_bps
from ibmon.infiniband.model import Snapshot
from ibmon.infiniband.xmitwait import FAMILIES, WaitUnit, counts_for, family_of, stall_fraction
from ibmon.track.tracker import Tracker
from mocks.topology import Fabric, Link, Node
from mocks.traffic import FabricModel

#: One device of each rule, written out (not read from the simulator): a Quantum switch and a
#: ConnectX-6 HCA count 8 bytes per port, a Switch-IB 2 switch 32 bytes per lane.
DEVICES: dict[int, WaitUnit] = {
    0xD2F0: WaitUnit(8, False, "family", "Quantum"),
    0x101B: WaitUnit(8, False, "family", "ConnectX-6"),
    0xCF08: WaitUnit(32, True, "family", "Switch-IB 2"),
}
WIDTHS = ["1X", "4X", "8X", "12X"]
SPEEDS = ["QDR", "EDR", "HDR", "NDR"]


def pair(device_id: int, width: str, speed: str) -> Fabric:
    """A switch of ``device_id`` cabled to an HCA (ConnectX-6) at ``width`` ``speed``."""
    sw = Node(guid="0x0002c90100000010", kind="switch", desc="sw", nports=2, lid=1,
              device_id=device_id)
    ca = Node(guid="0x0002c90a00000010", kind="ca", desc="ca mlx5_0", nports=1, lid=2,
              device_id=0x101B)
    return Fabric(nodes={sw.guid: sw, ca.guid: ca},
                  links=[Link(a=(sw.guid, 1), b=(ca.guid, 1), width=width, speed=speed)])


def test_the_written_out_units_are_the_families() -> None:
    for dev, unit in DEVICES.items():
        assert family_of(dev) == unit
        assert dev in FAMILIES


@settings(max_examples=200, deadline=None)
@given(
    fraction=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
    device_id=st.sampled_from(sorted(DEVICES)),
    width=st.sampled_from(WIDTHS),
    speed=st.sampled_from(SPEEDS),
    seconds=st.floats(min_value=0.5, max_value=5.0),
)
def test_any_stall_fraction_comes_back_from_the_counts(
    fraction: float, device_id: int, width: str, speed: str, seconds: float
) -> None:
    model = FabricModel(pair(device_id, width, speed), seed=1, load=0.0)
    key = ("0x0002c90100000010", 1)
    model.congest(key, wait_ratio=fraction, utilization=0.0)
    before = model.value(key, "transmit_wait")
    model.advance(seconds)
    counts = model.value(key, "transmit_wait") - before
    unit = DEVICES[device_id]
    bpc = unit.bytes_per_count(width)
    rate = effective_rate_bps(width, speed)
    assert bpc is not None
    assert rate is not None
    one_count = bpc / (rate / 8 * seconds)
    back = stall_fraction(counts, bpc, rate / 8, seconds)
    assert back is not None
    # the counts are whole: the fraction's counts rounded down, carry kept for the next step
    assert fraction - one_count - 1e-12 <= back <= fraction + 1e-12
    assert abs(counts - counts_for(fraction, bpc, rate / 8, seconds)) < 1.0 + 1e-6
    # and the sample says which unit they are in
    assert model.port_sample(*key).identity.xmit_wait == unit


@settings(max_examples=60, deadline=None)
@given(
    fraction=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
    device_id=st.sampled_from(sorted(DEVICES)),
    width=st.sampled_from(WIDTHS),
    speed=st.sampled_from(SPEEDS),
)
def test_the_tracker_reports_the_fraction_from_the_simulated_samples(
    fraction: float, device_id: int, width: str, speed: str
) -> None:
    """End to end in process: the mock source's samples (counts and the identity's unit) into
    the real Tracker give the stall fraction the fault asked for, on either rule."""
    model = FabricModel(pair(device_id, width, speed), seed=1, load=0.0)
    key = ("0x0002c90100000010", 1)
    model.congest(key, wait_ratio=fraction, utilization=0.0)
    tracker = Tracker()
    ratio: float | None = None
    for t in (0.0, 2.0):
        model.advance_to(t)
        snap = Snapshot(source="mock", monotonic=t, wall=1.7e9 + t)
        s = model.port_sample(*key)
        snap.ports[s.key] = s
        ratio = tracker.update(snap)[s.key].xmit_wait_ratio
    bpc = DEVICES[device_id].bytes_per_count(width)
    rate = effective_rate_bps(width, speed)
    assert bpc is not None
    assert rate is not None
    one_count = bpc / (rate / 8 * 2.0)
    assert ratio is not None
    assert fraction - one_count - 1e-9 <= ratio <= fraction + 1e-9


def test_the_same_fraction_is_sixteen_times_the_counts_on_quantum_as_on_switch_ib_2() -> None:
    """At 4X a Switch-IB 2 count is 128 bytes, a Quantum count 8: the old fixed 64 ns tick
    gave both the same counts (and the 8-byte ports 200-400x the stall at HDR/NDR)."""
    counts = {}
    for dev in (0xD2F0, 0xCF08):
        model = FabricModel(pair(dev, "4X", "HDR"), seed=1, load=0.0)
        key = ("0x0002c90100000010", 1)
        model.congest(key, wait_ratio=0.25, utilization=0.0)
        before = model.value(key, "transmit_wait")
        model.advance(1.0)
        counts[dev] = model.value(key, "transmit_wait") - before
    assert counts[0xD2F0] == round(counts_for(0.25, 8.0, 200e9 / 8, 1.0))
    assert counts[0xCF08] == round(counts_for(0.25, 128.0, 200e9 / 8, 1.0))
    assert counts[0xD2F0] == 16 * counts[0xCF08]
