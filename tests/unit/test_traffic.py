"""Physical sanity of the simulated fabric: what the real collectors are fed must be possible."""

from __future__ import annotations

import pytest

from ibmon.counters import BY_NAME
from ibmon.model import PhysState, PortState
from mocks.scenario import ScenarioPlayer, load_scenario
from mocks.topology import fat_tree
from mocks.traffic import (
    COUNTER_NAMES,
    MTU_BYTES,
    TICK_SECONDS,
    WIDE_COUNTERS,
    FabricModel,
    counter_max,
)

IX = {n: i for i, n in enumerate(COUNTER_NAMES)}
NARROW = [n for n in COUNTER_NAMES if n not in WIDE_COUNTERS]


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
            # a healthy fabric: no errors, transmit-wait far below any congestion level
            for name in NARROW:
                if name != "transmit_wait":
                    assert delta[IX[name]] == 0, name
            assert delta[IX["transmit_wait"]] * TICK_SECONDS / dt < 0.01
            assert model.state[i] == PortState.ACTIVE
            assert model.phys[i] == PhysState.LINK_UP
        prev = [list(c) for c in cur]
    assert polls == sc.duration / dt
    assert all(all(v < counter_max(nm) for nm, v in zip(COUNTER_NAMES, c, strict=True))
               for c in model.rows()), "nothing saturates in four healthy hours"


@pytest.mark.parametrize("name", NARROW)
def test_narrow_counters_saturate_at_their_width(name: str) -> None:
    model = _small()
    key = model.keys[0]
    width = BY_NAME[name].bits
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


def test_congestion_sets_the_wait_ratio_and_utilization() -> None:
    model = _small()
    key = model.keys[0]
    model.congest(key, wait_ratio=0.35, utilization=0.6)
    w0, d0 = model.value(key, "transmit_wait"), model.value(key, "transmit_data")
    model.advance(10.0)
    ratio = (model.value(key, "transmit_wait") - w0) * TICK_SECONDS / 10.0
    util = (model.value(key, "transmit_data") - d0) * 32 / (model.rate_bps(0) * 10.0)
    assert ratio == pytest.approx(0.35, rel=1e-6)
    assert util == pytest.approx(0.6, rel=1e-6)
    with pytest.raises(ValueError, match="100 %"):
        model.congest(key, wait_ratio=0.6, utilization=0.6)


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
    assert s.wide == WIDE_COUNTERS
    assert s.link is not None
    assert s.link.remote_node_desc == "leaf03"
    assert s.link.remote_port == "6"
    assert set(s.counters) == set(COUNTER_NAMES)
