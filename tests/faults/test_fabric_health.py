"""Fault matrix, fabric sources.

A real ``python -m ibmon run`` polls a real simulated fabric (ibsim + opensm) through the ``mad``
source, and the test does to the fabric what a bad day does: kills it and brings it back, drops
half or all of the MADs to one switch, freezes the simulator, freezes the MAD worker. Every
scrape of every run goes through ``TotalsWatch`` (no port total ever goes down), and every run
ends with: the daemon still polling, no traceback in its log, a clean SIGTERM exit and no MAD
worker process left behind. ``MATRIX`` collects the figures the report quotes (printed at the end
of the module with ``-s``).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mocks.ibsim import IbSim
from mocks.ibsim_driver import ibsim_node_id
from mocks.topology import Fabric, fat_tree, to_ibsim_netfile
from tests.faults.ha_daemons import SimDaemon, wait_for
from tests.faults.promise import Scrape
from tests.ibsim_fixtures import require_ibsim

pytestmark = pytest.mark.system

FAB: Fabric = fat_tree(levels=2, radix=8, leaves=2, hosts_per_leaf=4)
N_PORTS = 32  # 3 switches x 8 ports + 8 hosts
LEAF = FAB.node_by_desc("leaf02")
#: The hosts cabled to leaf02 (ports 1-4): behind it for a sweep from spine01.
LEAF_HOSTS = {peer[0] for p in range(1, 5) if (peer := FAB.peer(LEAF.guid, p)) is not None}
BEHIND = {LEAF.guid, *LEAF_HOSTS}  # what a sweep from spine01 reaches only through leaf02
SRC = "mad"
MATRIX: dict[str, dict[str, Any]] = {}


def node_id(guid: str) -> str:
    return ibsim_node_id(FAB, guid)


class Daemon(SimDaemon):
    """One ``ibmon run`` process with a ``mad`` (or ``diags``) source on the simulator at 1 s,
    scraped through one ``TotalsWatch`` (keep the object for the whole test: the watch spans
    restarts); ``scrapes`` counts what the watch checked."""

    def __init__(self, tmp: Path, sim: IbSim, extra: str = "", kind: str = "mad") -> None:
        super().__init__(tmp, sim, "daemon",
                         f'type = "{kind}"\nname = "{SRC}"\ninterval = "1s"\n{extra}',
                         save_interval="1s")
        self.scrapes = 0

    def start(self) -> None:
        super().start()
        self.until("the first good poll", lambda s: s.value("ibmon_source_up", source=SRC) == 1)

    def scrape(self) -> Scrape:
        self.scrapes += 1
        return super().scrape()

    def watch_polls(self, n: int, check: Callable[[Scrape], None] | None = None) -> Scrape:
        """Scrape through ``n`` more polls, running ``check`` on every scrape."""
        start = self.polls(self.scrape())
        while True:
            s = self.scrape()
            if check is not None:
                check(s)
            if self.polls(s) >= start + n:
                return s
            time.sleep(0.2)

    def workers(self) -> list[int]:
        """Live MAD worker processes of this daemon (children running ibmon.sources.madworker)."""
        assert self.proc is not None
        return mad_workers(self.proc.pid)

    def stop(self) -> None:
        """SIGTERM to the whole process group, as systemd's ``KillMode=control-group`` does:
        exit 0, no traceback, no worker left, and the stop is no failed poll."""
        assert self.proc is not None
        pid = self.proc.pid
        failed = len(fired(self, "source_failed"))
        super().stop()
        assert len(fired(self, "source_failed")) == failed, "the stop made a failed poll"
        assert mad_workers(pid) == [] and stray_workers(pid) == []
        assert tools_of(self.sim) == []


def _proc_stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state letter) of a process, None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    return int(fields[1]), fields[0]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def mad_workers(parent: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _proc_stat(int(entry))
            if st and st[0] == parent and st[1] != "Z" and "madworker" in _cmdline(int(entry)):
                out.append(int(entry))
    return out


def stray_workers(parent: int) -> list[int]:
    """MAD workers whose daemon ``parent`` is gone but which still run (orphans)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and f'"parent": {parent}' in _cmdline(int(entry)):
            st = _proc_stat(int(entry))
            if st and st[1] != "Z":
                out.append(int(entry))
    return out


