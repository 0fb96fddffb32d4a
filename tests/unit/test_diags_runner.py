"""DiagsSource with a fake runner (hung, garbage, crashing nodes) and the real runner's kills."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from ibmon.infiniband.counters import DETAIL_ATTRIBUTES
from ibmon.sources.diags import (
    CommandResult,
    DiagsSource,
    DiagsUnavailableError,
    SubprocessRunner,
    classify,
)
from ibmon.sources.parse import parse_ibnetdiscover_ports
from tests.ibnd_cache import cache_from_ports

TOPO = """\
SW     1  1 0x0000000000200000 4x EDR - CA     2  1 0x0000000000100001 ( 'sw' - 'h1' )
SW     1  2 0x0000000000200000 4x EDR - CA     3  1 0x0000000000100002 ( 'sw' - 'h2' )
SW     1  3 0x0000000000200000 4x EDR - CA     4  1 0x0000000000100003 ( 'sw' - 'h3' )
CA     2  1 0x0000000000100001 4x EDR - SW     1  1 0x0000000000200000 ( 'h1' - 'sw' )
CA     3  1 0x0000000000100002 4x EDR - SW     1  2 0x0000000000200000 ( 'h2' - 'sw' )
CA     4  1 0x0000000000100003 4x EDR - SW     1  3 0x0000000000200000 ( 'h3' - 'sw' )
"""


ERRORS = (
    "SymbolErrorCounter", "LinkErrorRecoveryCounter", "LinkDownedCounter", "PortRcvErrors",
    "PortRcvRemotePhysicalErrors", "PortRcvSwitchRelayErrors", "PortXmitDiscards",
    "PortXmitConstraintErrors", "PortRcvConstraintErrors", "LocalLinkIntegrityErrors",
    "ExcessiveBufferOverrunErrors", "VL15Dropped", "PortXmitWait", "QP1Dropped",
)


def _block(lid: int, port: int, value: int) -> str:
    """A complete ``perfquery -x`` block with the 64-bit error copies (CapMask2 bit 1)."""
    return (
        f"# Port extended counters: Lid {lid} port {port} (CapMask: 0x1300 CapMask2: 0x0000002)\n"
        f"PortSelect:......................{port}\nCounterSelect:...................0x0000\n"
        f"PortXmitData:....................{value}\n"
        "PortRcvData:.....................1\nPortXmitPkts:....................2\n"
        "PortRcvPkts:.....................3\nPortUnicastXmitPkts:.............4\n"
        "PortUnicastRcvPkts:..............5\nPortMulticastXmitPkts:...........6\n"
        "PortMulticastRcvPkts:............7\nCounterSelect2:..................0x00000000\n"
        "SymbolErrorCounter:..............9\n"
        + "".join(f"{name}:....0\n" for name in ERRORS[1:])
    )


NARROW = (*ERRORS[:12], "PortXmitData", "PortRcvData", "PortXmitPkts", "PortRcvPkts")


def _narrow(lid: int, port: int) -> str:
    """A complete plain ``perfquery`` block."""
    return (f"# Port counters: Lid {lid} port {port} (CapMask: 0x1300)\n"
            f"PortSelect:......................{port}\nCounterSelect:...................0x0000\n"
            + "".join(f"{name}:....1\n" for name in NARROW))


def answer_details(argv: list[str], values: dict[str, int] | None = None) -> CommandResult:
    """What ``perfquery -e -E|-D <lid> <port>`` prints (fields 0 unless in ``values``)."""
    attr = "PortRcvErrorDetails" if "-E" in argv else "PortXmitDiscardDetails"
    lid, port = argv[-2], argv[-1]
    fields = "".join(f"{spec.pma}:....{(values or {}).get(spec.pma, 0)}\n"
                     for spec in DETAIL_ATTRIBUTES[attr])
    return CommandResult(0, f"# {attr} counters: Lid {lid} port {port}\n"
                         f"PortSelect:......{port}\nCounterSelect:....0x0000\n{fields}", "")


def is_detail_read(argv: list[str]) -> bool:
    return "perfquery" in argv[0] and ("-E" in argv or "-D" in argv)


def is_tick_read(argv: list[str]) -> bool:
    return "perfquery" in argv[0] and "-c" in argv


def answer_tick_read(argv: list[str]) -> CommandResult:
    """What ``perfquery -c <lid> <port>`` does against a PMA without PortSamplesControl
    (captured against ibsim, which has no handler for it)."""
    return CommandResult(255, "perfquery: iberror: failed: sampctlquery\n",
                         f"ibwarn: [1] mad_rpc: _do_madrpc failed; dport (Lid {argv[-2]})\n")


def answer_discovery(argv: list[str], text: str) -> CommandResult:
    """What ibnetdiscover does: the text on stdout, the matching cache in --cache FILE."""
    if "--cache" in argv:
        Path(argv[argv.index("--cache") + 1]).write_bytes(
            cache_from_ports(parse_ibnetdiscover_ports(text))
        )
    return CommandResult(0, text if "-p" in argv else "", "ibwarn: noise\n")


class FakeRunner:
    """Answers like the tools would; lid 3 hangs forever, lid 4 prints garbage."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    async def run(self, argv: list[str], timeout: float, max_output: int = 0) -> CommandResult:
        self.calls.append(argv)
        if "ibnetdiscover" in argv[0]:
            return answer_discovery(argv, TOPO)
        if is_tick_read(argv):
            return answer_tick_read(argv)
        detail = is_detail_read(argv)
        lid = int(argv[-2] if detail else argv[argv.index("-l") + 1])
        ports = [int(p) for p in argv[-1].split(",")]
        if lid == 3:
            await asyncio.sleep(3600)  # a perfquery that never returns
        if lid == 4:
            return CommandResult(0, "\x00\x01garbage ### \n", "")
        if detail:
            return answer_details(argv)
        if "-x" not in argv:
            return CommandResult(0, "".join(_narrow(lid, p) for p in ports), "")
        return CommandResult(0, "".join(_block(lid, p, 1000 * lid + p) for p in ports), "")


