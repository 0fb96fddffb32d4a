"""Physical sanity of the simulated fabric: what the real collectors are fed must be possible."""

from __future__ import annotations

import pytest

from ibmon.infiniband.counters import BY_NAME
from ibmon.infiniband.model import PhysState, PortState
from ibmon.infiniband.xmitwait import WaitUnit, counts_for, stall_fraction
from mocks.scenario import ScenarioPlayer, load_scenario
from mocks.topology import fat_tree
from mocks.traffic import (
    COUNTER_NAMES,
    MTU_BYTES,
    WIDE_COUNTERS,
    FabricModel,
    counter_max,
)

IX = {n: i for i, n in enumerate(COUNTER_NAMES)}
NARROW = [n for n in COUNTER_NAMES if n not in WIDE_COUNTERS]
#: What one PortXmitWait count is on each kind of simulated node, written out: ConnectX-6 HCAs,
#: Quantum leaves and Quantum-2 cores count 8 bytes per port, Switch-IB 2 spines 32 per lane.
PORT_8 = WaitUnit(8, False, "family")
LANE_32 = WaitUnit(32, True, "family")
UNIT_BY_ROLE = {"host": PORT_8, "leaf": PORT_8, "spine": LANE_32, "core": PORT_8}


def unit_of(model: FabricModel, i: int) -> WaitUnit:
    desc = model.fabric.nodes[model.keys[i][0]].desc
    return next(u for role, u in UNIT_BY_ROLE.items() if desc.startswith(role))


def _small() -> FabricModel:
    return FabricModel(fat_tree(radix=8, leaves=2, hosts_per_leaf=4), seed=5, load=0.5)


def test_healthy_scenario_obeys_physics() -> None:
    """Four simulated hours, polled every 2 minutes: the invariants hold at every poll."""
    sc = load_scenario("healthy")
    model = FabricModel(sc.topology.build(), seed=sc.seed, load=sc.load)
    player = ScenarioPlayer(sc, model)
    n = len(model.keys)
    prev = [list(c) for c in model.rows()]
    dt = 120.0
    t = 0.0
    polls = 0
    while t < sc.duration:
        t += dt
        player.run_until(t)
        polls += 1
        cur = model.rows()
        for i in range(n):
            c, p = cur[i], prev[i]
            delta = [a - b for a, b in zip(c, p, strict=True)]
            assert min(delta) >= 0, f"a counter decreased on port {model.keys[i]}"
            bits = delta[IX["transmit_data"]] * 32
            assert bits <= model.rate_bps(i) * dt, "transmit beyond the link rate"
            assert delta[IX["receive_data"]] * 32 <= model.rate_bps(i) * dt
            # what this end sent, its peer received, in the same poll
            q = model.peer_index(i)
            dq = [a - b for a, b in zip(cur[q], prev[q], strict=True)]
            assert delta[IX["transmit_data"]] == dq[IX["receive_data"]]
            assert delta[IX["transmit_packets"]] == dq[IX["receive_packets"]]
            assert delta[IX["multicast_transmit_packets"]] == dq[IX["multicast_receive_packets"]]
            # packets follow bytes and the MTU; unicast + multicast = all
            pkts = delta[IX["transmit_packets"]]
            assert delta[IX["transmit_data"]] * 4 <= pkts * (MTU_BYTES + 126)
            assert delta[IX["transmit_data"]] * 4 >= pkts * 64
            assert pkts == delta[IX["unicast_transmit_packets"]] + delta[
                IX["multicast_transmit_packets"]]
            assert pkts > 0, "a healthy port carries traffic"
            # multicast is a small share of it (0.1 %), never none on a busy port
            assert 0 < delta[IX["multicast_transmit_packets"]] <= pkts * 0.001
            # a healthy fabric: no errors, transmit-wait far below any congestion level
            for name in NARROW:
                if name != "transmit_wait":
                    assert delta[IX[name]] == 0, name
            unit = unit_of(model, i)
            bpc = unit.bytes_per_count(model.width[model.link_index_of(i)])
            assert bpc is not None
            assert delta[IX["transmit_wait"]] < counts_for(0.01, bpc, model.rate_bps(i) / 8, dt)
            assert model.state[i] == PortState.ACTIVE
            assert model.phys[i] == PhysState.LINK_UP
        prev = [list(c) for c in cur]
    assert polls == sc.duration / dt
    # PortXmitWait is the 64-bit copy (a healthy 4X EDR port at 8 bytes a count passes 2**32
    # within hours); every narrow counter stays below its maximum
    assert all(all(v < counter_max(nm) for nm, v in zip(COUNTER_NAMES, c, strict=True)
                   if nm != "transmit_wait")
               for c in model.rows()), "nothing saturates in four healthy hours"


