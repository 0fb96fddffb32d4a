"""Scenario files: validation with clear errors, the player, and answer keys that hold.

The answer-key test runs each scenario through the model and the real Tracker at the key's poll
interval, feeds the views to a small reference detector that implements the conventions written
in ``mocks/scenario.py``, and requires exactly the expected events, each inside its window. The
BER rule runs in both readings the key allows (window over the history so far, or always 600 s).
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ibmon.infiniband.model import PortKey, PortView, Snapshot
from ibmon.track.tracker import Tracker
from mocks.scenario import (
    Congestion,
    Expected,
    Scenario,
    ScenarioError,
    ScenarioPlayer,
    build_fabric,
    iter_expected,
    list_scenarios,
    load_scenario,
    parse_scenario,
    resolve_port,
    running_jobs,
    squeue_json,
)
from mocks.topology import fat_tree, load_ibnetdiscover
from mocks.traffic import FabricModel

REQUIRED = {"healthy", "congestion", "link-errors", "flap", "degraded", "counter-reset",
            "saturation", "demo"}


def test_required_scenarios_are_shipped_and_load() -> None:
    names = set(list_scenarios())
    assert names >= REQUIRED
    for name in names:
        sc = load_scenario(name)
        assert sc.name == name
        assert sc.description
        assert sc.poll_interval == 1.0
        if name != "healthy":
            assert sc.timeline
            assert sc.expect
    assert load_scenario("healthy").duration >= 3 * 3600
    assert load_scenario("demo").loop


def test_load_by_path_and_unknown_name(tmp_path: Path) -> None:
    p = tmp_path / "mine.yaml"
    p.write_text("name: mine\ndescription: d\nduration: 60\n")
    assert load_scenario(p).name == "mine"
    with pytest.raises(ScenarioError, match=r"unknown scenario 'nope'.*healthy"):
        load_scenario("nope")
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "missing.yaml")


BASE = "name: x\ndescription: d\nduration: 600\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (BASE + "timeline:\n  - {at: 10, fault: ber, port: 'leaf01[20]', ber: 2}\n",
         r"<t>:5: timeline\[0\]\.ber: Input should be less than 0\.001"),
        (BASE + "timeline:\n  - at: 10\n    fault: flap\n    port: 'leaf09[3]'\n",
         r"<t>:7: timeline\[0\]\.port: no node 'leaf09'"),
        (BASE + "timeline:\n  - {at: 10, fault: ber, port: 'leaf01[40]', ber: 1e-9}\n",
         r"<t>:5: timeline\[0\]\.port: leaf01\[40\] is not a connected port"),
        (BASE + "timeline:\n  - {at: 10, fault: meteor, port: 'leaf01[2]'}\n",
         r"<t>:5: timeline\[0\]: Input tag 'meteor'"),
        (BASE + "timeline:\n  - {at: 10, fault: flap, port: 'leaf01[2]', colour: red}\n",
         r"<t>:5: timeline\[0\]\.colour: Extra inputs are not permitted"),
        (BASE + "timeline:\n  - {at: 10, fault: congestion, port: 'leaf01[2]', kind: hotspot,"
                " wait_ratio: 0.7, utilization: 0.6}\n",
         r"timeline\[0\].*must not exceed 1"),
        (BASE + "timeline:\n  - {at: 10, fault: saturate, port: 'leaf01[2]'}\n",
         r"timeline\[0\].*needs at: 0"),
        (BASE + "expect:\n  - {type: bogus, port: 'leaf01[1]', status: firing, window: [1, 2]}\n",
         r"<t>:5: expect\[0\]\.type: Input should be 'port_down'"),
        (BASE + "expect:\n  - {type: port_down, port: 'leaf01[1]', status: firing,"
                " window: [3, 1]}\n",
         r"<t>:5: expect\[0\]\.window: window must be \[from, to\]"),
        (BASE + "topology: {leaves: 99}\n", r"<t>:4: topology: 99 leaves need"),
        # a count is bytes of the port's device family now, not a time the file could set
        (BASE + "tick_seconds: 6.4e-8\n",
         r"<t>:4: tick_seconds: no longer a scenario setting.*device family.*delete the line"),
        (BASE + "topology: {host_link: 4X QQR}\n", r"<t>:4: topology\.host_link: .*'4X QQR'"),
        ("name: x\ndescription: [unclosed\nduration: 5\n", r"<t>:3: YAML syntax error"),
        ("name: x\n", r"<t>:1: \(top level\)\.?.*duration.*Field required|duration: Field"),
        ("- just\n- a list\n", r"a scenario is a mapping"),
        (BASE + "timeline:\n  - {at: 10, fault: flap, port: 'leaf01[2]', every: 5, down_for: 5}\n",
         r"timeline\[0\].*every must be longer than down_for"),
        (BASE + "timeline:\n  - {at: 10, for: 30, fault: flap, port: 'leaf01[2]'}\n",
         r"timeline\[0\].*'for' is not used by flap"),
        (BASE + "timeline:\n  - {at: 10, fault: degraded, port: 'leaf01[2]'}\n",
         r"timeline\[0\].*degraded needs width and/or speed"),
        (BASE + "timeline:\n  - {at: 10, fault: degraded, port: 'leaf01[2]', width: 3X}\n",
         r"timeline\[0\].*width '3X' is not one of"),
        (BASE + "timeline:\n  - {at: 10, fault: degraded, port: 'leaf01[2]', speed: QQR}\n",
         r"timeline\[0\].*speed 'QQR' is not one of"),
        (BASE + "timeline:\n  - {at: 10, fault: counter_reset, port: 'leaf01[2]',"
                " counters: [symbol_errors, bogus]}\n",
         r"timeline\[0\]\.counters: .*unknown counters \['bogus'\]"),
        (BASE + "timeline:\n  - {at: 0, fault: saturate, port: 'leaf01[2]',"
                " counter: transmit_data}\n",
         r"timeline\[0\].*'transmit_data' is not a narrow counter"),
        (BASE + "timeline:\n  - {at: 600, fault: link_down, port: 'leaf01[2]'}\n",
         r"timeline\[0\]\.at: 600\.0 is not before duration 600"),
        (BASE + "loop: true\ntimeline:\n  - {at: 590, for: 20, fault: link_down,"
                " port: 'leaf01[2]'}\n",
         r"timeline\[0\]: ends at 610\.0, after the loop's duration"),
        # the ends of a flap (the last one back up) and of an integrity series (its last bump)
        (BASE + "loop: true\ntimeline:\n  - {at: 476, fault: flap, port: 'leaf01[2]'}\n",
         r"timeline\[0\]: ends at 601\.0, after the loop's duration"),
        (BASE + "loop: true\ntimeline:\n  - {at: 490, fault: integrity, port: 'leaf01[2]',"
                " count: 3}\n",
         r"timeline\[0\]: ends at 610\.0, after the loop's duration"),
        (BASE + "loop: true\ntimeline:\n  - {at: 0, fault: saturate, port: 'leaf01[2]'}\n",
         r"a looping scenario cannot use saturate"),
        (BASE + "expect:\n  - {type: port_down, port: 'leaf01[1]', status: firing,"
                " window: [601, 700]}\n",
         r"expect\[0\]\.window: starts after duration 600"),
        (BASE + "jobs:\n  - {id: 1, name: j, hosts: 'host[001-002]', start: 10, end: 10}\n",
         r"<t>:5: jobs\[0\]: .*end must be after start"),
        (BASE + "jobs:\n  - {id: 1, name: j, hosts: 'host[071-073]'}\n",
         r"jobs\[0\]\.hosts: no such host: host073"),
    ],
)
def test_invalid_scenarios_name_line_and_field(text: str, expected: str) -> None:
    with pytest.raises(ScenarioError, match=expected):
        parse_scenario(text, source="<t>")


def test_missing_field_is_named() -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario("name: x\n", source="f.yaml")
    text = str(info.value)
    assert "f.yaml:1: duration: Field required" in text
    assert "f.yaml:1: description: Field required" in text


def test_valid_edges_of_a_scenario_file() -> None:
    """What the checks above must not refuse: a flap whose last cycle ends exactly at the loop's
    end, link kinds written ``4x HDR`` or ``4XHDR``, and an explicit zero stall fraction."""
    sc = parse_scenario(BASE + "loop: true\ntopology: {host_link: 4x HDR, leaf_link: 4XHDR}\n"
                        "timeline:\n  - {at: 475, fault: flap, port: 'leaf01[2]'}\n"
                        "  - {at: 10, fault: congestion, port: 'leaf01[3]', kind: hotspot,"
                        " wait_ratio: 0}\n")
    fabric = sc.topology.build()
    assert {(lk.width, lk.speed) for lk in fabric.links} == {("4X", "HDR")}
    congestion = sc.timeline[1]
    assert isinstance(congestion, Congestion) and congestion.levels() == (0.0, 0.6)


def test_jobs_run_from_start_to_end_in_every_loop() -> None:
    sc = parse_scenario(BASE + "loop: true\njobs:\n  - {id: 7, name: j, hosts: 'host[001-002]',"
                        " start: 10, end: 20}\n")
    for t, running in ((9.9, False), (10, True), (19.9, True), (20, False), (610, True),
                       (1215, True), (1220, False)):
        assert bool(running_jobs(sc, t)) is running, t
    listed = json.loads(squeue_json(running_jobs(sc, 10), started=1000.0))["jobs"]
    assert [(j["job_id"], j["start_time"], j["nodes"]) for j in listed] == [
        (7, 1010, "host[001-002]")]


def test_player_clears_before_it_applies_and_at_the_end_of_each_loop() -> None:
    """At one instant a fault's end comes before the next fault's start (a link down again as
    it comes back stays down); a looping scenario clears what is still in force at its end; an
    integrity bump is an instant, never a fault in force."""
    sc = parse_scenario(BASE + "loop: true\ntimeline:\n"
                        "  - {at: 15, for: 5, fault: link_down, port: 'leaf01[2]'}\n"
                        "  - {at: 10, for: 5, fault: link_down, port: 'leaf01[2]'}\n"
                        "  - {at: 500, fault: link_down, port: 'leaf01[3]'}\n"
                        "  - {at: 30, fault: integrity, port: 'leaf01[4]'}\n")
    model = FabricModel(sc.topology.build())
    player = ScenarioPlayer(sc, model)
    again, forever = (model.port_index(resolve_port(model.fabric, f"leaf01[{p}]")) for p in (2, 3))
    player.run_until(17)
    assert model.state[again] == 1
    player.run_until(31)
    assert model.state[again] == 4
    assert player.active() == []  # the integrity bump at 30 is over
    player.run_until(550)
    assert model.state[forever] == 1 and player.active() == ["link_down on leaf01[3]"]
    player.run_until(610)  # the second loop: leaf01[3] is back until 1100
    assert model.state[forever] == 4


def test_hosts_override_keeps_the_scenario_leaf_shape() -> None:
    sc = parse_scenario(BASE + "topology: {radix: 8, leaves: 2, hosts_per_leaf: 2}\n")
    fabric = build_fabric(sc, hosts=10)
    assert len(fabric.hosts()) == 10
    assert sum(n.desc.startswith("leaf") for n in fabric.nodes.values()) == 5


def test_a_reference_two_nodes_match_by_number_is_refused() -> None:
    fabric = load_ibnetdiscover('Switch 2 "leaf03"\n[1] "leaf003"[1]\n\n'
                                'Switch 2 "leaf003"\n[1] "leaf03"[1]\n')
    with pytest.raises(ValueError, match="no node 'leaf3'"):
        resolve_port(fabric, "leaf3[1]")
    assert fabric.nodes[resolve_port(fabric, "leaf03[1]")[0]].desc == "leaf03"


def test_ports_resolve_across_zero_padding() -> None:
    small = fat_tree()
    big = fat_tree(levels=3, radix=36, leaves=120, hosts_per_leaf=18)
    assert big.node_by_desc("leaf003")
    assert resolve_port(small, "leaf03[12]")[1] == 12
    assert big.nodes[resolve_port(big, "leaf03[12]")[0]].desc == "leaf003"
    assert big.nodes[resolve_port(big, "host042 mlx5_0[1]")[0]].desc == "host0042 mlx5_0"


def test_hosts_override_keeps_scenario_ports() -> None:
    sc = load_scenario("demo")
    fabric = build_fabric(sc, hosts=3000)
    assert len(fabric.hosts()) >= 3000
    for e in sc.timeline:
        resolve_port(fabric, e.port)
    with pytest.raises(ScenarioError, match="--hosts 10"):
        build_fabric(sc, hosts=10)


def test_player_applies_faults_exactly_on_time() -> None:
    sc = parse_scenario(BASE + "timeline:\n  - {at: 10.5, for: 2, fault: link_down,"
                        " port: 'leaf01[2]'}\n")
    model = FabricModel(sc.topology.build())
    player = ScenarioPlayer(sc, model)
    key = resolve_port(model.fabric, "leaf01[2]")
    i = model.port_index(key)
    player.run_until(10.4)
    assert model.state[i] == 4
    before = model.value(key, "transmit_data")
    player.run_until(11.0)
    assert model.state[i] == 1
    # traffic stopped at 10.5 exactly: compare with the data that 0.1 s more would have added
    assert model.value(key, "transmit_data") - before < 0.98 * model.rate_bps(i) * 0.2 / 32
    player.run_until(12.6)
    assert model.state[i] == 4
    assert model.value(key, "link_downed") == 1


def test_demo_loops() -> None:
    sc = load_scenario("demo")
    model = FabricModel(sc.topology.build(), seed=sc.seed)
    player = ScenarioPlayer(sc, model)
    key = resolve_port(model.fabric, "leaf02[3]")
    player.run_until(sc.duration - 1)
    assert model.value(key, "link_downed") == 3
    player.run_until(2 * sc.duration - 1)
    assert model.value(key, "link_downed") == 6
    assert player.loop_start == sc.duration
    keys = list(iter_expected(sc, loops=2))
    assert len(keys) == 2 * len(sc.expect)
    assert keys[len(sc.expect)].window[0] == sc.expect[0].window[0] + sc.duration


# --------------------------------------------------------------------------------------------
# Answer keys against a reference detector


@dataclass
class Event:
    type: str
    port: PortKey
    status: str
    t: float
    severity: str | None = None
    details: dict[str, str] = field(default_factory=dict)


@dataclass
class _PortState:
    active_seen: bool = False
    down: bool = False
    degraded: bool = False
    downs: list[float] = field(default_factory=list)
    flapping: bool = False
    sym: deque[tuple[float, int]] = field(default_factory=deque)
    ber_level: int = 0
    integrity_last: float | None = None
    rcv: bool = False
    disc: bool = False
    cong: int = 0
    above: int = 0
    crit: int = 0
    below: int = 0
    resets: int = 0
    saturated: frozenset[str] = frozenset()
    totals: dict[str, int] = field(default_factory=dict)
    inc: dict[str, int] = field(default_factory=dict)


#: The causes of each detail counter, per aggregate (written out, not imported).
_DETAIL_CAUSE: dict[str, dict[str, str]] = {
    "receive_errors": {
        "receive_local_physical_errors": "physical",
        "receive_malformed_packet_errors": "mtu_mismatch",
        "receive_buffer_overrun_errors": "buffer_overrun",
        "receive_dlid_mapping_errors": "routing",
        "receive_vl_mapping_errors": "routing",
        "receive_looping_errors": "routing",
    },
    "transmit_discards": {
        "transmit_inactive_discards": "link_down",
        "transmit_neighbor_mtu_discards": "mtu_mismatch",
        "transmit_sw_lifetime_limit_discards": "congestion_victim",
        "transmit_sw_hoq_lifetime_limit_discards": "congestion_victim",
    },
}


class Reference:
    """The conventions of mocks/scenario.py, as plainly as possible.

    Link faults (down, degraded, flapping) are judged per port, then once per link: the link
    has the fault while either end does, and the event is on the carrying end (the switch end
    of a host link, the lower (GUID, port) of a switch-to-switch link).
    """

    def __init__(self, *, full_window: bool) -> None:
        self.full_window = full_window
        self.ports: dict[PortKey, _PortState] = {}
        self.events: list[Event] = []
        self.links: dict[tuple[str, PortKey], bool] = {}

    def _emit(self, key: PortKey, t: float, type_: str, status: str,
              severity: str | None = None, **details: str) -> None:
        self.events.append(Event(type_, key, status, t, severity, dict(details)))

    def update(self, t: float, views: dict[PortKey, PortView]) -> None:
        for key, v in views.items():
            st = self.ports.setdefault(key, _PortState())
            first = not st.totals
            inc = {c: v.totals[c] - st.totals.get(c, v.totals[c]) for c in v.totals}
            st.totals = dict(v.totals)
            self._state(st, v)
            self._flaps(t, st, inc, first)
            self._ber(key, t, v, st)
            self._integrity(key, t, st, inc)
            st.inc = inc
            self._rates(key, t, v, st)
            self._congestion(key, t, v, st)
            self._counters(key, t, v, st)
        self._links(t, views)

    def _links(self, t: float, views: dict[PortKey, PortView]) -> None:
        for key, v in views.items():
            peer = (v.link.remote_guid, v.link.remote_port) if v.link else None
            ends = [key] + ([peer] if peer in views else [])
            if peer in views and key > peer:
                continue  # each link once
            switches = [k for k in ends if views[k].identity.node_type == "switch"]
            carrier = switches[0] if len(switches) == 1 else min(ends)
            states = [self.ports[k] for k in ends]
            ber = any(self.ports[k].ber_level for k in ends)
            for type_, on, cause in (
                ("port_down", any(s.down for s in states), "link_down"),
                ("link_degraded", any(s.degraded for s in states), "speed_negotiation"),
                ("link_flapping", any(s.flapping for s in states),
                 "physical" if ber else "link_down"),
            ):
                was = self.links.get((type_, carrier), False)
                if on and not was:
                    self._emit(carrier, t, type_, "firing", cause=cause)
                elif was and not on:
                    self._emit(carrier, t, type_, "resolved")
                self.links[(type_, carrier)] = on

    def _state(self, st: _PortState, v: PortView) -> None:
        if v.state == 4:
            st.active_seen, st.down = True, False
        elif st.active_seen:
            st.down = True
        link = v.link
        st.degraded = link is not None and (link.active_width, link.active_speed) != (
            link.max_width, link.max_speed)

    def _flaps(self, t: float, st: _PortState, inc: dict[str, int], first: bool) -> None:
        if not first:
            st.downs += [t] * inc["link_downed"]
        st.downs = [d for d in st.downs if d > t - 600]
        st.flapping = len(st.downs) >= 3

    def _ber(self, key: PortKey, t: float, v: PortView, st: _PortState) -> None:
        st.sym.append((t, v.totals["symbol_errors"]))
        while st.sym[0][0] < t - 600:
            st.sym.popleft()
        t0, e0 = st.sym[0]
        span = 600.0 if self.full_window else t - t0
        rate = (v.rate_bytes_per_second or 0.0) * 8
        ber = (v.totals["symbol_errors"] - e0) / (span * rate) if span > 0 and rate else 0.0
        level = 2 if ber >= 1e-10 else 1 if ber >= 1e-12 else 0
        if level > st.ber_level:
            self._emit(key, t, "high_ber", "firing", "critical" if level == 2 else "warning",
                       cause="physical")
            st.ber_level = level
        elif level == 0 and st.ber_level:
            self._emit(key, t, "high_ber", "resolved")
            st.ber_level = 0

    def _integrity(self, key: PortKey, t: float, st: _PortState, inc: dict[str, int]) -> None:
        if inc["local_link_integrity_errors"] or inc["excessive_buffer_overrun_errors"]:
            if st.integrity_last is None:
                physical = inc["local_link_integrity_errors"] >= inc[
                    "excessive_buffer_overrun_errors"]
                self._emit(key, t, "link_integrity", "firing",
                           cause="physical" if physical else "buffer_overrun")
            st.integrity_last = t
        elif st.integrity_last is not None and t - st.integrity_last >= 600:
            self._emit(key, t, "link_integrity", "resolved")
            st.integrity_last = None

    def _rates(self, key: PortKey, t: float, v: PortView, st: _PortState) -> None:
        for name, limit, attr, type_ in (("receive_errors", 10, "rcv", "receive_errors"),
                                         ("transmit_discards", 100, "disc", "discards")):
            rate = v.rates.get(name)
            if rate is None:
                continue
            on = rate > limit
            if on != getattr(st, attr):
                setattr(st, attr, on)
                if not on:
                    self._emit(key, t, type_, "resolved")
                    continue
                # the simulated fabric raises one detail counter with its aggregate: its cause
                moved = {c: n for c, n in st.inc.items() if c in _DETAIL_CAUSE[name] and n > 0}
                cause = _DETAIL_CAUSE[name][max(moved, key=moved.__getitem__)] if moved \
                    else "unknown"
                self._emit(key, t, type_, "firing", cause=cause)

    def _congestion(self, key: PortKey, t: float, v: PortView, st: _PortState) -> None:
        r = v.xmit_wait_ratio
        if r is None:
            return
        st.above = st.above + 1 if r >= 0.10 else 0
        st.crit = st.crit + 1 if r >= 0.50 else 0
        st.below = st.below + 1 if r < 0.05 else 0
        level = 2 if st.crit >= 3 else 1 if st.above >= 3 else 0
        if level > st.cong:
            kind = "hotspot" if (v.utilization_tx or 0.0) >= 0.5 else "backpressure"
            cause = "congestion_victim" if kind == "backpressure" else "unknown"
            self._emit(key, t, "congestion", "firing", "critical" if level == 2 else "warning",
                       kind=kind, cause=cause)
            st.cong = level
        elif st.cong and st.below >= 3:
            self._emit(key, t, "congestion", "resolved")
            st.cong = 0

    def _counters(self, key: PortKey, t: float, v: PortView, st: _PortState) -> None:
        n = sum(v.resets.values())
        if n > st.resets:
            self._emit(key, t, "counter_reset", "firing", "info")
        st.resets = n
        for c in sorted(v.saturated - st.saturated):
            self._emit(key, t, "counter_saturated", "firing", counter=c)
        for c in sorted(st.saturated - v.saturated):
            self._emit(key, t, "counter_saturated", "resolved", counter=c)
        st.saturated = v.saturated


def _run(sc: Scenario, *, full_window: bool, step: float, all_ports: bool) -> list[Event]:
    model = FabricModel(sc.topology.build(), seed=sc.seed, load=sc.load)
    player = ScenarioPlayer(sc, model)
    if all_ports:
        watched = list(range(len(model.keys)))
    else:
        idx = {model.port_index(resolve_port(model.fabric, r))
               for r in [e.port for e in sc.timeline] + [x.port for x in sc.expect]}
        watched = sorted(idx | {model.peer_index(i) for i in idx})
    tracker = Tracker()
    ref = Reference(full_window=full_window)
    t = 0.0
    while t <= sc.duration:
        player.run_until(t)
        snap = Snapshot(source="mock", monotonic=t, wall=1.7e9 + t)
        for i in watched:
            s = model.sample_index(i)
            snap.ports[s.key] = s
        ref.update(t, tracker.update(snap))
        t += step
    return ref.events


def _match(sc: Scenario, events: list[Event], fabric_keys: dict[str, PortKey]) -> list[str]:
    problems: list[str] = []
    left = list(events)
    for exp in sc.expect:
        key = fabric_keys[exp.port]
        hit = next((e for e in left if _fits(exp, key, e)), None)
        if hit is None:
            near = [(e.t, e.severity, e.details) for e in events
                    if e.type == exp.type and e.port == key and e.status == exp.status]
            problems.append(f"missing {exp.type} {exp.status} {exp.port} in {exp.window}: "
                            f"got {near}")
        else:
            left.remove(hit)
    problems += [f"unexpected {e.type} {e.status} {e.port} at {e.t} {e.severity} {e.details}"
                 for e in left]
    return problems


def _fits(exp: Expected, key: PortKey, e: Event) -> bool:
    return (e.type == exp.type and e.port == key and e.status == exp.status
            and exp.window[0] <= e.t <= exp.window[1]
            and (exp.severity is None or exp.severity == e.severity)
            and all(e.details.get(k) == v for k, v in exp.details.items()))


KEYED = sorted(REQUIRED - {"healthy"})
BER_SCENARIOS = ["demo", "link-errors"]


@pytest.mark.parametrize(
    ("name", "full_window"),
    [(n, False) for n in KEYED] + [(n, True) for n in BER_SCENARIOS],
    ids=[f"{n}-history" for n in KEYED] + [f"{n}-full600" for n in BER_SCENARIOS],
)
def test_answer_key_holds(name: str, full_window: bool) -> None:
    sc = load_scenario(name)
    fabric = sc.topology.build()
    keys = {}
    for x in sc.expect:
        g, p = resolve_port(fabric, x.port)
        keys[x.port] = (g, str(p))
    events = _run(sc, full_window=full_window, step=sc.poll_interval, all_ports=False)
    assert _match(sc, events, keys) == []


def test_healthy_is_silent_on_every_port() -> None:
    sc = load_scenario("healthy")
    events = _run(sc, full_window=False, step=60.0, all_ports=True)
    assert events == []
