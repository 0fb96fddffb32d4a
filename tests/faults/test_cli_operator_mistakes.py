"""The CLI, config, state file and API never blind, never wrong: the real ``ibmon`` and daemon.

Every test runs the real command line (``python -m ibmon``) and, where a daemon is involved, a
real ``ibmon run`` on an ephemeral loopback port, and checks what an operator relies on: a
mistake is one line that says what to fix (and never prints a password), something that is not
ours is never replaced, and a textfile or an API answer never looks clean while it is not.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.faults.daemonproc import REPO, DaemonProcess
from tests.faults.promise import Scrape, TotalsWatch
from tests.sysfs_tree import FULL_COUNTERS, write_device, write_port
from tests.syspkg import unavailable

SECRET = "s3cr3t-Pw"  # a test password: it must never be printed


def ibmon(*args: str, env: dict[str, str] | None = None, cwd: Path = REPO,
          timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("IBMON_")}
    full["IBMON_LOG__FORMAT"] = "json"
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "ibmon", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=full, check=False)


def one_line_error(proc: subprocess.CompletedProcess[str], needle: str) -> str:
    """The single ``ibmon: error:`` line of a refused command (exit 2, no traceback)."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("ibmon: error: "), lines[0]
    assert needle in lines[0], lines[0]
    return lines[0]


def sysfs(root: Path, **counters: int | str) -> Path:
    write_device(root, "mlx5_0")
    write_port(root, "mlx5_0", 1, counters={**FULL_COUNTERS, **counters})
    return root