@pytest.mark.parametrize("name", NARROW)
def test_narrow_counters_saturate_at_their_width(name: str) -> None:
    model = _small()
    key = model.keys[0]
    width = BY_NAME[name].bits
    if name == "transmit_wait":
        model.narrow_wait(key)  # a PMA with only the 32-bit PortXmitWait
    model.set_value(key, name, (1 << width) - 3)
    model.set_error_rate(key, name, 1000.0)
    model.advance(1.0)
    assert model.value(key, name) == (1 << width) - 1
    model.advance(10.0)
    assert model.value(key, name) == (1 << width) - 1


def test_wide_counters_do_not_stop_at_32_bits() -> None:
    model = _small()
    key = model.keys[0]
    model.set_value(key, "transmit_data", (1 << 32) - 5)
    model.advance(1.0)
    assert model.value(key, "transmit_data") > (1 << 32)


def test_transmit_wait_is_64_bit_unless_the_port_has_only_the_32_bit_field() -> None:
    """A congested 4X EDR port at 8 bytes a count passes 2**32 in seconds: the model keeps the
    64-bit copy (and says so in its samples), and a ``narrow_wait`` port pins at 2**32-1."""
    model = _small()
    host = next(i for i, k in enumerate(model.keys)
                if model.fabric.nodes[k[0]].kind == "ca")
    wide, narrow = model.keys[host], model.keys[model.peer_index(host)]
    model.narrow_wait(narrow)
    for key in (wide, narrow):
        model.congest(key, wait_ratio=0.8, utilization=0.1)
        model.set_value(key, "transmit_wait", (1 << 32) - 1000)
    model.advance(1.0)
    assert model.value(wide, "transmit_wait") > (1 << 32)
    assert "transmit_wait" in model.port_sample(*wide).wide
    assert model.value(narrow, "transmit_wait") == (1 << 32) - 1
    assert "transmit_wait" not in model.port_sample(*narrow).wide


def test_same_seed_same_fabric_different_seed_differs() -> None:
    a, b, c = _small(), _small(), FabricModel(fat_tree(radix=8, leaves=2, hosts_per_leaf=4),
                                             seed=6, load=0.5)
    for m in (a, b, c):
        m.advance(10.0)
        m.advance(0.5)
    assert a.flat == b.flat
    assert a.flat != c.flat


def test_flap_counts_link_downed_on_both_ends_and_stops_traffic() -> None:
    model = _small()
    key = model.keys[0]
    peer = model.keys[model.peer_index(0)]
    model.flap(key, count=2, every=10, down_for=3)
    assert model.state[0] == PortState.DOWN
    assert model.phys[0] == PhysState.POLLING
    assert model.value(key, "link_downed") == 1
    assert model.value(peer, "link_downed") == 1
    before = model.value(key, "transmit_data")
    model.advance(2.9)
    assert model.value(key, "transmit_data") == before, "a down link carries nothing"
    model.advance(0.2)  # up at 3 s
    assert model.state[0] == PortState.ACTIVE
    model.advance(7.0)  # second down at 10 s, up at 13 s
    assert model.state[0] == PortState.DOWN
    assert model.value(peer, "link_downed") == 2
    model.advance(5.0)
    assert model.state[model.peer_index(0)] == PortState.ACTIVE


@pytest.mark.parametrize("role", ["spine", "leaf", "host"])
def test_congestion_sets_the_wait_ratio_and_utilization(role: str) -> None:
    """PortXmitWait counts in the port's family unit (a spine's Switch-IB 2: 32 bytes a lane,
    128 a count on 4X; a Quantum leaf or a ConnectX-6 host: 8 bytes), so the stall fraction
    from them is the one the fault asked for."""
    model = _small()
    i = next(n for n, k in enumerate(model.keys)
             if model.fabric.nodes[k[0]].desc.startswith(role))
    key = model.keys[i]
    model.congest(key, wait_ratio=0.35, utilization=0.6)
    w0, d0 = model.value(key, "transmit_wait"), model.value(key, "transmit_data")
    model.advance(10.0)
    counts = model.value(key, "transmit_wait") - w0
    rate_bytes = 100e9 / 8  # 4X EDR
    bpc = UNIT_BY_ROLE[role].bytes_per_count("4X")
    assert bpc == (128.0 if role == "spine" else 8.0)
    assert counts == pytest.approx(counts_for(0.35, bpc, rate_bytes, 10.0), abs=1.0)
    assert stall_fraction(counts, bpc, rate_bytes, 10.0) == pytest.approx(0.35, rel=1e-6)
    util = (model.value(key, "transmit_data") - d0) * 32 / (model.rate_bps(i) * 10.0)
    assert util == pytest.approx(0.6, rel=1e-6)
    with pytest.raises(ValueError, match="100 %"):
        model.congest(key, wait_ratio=0.6, utilization=0.6)


