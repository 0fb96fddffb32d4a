"""Fault matrix, the daemon itself: it stays up and says what is wrong.

Reloads (SIGHUP) to configs that validate but cannot start, or do not validate, must leave the
running config serving and say so (log line, ``ibmon_config_reloads_total{result}``); flags given
at start survive reloads; a daemon that cannot listen exits 2 with one line naming the address;
``check-config`` refuses, with ``run``'s own words, every config ``run`` would refuse. Real
``python -m ibmon`` processes, real sockets (a port held by a real listener), real TLS files
made with the openssl CLI; every scrape goes through one ``TotalsWatch``.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.daemonproc import REPO, DaemonProcess, group_gone, wait_until
from tests.faults.promise import Scrape, TotalsWatch
from tests.mqtt_broker import free_port, make_tls
from tests.sysfs_tree import write_device, write_port
from tests.syspkg import require_binary

GUID = "0x0002c90300a1b2c3"
TX = "ibmon_port_transmit_data_bytes_total"
RELOADS = "ibmon_config_reloads_total"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    write_device(root, "mlx5_0")
    write_port(root, "mlx5_0", 1)
    return root


def write_config(path: Path, tree: Path, *, prometheus: str = 'listen = "127.0.0.1:0"\n',
                 extra: str = "") -> Path:
    path.write_text(
        f"[prometheus]\n{prometheus}"
        f'[[sources]]\ntype = "sysfs"\nname = "node"\nroot = "{tree}"\ninterval = "100ms"\n'
        f'[state]\npath = "{path.parent / "state.json"}"\n{extra}'
    )
    return path


def polls(s: Scrape) -> float:
    return s.value("ibmon_source_poll_duration_seconds_count", source="node") or 0.0


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port a real listener holds for the test."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


def reload(daemon: DaemonProcess, result: str, before: Scrape) -> Scrape:
    """SIGHUP, then scrape until the reload counted ``result`` and two more polls happened."""
    count = before.value(RELOADS, result=result) or 0
    daemon.signal(signal.SIGHUP)
    after = daemon.scrape_until(f"a reload {result}",
                                lambda s: (s.value(RELOADS, result=result) or 0) == count + 1)
    return daemon.scrape_until("polls after the reload", lambda s: polls(s) >= polls(after) + 2)


# -- reloads ------------------------------------------------------------------------------


def test_a_reload_that_cannot_start_keeps_the_running_config(
    tmp_path: Path, tree: Path, busy_port: int
) -> None:
    """A valid config whose port is taken used to kill the daemon with exit 2 (no restart by
    systemd); a missing TLS file too. Now both are refused and the old listener keeps serving."""
    cfg = write_config(tmp_path / "ibmon.toml", tree)
    watch = TotalsWatch()
    daemon = DaemonProcess(tmp_path, cfg, watch)
    try:
        daemon.start()
        first = daemon.scrape_until("polls", lambda s: polls(s) >= 2)
        assert first.value("ibmon_config_last_reload_successful") == 1

        write_config(cfg, tree, prometheus=f'listen = "127.0.0.1:{busy_port}"\n')
        taken = reload(daemon, "failed", first)
        assert taken.value("ibmon_config_last_reload_successful") == 0
        assert taken.value("ibmon_source_up", source="node") == 1
        (failed,) = daemon.events("reload_failed")
        assert failed["error"] == f"cannot listen on 127.0.0.1:{busy_port}: address already in use"
        assert "running config stays" in failed["consequence"]

        write_config(cfg, tree, prometheus='listen = "127.0.0.1:0"\ntls_cert = "/nonexistent/'
                     'tls.crt"\ntls_key = "/nonexistent/tls.key"\n')
        missing = reload(daemon, "rejected", taken)
        (rejected,) = daemon.events("reload_rejected")
        assert rejected["error"] == (
            f"{cfg}: prometheus.tls_cert: cannot read /nonexistent/tls.crt: "
            "No such file or directory")
        assert missing.value("ibmon_config_reloads_total", result="applied") == 0

        new_port = free_port()
        write_config(cfg, tree, prometheus=f'listen = "127.0.0.1:{new_port}"\n')
        old_url = daemon.url
        daemon.signal(signal.SIGHUP)
        wait_until("the reload", lambda: bool(daemon.events("config_reloaded")))
        daemon.port = new_port
        moved = daemon.scrape_until("polls on the new port", lambda s: polls(s) >= 2)
        assert moved.value("ibmon_config_last_reload_successful") == 1
        assert moved.value(RELOADS, result="applied") == 1
        assert moved.value(TX, guid=GUID, port="1") == 8000  # totals kept (2000 raw x 4)
        with pytest.raises(urllib.error.URLError, match="Connection refused"):
            urllib.request.urlopen(old_url, timeout=5)  # the old listener is closed
        assert daemon.proc is not None and daemon.proc.poll() is None
        assert daemon.stop() == 0
    finally:
        daemon.cleanup()
    daemon.traceback_free()


def test_a_reload_on_the_same_address_hands_the_listening_socket_over(
    tmp_path: Path, tree: Path
) -> None:
    """Turning TLS on with the same ``listen`` opens the new listener before the old closes:
    on ``127.0.0.1:0`` the port stays the same (a close-then-bind would get another one), and a
    client connecting throughout the reload is never refused. The daemon started without TLS,
    so without OpenSSL (``ibmon.runtime.sslgate``): the reload loads it and hands it to asyncio."""
    require_binary("openssl")
    tls = make_tls(tmp_path / "tls")
    cfg = write_config(tmp_path / "ibmon.toml", tree)
    watch = TotalsWatch()
    daemon = DaemonProcess(tmp_path, cfg, watch)
    refused: list[BaseException] = []
    connects = 0
    done = threading.Event()

    def knock() -> None:
        nonlocal connects
        while not done.is_set():
            try:
                socket.create_connection(("127.0.0.1", daemon.port), timeout=5).close()
                connects += 1
            except OSError as exc:
                refused.append(exc)
            time.sleep(0.001)

    knocker = threading.Thread(target=knock, name="knock")
    try:
        daemon.start()
        before = daemon.scrape_until("polls", lambda s: polls(s) >= 2)
        assert daemon.proc is not None
        maps = Path(f"/proc/{daemon.proc.pid}/maps").read_text()
        assert "libssl" not in maps and "libcrypto" not in maps  # no TLS yet: no OpenSSL
        port = daemon.port
        write_config(cfg, tree, prometheus=f'listen = "127.0.0.1:0"\ntls_cert = '
                     f'"{tls.server_cert}"\ntls_key = "{tls.server_key}"\n')
        knocker.start()
        daemon.signal(signal.SIGHUP)
        wait_until("the reload", lambda: bool(daemon.events("config_reloaded")))
        done.set()
        knocker.join()
        assert [e["port"] for e in daemon.events("listening")] == [port, port]
        ctx = ssl.create_default_context(cafile=str(tls.ca))
        https = f"https://127.0.0.1:{port}/metrics"

        def scrape_tls() -> Scrape:
            from tests.faults.promise import parse_exposition

            with urllib.request.urlopen(https, timeout=10, context=ctx) as resp:
                return watch.check(parse_exposition(resp.read().decode()))

        after = scrape_tls()
        assert after.value(RELOADS, result="applied") == 1
        assert after.value(TX, guid=GUID, port="1") == before.value(TX, guid=GUID, port="1")
        assert refused == [] and connects > 0
        assert daemon.stop() == 0
    finally:
        done.set()
        if knocker.is_alive():
            knocker.join()
        daemon.cleanup()
    daemon.traceback_free()


def test_sighup_keeps_the_listen_flag(tmp_path: Path, tree: Path) -> None:
    """``run --listen`` used to fall back to the file's address at the first SIGHUP."""
    port = free_port()
    cfg = write_config(tmp_path / "ibmon.toml", tree)
    watch = TotalsWatch()
    daemon = DaemonProcess(tmp_path, cfg, watch, args=("--listen", f"127.0.0.1:{port}"))
    try:
        daemon.start()
        assert daemon.port == port
        before = daemon.scrape_until("polls", lambda s: polls(s) >= 2)
        write_config(cfg, tree, extra="[detect.congestion]\nenabled = false\n")
        after = reload(daemon, "applied", before)  # scraped on the flag's port throughout
        assert after.value("ibmon_config_last_reload_successful") == 1
        assert [e["port"] for e in daemon.events("listening")] == [port]  # never re-opened
        assert daemon.stop() == 0
    finally:
        daemon.cleanup()
    daemon.traceback_free()