async def test_hung_and_garbage_nodes_cost_only_their_ports() -> None:
    runner = FakeRunner()
    src = DiagsSource(runner=runner, command_timeout=0.3)
    try:
        topo = await src.discover()
        assert len(topo.ports) == 6
        t0 = time.monotonic()
        snap = await src.sample()
        elapsed = time.monotonic() - t0
    finally:
        await src.close()
    assert elapsed < 3.0  # bounded by the command timeout, not by the hung node
    got = set(snap.ports)
    assert ("0x0000000000200000", "1") in got and ("0x0000000000100001", "1") in got
    assert ("0x0000000000100002", "1") not in got  # lid 3 hung
    assert ("0x0000000000100003", "1") not in got  # lid 4 garbage
    reasons = {(e.reason, e.key) for e in snap.errors}
    assert ("timeout", ("0x0000000000100002", "1")) in reasons
    assert ("parse_error", ("0x0000000000100003", "1")) in reasons
    sw = snap.ports[("0x0000000000200000", "2")]
    assert sw.counters["transmit_data"] == 1002 and "transmit_data" in sw.wide
    assert sw.counters["symbol_errors"] == 9 and "symbol_errors" in sw.wide
    # one process per LID (switch: all its ports at once), not per port
    pq = [c for c in runner.calls if "perfquery" in c[0]]
    assert any(c[-1] == "1,2,3" for c in pq)


async def test_capmask2_learned_skips_narrow_query() -> None:
    runner = FakeRunner()
    src = DiagsSource(runner=runner, command_timeout=0.3)
    try:
        await src.discover()
        await src.sample()
        first = len([c for c in runner.calls if "-l" in c and "-x" not in c])
        runner.calls.clear()
        await src.sample()
        second = len([c for c in runner.calls if "-l" in c and "-x" not in c])
    finally:
        await src.close()
    # only the garbage lid still needs both; the hung one is asked again in the background
    assert first == 4 and second == 1


def test_classify() -> None:
    assert classify(CommandResult(0, "", "")) is None
    assert classify(CommandResult(None, "", "", True)) == "timeout"
    assert classify(CommandResult(127, "", "")) == "tool_missing"
    assert classify(CommandResult(-11, "", "")) == "crashed"
    assert (
        classify(
            CommandResult(
                1,
                "",
                "ibwarn: [1] mad_rpc: _do_madrpc failed; dport (Lid 9)"
                "\nperfquery: iberror: failed: classportinfo query",
            )
        )
        == "mad_timeout"
    )
    assert classify(CommandResult(1, "", "ibwarn: can't open UMAD port (ibsim0:1)")) == "permission"
    assert classify(CommandResult(2, "", "something else")) == "failed"
    # perfquery given a GUID that is not in the fabric (infiniband-diags' IBEXIT text)
    assert classify(CommandResult(
        255, "", "perfquery: iberror: failed: can't resolve destination port 0x0002c903000a0b0c",
    )) == "no_such_lid"