@pytest.mark.parametrize(("role", "bpc"), [("spine", 32.0), ("host", 8.0)])
def test_a_narrower_link_counts_in_its_units_at_its_lower_rate(role: str, bpc: float) -> None:
    """Retrained from 4X to 1X, a port sends a quarter of the bytes a second. A Switch-IB 2
    spine's count (32 bytes a lane) shrinks with the width too, so the same stall fraction is
    the same counts; a ConnectX-6's (8 bytes a port) does not, so it is a quarter of them."""
    model = _small()
    i = next(n for n, k in enumerate(model.keys)
             if model.fabric.nodes[k[0]].desc.startswith(role))
    key = model.keys[i]
    model.congest(key, wait_ratio=0.5, utilization=0.1)
    model.degrade(key, width="1X")
    w0 = model.value(key, "transmit_wait")
    model.advance(10.0)
    counts = model.value(key, "transmit_wait") - w0
    assert UNIT_BY_ROLE[role].bytes_per_count("1X") == bpc
    assert counts == pytest.approx(counts_for(0.5, bpc, 25e9 / 8, 10.0), abs=1.0)


def test_ber_produces_symbol_errors_at_the_rate_of_the_link() -> None:
    model = _small()
    key = model.keys[0]
    model.set_ber(key, 1e-9)
    model.advance(100.0)
    assert model.value(key, "symbol_errors") == round(1e-9 * model.rate_bps(0) * 100)


def test_degraded_link_reports_and_carries_the_lower_rate() -> None:
    model = _small()
    key = model.keys[0]
    full = model.rate_bps(0)
    model.degrade(key, width="1X")
    assert model.rate_bps(0) == full / 4
    info = model.link_info(0)
    assert (info.active_width, info.max_width) == ("1X", "4X")
    d0 = model.value(key, "transmit_data")
    model.advance(10.0)
    assert (model.value(key, "transmit_data") - d0) * 32 <= full / 4 * 10.0
    model.restore(key)
    assert model.link_info(model.peer_index(0)).active_width == "4X"


def test_reset_is_the_only_way_down() -> None:
    sc = load_scenario("counter-reset")
    model = FabricModel(sc.topology.build(), seed=sc.seed)
    player = ScenarioPlayer(sc, model)
    resets = {(e.at, model.port_index(player._keys[n])) for n, e in enumerate(sc.timeline)}
    prev = [list(c) for c in model.rows()]
    decreased: set[tuple[float, int]] = set()
    for t in range(10, int(sc.duration) + 1, 10):
        player.run_until(float(t))
        for i, (c, p) in enumerate(zip(model.rows(), prev, strict=True)):
            if any(a < b for a, b in zip(c, p, strict=True)):
                decreased.add((float(t), i))
        prev = [list(c) for c in model.rows()]
    assert decreased == {(at + 10 - at % 10 if at % 10 else at, i) for at, i in resets}


def test_port_sample_describes_the_port() -> None:
    model = FabricModel(fat_tree(), seed=1)
    host = model.fabric.node_by_desc("host042 mlx5_0")
    s = model.port_sample(host.guid, 1)
    assert s.identity.node_desc == "host042 mlx5_0"
    assert s.identity.device == "mlx5_41"
    assert s.identity.node_type == "ca"
    assert s.identity.link_layer == "InfiniBand"
    assert s.rate_bps == 100e9
    assert s.wide == WIDE_COUNTERS | {"transmit_wait"}  # PortCountersExtended's 64-bit copy
    # a ConnectX-6: hca_type as mlx5 writes it, and its PortXmitWait unit by family
    assert s.identity.hca_type == "MT4123"
    assert s.identity.xmit_wait == WaitUnit(8, False, "family", "ConnectX-6")
    spine = model.fabric.node_by_desc("spine01")
    unit = model.port_sample(spine.guid, 1).identity.xmit_wait
    assert unit == WaitUnit(32, True, "family", "Switch-IB 2")
    assert s.link is not None
    assert s.link.remote_node_desc == "leaf03"
    assert s.link.remote_port == "6"
    assert set(s.counters) == set(COUNTER_NAMES)


