"""An HA pair on a real fabric: two ``ibmon run`` daemons, one ibsim fabric, one Mosquitto.

Both replicas run shard 0 of 2 of the fabric of tests/shard_fabric.py (its
assignment written out there: sw-b, h2 and dual are shard 0) with the ``mad`` source, started so
that they poll at different moments of each interval, and publish to one broker. The test does
to the fabric what an operator's day does: a host link goes down and comes back (ibsim Unlink,
ReLink and an opensm sweep), the whole fabric stops answering and comes back (ibsim drops every
MAD arriving at the switch the daemons attach to), another link goes down and stays down. Then
it asserts what an HA user relies on:

- each daemon publishes the same events, each with one id in both, so a subscriber of both gets
  every event twice and drops the twin by its id;
- both export the same port and link series with the same state values (only ``instance``
  tells them apart), and the shipped rules, fed with both daemons' real scrapes, page once for
  the link that is down and count the pair as one shard: shard 1, which nobody polls, is
  reported missing (one shard, not zero: two live replicas do not stand in for it), and it
  stays so when one replica dies;
- a daemon exports its shard, and a reload replaces it.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from mocks.ibsim import IbSim
from tests.faults.ha_daemons import SimDaemon, start_apart, wait_for
from tests.faults.promise import Scrape
from tests.ibsim_fixtures import REPO, require_ibsim
from tests.mqtt_broker import Collector, Mosquitto
from tests.shard_fabric import DUAL, H2, NETFILE, SW_A, SW_B
from tests.syspkg import require_binary

pytestmark = pytest.mark.system

INTERVAL = 1.0
PROM = REPO / "deploy" / "prometheus"
#: Port and link series whose values say what state the fabric is in (totals and rates move
#: between two scrapes; these must be equal in both replicas).
STATE_SERIES = ("ibmon_port_info", "ibmon_link_info", "ibmon_port_state",
                "ibmon_port_physical_state", "ibmon_port_condition_cause")


def source(shard: str) -> str:
    return (f'type = "mad"\nname = "fabric"\ninterval = "{INTERVAL}s"\nshard = "{shard}"\n'
            'topology_interval = "1h"\ntimeout = "0.5s"\nretries = 1\n')


@pytest.fixture
def sim() -> Iterator[IbSim]:
    require_ibsim()
    with IbSim(NETFILE) as s:
        yield s


def node(switch_guid: str) -> str:
    """A switch's node id on ibsim's console (the net file names switches "S-<guid>")."""
    return f"S-{switch_guid[2:]}"


def day(sim: IbSim, pair: tuple[SimDaemon, SimDaemon]) -> tuple[Scrape, Scrape]:
    """The operator's day; returns both daemons' scrapes at its end."""
    base = [len(d.events()) for d in pair]

    def seen(n: int) -> None:
        wait_for(f"both daemons to publish {n} events", lambda: all(
            len(d.events()) - k >= n for d, k in zip(pair, base, strict=True)))

    sim.unlink(node(SW_B), 2)  # h2's link
    seen(1)
    time.sleep(0.4)
    sim.relink(node(SW_B), 2)
    sim.resweep()
    seen(2)
    time.sleep(0.3)
    sim.error(node(SW_A), None, 100)  # every MAD back to the daemons is lost: blind
    seen(3)
    time.sleep(0.6)
    sim.error(node(SW_A), None, 0)
    seen(4)
    for d in pair:  # both polling again, with every port of the shard
        d.until("a good poll", lambda s: s.value("ibmon_source_up") == 1
                and s.value("ibmon_port_info", guid=H2, port="1") is not None)
    time.sleep(0.2)
    sim.unlink(node(SW_B), 3)  # dual's port 1: stays down
    seen(5)
    time.sleep(3 * INTERVAL)  # nothing more may come
    scrapes = tuple(d.until("the down link", lambda s: s.value(
        "ibmon_port_condition_cause", guid=SW_B, port="3", condition="down") is not None)
        for d in pair)
    return scrapes[0], scrapes[1]


async def test_an_ha_pair_on_ibsim_publishes_and_exports_as_one(
    sim: IbSim, broker: Mosquitto, tmp_path: Path
) -> None:
    mqtt = f'[mqtt]\nport = {broker.port}\nkeepalive = "1s"\n'
    pair = (SimDaemon(tmp_path, sim, "a", source("0/2"), extra=mqtt),
            SimDaemon(tmp_path, sim, "b", source("0/2"), extra=mqtt))
    async with Collector(broker.port, "ibmon/main/events/#").running() as sub:
        try:
            await asyncio.to_thread(start_apart, *pair, INTERVAL)
            scrape_a, scrape_b = await asyncio.to_thread(day, sim, pair)
            a, b = (d.events() for d in pair)
            expected = 2 * len(a)
            await sub.wait_for(lambda: len(sub.messages) >= expected, within=20)
            for d in pair:
                await asyncio.to_thread(d.stop)
        finally:
            for d in pair:
                d.kill()

    kinds = [(e["type"], e["status"], e["port"]["guid"] if e["port"] else None) for e in a]
    assert kinds == [("port_down", "firing", SW_B), ("port_down", "resolved", SW_B),
                     ("source_failed", "firing", None), ("source_failed", "resolved", None),
                     ("port_down", "firing", SW_B)]
    # The same events, with the same ids, although each daemon saw them at its own moment.
    assert [e["id"] for e in a] == [e["id"] for e in b]
    assert [e["time"] for e in a] != [e["time"] for e in b]
    assert len({e["id"] for e in a}) == len(a)  # unique within one daemon
    # What a subscriber gets: every event twice (once per daemon), one id for the two copies.
    on_mqtt = [json.loads(payload) for _, payload, _ in sub.messages]
    ids = [m["id"] for m in on_mqtt]
    assert sorted(ids) == sorted(e["id"] for e in a + b)
    assert all(ids.count(i) == 2 for i in ids)

    # Both export the same series, and the same state, for the same ports of the shard.
    port_a, port_b = _port_series(scrape_a), _port_series(scrape_b)
    assert port_a.keys() == port_b.keys()
    assert {dict(lbl)["guid"] for _, lbl in port_a} == {SW_B, H2, DUAL}
    assert {k: v for k, v in port_a.items() if k[0] in STATE_SERIES} == \
        {k: v for k, v in port_b.items() if k[0] in STATE_SERIES}
    _rules_page_once_and_count_the_pair_once(scrape_a, scrape_b, a[-1], tmp_path)


def _port_series(s: Scrape) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {k: v for k, v in s.samples.items() if k[0].startswith(("ibmon_port_", "ibmon_link_"))}


def _series(s: Scrape, instance: str) -> list[tuple[str, str]]:
    """Every sample of a scrape as a promtool input series of this instance (and ``job``)."""
    out = []
    for (name, labels), value in sorted(s.samples.items()):
        if name.endswith(("_bucket", "_created")) or value != value:  # histograms, NaN
            continue
        lbl = {**dict(labels), "job": "ibmon", "instance": instance}
        text = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(lbl.items()))
        out.append((f"{name}{{{text}}}", repr(float(value))))
    return out


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _rules_page_once_and_count_the_pair_once(
    a: Scrape, b: Scrape, down: dict[str, Any], tmp: Path
) -> None:
    promtool = require_binary("promtool")
    rules = yaml.safe_load((PROM / "ibmon-alerts.rules.yml").read_text(encoding="utf-8"))
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") not in (None, "IbmonFabricShardsUncovered"):
                rule.pop("annotations", None)  # the expressions are under test, not the text
    (tmp / "alerts.rules.yml").write_text(yaml.safe_dump(rules, sort_keys=False))

    guid, port = down["port"]["guid"], down["port"]["port"]
    ((_, lbl),) = [k for k in a.samples if k[0] == "ibmon_port_info"
                   and dict(k[1]).get("guid") == guid and dict(k[1]).get("port") == port]
    me = dict(lbl)
    links = [dict(k[1]) for k in a.samples if k[0] == "ibmon_link_info"
             and dict(k[1]).get("guid") == guid and dict(k[1]).get("port") == port]
    remote_desc = links[0]["remote_node_desc"] if links else "unknown"
    remote_port = links[0]["remote_port"] if links else "unknown"
    (cause,) = [dict(k[1])["cause"] for k in a.samples if k[0] == "ibmon_port_condition_cause"
                and dict(k[1]).get("guid") == guid and dict(k[1]).get("condition") == "down"]
    expect_down = {"guid": guid, "port": port, "cause": cause, "node_desc": me["node_desc"],
                   "node_type": me["node_type"], "remote_node_desc": remote_desc,
                   "remote_port": remote_port, "switch": me["node_desc"],
                   "severity": "critical"}

    def inputs(b_up: bool) -> list[dict[str, str]]:
        items = [{"series": s, "values": f"{v}x20"} for s, v in _series(a, "a:9683")]
        if b_up:
            items += [{"series": s, "values": f"{v}x20"} for s, v in _series(b, "b:9683")]
        items += [{"series": 'up{instance="a:9683",job="ibmon"}', "values": "1x20"},
                  {"series": 'up{instance="b:9683",job="ibmon"}',
                   "values": "1x20" if b_up else "0x20"}]
        return items

    uncovered = {
        "exp_labels": {"fabric": "main", "severity": "critical"},
        "exp_annotations": {
            "summary": "1 shard(s) of fabric main have no live ibmon",
            "description": (
                "Fabric main is split into shards, and 1 of them have no collector that is up "
                "and polling: the ports of those shards are not monitored and no port alert can "
                "fire for them. Shards covered now: 0. Look for IbmonDown and IbmonSourceFailing "
                "on the missing shards' daemons (Kubernetes: `kubectl -n ibmon get pods -l "
                "app.kubernetes.io/component=fabric`). If every daemon of the fabric was retired "
                "on purpose, this clears an hour later; silence it meanwhile."),
        },
    }
    tests = [
        {"interval": "1m", "input_series": inputs(b_up),
         "alert_rule_test": [
             {"eval_time": "10m", "alertname": "IBPortDown",
              "exp_alerts": [{"exp_labels": expect_down}]},
             {"eval_time": "10m", "alertname": "IbmonFabricShardsUncovered",
              "exp_alerts": [uncovered]},
             {"eval_time": "10m", "alertname": "IbmonFabricNodesUnreachable", "exp_alerts": []},
         ]}
        for b_up in (True, False)
    ]
    doc = {"rule_files": ["alerts.rules.yml"], "evaluation_interval": "1m", "tests": tests}
    (tmp / "pair.test.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = subprocess.run([promtool, "test", "rules", "pair.test.yml"], cwd=tmp,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


def test_the_daemon_exports_its_shard_and_a_reload_replaces_it(
    sim: IbSim, tmp_path: Path
) -> None:
    d = SimDaemon(tmp_path, sim, "one", source("0/2"), fabric="east")

    def shards(s: Scrape) -> set[str]:
        return {f"{n}{json.dumps(dict(lbl), sort_keys=True)} {v}"
                for (n, lbl), v in s.samples.items()
                if n in ("ibmon_shard_info", "ibmon_source_shards")}

    try:
        d.start()
        first = d.until("a first poll", lambda s: s.value("ibmon_source_up") == 1)
        assert shards(first) == {
            'ibmon_shard_info{"fabric": "east", "shard": "0", "shards": "2", "source": "fabric"}'
            " 1.0",
            'ibmon_source_shards{"fabric": "east", "source": "fabric"} 2.0',
        }
        d.config.write_text(d.config.read_text().replace('shard = "0/2"', 'shard = "2/3"'))
        assert d.proc is not None
        d.proc.send_signal(signal.SIGHUP)
        reloaded = d.until("the reloaded shard", lambda s: any(
            '"shards": "3"' in x for x in shards(s)))
        assert shards(reloaded) == {
            'ibmon_shard_info{"fabric": "east", "shard": "2", "shards": "3", "source": "fabric"}'
            " 1.0",
            'ibmon_source_shards{"fabric": "east", "source": "fabric"} 3.0',
        }
        d.stop()
    finally:
        d.kill()

