"""User mistakes exit 2 with exactly one clear line on stderr and no traceback."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest


def ibmon(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ibmon", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        check=False,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], needle: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("ibmon: error: ")
    assert needle in lines[0]


def test_version() -> None:
    proc = ibmon("version")
    assert proc.returncode == 0
    assert proc.stdout.startswith("ibmon ")


def test_unknown_flag() -> None:
    assert_one_line_error(ibmon("scan", "--bogus"), "--bogus")


def test_bad_flag_value() -> None:
    assert_one_line_error(ibmon("scan", "--interval", "soon"), "--interval")


def test_bad_format_choice() -> None:
    assert_one_line_error(ibmon("scan", "--format", "xml"), "--format")


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ('[[sources]]\ntype = "sysfs"\ninterval = "soon"\n', "sources.0.interval"),
        ("[prometheus\n", "TOML syntax error"),
        ('[prometheus]\nlisten = "nowhere"\n', "prometheus.listen"),
        # a mistyped key: named, with the key it most likely meant, wherever it is
        ('[[sources]]\ntype = "mad"\nintervall = "5s"\n',
         "sources.0.intervall: unknown setting (did you mean 'interval'?)"),
        ('[detect.high_ber]\nwarnng = 1e-12\n',
         "high_ber.warnng: unknown setting (did you mean 'warning'?)"),
        ('fabrc = "x"\n[mqtt.tls]\nca_fil = "ca.pem"\n',
         "mqtt.tls.ca_fil: unknown setting (did you mean 'ca_file'?) (and 1 more: fabrc)"),
        ('[[sources]]\ntype = "sysfs"\nca = "mlx5_0"\n', "sources.0.ca: unknown setting"),
    ],
)
@pytest.mark.parametrize("command", ["check-config", "run"])
def test_bad_config(tmp_path: Path, body: str, needle: str, command: str) -> None:
    cfg = tmp_path / "ibmon.toml"
    cfg.write_text(body)
    args = [command, str(cfg)] if command == "check-config" else [command, "--config", str(cfg)]
    assert_one_line_error(ibmon(*args), needle)


def test_check_config_ok(tmp_path: Path) -> None:
    cfg = tmp_path / "ibmon.toml"
    cfg.write_text('[[sources]]\ntype = "sysfs"\ninterval = "2s"\n')
    proc = ibmon("check-config", str(cfg))
    assert proc.returncode == 0, proc.stderr
    assert "OK" in proc.stdout


def test_scan_without_devices(tmp_path: Path) -> None:
    assert_one_line_error(ibmon("scan", "--sysfs-root", str(tmp_path)), "no InfiniBand devices")


def test_demo_unknown_scenario() -> None:
    assert_one_line_error(ibmon("demo", "--scenario", "nope"), "unknown scenario")


@pytest.mark.parametrize("command", [["top", "--once"], ["explain", "0x1/1"], ["jobs"],
                                     ["topology"]])
def test_a_daemon_not_listening_is_named_once(command: list[str]) -> None:
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    proc = ibmon(*command, "--url", url)
    assert_one_line_error(proc, f"cannot reach {url}: ")
    assert proc.stderr.count(url) == 1, proc.stderr