def test_no_port_sends_more_than_98_percent_of_its_link_at_full_load() -> None:
    model = FabricModel(fat_tree(radix=8, leaves=2, hosts_per_leaf=4), seed=5, load=0.98)
    before = [model.row(i)[IX["transmit_data"]] for i in range(len(model.keys))]
    model.advance(10.0)
    for i, d0 in enumerate(before):
        sent = (model.row(i)[IX["transmit_data"]] - d0) * 32
        assert sent <= 0.98 * model.rate_bps(i) * 10.0 + 32
    assert max((model.row(i)[IX["transmit_data"]] - d0) * 32 / (model.rate_bps(i) * 10.0)
               for i, d0 in enumerate(before)) > 0.97  # the cap is what held them


def test_packets_follow_bytes_at_any_step_and_in_the_history() -> None:
    """Counters read at any instant show no bytes without the packets that carried them: the
    model's starting history, and steps too short for a whole packet."""
    model = _small()

    def size_ok(words: int, pkts: int) -> bool:
        return pkts * 64 <= words * 4 <= pkts * (MTU_BYTES + 126)

    rows = model.rows()
    assert all(size_ok(r[IX["transmit_data"]], r[IX["transmit_packets"]]) for r in rows)
    for _ in range(300):  # 20 ns steps: a few words each, most of a packet at the most
        model.advance(2e-8)
        cur = model.rows()
        for c, p in zip(cur, rows, strict=True):
            words = c[IX["transmit_data"]] - p[IX["transmit_data"]]
            pkts = c[IX["transmit_packets"]] - p[IX["transmit_packets"]]
            assert pkts >= (1 if words else 0)  # never down, and no bytes without a packet
            # a packet counts once whole: at most one more packet's bytes than packets
            assert words * 4 <= (pkts + 1) * (MTU_BYTES + 126)
        rows = cur


def test_a_down_link_counts_no_errors() -> None:
    model = _small()
    key = model.keys[0]
    model.set_error_rate(key, "symbol_errors", 10.0)
    model.link_down(key)
    model.advance(10.0)
    assert model.value(key, "symbol_errors") == 0
    model.link_up(key)
    model.advance(10.0)
    assert model.value(key, "symbol_errors") == 100


def test_a_flaps_transitions_happen_at_their_time_within_one_advance() -> None:
    """Down for 5 s of a 10 s advance: traffic for the 5 s it was up, not the whole step."""
    model = _small()
    key = model.keys[0]
    model.congest(key, wait_ratio=0.0, utilization=0.5)
    d0 = model.value(key, "transmit_data")
    model.flap(key, count=1, down_for=5.0)
    model.advance(10.0)
    words = model.value(key, "transmit_data") - d0
    assert words * 32 == pytest.approx(0.5 * model.rate_bps(0) * 5.0, abs=64)


def test_a_port_with_the_32_bit_wait_only_says_so_in_every_sample() -> None:
    model = _small()
    key = model.keys[3]
    model.set_value(key, "transmit_wait", 1 << 40)
    model.narrow_wait(key)
    assert model.value(key, "transmit_wait") == (1 << 32) - 1  # a 32-bit field holds no more
    (poll,) = [s for s in model.samples() if s.identity.key == (key[0], str(key[1]))]
    assert "transmit_wait" not in poll.wide
    assert poll.wide == model.port_sample(*key).wide
    assert poll.counters["transmit_wait"] == (1 << 32) - 1


def test_load_swings_slowly_so_graphs_move() -> None:
    """Each port's load follows a 15-minute swing of +-25 % (its own phase): a minute now and
    a minute half a swing later differ by more than the per-step noise on many ports."""
    model = _small()
    n = len(model.keys)

    def minute() -> list[int]:
        start = [model.row(i)[IX["transmit_data"]] for i in range(n)]
        for _ in range(60):
            model.advance(1.0)
        return [model.row(i)[IX["transmit_data"]] - start[i] for i in range(n)]

    first = minute()
    model.advance(450.0 - 60.0)
    later = minute()
    moved = [abs(a - b) / max(a, b) > 0.1 for a, b in zip(first, later, strict=True)]
    assert sum(moved) >= n // 4


def test_a_congested_port_never_sends_and_waits_more_than_the_time_there_is() -> None:
    """``congest`` allows rounding past 100 % (0.35 + 0.65 in floats): the port still sends
    at most the 65 % it does not wait."""
    model = _small()
    key = model.keys[0]
    model.congest(key, wait_ratio=0.35, utilization=0.65 + 5e-10)
    d0 = model.value(key, "transmit_data")
    model.advance(10.0)
    sent = (model.value(key, "transmit_data") - d0) * 32
    assert sent <= (1.0 - 0.35) * model.rate_bps(0) * 10.0 + 32