async def test_missing_tool_fails_the_source() -> None:
    src = DiagsSource(runner=SubprocessRunner(), ibnetdiscover="/nonexistent/ibnetdiscover")
    try:
        with pytest.raises(DiagsUnavailableError, match="tool_missing"):
            await src.discover()
    finally:
        await src.close()


@pytest.mark.parametrize(("content", "mode", "why"), [
    (b"#!/bin/sh\nexit 0\n", 0o644, "Permission denied"),  # not executable (even for root)
    (b"\x7fELF, but not a program", 0o755, "Exec format error"),  # a broken install
])
async def test_a_tool_that_cannot_be_run_fails_the_source_by_name(
    tmp_path: Path, content: bytes, mode: int, why: str
) -> None:
    """Not one rejected discovery a poll: the source cannot work at all, and says why."""
    tool = tmp_path / "ibnetdiscover"
    tool.write_bytes(content)
    tool.chmod(mode)
    src = DiagsSource(runner=SubprocessRunner(), ibnetdiscover=str(tool))
    try:
        with pytest.raises(DiagsUnavailableError, match=f"^ibnetdiscover: permission: .*{why}"):
            await src.discover()
    finally:
        await src.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


async def test_real_runner_kills_whole_group_on_timeout(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    script = (
        f"import subprocess, sys, time\n"
        f"c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(c.pid))\n"
        f"time.sleep(3600)\n"
    )
    runner = SubprocessRunner(concurrency=2)
    t0 = time.monotonic()
    res = await runner.run([sys.executable, "-c", script], timeout=1.5)
    assert res.timed_out and res.rc is None and classify(res) == "timeout"
    assert time.monotonic() - t0 < 5
    child = int(pidfile.read_text())
    for _ in range(50):
        if not _alive(child):
            break
        await asyncio.sleep(0.05)
    assert not _alive(child), "grandchild survived the timeout"


async def test_real_runner_sweeps_children_left_by_a_tool_that_exits(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    script = (
        f"import subprocess, sys\n"
        f"c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)'],"
        f" stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        f"open({str(pidfile)!r}, 'w').write(str(c.pid))\nprint('done')\n"
    )
    res = await SubprocessRunner().run([sys.executable, "-c", script], timeout=10)
    assert res.rc == 0 and res.stdout.strip() == "done"
    child = int(pidfile.read_text())
    for _ in range(50):
        if not _alive(child):
            break
        await asyncio.sleep(0.05)
    assert not _alive(child)


async def test_real_runner_reports_a_crash() -> None:
    res = await SubprocessRunner().run(
        [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"], 10
    )
    assert classify(res) == "crashed"


class Discoveries:
    """An ibnetdiscover whose answers the test scripts: (text, exit status, cache text)."""

    def __init__(self) -> None:
        self.answers: list[tuple[str, int, str]] = []

    async def run(self, argv: list[str], timeout: float, max_output: int = 0) -> CommandResult:
        if is_detail_read(argv):
            return answer_details(argv)
        if is_tick_read(argv):
            return answer_tick_read(argv)
        if "perfquery" in argv[0]:  # every node answers
            lid = int(argv[argv.index("-l") + 1])
            ports = [int(p) for p in argv[-1].split(",")]
            make = (lambda p: _block(lid, p, p)) if "-x" in argv else (lambda p: _narrow(lid, p))
            return CommandResult(0, "".join(make(p) for p in ports), "")
        text, rc, cache_text = self.answers.pop(0)
        if "--cache" in argv and cache_text:
            answer_discovery(argv, cache_text)  # the cache of the fabric as it is
        return CommandResult(rc, text, "ibnetdiscover: iberror: failed" if rc else "")


def _star(hosts: int) -> str:
    """``ibnetdiscover -p`` of one switch and ``hosts`` hosts on its ports 1, 2, ..."""
    return "".join(
        f"SW     1  {h} 0x0000000000200000 4x EDR - CA     {h + 1}  1 0x000000000010000{h} "
        f"( 'sw' - 'h{h}' )\n"
        f"CA     {h + 1}  1 0x000000000010000{h} 4x EDR - SW     1  {h} 0x0000000000200000 "
        f"( 'h{h}' - 'sw' )\n"
        for h in range(1, hosts + 1)
    )


def _switch_only(topo: str) -> str:
    return "".join(ln for ln in topo.splitlines(keepends=True) if ln.startswith("SW"))


async def test_a_rejected_discovery_keeps_the_last_topology() -> None:
    runner = Discoveries()
    src = DiagsSource(runner=runner, command_timeout=5)
    # Six nodes, then the switch and one host. (A discovery that reaches only the local node is
    # a blind one, never a shrink: the topology memory refuses it every time.)
    big, small = _star(5), _star(1)
    try:
        runner.answers.append(("garbage\n" * 1000, 0, TOPO))
        with pytest.raises(DiagsUnavailableError, match=r"no topology yet.*parse_error"):
            await src.discover()  # nothing to keep: the poll fails
        runner.answers.append((big, 0, big))
        good = await src.discover()
        assert len(good.ports) == 10
        with capture_logs() as logs:
            for answer in [
                (big[: len(big) // 2], 1, big),  # half an output and exit 1
                ("", 0, big),  # nothing at all
                ("~" * 99 + "\n") * 10_000,  # 1 MB of garbage
                ("".join(big.splitlines(keepends=True)[:-2]), 0, big),  # cut at a line end
                (small, 0, small),  # 2 nodes where there were 6: implausible...
                (small, 0, small),
            ]:
                runner.answers.append(answer if isinstance(answer, tuple) else (answer, 0, big))
                assert await src.discover() == good
                snap = await src.sample()
                assert [e.reason for e in snap.errors if e.key is None] == ["discovery_rejected"]
                assert len(snap.ports) == 10  # every port of the last good topology polled
            runner.answers.append((small, 0, small))  # ...until three discoveries agree
            assert {("0x0000000000100001", "1"), ("0x0000000000200000", "1")} <= set(
                (await src.discover()).ports
            )
        rejected = [e for e in logs if e["event"] == "discovery_rejected"]
        assert [e["cause"] for e in rejected] == [
            "failed", "empty", "parse_error", "incomplete", "implausible", "implausible",
        ]
        incomplete = next(e["detail"] for e in rejected if e["cause"] == "incomplete")
        assert incomplete.startswith("the text lacks 1 of the 6 nodes in the cache")
        assert all(len(e["detail"]) < 400 for e in rejected)  # a sample, not the output
        assert [e["event"] for e in logs if e["event"] == "fabric_shrank"] == ["fabric_shrank"]
    finally:
        await src.close()


async def test_only_implausible_discoveries_in_a_row_accept_a_shrink() -> None:
    """A good discovery between two small ones starts the count again: a flaky local port
    that now and then sees only its own switch never shrinks the fabric."""
    runner = Discoveries()
    src = DiagsSource(runner=runner, command_timeout=5)
    big, small = _star(5), _star(1)
    try:
        runner.answers += [(big, 0, big), (small, 0, small), (big, 0, big)]
        good = await src.discover()
        assert await src.discover() == good
        assert await src.discover() == good
        runner.answers += [(small, 0, small)] * 3
        with capture_logs() as logs:
            assert await src.discover() == good
            assert await src.discover() == good  # the second in a row, not the third
            assert not [e for e in logs if e["event"] == "fabric_shrank"]
            await src.discover()  # the third: the fabric did shrink
        assert [e["discoveries"] for e in logs if e["event"] == "fabric_shrank"] == [3]
    finally:
        await src.close()


async def test_the_first_discovery_may_take_most_of_the_poll() -> None:
    """With no topology to keep polling, a slow first discovery gets 0.9 of the poll timeout;
    later ones get the discovery budget, so a hung node still fits in the same poll."""
    runner = Discoveries()
    seen: list[float] = []
    run = runner.run

    async def timed(argv: list[str], timeout: float, max_output: int = 0) -> CommandResult:
        if "ibnetdiscover" in argv[0]:
            seen.append(timeout)
        return await run(argv, timeout, max_output)

    runner.run = timed  # type: ignore[method-assign]
    src = DiagsSource(runner=runner, interval=1.0)
    try:
        runner.answers += [(TOPO, 0, TOPO), (TOPO, 0, TOPO)]
        await src.discover()
        await src.discover()
    finally:
        await src.close()
    assert seen == [9.0, 5.0]  # poll timeout 10 s: 0.9 of it, then half