def scan_prom(root: Path, output: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return ibmon("scan", "--sysfs-root", str(root), "--interval", "0", "--format", "prom",
                 "--output", output, *extra)


# --- scan --output -------------------------------------------------------------------------------


def _make(kind: str, path: Path) -> None:
    if kind == "character device":
        if os.geteuid() != 0:
            unavailable("creating a character device needs root")
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # what /dev/null is
    elif kind == "FIFO":
        os.mkfifo(path)
    elif kind == "symlink":
        path.symlink_to("/dev/null")
    else:
        path.mkdir()


@pytest.mark.parametrize("kind", ["character device", "FIFO", "symlink", "directory"])
def test_scan_output_never_replaces_what_is_not_a_regular_file(tmp_path: Path, kind: str) -> None:
    """``--output /dev/null`` under the documented root cron job would replace /dev/null."""
    root = sysfs(tmp_path / "sys")
    target = tmp_path / "mynull"
    _make(kind, target)
    before = os.lstat(target)
    error = one_line_error(scan_prom(root, str(target)), "not a regular file")
    assert kind in error and "not replacing it" in error
    after = os.lstat(target)
    assert stat.S_IFMT(after.st_mode) == stat.S_IFMT(before.st_mode)
    assert (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_scan_output_replaces_a_regular_file_and_creates_a_new_one(tmp_path: Path) -> None:
    root = sysfs(tmp_path / "sys")
    old = tmp_path / "old.prom"
    old.write_text("stale\n")
    new = tmp_path / "new.prom"
    for path in (old, new):
        proc = scan_prom(root, str(path))
        assert proc.returncode == 0, proc.stderr
        assert path.read_text().startswith("# HELP ibmon_build_info")


def test_scan_output_empty_path_says_it_is_empty(tmp_path: Path) -> None:
    """``--output ""`` said "Device or resource busy" (it became ``.``)."""
    root = sysfs(tmp_path / "sys")
    one_line_error(scan_prom(root, ""), "--output: the path is empty")


def test_textfile_carries_read_errors_as_the_daemon_counts_them(tmp_path: Path) -> None:
    """A counter file that cannot be read showed on stderr only: the textfile looked clean."""
    root = sysfs(tmp_path / "sys", symbol_error="junk\n")
    out = tmp_path / "ibmon.prom"
    proc = scan_prom(root, str(out))
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert "# TYPE ibmon_source_poll_errors_total counter\n" in text
    assert 'ibmon_source_poll_errors_total{reason="garbage",source="sysfs"} 2.0\n' in text
    assert 'ibmon_source_up{source="sysfs"} 1.0' in text  # the rest was read
    check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                           text=True, timeout=60, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    clean = sysfs(tmp_path / "clean")
    ok = tmp_path / "clean.prom"
    assert scan_prom(clean, str(ok)).returncode == 0
    assert "ibmon_source_poll_errors" not in ok.read_text()


# --- IBMON_PASSWORD, --url -----------------------------------------------------------------------


def mock_config(tmp: Path, extra: str = "") -> Path:
    cfg = tmp / "ibmon.toml"
    cfg.write_text('[prometheus]\nlisten = "127.0.0.1:0"\n' + extra +
                   '[[sources]]\ntype = "mock"\nname = "sim"\nscenario = "congestion"\n'
                   'interval = "100ms"\n')
    return cfg


def basic_auth(tmp: Path) -> str:
    users = tmp / "users"
    users.write_text(f"ops:{hashlib.sha256(SECRET.encode()).hexdigest()}\n")
    return f'basic_auth_file = "{users}"\n'


def polled(s: Scrape) -> bool:
    return (s.value("ibmon_source_poll_duration_seconds_count", source="sim") or 0) >= 2


def test_client_password_variable_starts_every_command_and_reaches_the_daemon(
    tmp_path: Path,
) -> None:
    """``IBMON_PASSWORD`` (documented for ``top --url``) was refused as "no such setting", and
    with it exported ``run``, ``scan`` and ``check-config`` refused to start."""
    env = {"IBMON_PASSWORD": SECRET}
    cfg = mock_config(tmp_path, basic_auth(tmp_path))
    assert ibmon("check-config", str(cfg), env=env).returncode == 0
    scan = ibmon("scan", "--source", "mock", "--interval", "0", env=env)
    assert scan.returncode == 0, scan.stderr
    # the daemon's totals are read through the authenticated client here, not scraped
    daemon = DaemonProcess(tmp_path, cfg, TotalsWatch(expect_scrapes=False), env=env)
    try:
        daemon.start()
        url = f"http://127.0.0.1:{daemon.port}"
        top = ibmon("top", "--once", "--url", url, "--user", "ops", env=env)
        assert top.returncode == 0, top.stderr
        assert "ports" in top.stdout
        wrong = ibmon("top", "--once", "--url", url, "--user", "ops",
                      env={"IBMON_PASSWORD": "wrong"})
        one_line_error(wrong, "401")
        assert daemon.stop() == 0
    finally:
        daemon.cleanup()
    daemon.traceback_free()


@pytest.mark.parametrize(("url", "needle"), [
    ("http://[::1", "brackets"),
    ("http://[::1:9683", "brackets"),
    ("http://local host:9683", "no spaces"),
    ("http://127.0.0.1:9683/a b", "no spaces"),
    ("http://127.0.0.1:port", "port must be a number"),
    ("http://127.0.0.1:99999", "port must be a number"),
    (f"http://ops:{SECRET}@127.0.0.1:9683", "--password-file"),
    (f"http://ops:{SECRET}@[::1", "--password-file"),  # the password is named first
    (f"ftp://ops:{SECRET}@127.0.0.1", "http://"),
])
@pytest.mark.parametrize("command", [("top", "--once"), ("explain", "aa/1"), ("topology",)])
def test_url_mistakes_are_one_line_without_the_password(
    url: str, needle: str, command: tuple[str, ...]
) -> None:
    proc = ibmon(*command, "--url", url)
    line = one_line_error(proc, needle)
    assert SECRET not in proc.stderr + proc.stdout, line


# --- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "needle"), [
    ('[[sources]]\ntype = "mock"\ninterval = "\u0661s"\n', "sources.0.interval: invalid duration"),
    ('[[sources]]\ntype = "mock"\ninterval = "\uff11s"\n', "sources.0.interval: invalid duration"),
    ('[[sources]]\ntype = "mock"\nspeed = nan\n', "sources.0.speed: must be a finite number"),
    ('[[sources]]\ntype = "mock"\nspeed = inf\n', "sources.0.speed: must be a finite number"),
])
def test_config_values_nobody_means_are_refused_in_words_that_fit(
    tmp_path: Path, body: str, needle: str
) -> None:
    cfg = tmp_path / "ibmon.toml"
    cfg.write_text(body, encoding="utf-8")
    for command in (("check-config", str(cfg)), ("run", "--config", str(cfg))):
        one_line_error(ibmon(*command), needle)


@pytest.mark.parametrize("args", [
    ("demo", "--speed", "nan"),
    ("demo", "--interval", "inf"),
    ("scan", "--source", "mock", "--interval", "nan"),
    ("top", "--source", "mock", "--once", "--interval", "nan"),
])
def test_flags_that_are_no_number_say_so(args: tuple[str, ...]) -> None:
    """``--speed nan`` said "should be less than or equal to 10000"; ``--interval inf`` ran."""
    one_line_error(ibmon(*args, timeout=30), f"must be a finite number, got {args[-1]}")


def test_too_deep_environment_json_blames_the_variable_not_the_file(tmp_path: Path) -> None:
    cfg = mock_config(tmp_path)
    deep = "[" * 5000 + "]" * 5000
    line = one_line_error(ibmon("check-config", str(cfg), env={"IBMON_SOURCES": deep}),
                          "environment variable IBMON_SOURCES: nested deeper")
    assert str(cfg) not in line


# --- state path ----------------------------------------------------------------------------------


