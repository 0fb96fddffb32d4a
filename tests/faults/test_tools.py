"""Fault matrix, tools: infiniband-diags that hang, lie and die.

Every test runs a real ``python -m ibmon run`` with the ``diags`` source against real ibsim +
opensm, read by the real infiniband-diags. A fake tool sits on the daemon's PATH only for what
the real one cannot do on demand: a perfquery that hangs for one LID, appends counter-shaped
junk, or leaves a ``setsid`` grandchild holding its stdout; an ibnetdiscover that exits 1 half
way, prints 10 MB of garbage, is cut short or hangs. Each fake runs the real tool for everything
else. A control file switches a fault on and off while the daemon runs, so every test also shows
the daemon before and after the fault. Every scrape of every run goes through ``TotalsWatch``.

The promises checked throughout: the daemon reports the fault (metric and log line), keeps
polling everything else (``ibmon_source_up`` 1, every other port read), never crashes or prints
a traceback, never loses or invents a count, and leaves no process behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ibmon.sources.parse import ParseError, parse_ibnd_cache
from mocks.ibsim import IbSim
from tests.faults.promise import Scrape, TotalsWatch
from tests.ibsim_fixtures import REPO, sim_for
from tests.parse_properties import SETTINGS, check_ibnd, check_perfquery, mutations
from tests.syspkg import require_binary

#: Two switches; discovery starts at S1 (ibsim attaches every client to the first node).
#: Cutting S1's two links to S2 leaves 2 of 7 nodes: a discovery that is implausible.
NET = """\
Switch 8 "S1"
[1] "H1"[1]
[3] "S2"[3]
[5] "S2"[5]

Switch 8 "S2"
[1] "H2"[1]
[2] "H3"[1]
[4] "H4"[1]
[6] "H5"[1]
[3] "S1"[3]
[5] "S1"[5]

Hca 2 "H1"
[1] "S1"[1]

Hca 2 "H2"
[1] "S2"[1]

Hca 2 "H3"
[1] "S2"[2]

Hca 2 "H4"
[1] "S2"[4]

