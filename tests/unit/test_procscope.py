"""Kill scopes: nothing a tool starts outlives its command, nothing else is
touched. Real processes: tools are small Python programs that fork, call setsid, hang or flood.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from ibmon.sources.diags import SubprocessRunner, classify
from ibmon.sources.procscope import SCOPE_ENV, become_subreaper, children, read_stat


def _escaping_tool(pidfile: Path, *, then: str = "print('done')") -> list[str]:
    """A tool whose grandchild leaves the session, keeps stdout and stderr, sleeps an hour."""
    script = (
        "import os, sys, time\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        open({str(pidfile)!r}, 'w').write(str(os.getpid()))\n"
        "        time.sleep(3600)\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        f"while not os.path.exists({str(pidfile)!r}): time.sleep(0.01)\n"
        f"{then}\n"
    )
    return [sys.executable, "-c", script]


def _gone(pid: int) -> bool:
    st = read_stat(pid)
    return st is None or st.zombie


def _all_zombie_children() -> set[int]:
    return {c for c in children(os.getpid()) if (st := read_stat(c)) and st.zombie}


#: Zombies this process had before the test: once an earlier test in the same pytest process ran
#: a tool through the kill scopes, this process is a subreaper and adopts (and never reaps) the
#: orphans other tests' killed daemons leave. They are not what these tests are about.
_FOREIGN: set[int] = set()


@pytest.fixture(autouse=True)
def _foreign_zombies() -> None:
    _FOREIGN.clear()
    _FOREIGN.update(_all_zombie_children())


def _zombie_children() -> list[int]:
    """This test's zombies: children left unreaped since the test began."""
    return sorted(_all_zombie_children() - _FOREIGN)


async def _settle(pred: object, timeout: float = 5.0) -> None:
    """Wait for ``pred()`` (processes take a moment to die after SIGKILL)."""
    assert callable(pred)
    for _ in range(int(timeout / 0.02)):
        if pred():
            return
        await asyncio.sleep(0.02)


async def test_a_setsid_grandchild_holding_stdout_is_killed_when_the_tool_exits(
    tmp_path: Path,
) -> None:
    assert become_subreaper()
    pidfile = tmp_path / "grandchild"
    res = await SubprocessRunner().run(_escaping_tool(pidfile), timeout=30)
    # the command did not wait for the grandchild's copy of stdout to close
    assert not res.timed_out and res.rc == 0 and res.stdout == "done\n"
    assert res.duration < 15  # far below the timeout it would otherwise run into
    assert res.strays == 1
    grandchild = int(pidfile.read_text())
    assert _gone(grandchild)
    await _settle(lambda: grandchild not in children(os.getpid()))
    assert grandchild not in children(os.getpid())  # killed and reaped: no zombie left
    assert not _zombie_children()


async def test_a_hung_tool_is_killed_with_everything_below_it(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild"
    res = await SubprocessRunner().run(
        _escaping_tool(pidfile, then="time.sleep(3600)"), timeout=1.5
    )
    assert res.timed_out and classify(res) == "timeout"
    grandchild = int(pidfile.read_text())
    await _settle(lambda: _gone(grandchild))
    assert _gone(grandchild)
    await _settle(lambda: not _zombie_children())
    assert not _zombie_children()


async def test_a_tool_that_floods_is_stopped_at_the_cap() -> None:
    flood = [sys.executable, "-c", "import sys\nwhile True: sys.stdout.write('x' * 65536)"]
    res = await SubprocessRunner().run(flood, timeout=30, max_output=1 << 20)
    assert res.too_large and not res.timed_out
    assert classify(res) == "output_too_large"
    assert len(res.stdout) == 1 << 20


async def test_foreign_children_and_running_scopes_are_left_alone(tmp_path: Path) -> None:
    """Only a finished command's leftovers are killed: another component's child and the
    grandchild of a command still running survive another command's end."""
    # deliberately not asyncio's: a child another part of the process owns and waits for
    foreign = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])  # noqa: ASYNC220
    pidfile = tmp_path / "grandchild"
    runner = SubprocessRunner(concurrency=4)
    try:
        slow = asyncio.ensure_future(
            runner.run(_escaping_tool(pidfile, then="time.sleep(2); print('slow')"), 30)
        )
        await _settle(pidfile.exists)
        quick = await runner.run(_escaping_tool(tmp_path / "other"), 30)
        assert quick.strays == 1 and _gone(int((tmp_path / "other").read_text()))
        grandchild = int(pidfile.read_text())
        assert not _gone(grandchild)  # its command is still running
        res = await slow
        assert res.stdout == "slow\n" and res.strays == 1
        await _settle(lambda: _gone(grandchild))
        assert _gone(grandchild)
        assert foreign.poll() is None  # never touched, never reaped behind Popen's back
    finally:
        foreign.kill()
    assert foreign.wait(timeout=10) == -9  # its own status, reaped by its owner