def state_config(tmp: Path, root: Path, state: Path) -> Path:
    cfg = tmp / "state.toml"
    cfg.write_text(
        '[prometheus]\nlisten = "127.0.0.1:0"\n'
        f'[[sources]]\ntype = "sysfs"\nname = "node"\nroot = "{root}"\ninterval = "100ms"\n'
        f'[state]\npath = "{state}"\nsave_interval = "1h"\n')
    return cfg


def node_polled(s: Scrape) -> bool:
    return (s.value("ibmon_source_poll_duration_seconds_count", source="node") or 0) >= 2


def test_directory_at_the_state_path_costs_the_state_not_the_monitoring(tmp_path: Path) -> None:
    """README: a directory at the state path starts without saved state; ``run`` exited 2."""
    root = sysfs(tmp_path / "sys")
    state = tmp_path / "state.json"
    state.mkdir()
    cfg = state_config(tmp_path, root, state)
    assert ibmon("check-config", str(cfg)).returncode == 0
    daemon = DaemonProcess(tmp_path, cfg, TotalsWatch())
    try:
        daemon.start()
        up = daemon.scrape_until("two polls", node_polled)
        assert up.value("ibmon_source_up", source="node") == 1
        assert up.value("ibmon_state_file_errors_total", reason="not_a_file") == 1
        (problem,) = daemon.events("state_file_problem")
        assert "directory" in problem["detail"]
        assert "starting without saved state" in problem["consequence"]
        assert daemon.stop() == 0
        refused = daemon.events("state_file_problem")[1]
        assert refused["reason"] == "save_failed" and "not replacing it" in refused["detail"]
    finally:
        daemon.cleanup()
    assert state.is_dir() and not any(state.iterdir())
    daemon.traceback_free()


def test_symlink_to_dev_null_at_the_state_path_stays_refused(tmp_path: Path) -> None:
    """"saves are refused until it is removed", then the next save replaced the symlink."""
    root = sysfs(tmp_path / "sys")
    state = tmp_path / "state.json"
    state.symlink_to("/dev/null")
    daemon = DaemonProcess(tmp_path, state_config(tmp_path, root, state), TotalsWatch())
    try:
        daemon.start()
        daemon.scrape_until("two polls", node_polled)
        (problem,) = daemon.events("state_file_problem")
        assert problem["reason"] == "not_a_file"
        assert "saves are refused" in problem["consequence"]
        assert daemon.stop() == 0
        refused = daemon.events("state_file_problem")[1]
        assert refused["reason"] == "save_failed"
        assert "symlink to a character device" in refused["detail"]
    finally:
        daemon.cleanup()
    assert state.is_symlink() and os.readlink(state) == "/dev/null"
    daemon.traceback_free()


# --- a start that fails --------------------------------------------------------------------------


def test_a_start_that_fails_says_only_why(tmp_path: Path) -> None:
    """``ibmon demo`` on a busy port logged ``stopped`` before its one error line."""
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = ibmon("demo", "--listen", f"127.0.0.1:{port}")
    one_line_error(proc, f"cannot listen on 127.0.0.1:{port}: address already in use")


# --- the API's queries ---------------------------------------------------------------------------


def get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_api_refuses_queries_that_cannot_be_meant(tmp_path: Path) -> None:
    """``?condition=nonsense`` and ``events?since=garbage`` answered 200 (nothing there); a bad
    cursor's 400 carried the decoder's words."""
    daemon = DaemonProcess(tmp_path, mock_config(tmp_path), TotalsWatch())
    try:
        daemon.start()
        daemon.scrape_until("two polls", polled)
        base = f"http://127.0.0.1:{daemon.port}/api/v1"
        status, doc = get(f"{base}/ports?condition=nonsense")
        assert status == 400
        assert doc["error"].startswith("condition must be one of ")
        assert "congestion" in doc["error"] and "high_ber" in doc["error"]
        assert get(f"{base}/ports?condition=congestion")[0] == 200
        status, doc = get(f"{base}/events?since=garbage")
        assert status == 400 and "since must be an event id" in doc["error"]
        status, doc = get(f"{base}/events?type=nonsense")
        assert status == 400 and "port_down" in doc["error"]
        status, events = get(f"{base}/events")
        assert status == 200
        if events["events"]:
            assert get(f"{base}/events?since={events['events'][0]['id']}")[0] == 200
        for path in ("ports", "topology"):
            for cursor in ("!!!", "W10", "eyJ", "a" * 600):
                status, doc = get(f"{base}/{path}?cursor={cursor}")
                assert status == 400
                assert doc["error"] == ("cursor is not one this server gave (pass the previous"
                                        " answer's next)")
        assert daemon.stop() == 0
    finally:
        daemon.cleanup()
    daemon.traceback_free()