def tools_of(sim: IbSim) -> list[str]:
    """infiniband-diags processes still running against this simulator (orphans)."""
    out = []
    marker = f"IBSIM_SOCKNAME={sim.sockname}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        cmd = _cmdline(int(entry))
        if marker in env.split(b"\0") and ("perfquery" in cmd or "ibnetdiscover" in cmd):
            out.append(cmd)
    return out


@pytest.fixture
def sim() -> Iterator[IbSim]:
    require_ibsim()
    s = IbSim(to_ibsim_netfile(FAB))
    s.start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def daemon(tmp_path: Path, sim: IbSim, request: pytest.FixtureRequest) -> Iterator[Daemon]:
    extra = getattr(request, "param", "")
    d = Daemon(tmp_path, sim, extra)
    try:
        yield d
    finally:
        d.kill()


def fired(d: Daemon, kind: str, status: str = "firing") -> list[dict[str, Any]]:
    return [e for e in d.events() if e["type"] == kind and e["status"] == status]


# ---------------------------------------------------------------------------------------------
# blind means down, ports stay (stale), the source heals itself


def test_fabric_vanishes_then_returns(daemon: Daemon, sim: IbSim) -> None:
    daemon.start()
    before = daemon.watch_polls(2)
    assert before.value("ibmon_source_ports", source=SRC) == N_PORTS
    totals = before.series("ibmon_port_transmit_data_bytes_total")
    assert len(totals) == N_PORTS

    sim.stop()  # ibsim and opensm killed: every MAD fails from now on
    at = daemon.polls(daemon.scrape())
    down = daemon.until("source_up 0", lambda s: s.value("ibmon_source_up", source=SRC) == 0)
    detected = daemon.polls(down) - at
    assert detected <= 3
    # Every port is still there, marked stale, with the totals it had.
    blind = daemon.watch_polls(3)
    assert blind.value("ibmon_source_up", source=SRC) == 0
    assert len(blind.series("ibmon_port_stale")) == N_PORTS
    assert blind.value("ibmon_source_stale_ports", source=SRC) == N_PORTS
    assert blind.series("ibmon_port_transmit_data_bytes_total").keys() == totals.keys()
    failed = fired(daemon, "source_failed")
    assert len(failed) == 1 and failed[0]["details"]["reason"] in ("no_answer", "poll_failed")
    assert not fired(daemon, "topology_changed")  # nothing "vanished"

    sim.start()  # same socket name: the fabric comes back; no SIGHUP is sent
    back_at = daemon.polls(daemon.scrape())
    up = daemon.until("source_up 1 again",
                      lambda s: s.value("ibmon_source_up", source=SRC) == 1
                      and not s.series("ibmon_port_stale"), timeout=90)
    recovered = daemon.polls(up) - back_at
    assert up.value("ibmon_source_ports", source=SRC) == N_PORTS
    assert len(fired(daemon, "source_failed", "resolved")) == 1
    assert len(daemon.workers()) == 1
    daemon.watch_polls(2)
    daemon.stop()
    MATRIX["fabric vanishes (ibsim+opensm killed)"] = {
        "detected_polls": detected, "recovered_polls_after_return": recovered,
        "scrapes": daemon.scrapes,
    }


def s_up(s: Scrape) -> float | None:
    return s.value("ibmon_source_up", source=SRC)


def test_diags_gets_the_same_rule(tmp_path: Path, sim: IbSim) -> None:
    """Health is decided in the pipeline: the diags source is blind and heals the same way."""
    d = Daemon(tmp_path, sim, kind="diags")
    try:
        d.start()
        d.watch_polls(1)
        sim.stop()
        at = d.polls(d.scrape())
        down = d.until("source_up 0", lambda s: s.value("ibmon_source_up", source=SRC) == 0)
        detected = d.polls(down) - at
        assert detected <= 3
        # blind within 3 intervals; the ports turn stale when the hung poll fails
        stale = d.until("every port stale",
                        lambda s: len(s.series("ibmon_port_stale")) == N_PORTS)
        assert s_up(stale) == 0
        sim.start()
        d.until("source_up 1 again", lambda s: s.value("ibmon_source_up", source=SRC) == 1
                and not s.series("ibmon_port_stale"), timeout=90)
        assert len(fired(d, "source_failed", "resolved")) == 1
        d.stop()
    finally:
        d.kill()
    MATRIX["fabric vanishes, diags source"] = {"detected_polls": detected}