Hca 2 "H5"
[1] "S2"[6]
"""
#: Ports the diags source reports on this fabric: 8 + 8 switch ports, 5 CA ports.
PORTS = 21
SOURCE = "fabric"
#: A junk total the fake perfquery offers: no total may ever grow by a multiple of it.
JUNK = 123456789
#: Where the tests write their matrix figures (polls to detect, faults refused, scrapes
#: checked), one JSON line per test, when set: ``IBMON_FAULT_FIGURES=/tmp/f.jsonl pytest ...``.
FIGURES = os.environ.get("IBMON_FAULT_FIGURES")


def record(test: str, **figures: object) -> None:
    if FIGURES:
        with open(FIGURES, "a", encoding="utf-8") as f:
            f.write(json.dumps({"test": test, **figures}) + "\n")

PERFQUERY = r'''#!{python}
"""A perfquery that misbehaves for the LIDs the control file names (else the real one)."""
import json, os, re, subprocess, sys, time
REAL, CONTROL, MARK = {real!r}, {control!r}, {mark!r}
try:
    with open(CONTROL) as f:
        ctl = json.load(f)
except (OSError, ValueError):
    ctl = {{}}
if ctl.get("hold"):  # not attached to ibsim yet: safe to kill (Tools.hold)
    time.sleep(3600)
args = sys.argv[1:]
lid = args[args.index("-l") + 1] if "-l" in args else ""
mode = ctl.get(lid, ctl.get("*", ""))
if mode == "hang":
    time.sleep(3600)
if mode == "escape":
    # A grandchild that leaves the session and keeps our stdout and stderr open.
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(3600)", MARK])
        os._exit(0)
    os.waitpid(pid, 0)
if mode == "junk" and "-x" in args:
    real = subprocess.run([REAL, *args], capture_output=True)
    out = real.stdout.decode()
    try:
        with open(CONTROL + ".turn") as f:
            turn = int(f.read())
    except (OSError, ValueError):
        turn = 0
    with open(CONTROL + ".turn", "w") as f:
        f.write(str(turn + 1))
    value = [ln for ln in out.splitlines() if ln.startswith("PortXmitData:")][0].split(".")[-1]
    junk = [
        # counter-shaped junk after the last block, as a broken perfquery printed it
        out + "PortXmitData:....................{junk}\n" * 4,
        # the whole answer twice, the second time with a junk total
        out + out.replace(value, "{junk}"),
        # a block for a port that was not asked for
        out + re.sub(r"(PortSelect:\.+)1\n", r"\g<1>7\n", out.replace("port 1 ", "port 7 ")),
        # a line of garbage in the middle
        out.replace("\n", "\n%%% \x1b[31m not perfquery\n", 3),
        # cut short in the middle of a line
        out[: len(out) - 9],
    ][turn % 5]
    sys.stdout.write(junk)
    sys.stderr.buffer.write(real.stderr)
    sys.exit(real.returncode)
os.execv(REAL, [REAL, *args])
'''

IBNETDISCOVER = r'''#!{python}
"""An ibnetdiscover whose discoveries (-p) misbehave as the control file says."""
import json, os, subprocess, sys, time
REAL, CONTROL = {real!r}, {control!r}
try:
    with open(CONTROL) as f:
        ctl = json.load(f)
except (OSError, ValueError):
    ctl = {{}}
if ctl.get("hold"):  # not attached to ibsim yet: safe to kill (Tools.hold)
    time.sleep(3600)
args = sys.argv[1:]
mode = ctl.get("discover", "") if "-p" in args else ""
if mode == "hang":
    time.sleep(3600)
if not mode:
    os.execv(REAL, [REAL, *args])
real = subprocess.run([REAL, *args], capture_output=True)  # the real cache is written too
text = real.stdout
if mode == "half_exit1":
    sys.stdout.buffer.write(text[: len(text) // 2])
    sys.exit(1)
if mode == "garbage":
    line = b"~" * 99 + b"\n"
    for _ in range(100):  # 10 MB
        sys.stdout.buffer.write(line * 1000)
    sys.exit(0)
if mode == "truncated":
    lines = text.splitlines(keepends=True)
    sys.stdout.buffer.write(b"".join(lines[: len(lines) - 3]))
    sys.exit(0)
raise SystemExit(f"unknown mode {{mode}}")
'''


@pytest.fixture(scope="module")
def sim() -> Iterator[IbSim]:
    yield from sim_for(NET)


class Tools:
    """Fake perfquery and ibnetdiscover in a directory, and the control file they read."""

    def __init__(self, tmp: Path) -> None:
        self.bin = tmp / "bin"
        self.bin.mkdir()
        self.control = tmp / "control.json"
        self.mark = f"ibmon-f2-escapee-{os.getpid()}-{time.monotonic_ns()}"
        self.real: set[str] = set()
        self._ctl: dict[str, Any] = {}
        self._held = False
        for name, template in (("perfquery", PERFQUERY), ("ibnetdiscover", IBNETDISCOVER)):
            real = require_binary(name)
            self.real.add(real)
            path = self.bin / name
            path.write_text(template.format(python=sys.executable, real=real,
                                            control=str(self.control), mark=self.mark,
                                            junk=JUNK))
            path.chmod(0o755)
        self.set({})

    def set(self, ctl: dict[str, Any]) -> None:
        self._ctl = ctl
        self._write()

    def _write(self) -> None:
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text(json.dumps({**self._ctl, "hold": True} if self._held else self._ctl))
        tmp.replace(self.control)

    def hold(self, timeout: float = 10.0) -> None:
        """Hold every new tool before it attaches to ibsim, then wait (up to ``timeout``) for
        the real tools already running to end: a daemon stopped or killed now kills none
        while it attaches. Unguarded, ibsim exits when a client dies between asking to attach
        and being connected (its IBPANIC in ``sim_ctl_new_client``; ``mocks/ibsim_guard.c``
        keeps it up), and even guarded each such tool holds a client slot until reaped; on a
        fabric a killed perfquery costs nothing, so the daemon rightly kills its tools on a
        stop, and this is the harness's care, not the daemon's."""
        self._held = True
        self._write()
        deadline = time.monotonic() + timeout
        # a real tool's command line starts with its path (a fake's with the interpreter)
        while any(self.processes(real) for real in self.real) and time.monotonic() < deadline:
            time.sleep(0.05)

    def release(self) -> None:
        """New tools run again, as the control file says."""
        self._held = False
        self._write()

    def turns(self) -> int:
        """How many junk answers the fake perfquery gave."""
        try:
            return int(Path(f"{self.control}.turn").read_text())
        except (OSError, ValueError):
            return 0

    @staticmethod
    def processes(*needles: str) -> set[tuple[int, int]]:
        """Live (not zombie) processes whose command line contains every one of ``needles``
        (arguments joined by NUL, as in /proc): (pid, start time) pairs, so a reused pid is
        never taken for the process that had it before."""
        out = set()
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                cmd = Path(f"/proc/{name}/cmdline").read_bytes()
                stat = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if stat[0] != "Z" and all(n.encode() in cmd for n in needles):
                out.add((int(name), int(stat[19])))
        return out

    def kill_leftovers(self) -> None:
        for needle in (self.mark, str(self.bin)):
            for pid, _start in self.processes(needle):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture
def tools(tmp_path: Path) -> Iterator[Tools]:
    t = Tools(tmp_path)
    yield t
    t.kill_leftovers()


class Daemon:
    """One ``python -m ibmon run`` with the diags source on the simulator, fakes first on PATH.

    Every scrape goes through the shared ``TotalsWatch``; ``polls`` counts finished polls
    (``ibmon_source_poll_duration_seconds_count``).
    """

    def __init__(self, sim: IbSim, tools: Tools, tmp: Path, watch: TotalsWatch,
                 **source: str) -> None:
        self.sim, self.tools, self.watch = sim, tools, watch
        tools.release()  # a daemon stopped before this one held them
        self.log = tmp / "daemon.log"
        # The MAD timeout is the source's default (1 s): the faults here are in the tools, and a
        # tighter one loses healthy nodes to a busy simulator, which no test is about.
        options = {"interval": '"1s"', "topology_interval": '"1h"', "concurrency": "4",
                   "timeout": '"1s"', **source}
        cfg = tmp / "ibmon.toml"
        cfg.write_text(
            '[prometheus]\nlisten = "127.0.0.1:0"\n'
            f'[[sources]]\ntype = "diags"\nname = "{SOURCE}"\n'
            + "".join(f"{k} = {v}\n" for k, v in options.items())
        )
        env = sim.tool_env()
        env.update(PATH=f"{tools.bin}{os.pathsep}{env.get('PATH', '')}",
                   PYTHONPATH=str(REPO), IBMON_LOG__FORMAT="json")
        with self.log.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ibmon", "run", "--config", str(cfg)],
                cwd=sim.workdir, env=env, stdout=subprocess.DEVNULL, stderr=err,
                start_new_session=True,
            )
        self.port = 0
        self.wait("the daemon to listen", self._listening, timeout=60)
        self.scrapes: list[Scrape] = []
        self._stop_reaper = threading.Event()
        self._reaper = threading.Thread(target=self._reap_clients, daemon=True)
        self._reaper.start()
        # A first poll on a busy machine may lose a node to a slow perfquery (the source then
        # rightly reports it missing): the faults under test start from one complete poll.
        self.wait("a first complete poll", self._complete, timeout=90)
        self.scrapes.clear()  # kept from here on: every one of them is checked by the tests

    def _reap_clients(self) -> None:
        """ibsim has 10 client slots and frees a killed tool's only when told: a test harness
        chore (real fabrics have no such table), done here so killed tools never starve it."""
        while not self._stop_reaper.wait(0.5):
            with contextlib.suppress(Exception):
                self.sim.reap_clients()

    def _complete(self) -> bool:
        s = self.scrape()
        return (self.polls(s) >= 1 and s.value("ibmon_source_up", source=SOURCE) == 1
                and s.value("ibmon_source_ports", source=SOURCE) == PORTS)

    def _listening(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()
        for entry in self.entries():
            if entry.get("event") == "listening":
                self.port = int(entry["port"])
                return True
        return False

    def entries(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.entries() if e.get("event") == name]

    @staticmethod
    def wait(what: str, pred: Callable[[], bool], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.1)

    def scrape(self) -> Scrape:
        s = self.watch.scrape(f"http://127.0.0.1:{self.port}/metrics")
        self.scrapes.append(s)
        return s

    def polls(self, s: Scrape | None = None) -> int:
        s = s or self.scrape()
        return int(s.value("ibmon_source_poll_duration_seconds_count", source=SOURCE) or 0)

    def errors(self, reason: str, s: Scrape | None = None) -> int:
        s = s or self.scrape()
        return int(s.value("ibmon_source_poll_errors_total", source=SOURCE, reason=reason) or 0)

    def until_polls(self, n: int, check: Callable[[Scrape], None] | None = None,
                    timeout: float = 90.0) -> Scrape:
        """Scrape (and check every scrape) until ``n`` more polls have finished."""
        start = self.polls()
        deadline = time.monotonic() + timeout
        while True:
            s = self.scrape()
            if check is not None:
                check(s)
            if self.polls(s) >= start + n:
                return s
            assert time.monotonic() < deadline, f"fewer than {n} polls in {timeout:.0f}s"
            time.sleep(0.2)

    def detect(self, reason: str, before: int, check: Callable[[Scrape], None]) -> int:
        """Polls it takes, from now (a fault was just switched on), until ``reason`` is counted;
        every scrape on the way is checked."""
        start = self.polls()
        deadline = time.monotonic() + 90
        while True:
            s = self.scrape()
            check(s)
            if self.errors(reason, s) > before:
                return self.polls(s) - start
            assert time.monotonic() < deadline, f"{reason} never counted"
            time.sleep(0.1)

    def children(self) -> dict[int, str]:
        """The daemon's direct children: pid -> state."""
        out = {}
        for tid in os.listdir(f"/proc/{self.proc.pid}/task"):
            with contextlib.suppress(OSError):
                for pid in Path(f"/proc/{self.proc.pid}/task/{tid}/children").read_text().split():
                    with contextlib.suppress(OSError):
                        stat = Path(f"/proc/{pid}/stat").read_text()
                        out[int(pid)] = stat.rsplit(")", 1)[1].split()[0]
        return out

    def stop(self) -> None:
        """SIGTERM: a clean exit (status 0) and a log without a single traceback."""
        self._stop_reaper.set()
        self._reaper.join(timeout=5)
        if self.proc.poll() is None:
            self.tools.hold()
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
                raise
            assert rc == 0, self.log.read_text()[-3000:]
        text = self.log.read_text(errors="replace")
        assert "Traceback" not in text, text[-3000:]

    def kill(self) -> None:
        self._stop_reaper.set()
        if self.proc.poll() is None:
            self.tools.hold()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