# -- a daemon that cannot listen ---------------------------------------------------------


def ibmon(*args: str, env: dict[str, str] | None = None,
          timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run ``python -m ibmon`` in its own session; also checks nothing of it outlived it."""
    started = time.monotonic()
    with subprocess.Popen(
        [sys.executable, "-m", "ibmon", *args], cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "IBMON_LOG__FORMAT": "json", **(env or {})},
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise AssertionError(f"ibmon {' '.join(args)} did not exit:\n{err}") from None
        elapsed = time.monotonic() - started
        wait_until("its process group to be gone", lambda: group_gone(proc.pid))
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), elapsed


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """Exit 2, no traceback, and exactly one non-log line on stderr: the error."""
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith("{")]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("ibmon: error: "), lines
    return lines[0].removeprefix("ibmon: error: ")


@pytest.mark.parametrize("command", ["run", "demo"])
@pytest.mark.parametrize(
    ("fault", "expect"),
    [
        ("busy", "cannot listen on 127.0.0.1:{port}: address already in use"),
        ("unresolvable", "--listen: cannot resolve host 'no-such-host.invalid' of "
                         "no-such-host.invalid:9683: "),
        ("not-here", "--listen: cannot listen on 192.0.2.1:9683 (192.0.2.1): "
                     "Cannot assign requested address"),
    ],
)
def test_a_daemon_that_cannot_listen_exits_2_with_one_line(
    tmp_path: Path, tree: Path, busy_port: int, command: str, fault: str, expect: str
) -> None:
    listen = {"busy": f"127.0.0.1:{busy_port}", "unresolvable": "no-such-host.invalid:9683",
              "not-here": "192.0.2.1:9683"}[fault]
    cfg = write_config(tmp_path / "ibmon.toml", tree)
    args = ["run", "--config", str(cfg)] if command == "run" else ["demo"]
    proc, elapsed = ibmon(*args, "--listen", listen)
    line = one_error_line(proc)
    assert line.startswith(expect.format(port=busy_port)), line
    assert listen in line
    assert not (tmp_path / "state.json").exists()  # a start that failed saved nothing
    print(f"{command} {fault}: exit 2 after {elapsed:.2f}s")  # measured, reported, not asserted


# -- check-config runs every check run runs ----------------------------------------------


GARBAGE = "this is not PEM\n"
LISTEN = 'listen = "127.0.0.1:0"\n'
SIM = '[[sources]]\ntype = "mock"\nname = "sim"\n'


def bad_configs(tmp: Path) -> dict[str, tuple[str, str, str]]:
    """name -> ([prometheus] keys, further tables, what the error says after the field)."""
    garbage = tmp / "garbage.pem"
    auth_line = tmp / "auth-line"
    auth_hash = tmp / "auth-hash"
    fifo = tmp / "key.fifo"
    if tmp.is_dir():
        garbage.write_text(GARBAGE)
        auth_line.write_text("prometheus secret\n")
        auth_hash.write_text("prometheus:" + "g" * 64 + "\n")
        os.mkfifo(fifo)  # read, it would wait for a writer for ever
    mqtt = '[mqtt]\nhost = "127.0.0.1"\n'
    return {
        "tls-key-fifo": (LISTEN + f'tls_cert = "{garbage}"\ntls_key = "{fifo}"\n', "",
                         f"prometheus.tls_key: {fifo} is not a regular file"),
        "events-directory": (LISTEN, f'[events]\nfile = "{tmp}"\n',
                             f"events.file: {tmp} is a directory; give a file path"),
        "mqtt-password-missing": (LISTEN, mqtt + 'username = "ibmon"\n'
                                  'password_file = "/nonexistent/pw"\n',
                                  "mqtt.password_file: cannot read /nonexistent/pw"),
        "mqtt-ca-garbage": (LISTEN, mqtt + f'[mqtt.tls]\nca_file = "{garbage}"\n',
                            f"mqtt.tls.ca_file: {garbage} holds no PEM certificate"),
        "tls-missing": (LISTEN + 'tls_cert = "/nonexistent/tls.crt"\n'
                        'tls_key = "/nonexistent/tls.key"\n', "",
                        "prometheus.tls_cert: cannot read /nonexistent/tls.crt: No such file"),
        "tls-garbage": (LISTEN + f'tls_cert = "{garbage}"\ntls_key = "{garbage}"\n', "",
                        f"prometheus.tls_cert: {garbage} holds no PEM certificate"),
        "cert-without-key": (LISTEN + f'tls_cert = "{garbage}"\n', "",
                             "prometheus: tls_cert needs tls_key"),
        "auth-bad-line": (LISTEN + f'basic_auth_file = "{auth_line}"\n', "",
                          f"prometheus.basic_auth_file: {auth_line}:1: expected user:"),
        "auth-bad-hash": (LISTEN + f'basic_auth_file = "{auth_hash}"\n', "",
                          f"prometheus.basic_auth_file: {auth_hash}:1: expected user:"),
        "auth-missing": (LISTEN + 'basic_auth_file = "/nonexistent/users"\n', "",
                         "prometheus.basic_auth_file: cannot read /nonexistent/users"),
        "listen-unresolvable": ('listen = "no-such-host.invalid:9683"\n', "",
                                "prometheus.listen: cannot resolve host 'no-such-host.invalid'"),
        "listen-not-here": ('listen = "192.0.2.1:9683"\n', "",
                            "prometheus.listen: cannot listen on 192.0.2.1:9683"),
        "mock-scenario": (LISTEN, SIM + 'scenario = "no-such-scenario"\n',
                          "sources.1.scenario: unknown scenario 'no-such-scenario'"),
        "mock-hosts": (LISTEN, SIM + "hosts = 8\n",
                       "sources.1.scenario: --hosts 8: scenario 'demo' uses"),
        "mqtt-ca-missing": (LISTEN, '[mqtt]\nhost = "127.0.0.1"\n[mqtt.tls]\n'
                            'ca_file = "/nonexistent/ca.crt"\n',
                            "mqtt.tls.ca_file: cannot read /nonexistent/ca.crt"),
        "interval-nan": (LISTEN, SIM + "interval = nan\n",
                         "sources.1.interval: must be a finite number"),
        "interval-inf": (LISTEN, SIM + "interval = inf\n",
                         "sources.1.interval: must be a finite number"),
        "interval-tiny": (LISTEN, SIM + "interval = 1e-9\n",
                          "sources.1.interval: duration 1e-09 is below"),
        "shard-out-of-range": (LISTEN, '[[sources]]\ntype = "mad"\nshard = "3/3"\n',
                               "sources.1.shard: shard '3/3': need N >= 1 and 0 <= K < N"),
        "nested-arrays": (LISTEN + "x = " + "[" * 5000 + "]" * 5000 + "\n", "",
                          "arrays or tables nested too deeply"),
        "nested-keys": (LISTEN, "[detect]\n" + "a." * 10_000 + "b = 1\n",
                        "keys nested deeper than"),
    }


CASES = sorted(bad_configs(Path("/nonexistent")))


@pytest.mark.parametrize("case", CASES)
def test_check_config_refuses_what_run_refuses_in_the_same_words(
    tmp_path: Path, tree: Path, case: str
) -> None:
    prometheus, tables, expect = bad_configs(tmp_path)[case]
    cfg = write_config(tmp_path / "ibmon.toml", tree, prometheus=prometheus, extra=tables)
    check, _ = ibmon("check-config", str(cfg))
    run, _ = ibmon("run", "--config", str(cfg))
    line = one_error_line(check)
    assert line.startswith(f"{cfg}:"), line
    assert expect in line, line
    assert one_error_line(run) == line  # one function: run refuses it in the same words
    assert "listening" not in run.stderr  # ... before opening anything
    assert not (tmp_path / "state.json").exists()


@pytest.mark.parametrize(
    ("variable", "value", "expect"),
    [
        ("IBMON_SOURCES", "garbage", "environment variable IBMON_SOURCES: not valid JSON"),
        ("IBMON_PROMETHEUS", "{", "environment variable IBMON_PROMETHEUS: not valid JSON"),
        ("IBMON_BOGUS", "1", "environment variable IBMON_BOGUS: no such setting"),
        ("IBMON_PROMETHEUS_LISTEN", "127.0.0.1:1",
         "environment variable IBMON_PROMETHEUS_LISTEN: no such setting"),
        ("IBMON_PROMETHEUS__LISTEN", "nowhere",
         "environment variable IBMON_PROMETHEUS__LISTEN: prometheus.listen: listen address"),
        ("IBMON_STATE__SAVE_INTERVAL", "nan",
         "environment variable IBMON_STATE__SAVE_INTERVAL: state.save_interval: invalid"),
    ],
)
def test_bad_environment_is_one_line_naming_the_variable(
    tmp_path: Path, tree: Path, variable: str, value: str, expect: str
) -> None:
    cfg = write_config(tmp_path / "ibmon.toml", tree)
    check, _ = ibmon("check-config", str(cfg), env={variable: value})
    run, _ = ibmon("run", "--config", str(cfg), env={variable: value})
    assert one_error_line(check).startswith(expect)
    assert one_error_line(run) == one_error_line(check)


def test_legitimate_environment_and_a_good_config_pass(tmp_path: Path, tree: Path) -> None:
    """IBMON_<SECTION>__<KEY> variables (the tests' own IBMON_STATE__PATH too) are settings."""
    require_binary("openssl")
    tls = make_tls(tmp_path / "tls")
    users = tmp_path / "users"
    users.write_text("# comment\nprometheus:" + "0" * 64 + "\n")
    cfg = write_config(tmp_path / "ibmon.toml", tree, prometheus=(
        f'listen = "127.0.0.1:0"\ntls_cert = "{tls.server_cert}"\ntls_key = "{tls.server_key}"\n'
        f'basic_auth_file = "{users}"\n'), extra=(
        f'[mqtt]\nhost = "127.0.0.1"\n[mqtt.tls]\nca_file = "{tls.ca}"\n'
        f'cert_file = "{tls.client_cert}"\nkey_file = "{tls.client_key}"\n'))
    env = {"IBMON_STATE__PATH": str(tmp_path / "env-state.json"), "IBMON_LOG__LEVEL": "debug",
           "IBMON_FABRIC": "lab"}
    check, _ = ibmon("check-config", str(cfg), env=env)
    assert check.returncode == 0, check.stderr
    assert check.stdout == f"{cfg}: OK (1 source(s), listen 127.0.0.1:0)\n"


@pytest.mark.parametrize("section", ["prometheus", "mqtt"])
def test_a_key_that_is_not_the_certificates_is_refused(
    tmp_path: Path, tree: Path, section: str
) -> None:
    """A certificate with another's private key would fail the first TLS handshake; check-config
    and run refuse it first, naming the key."""
    require_binary("openssl")
    tls = make_tls(tmp_path / "tls")
    if section == "prometheus":
        cfg = write_config(tmp_path / "ibmon.toml", tree, prometheus=(
            f'listen = "127.0.0.1:0"\ntls_cert = "{tls.server_cert}"\n'
            f'tls_key = "{tls.client_key}"\n'))
        expect = (f"prometheus.tls_key: {tls.client_key} is not the PEM private key of "
                  f"{tls.server_cert}")
    else:
        cfg = write_config(tmp_path / "ibmon.toml", tree, extra=(
            f'[mqtt]\nhost = "127.0.0.1"\n[mqtt.tls]\ncert_file = "{tls.client_cert}"\n'
            f'key_file = "{tls.server_key}"\n'))
        expect = f"mqtt.tls.key_file: no PEM private key for {tls.client_cert} in {tls.server_key}"
    check, _ = ibmon("check-config", str(cfg))
    run, _ = ibmon("run", "--config", str(cfg))
    assert one_error_line(check) == one_error_line(run)
    assert one_error_line(check).startswith(f"{cfg}: {expect}"), one_error_line(check)


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (("sim", "sysfs", "--out", "{tmp}/out", "--hosts", "8"),
         "--hosts 8: scenario 'demo' uses host042 mlx5_0[1]"),
        (("demo", "--hosts", "8"), "--scenario: --hosts 8: scenario 'demo' uses"),
        (("demo", "--scenario", "no-such-scenario"), "--scenario: unknown scenario"),
        (("demo", "--listen", "nowhere"), "--listen: listen address 'nowhere'"),
    ],
)
def test_simulator_commands_refuse_in_one_line(
    tmp_path: Path, args: tuple[str, ...], expect: str
) -> None:
    proc, _ = ibmon(*(a.format(tmp=tmp_path) for a in args))
    assert one_error_line(proc).startswith(expect)
    assert not (tmp_path / "out").exists()