def test_kill9_of_the_daemon_leaves_no_mad_worker(daemon: Daemon) -> None:
    daemon.start()
    assert daemon.proc is not None
    pid = daemon.proc.pid
    workers = daemon.workers()
    assert len(workers) == 1
    daemon.kill()  # kill -9 of the daemon's process group... and of the daemon alone:
    wait_for("the worker to die with its daemon", lambda: not stray_workers(pid))
    daemon.start()
    assert daemon.proc is not None
    pid = daemon.proc.pid
    daemon.proc.kill()  # only the daemon: the worker must follow it (PR_SET_PDEATHSIG)
    daemon.proc.wait(timeout=10)
    daemon.proc = None
    wait_for("the worker to die with its daemon", lambda: not stray_workers(pid))
    MATRIX["kill -9 of the daemon"] = {"orphans": 0}


# ---------------------------------------------------------------------------------------------
# lost MADs never rewrite the topology


@pytest.mark.parametrize(
    "daemon", ['topology_interval = "2s"\nunreachable_discoveries = 1000'], indirect=True
)
@pytest.mark.parametrize("rate", [50, 100])
def test_mad_loss_on_one_switch_costs_only_its_ports(daemon: Daemon, sim: IbSim,
                                                     rate: int) -> None:
    daemon.start()
    daemon.watch_polls(2)
    sim.error(node_id(LEAF.guid), None, rate)
    try:
        def check(s: Scrape) -> None:
            descs = {dict(lbl)["guid"]: dict(lbl)["node_desc"]
                     for lbl in s.series("ibmon_port_info")}
            assert len(descs) == len(FAB.nodes), "a node left the topology"
            assert all(descs.values()), "a node description became empty"
            assert s.value("ibmon_source_up", source=SRC) == 1
            assert len(s.series("ibmon_port_transmit_data_bytes_total")) == N_PORTS
            for lbl in s.series("ibmon_port_stale"):
                assert dict(lbl)["guid"] in BEHIND, "a port the loss does not touch is stale"

        t0 = daemon.scrape().value("ibmon_source_poll_errors_total", source=SRC,
                                   reason="timeout") or 0
        # A 2 s topology interval: several discoveries run under loss (at 100 % the switch
        # and the hosts the sweep reaches only through it miss every one of them; dropping
        # them after N is the next test's subject, so N is out of reach here).
        end = daemon.watch_polls(6 if rate == 100 else 20, check)
        t1 = end.value("ibmon_source_poll_errors_total", source=SRC, reason="timeout") or 0
        assert t1 > t0  # the lossy switch's ports keep costing timeouts: it is still asked
        if rate == 100:
            # ibsim drops a MAD entering any port of the switch, in transit too: the switch and
            # the hosts behind it are unreachable, their 12 ports stale, the other 20 fresh.
            assert end.value("ibmon_source_unreachable_nodes", source=SRC) == len(BEHIND)
            stale = {dict(lbl)["guid"] for lbl in end.series("ibmon_port_stale")}
            assert stale == BEHIND and len(end.series("ibmon_port_stale")) == 8 + len(LEAF_HOSTS)
    finally:
        sim.error(node_id(LEAF.guid), None, 0)
    healed = daemon.until("the switch to answer again",
                          lambda s: not s.series("ibmon_port_stale")
                          and s.value("ibmon_source_unreachable_nodes", source=SRC) == 0)
    assert healed.value("ibmon_source_up", source=SRC) == 1
    assert not fired(daemon, "topology_changed")
    assert not fired(daemon, "source_failed")
    daemon.stop()
    MATRIX[f"{rate} % MAD loss on one switch"] = {
        "topology_changed": 0, "empty_descriptions": 0, "timeouts_counted": t1 - t0,
    }


@pytest.mark.parametrize(
    "daemon", ['topology_interval = "2s"\nunreachable_discoveries = 2'], indirect=True
)
def test_an_unreachable_switch_is_dropped_after_n_discoveries_and_comes_back(
    daemon: Daemon, sim: IbSim
) -> None:
    daemon.start()
    sim.error(node_id(LEAF.guid), None, 100)
    try:
        daemon.until("the switch to be unreachable",
                     lambda s: (s.value("ibmon_source_unreachable_nodes", source=SRC) or 0) > 0)
        gone = daemon.until(
            "the switch to leave the topology",
            lambda s: LEAF.guid not in {dict(lbl)["guid"] for lbl in s.series("ibmon_port_info")})
        assert gone.value("ibmon_source_unreachable_nodes", source=SRC) == 0
        assert gone.value("ibmon_source_up", source=SRC) == 1

        def changes(kind: str) -> set[str]:
            return {e["port"]["guid"] for e in fired(daemon, "topology_changed")
                    if e["details"]["change"] == kind}

        # Dropped after 2 discoveries (the switch and the hosts the sweep reaches through it);
        # gone for absent_polls polls, that is news: vanished.
        daemon.until("vanished events", lambda s: changes("vanished") == BEHIND)
    finally:
        sim.error(node_id(LEAF.guid), None, 0)
    daemon.until("the switch to come back",
                 lambda s: LEAF.guid in {dict(lbl)["guid"] for lbl in s.series("ibmon_port_info")}
                 and not s.series("ibmon_port_stale"))
    daemon.until("appeared events", lambda s: changes("appeared") == BEHIND)
    daemon.stop()