async def test_the_scope_token_reaches_the_tool_and_strays_are_logged_once(
    tmp_path: Path,
) -> None:
    runner = SubprocessRunner()
    env = await runner.run([sys.executable, "-c", f"import os; print(os.environ['{SCOPE_ENV}'])"],
                           30)
    assert env.stdout.startswith(f"{os.getpid()}.")
    with capture_logs() as logs:
        for n in range(3):
            res = await runner.run(_escaping_tool(tmp_path / f"g{n}"), 30)
            assert res.strays == 1
    warned = [e for e in logs if e["event"] == "tool_left_processes"]
    assert len(warned) == 1  # one line a minute per tool, not one per command
    assert warned[0]["killed"] == 1 and warned[0]["log_level"] == "warning"


async def test_a_command_cancelled_twice_still_cleans_up(tmp_path: Path) -> None:
    """A poll's deadline and a shutdown can cancel a command, and cancel it again while it is
    cleaning up: the tool and its grandchild still die, are reaped, and no pipe is left open
    (an unclosed transport would complain when collected)."""
    import gc

    pidfile = tmp_path / "grandchild"
    runner = SubprocessRunner()
    task = asyncio.ensure_future(
        runner.run(_escaping_tool(pidfile, then="time.sleep(3600)"), 30)
    )
    await _settle(pidfile.exists)
    grandchild = int(pidfile.read_text())
    task.cancel()
    await asyncio.sleep(0)
    task.cancel()  # again, while the first cancellation is being handled
    results = await asyncio.gather(task, return_exceptions=True)
    assert isinstance(results[0], asyncio.CancelledError)
    await runner.aclose()
    await _settle(lambda: _gone(grandchild) and not _zombie_children())
    assert _gone(grandchild)
    assert not _zombie_children()
    gc.collect()


async def test_a_tool_runs_in_a_session_and_process_group_of_its_own() -> None:
    """A Ctrl-C at ibmon's terminal (SIGINT to its foreground group) reaches ibmon, which
    stops its tools itself; and a tool's whole group can be killed without touching ibmon."""
    probe = "import os; print(os.getsid(0) == os.getpid(), os.getpgid(0) == os.getpid())"
    res = await SubprocessRunner().run([sys.executable, "-c", probe], timeout=10)
    assert (res.rc, res.stdout.split()) == (0, ["True", "True"])


def test_a_command_name_with_parentheses_is_read_whole(tmp_path: Path) -> None:
    """``/proc/<pid>/stat`` puts the command name in parentheses, and a name may hold them
    itself (a tool's helper is named by whoever wrote it): the fields after it are still found,
    so its parent, group and session say where it belongs."""
    odd = tmp_path / "a) S 1 (b"
    odd.symlink_to(Path(sys.executable).resolve())
    proc = subprocess.Popen([str(odd), "-c", "import time; time.sleep(30)"],
                            start_new_session=True)
    try:
        st = read_stat(proc.pid)
        assert st is not None
        assert (st.comm, st.ppid, st.pgrp, st.session) == ("a) S 1 (b", os.getpid(), proc.pid,
                                                          proc.pid)
    finally:
        proc.kill()
        proc.wait()


def test_without_the_children_files_children_are_found_by_their_parent_field(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A kernel built without ``/proc/<pid>/task/<tid>/children`` (CONFIG_PROC_CHILDREN) still
    lets a scope find what a tool left behind: every process's parent field is read instead."""
    import builtins

    from ibmon.sources import procscope

    def no_children_files(path: object, *args: object, **kwargs: object) -> object:
        if str(path).endswith("/children"):
            raise FileNotFoundError(path)
        return builtins.open(path, *args, **kwargs)  # type: ignore[call-overload]

    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
             for _ in range(2)]
    try:
        monkeypatch.setattr(procscope, "open", no_children_files, raising=False)
        assert {p.pid for p in procs} <= set(children(os.getpid()))
    finally:
        for p in procs:
            p.kill()
            p.wait()


async def test_a_child_that_exits_before_its_tool_is_reaped_not_left_a_zombie() -> None:
    """A tool that never waits for a child it started leaves it a zombie, re-parented to ibmon
    (the subreaper) when the tool exits: it is reaped with the tool's scope, or every such
    command would leave one more zombie, for as long as the daemon runs."""
    assert become_subreaper()
    tool = ("import os, time\n"
            "if os.fork() == 0:\n"
            "    os._exit(0)\n"
            "time.sleep(0.2)\n"  # the child is a zombie now; the tool exits without reaping it
            "print(os.getpid())\n")
    res = await SubprocessRunner().run([sys.executable, "-c", tool], timeout=30)
    assert res.rc == 0 and res.strays == 0  # nothing was left running
    await _settle(lambda: not _zombie_children())
    assert not _zombie_children()