@pytest.fixture
def daemon(sim: IbSim, tools: Tools, tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    made: list[Daemon] = []
    watch = TotalsWatch()

    def start(**source: str) -> Daemon:
        sim.revive()  # the kills these tests cause can take ibsim down (IbSim.revive)
        sim.reap_clients()
        d = Daemon(sim, tools, tmp_path, watch, **source)
        made.append(d)
        return d

    yield start
    for d in made:
        d.kill()
        # Shown by pytest only for a failed test: what the daemon said went wrong in its polls.
        said = [e for e in d.entries() if e.get("level") in ("warning", "error")]
        print(f"daemon warnings ({len(said)}), the last 30:", *said[-30:], sep="\n",
              file=sys.stderr)
    # Said here, not by the next test's "ibsim is not running": the test that took it down.
    assert sim.running, f"ibsim died during this test: {sim.how_it_ended()}"


def port_of(s: Scrape, desc: str) -> tuple[str, str, int]:
    """(guid, port, lid) of the CA port whose node description is ``desc``."""
    for labels, _v in s.series("ibmon_port_info").items():
        lbl = dict(labels)
        if lbl.get("node_desc") == desc:
            return lbl["guid"], lbl["port"], int(lbl["lid"])
    raise AssertionError(f"no port of {desc}")


def healthy(s: Scrape, *, missing: int = 0) -> None:
    """The source is up and reports every port of the fabric (but ``missing`` of them: a node
    whose answer was refused this poll is not in its snapshot)."""
    assert s.value("ibmon_source_up", source=SOURCE) == 1
    ports = s.value("ibmon_source_ports", source=SOURCE)
    assert ports is not None and PORTS - missing <= ports <= PORTS, ports


# ----------------------------------------------------------------------------- a hung perfquery


def test_one_hung_perfquery_costs_only_its_node(
    sim: IbSim, tools: Tools, daemon: Callable[..., Daemon]
) -> None:
    """The per-command timeout (P/4 = 2.5 s at a 1 s interval) ends a hung perfquery
    long before the poll's own limit (10 s), so one node times out and the rest is read. The
    MAD timeout is the default 1 s, with which the old fixed per-command timeout was 13 s."""
    d = daemon(timeout='"1s"')
    first = d.until_polls(3, healthy)
    h3_guid, h3_port, h3_lid = port_of(first, "H3")
    h2_guid, h2_port, _ = port_of(first, "H2")
    timeouts = d.errors("timeout", first)
    tools.set({str(h3_lid): "hang"})
    # the poll under way when the hang is switched on may already meet it, or the next one
    detected = d.detect("timeout", timeouts, lambda s: healthy(s, missing=1))
    assert detected <= 2
    sim.set_counters("H2", 1, {"PortCountersExtended.PortXmitData": 7_000_000_000})
    hung_fake = (str(tools.bin), f"-l\0{h3_lid}\0")
    seen_hung: dict[tuple[int, int], int] = {}  # hung fake -> poll count when first seen

    def check(s: Scrape) -> None:
        healthy(s, missing=1)  # never the whole poll: at most H3's port is missing
        polls = d.polls(s)
        alive = tools.processes(*hung_fake)
        for proc in alive:
            seen_hung.setdefault(proc, polls)
        # a hung fake never outlives its command timeout (2.5 s: the node's background
        # re-read spans polls, which keep their 1 s cadence)
        for proc, at in seen_hung.items():
            assert polls < at + 5 or proc not in alive, f"hung fake {proc} survived"

    during = d.until_polls(4, check)
    assert d.errors("timeout", during) >= timeouts + 3  # one per poll: the hung node's port
    total = during.value("ibmon_port_transmit_data_bytes_total", guid=h2_guid, port=h2_port)
    assert total is not None and total >= 4 * 7_000_000_000  # H2 was read during the hang
    assert len(seen_hung) >= 2  # re-read in the background, each one gone after its timeout
    tools.set({})
    # the background re-read under way when the hang was lifted ends within its 2.5 s timeout
    after = d.until_polls(4)
    later = d.until_polls(3, healthy)
    assert d.errors("timeout", later) == d.errors("timeout", after)  # H3 answers again
    assert later.value("ibmon_port_transmit_data_bytes_total", guid=h3_guid, port=h3_port)
    d.stop()
    assert not tools.processes(str(tools.bin))
    record("hung perfquery", detected_within_polls=detected, hung_killed=len(seen_hung),
           scrapes_checked=d.watch.scrapes)


# ------------------------------------------------------------------- junk in perfquery's answer


def test_junk_in_perfquery_output_never_reaches_a_total(
    sim: IbSim, tools: Tools, daemon: Callable[..., Daemon]
) -> None:
    """Five kinds of junk in one node's perfquery answer (counter-shaped lines after
    the last block, the answer twice with a junk total, a block for a port not asked, garbage
    lines, output cut mid-line) are each refused whole: parse_error, no total moves by the junk,
    no fake reset, every other port read."""
    base = 5_000_000_000
    sim.set_counters("H2", 1, {"PortCountersExtended.PortXmitData": base})
    d = daemon()
    first = d.until_polls(3, healthy)
    guid, port, lid = port_of(first, "H2")
    parse_errors = d.errors("parse_error", first)

    def untouched(s: Scrape) -> None:
        total = s.value("ibmon_port_transmit_data_bytes_total", guid=guid, port=port)
        # ibsim adds its own MAD traffic to the real counter: a few KB, never the junk
        assert total is None or 4 * base <= total < 4 * base + 4 * JUNK // 100, total
        assert not s.value("ibmon_port_resets_total", guid=guid, port=port,
                           counter="transmit_data")

    def check(s: Scrape) -> None:
        healthy(s, missing=1)  # H2's port, in a poll whose answer was refused
        untouched(s)

    tools.set({str(lid): "junk"})
    detected = d.detect("parse_error", parse_errors, check)
    assert detected <= 2
    d.wait("five junk answers", lambda: (check(d.scrape()), tools.turns() >= 6)[1], timeout=90)
    tools.set({})
    # the poll under way may still get junk, and the one after it may still be reading H2 anew
    d.until_polls(3, check)
    last = d.until_polls(3, healthy)
    for s in d.scrapes:  # every scrape of the run, the daemon's first ones included
        untouched(s)
    assert last.value("ibmon_port_transmit_data_bytes_total", guid=guid, port=port)
    # each junk answer cost that node's port one poll, once
    assert d.errors("parse_error", last) - parse_errors >= 5
    d.stop()
    record("junk perfquery", detected_within_polls=detected,
           refused=d.errors("parse_error", last) - parse_errors, scrapes_checked=d.watch.scrapes)


# --------------------------------------------------------------------------- a failed discovery


def test_a_failed_discovery_keeps_the_last_good_topology(
    sim: IbSim, tools: Tools, daemon: Callable[..., Daemon]
) -> None:
    """Half an output and exit 1, 10 MB of garbage, a cut-short output and a hang:
    each discovery is rejected whole, the previous topology stays and every port is polled,
    one discovery_rejected error and one log line per discovery."""
    d = daemon(topology_interval='"1s"')
    d.until_polls(3, healthy)
    causes = {"half_exit1": "failed", "garbage": "parse_error", "truncated": "incomplete",
              "hang": "timeout"}
    detected = {}
    for mode, cause in causes.items():
        tools.set({"discover": mode})
        detected[mode] = d.detect("discovery_rejected", d.errors("discovery_rejected"), healthy)

        def rejected(c: str = cause) -> int:
            return sum(e.get("cause") == c for e in d.events("discovery_rejected"))

        d.wait(f"two rejected discoveries ({mode})",
               lambda: (healthy(d.scrape()), rejected() >= 2)[1], timeout=90)
        d.until_polls(1, healthy)
    tools.set({})
    d.until_polls(2, healthy)  # a discovery that hung when the fault was lifted ends
    before = len(d.events("discovery_rejected"))
    final = d.until_polls(4, healthy)  # two discoveries or more, every one accepted
    lines = d.events("discovery_rejected")
    assert len(lines) == before
    assert {e["cause"] for e in lines} == set(causes.values())
    # one error per rejected discovery, never one per line of garbage
    assert d.errors("discovery_rejected", final) == len(lines)
    assert all(len(json.dumps(e)) < 1000 for e in lines)  # a sample, never the output
    for s in d.scrapes:
        healthy(s)
    d.stop()
    # a discovery every second: the first one after the fault is rejected
    assert max(detected.values()) <= 4, detected
    record("failed discovery", detected_within_polls=detected, rejected=len(lines),
           scrapes_checked=d.watch.scrapes)


def test_an_implausible_discovery_is_held_back_until_it_repeats(
    sim: IbSim, tools: Tools, daemon: Callable[..., Daemon]
) -> None:
    """Far fewer nodes: cut S1 from S2 in ibsim and discovery from S1 sees 2 of 7
    nodes. Two such discoveries are rejected (implausible) and the old topology is polled; the
    third in a row is accepted (the fabric did shrink); relinked, the fabric is back at once."""
    d = daemon(topology_interval='"1s"')
    d.until_polls(3, healthy)
    try:
        sim.unlink("S1", 3)
        sim.unlink("S1", 5)
        d.wait("the shrink to be accepted", lambda: bool(d.events("fabric_shrank")), timeout=120)
        implausible = [e for e in d.events("discovery_rejected") if e["cause"] == "implausible"]
        assert len(implausible) == 2
        d.wait("the smaller topology",
               lambda: d.scrape().value("ibmon_source_ports", source=SOURCE) == 9)  # S1 + H1
    finally:
        sim.relink("S1", 3)
        sim.relink("S1", 5)
        sim.resweep()
    d.wait("the whole fabric again",
           lambda: d.scrape().value("ibmon_source_ports", source=SOURCE) == PORTS, timeout=120)
    d.stop()
    record("implausible discovery", rejected=len(implausible), scrapes_checked=d.watch.scrapes)


# --------------------------------------------------------------- processes a tool leaves behind


def test_no_process_outlives_its_poll(
    sim: IbSim, tools: Tools, daemon: Callable[..., Daemon]
) -> None:
    """Every perfquery leaves a grandchild that calls setsid and keeps the tool's
    stdout open. The kill scope finds and kills each one when its command ends, so polls do not
    wait for end-of-file, no grandchild outlives its poll and the daemon keeps no zombies."""
    tools.set({"*": "escape"})
    d = daemon()
    timeouts = d.errors("timeout")  # a busy machine's first polls may have lost a node
    seen: dict[tuple[int, int], int] = {}  # escapee -> poll count when first seen
    zombies: dict[int, int] = {}

    def check(s: Scrape) -> None:
        healthy(s)
        polls = d.polls(s)
        alive = tools.processes(tools.mark)
        for proc in alive:
            seen.setdefault(proc, polls)
        for proc, at in seen.items():
            assert polls < at + 2 or proc not in alive, f"escapee {proc} outlived its poll"
        children = d.children()
        for pid, state in children.items():
            if state == "Z":
                zombies.setdefault(pid, polls)
        for pid, at in zombies.items():
            assert polls < at + 2 or children.get(pid) != "Z", f"zombie {pid} never reaped"

    last = d.until_polls(6, check)
    assert seen, "the fake never started a grandchild"
    assert d.errors("timeout", last) == timeouts  # the open pipe no longer holds the command
    assert d.errors("stray_process", last) >= 6
    warned = d.events("tool_left_processes")
    assert 1 <= len(warned) <= 2  # one line a minute, however many commands misbehave
    d.stop()
    assert not tools.processes(tools.mark)
    record("setsid grandchildren", killed=d.errors("stray_process", last),
           seen_alive=len(seen), zombies_in_passing=len(zombies), scrapes_checked=d.watch.scrapes)


@pytest.fixture(scope="module")
def captures(sim: IbSim, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What the real tools print on this fabric: a switch's and a CA's perfquery answers (both
    kinds), ibnetdiscover -p and its cache."""
    sim.revive()
    sim.reap_clients()
    cache = tmp_path_factory.mktemp("captures") / "fabric.cache"

    def run(*argv: str) -> str:
        out = subprocess.run(list(argv), env=sim.tool_env(), cwd=sim.workdir,
                             capture_output=True, text=True, timeout=60, check=True)
        return out.stdout

    return {
        "perfquery": [
            run("perfquery", "-x", "-l", "1", "1,2,3,4,5,6,7,8"),
            run("perfquery", "-l", "1", "1,2,3,4,5,6,7,8"),
            run("perfquery", "-x", "-l", "2", "1") + run("perfquery", "-l", "2", "1"),
        ],
        "ibnetdiscover": run("ibnetdiscover", "-p", "--cache", str(cache)),
        "cache": cache.read_bytes(),
    }


@SETTINGS
@given(data=st.data())
def test_ibsim_output_parses_exactly_or_not_at_all(
    captures: dict[str, Any], data: st.DataObject
) -> None:
    """Junk in the simulator's own output: each mutation is read exactly or refused whole."""
    for original in captures["perfquery"]:
        kind, mutated = data.draw(mutations(original))
        check_perfquery(kind, original, mutated)
    original = captures["ibnetdiscover"]
    kind, mutated = data.draw(mutations(original))
    check_ibnd(kind, original, mutated)
    cache = captures["cache"]
    parse_ibnd_cache(cache)
    cut = data.draw(st.integers(0, len(cache) - 1))
    with pytest.raises(ParseError):
        parse_ibnd_cache(cache[:cut])


def test_fakes_are_on_the_path(tools: Tools) -> None:
    """The fakes run the real tools (a fake that cannot find them would test nothing)."""
    for name in ("perfquery", "ibnetdiscover"):
        assert shutil.which(name)
        text = (tools.bin / name).read_text()
        assert repr(require_binary(name)) in text


def test_a_simulator_that_died_is_revived_for_the_next_test(
    sim: IbSim, daemon: Callable[..., Daemon]
) -> None:
    """ibsim exits by itself when a tool dies while attaching (its IBPANIC in
    sim_ctl_new_client) unless guarded (tests/integration/test_ibsim_guard.py), and may die
    of anything else. Taken down the hard way here, it must come back for the next test:
    running, answering its console, the subnet swept, and a daemon polling every port of it."""
    assert not sim.revive()  # a running simulator is left alone
    proc = sim._ibsim
    assert proc is not None
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    restarts = sim.restarts
    assert sim.revive()
    assert sim.running and sim.restarts == restarts + 1
    assert sim.subnet_up_count() >= 1
    sim.console("Attached")
    d = daemon()  # waits for a first complete poll: every port answered
    d.stop()