# ---------------------------------------------------------------------------------------------
# a frozen fabric or a frozen MAD worker does not hold later polls


def test_frozen_fabric_fails_polls_on_time_and_recovers(daemon: Daemon, sim: IbSim) -> None:
    daemon.start()
    daemon.watch_polls(2)
    assert sim._ibsim is not None
    first = daemon.workers()
    frozen_at = time.monotonic()
    os.killpg(sim._ibsim.pid, signal.SIGSTOP)  # the simulator freezes mid-flight
    try:
        def one_worker(s: Scrape) -> None:
            assert len(daemon.workers()) <= 1, "two MAD workers (umad ports) at once"

        down = daemon.until("source_up 0", lambda s: s.value("ibmon_source_up", source=SRC) == 0)
        # blind within 3 intervals of the poll the freeze caught (1 s each, that poll may have
        # started up to one before): not at the poll's 10 s timeout (10.6 s before)
        blind_after = time.monotonic() - frozen_at
        assert blind_after < 5.5, blind_after
        one_worker(down)
        wait_for("the frozen worker to be killed", lambda: not set(daemon.workers()) & set(first))
        # Three poll timeouts' worth of freeze: only the poll caught by it may time out; the
        # ones after start on time with a fresh worker instead of queueing behind the old one.
        daemon.watch_polls(3, one_worker)
    finally:
        os.killpg(sim._ibsim.pid, signal.SIGCONT)
    assert len(fired(daemon, "source_failed")) == 1  # one edge for the whole freeze
    log = [json.loads(line) for line in daemon.log.read_text().splitlines()
           if line.startswith("{")]
    failures = [r["reason"] for r in log if r.get("event") == "source_failed"]
    assert failures.count("poll_timeout") == 1, failures
    sim.reap_clients()  # workers killed while the simulator was stopped keep their slots
    thawed = daemon.polls(daemon.scrape())
    up = daemon.until("source_up 1", lambda s: s.value("ibmon_source_up", source=SRC) == 1)
    recovered = daemon.polls(up) - thawed
    assert len(daemon.workers()) == 1
    daemon.stop()
    MATRIX["frozen fabric (ibsim SIGSTOP)"] = {
        "polls_timed_out": failures.count("poll_timeout"), "failed_polls": len(failures),
        "recovered_polls_after_thaw": recovered,
    }


def test_frozen_mad_worker_is_replaced(daemon: Daemon) -> None:
    daemon.start()
    daemon.watch_polls(1)
    (frozen,) = daemon.workers()
    frozen_at = time.monotonic()
    os.kill(frozen, signal.SIGSTOP)  # a worker stuck in a umad call
    daemon.until("source_up 0", lambda s: s.value("ibmon_source_up", source=SRC) == 0)
    assert time.monotonic() - frozen_at < 5.5  # blind within 3 intervals, not at the timeout
    up = daemon.until("source_up 1 with a fresh worker",
                      lambda s: s.value("ibmon_source_up", source=SRC) == 1)
    assert _proc_stat(frozen) is None  # killed and reaped, not left stopped or a zombie
    (fresh,) = daemon.workers()
    assert fresh != frozen
    assert len(fired(daemon, "source_failed", "resolved")) == 1
    del up
    daemon.stop()
    MATRIX["frozen MAD worker (SIGSTOP)"] = {"orphans": 0, "replaced": 1}


@pytest.fixture(scope="module", autouse=True)
def _print_matrix() -> Iterator[None]:
    """Prints the figures the report quotes at the end of the module (run with -s); not a
    test, so it cannot pass for nothing."""
    yield
    for fault, figures in MATRIX.items():
        print(f"MATRIX {fault}: {figures}")
