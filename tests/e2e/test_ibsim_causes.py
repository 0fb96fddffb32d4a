"""End to end, for each likely cause: ibsim counters -> the ``diags`` source -> the daemon's event,
its one-port API, ``ibmon explain`` and the firing alert through real Prometheus and Alertmanager
all name the same cause and both ends of the link.

One ibsim + opensm fabric (two leaves, two spines, eight hosts), one daemon polling it through
infiniband-diags every second, every fault at once on its own port, kept up by an injector that
raises the counters (aggregate and detail consistently) a little every half second:

- physical: host003's PortRcvErrors and SymbolErrorCounter (and PortLocalPhysicalErrors)
  rise: receive_errors;
- buffer_overrun: one ExcessiveBufferOverrunError on leaf02 port 2: link_integrity;
- congestion_victim: spine01 port 7 (a Switch-IB 2: 32 bytes a count per lane) waits 30 % of
  the time, sending nothing: congestion (ibsim's PortXmitWait is 32-bit only: at this rate it
  fills in about 145 s, after the test);
- link_down: the leaf01 port 5 uplink is unlinked: port_down, once, on the leaf end;
- routing: leaf01 port 2's PortRcvErrors and PortRcvErrorDetails.PortDLIDMappingErrors rise;
- mtu_mismatch: leaf02 port 4's PortXmitDiscards and
  PortXmitDiscardDetails.PortNeighborMTUDiscards rise: discards;
- the other detail counters, one port each: malformed packets on leaf01 port 1 (mtu_mismatch),
  receive buffer overruns on leaf02 port 1 (buffer_overrun), inactive discards on leaf01 port 4
  (link_down), switch lifetime limit discards on leaf02 port 3 (congestion_victim).

``routing`` and ``mtu_mismatch`` come only from the detail counters, which the ``diags`` source
reads (``perfquery -E``/``-D``) for ports whose aggregate moved. Values stop at the counter's
width, as the hardware's do (16-bit counters saturate; ibsim would take a larger value).
``speed_negotiation`` is not here: ibsim cannot retrain a live link at a lower width or speed
(docs/infiniband.md §6); the degraded scenario and the promtool tests cover it. Every other port
of the fabric must stay silent.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ibmon.config import load_settings
from ibmon.infiniband.counters import BY_PMA
from ibmon.infiniband.xmitwait import counts_for
from ibmon.runtime.daemon import Daemon
from ibmon.sources.diags import DiagsSource, SubprocessRunner
from mocks.ibsim import IbSim
from mocks.topology import Fabric, fat_tree, to_ibsim_netfile
from tests.e2e.test_prometheus_alertmanager import (
    ALERT_RULES,
    RECORDING_RULES,
    Proc,
    alertmanager_proc,
    fast_rules,
    firing,
    http_get,
    prometheus_config,
    wait_until,
    webhook_server,
)
from tests.ibsim_fixtures import require_ibsim
from tests.mqtt_broker import free_port
from tests.syspkg import require_binary

pytestmark = pytest.mark.system

IBMON = Path(sys.executable).with_name("ibmon")
FAB: Fabric = fat_tree(levels=2, radix=8, leaves=2, hosts_per_leaf=4)
DEADLINE = 120.0


def node_id(desc: str) -> str:
    node = FAB.node_by_desc(desc)
    return ("S-" if node.kind == "switch" else "H-") + node.guid[2:]


def key(desc: str, port: int) -> tuple[str, str]:
    return FAB.node_by_desc(desc).guid, str(port)


def peer_desc(desc: str, port: int) -> str:
    guid = FAB.node_by_desc(desc).guid
    link = FAB.link_of(guid, port)
    assert link is not None
    far = link.b if link.a == (guid, port) else link.a
    return FAB.nodes[far[0]].desc


# (cause, event type, alert, node, port, counters raised per tick: name -> step)
CASES: list[tuple[str, str, str, str, int, dict[str, int]]] = [
    ("physical", "receive_errors", "IBPortReceiveErrors", "host003 mlx5_0", 1,
     {"PortRcvErrors": 400, "SymbolErrorCounter": 400,
      "PortRcvErrorDetails.PortLocalPhysicalErrors": 400}),
    ("congestion_victim", "congestion", "IBPortCongestion", "spine01", 7,
     # 30 % of 0.5 s on 4X EDR (12.5e9 bytes/s) at 128 bytes a count
     {"PortXmitWait": round(counts_for(0.3, 128.0, 12.5e9, 0.5))}),
    ("routing", "receive_errors", "IBPortReceiveErrors", "leaf01", 2,
     {"PortRcvErrors": 200, "PortRcvErrorDetails.PortDLIDMappingErrors": 200}),
    ("mtu_mismatch", "discards", "IBPortTransmitDiscards", "leaf02", 4,
     {"PortXmitDiscards": 300, "PortXmitDiscardDetails.PortNeighborMTUDiscards": 300}),
    # the other detail counters, each on a port of its own, the cause written out literally
    ("mtu_mismatch", "receive_errors", "IBPortReceiveErrors", "leaf01", 1,
     {"PortRcvErrors": 200, "PortRcvErrorDetails.PortMalformedPktErrors": 200}),
    ("buffer_overrun", "receive_errors", "IBPortReceiveErrors", "leaf02", 1,
     {"PortRcvErrors": 200, "PortRcvErrorDetails.PortBufferOverrunErrors": 200}),
    ("link_down", "discards", "IBPortTransmitDiscards", "leaf01", 4,
     {"PortXmitDiscards": 300, "PortXmitDiscardDetails.PortInactiveDiscards": 300}),
    ("congestion_victim", "discards", "IBPortTransmitDiscards", "leaf02", 3,
     {"PortXmitDiscards": 300, "PortXmitDiscardDetails.PortSwLifetimeLimitDiscards": 300}),
]
#: Where a raised counter stops (its PMA width); the others here are 16-bit.
WIDEST = {"PortXmitWait": 0xFFFF_FFFF}
ONCE = [("buffer_overrun", "link_integrity", "IBLinkIntegrityErrors", "leaf02", 2,
         {"ExcessiveBufferOverrunErrors": 1})]
UPLINK = ("leaf01", 5)


@contextlib.contextmanager
def injector(sim: IbSim) -> Iterator[None]:
    """Raise every rising case's counters each half second until the test ends.

    A PerformanceSet that ibsim refuses fails the test when the injector stops (a case whose
    counters never moved must not pass or time out silently).
    """
    stop = threading.Event()
    values = {(desc, port, name): 0 for _, _, _, desc, port, steps in CASES for name in steps}
    refused: list[BaseException] = []

    def run() -> None:
        while not stop.wait(0.5):
            for _, _, _, desc, port, steps in CASES:
                update = {}
                for name, step in steps.items():
                    top = WIDEST.get(name.rpartition(".")[2], 0xFFFF)
                    values[(desc, port, name)] = min(values[(desc, port, name)] + step, top)
                    update[name] = values[(desc, port, name)]
                try:
                    sim.set_counters(node_id(desc), port, update)
                except Exception as exc:  # reported when the injector stops
                    refused.append(exc)
                    return

    thread = threading.Thread(target=run, name="ibsim-injector", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)
    assert not refused, f"ibsim refused the injected counters: {refused[0]!r}"


def ibmon(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(IBMON), *args], capture_output=True, text=True, timeout=120,
                          check=False)


async def test_each_cause_is_named_alike_by_event_api_explain_and_alert(tmp_path: Path) -> None:
    require_ibsim()
    prometheus = require_binary("prometheus")
    alertmanager = require_binary("prometheus-alertmanager")
    expected = [*CASES, *ONCE, ("link_down", "port_down", "IBPortDown", *UPLINK, {})]
    with IbSim(to_ibsim_netfile(FAB)) as sim, webhook_server() as (hook, hook_port), \
            contextlib.ExitStack() as stack:
        sim.reap_clients()
        settings = load_settings(None, prometheus={"listen": "127.0.0.1:0"},
                                 sources=[{"type": "diags", "name": "fabric", "interval": 1.0}])

        def source(cfg: Any) -> DiagsSource:
            runner = SubprocessRunner(concurrency=4, env=sim.tool_env(), cwd=sim.workdir)
            return DiagsSource(name=cfg.label, runner=runner, state_interval=1.0,
                               topology_interval=60.0)

        daemon = Daemon(settings, source_factory=source)
        task = asyncio.create_task(daemon.run())
        procs: list[Proc] = []
        try:
            await asyncio.wait_for(daemon.ready.wait(), 60)
            assert daemon.exporter is not None
            base = f"http://127.0.0.1:{daemon.exporter.port}"
            am, am_port = alertmanager_proc(alertmanager, hook_port, tmp_path)
            prom_port = free_port()
            rules = [fast_rules(RECORDING_RULES, tmp_path / RECORDING_RULES.name),
                     fast_rules(ALERT_RULES, tmp_path / ALERT_RULES.name)]
            prom = f"http://127.0.0.1:{prom_port}"
            server = Proc("prometheus", [
                prometheus, "--config.file="
                + str(prometheus_config(daemon.exporter.port, am_port, rules, tmp_path / "p.yml")),
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}", "--rules.alert.resend-delay=1s",
            ], tmp_path / "prometheus.log")
            for p in (am, server):
                p.start()
                procs.append(p)
                stack.callback(p.stop)
            # Baselines before any fault: a port first read after its one-off increase would
            # take the raised value as its start and never see it rise (seen on a loaded CI
            # machine, where the first polls took longer than a fixed wait). Two reads of each
            # port that changes once (its rates exist), zero where the fault will show.
            def read_clean(desc: str, port: int, counters: dict[str, int]) -> bool:
                guid, number = key(desc, port)
                body = http_get(f"{base}/api/v1/ports/{guid}/{number}")["port"]
                names = [BY_PMA[name].name for name in counters]
                return bool(body["rates"]) and all(body["totals"].get(n) == 0 for n in names)

            await asyncio.to_thread(
                wait_until, "two clean polls of each one-off fault's port",
                lambda: all(read_clean(d, p, c) for _, _, _, d, p, c in ONCE), 60, procs)
            assert [e for e in daemon.bus.history if e.port is not None] == []
            for _, _, _, desc, port, counters in ONCE:
                sim.set_counters(node_id(desc), port, counters)
            sim.unlink(node_id(UPLINK[0]), UPLINK[1])
            with injector(sim):
                missing: list[str] = []  # the alerts not firing yet, named on a timeout

                def all_alerts() -> bool:
                    missing[:] = [f"{alert} on {d}[{p}]" for _, _, alert, d, p, _ in expected
                                  if not any(a["guid"] == key(d, p)[0] and a["port"] == str(p)
                                             for a in firing(prom, alert))]
                    return not missing

                try:
                    await asyncio.to_thread(wait_until, "every case's alert firing in Prometheus",
                                            all_alerts, DEADLINE, procs)
                except AssertionError as exc:
                    raise AssertionError(f"{exc}; not firing: {missing}") from None
                await asyncio.to_thread(
                    wait_until, "every case's alert at the webhook",
                    lambda: all(any(a["labels"]["guid"] == key(d, p)[0]
                                    for a in hook.alerts(alert, "firing"))
                                for _, _, alert, d, p, _ in expected), 60, procs)
                for cause, kind, alert, desc, port, raised in expected:
                    await check_case(daemon, base, prom, hook, cause, kind, alert, desc, port,
                                     raised)
            # nothing else fired: one event per case (the link once), no other port
            fired = {(e.type, e.port.guid, e.port.port) for e in daemon.bus.history
                     if e.status == "firing" and e.port is not None}
            wanted = {(kind, *key(d, p)) for _, kind, _, d, p, _ in expected}
            wanted.add(("high_ber", *key("host003 mlx5_0", 1)))  # its symbol errors, physical
            assert fired == wanted, (f"missing {sorted(wanted - fired)}, "
                                     f"unexpected {sorted(fired - wanted)}")
        finally:
            daemon.stop()
            await asyncio.wait_for(task, 60)
            sim.reap_clients()


async def check_case(daemon: Daemon, base: str, prom: str, hook: Any, cause: str, kind: str,
                     alert: str, desc: str, port: int, raised: dict[str, int]) -> None:
    guid, number = key(desc, port)
    far = peer_desc(desc, port)
    where = f"{cause}: {desc}[{port}]"
    # the event
    # one firing, or two when it escalated (a loaded machine's late polls see a larger stall:
    # warning, then critical): every one names the cause
    events = [e for e in daemon.bus.history if e.type == kind and e.status == "firing"
              and e.port is not None and (e.port.guid, e.port.port) == (guid, number)]
    assert 1 <= len(events) <= 2, (where, [e.message for e in events])
    assert [e.details["cause"] for e in events] == [cause] * len(events), where
    assert all(e.details.get("escalated") for e in events[1:]), where
    event = events[-1]
    assert event.peer is not None
    assert event.peer.node_desc == far, where
    assert f"{desc} port {port}" in event.details["action"], where
    assert far in event.details["action"], where
    # the one-port API
    body = await asyncio.to_thread(http_get, f"{base}/api/v1/ports/{guid}/{number}")
    (cond,) = [c for c in body["conditions"] if c["type"] == kind]
    assert (cond["cause"], cond["on"]) == (cause, "port"), where
    assert body["peer"]["node_desc"] == far, where
    # the breakdown names the detail counter that was raised
    for detail in [BY_PMA[n.rpartition(".")[2]].name for n in raised if "Details." in n]:
        assert cond["breakdown"][detail] > 0, (where, cond["breakdown"])
        assert event.details["breakdown"][detail] > 0, (where, event.details["breakdown"])
    # ibmon explain
    proc = await asyncio.to_thread(ibmon, "explain", f"{guid}/{number}", "--url", base)
    assert proc.returncode == 0, proc.stderr
    assert f"likely cause {cause}" in proc.stdout, (where, proc.stdout)
    assert f"linked to {far} port" in proc.stdout, where
    # the firing alert in Prometheus and the notification
    labels = [a for a in firing(prom, alert) if (a["guid"], a["port"]) == (guid, number)]
    assert labels, where
    assert {a["cause"] for a in labels} == {cause}, (where, labels)
    assert {a["remote_node_desc"] for a in labels} == {far}, where
    sent = [a for a in hook.alerts(alert, "firing") if a["labels"]["guid"] == guid
            and a["labels"]["port"] == number]
    assert sent, where
    note = sent[0]
    assert note["labels"]["cause"] == cause, where
    assert f"likely cause {cause}" in note["annotations"]["summary"], where
    assert f"{desc} port {port}" in note["annotations"]["action"], where
    assert far in note["annotations"]["action"], where
    # and the far end of a link fault raised nothing of its own
    if kind == "port_down":
        assert not [e for e in daemon.bus.history if e.type == kind and e.port is not None
                    and e.port.node_desc == far], where
