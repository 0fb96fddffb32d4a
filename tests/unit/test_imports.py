"""What ``ibmon run`` imports on a compute node: nothing a sysfs-only daemon never uses.

Every import costs resident memory on each of 10,000 nodes, so the daemon
started with a sysfs-only config must not import the CLI's typer/rich machinery, YAML, the
simulator (``mocks``), the MAD ctypes bindings, numpy (the tracker's column store, for fabric
polls), orjson (the renderer's numbers of large blocks), MQTT or prometheus_client (its
exposition module imports ``ssl``, which maps OpenSSL; ibmon's own types are
``ibmon.runtime.metrics``). The daemon runs for real, as ``python -m ibmon run`` in a subprocess,
until it has completed a poll and served a scrape; then it is stopped with SIGTERM and, as the
interpreter exits, an ``atexit`` hook writes the names in ``sys.modules`` (every module
imported during the whole run, whichever way: ``-X importtime`` would miss those loaded with
``importlib.import_module``, as the source registry loads sources). A control run
(``check-config``, which goes through the typer app) shows that the list does see typer when it
is imported.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.sysfs_tree import write_device, write_port

#: Module name prefixes a sysfs-only ``ibmon run`` must never import.
FORBIDDEN = (
    "typer", "click", "rich", "yaml", "mocks", "aiomqtt", "paho", "exporters.mqtt",
    "ibmon.sources.libibmad", "ibmon.sources.madworker", "ibmon.sources.mad",
    "ibmon.sources.diags", "ibmon.sources.procscope", "ibmon.sources.mock", "ibmon.cli.app",
    "ctypes",
    "pydantic_settings", "aiohttp", "yarl", "multidict", "prometheus_client",
    # OpenSSL (4.5 MB) on a config without TLS: ``ibmon.runtime.sslgate``.
    "ssl", "_ssl", "_hashlib",
    # the tracker's column store, for polls of hundreds of ports (17 MB with numpy)
    "numpy", "ibmon.track.columns",
    # the renderer's numbers in C, for blocks of many ports (``exporters.valuetext``)
    "orjson",
)
#: ``python -c`` program: run ``python -m ibmon ARGS`` and list ``sys.modules`` at exit.
_HOOK = """
import atexit, runpy, sys
out, args = sys.argv[1], sys.argv[2:]
def dump():
    with open(out, "w") as fh:
        fh.write("\\n".join(sorted(k for k, v in sys.modules.items() if v is not None)))
atexit.register(dump)
sys.argv = ["ibmon", *args]
runpy.run_module("ibmon", run_name="__main__", alter_sys=True)
"""
_PORT = re.compile(r'"port": (\d+)')


def sysfs_only(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    write_device(root, "mlx5_0")
    write_port(root, "mlx5_0", 1, hw_counters={"out_of_buffer": 3})
    cfg = tmp_path / "ibmon.toml"
    cfg.write_text(f"""
[prometheus]
listen = "127.0.0.1:0"
[state]
path = "{tmp_path / "state.json"}"
[log]
format = "json"
[[sources]]
type = "sysfs"
root = "{root}"
interval = "1s"
""")
    return cfg


def ibmon_argv(modules: Path, *args: str) -> list[str]:
    return [sys.executable, "-c", _HOOK, str(modules), *args]


def imported(modules: Path) -> set[str]:
    return set(modules.read_text().split())


def banned(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == f or m.startswith(f + ".") for f in FORBIDDEN))


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("IBMON_")}


def run_until_polled(cfg: Path, tmp_path: Path) -> set[str]:
    """``python -m ibmon run -c cfg`` until a scrape shows a completed poll: what it imported."""
    err_path = tmp_path / "stderr.txt"
    modules = tmp_path / "modules.txt"
    with err_path.open("w") as err:
        proc = subprocess.Popen(
            ibmon_argv(modules, "run", "-c", str(cfg)),
            stdout=subprocess.DEVNULL, stderr=err, env=env(), start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 90
        polled = False
        while not polled:
            assert proc.poll() is None, err_path.read_text()[-2000:]
            assert time.monotonic() < deadline, "no poll within 90 s"
            port = _PORT.search(err_path.read_text())
            if port is not None:
                try:
                    with urllib.request.urlopen(
                        f"http://127.0.0.1:{port.group(1)}/metrics", timeout=10
                    ) as resp:
                        body = resp.read().decode()
                except OSError:
                    body = ""
                polled = re.search(
                    r'^ibmon_source_poll_duration_seconds_count\{[^}]*\} [1-9]', body, re.M
                ) is not None
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    return imported(modules)


def test_sysfs_only_run_imports_nothing_a_node_never_uses(tmp_path: Path) -> None:
    modules = run_until_polled(sysfs_only(tmp_path), tmp_path)
    # it did run
    assert {"ibmon.runtime.daemon", "ibmon.sources.sysfs", "exporters.http"} <= modules
    assert banned(modules) == []


def test_the_report_sees_what_the_typer_app_imports(tmp_path: Path) -> None:
    modules = tmp_path / "modules.txt"
    done = subprocess.run(
        ibmon_argv(modules, "check-config", str(sysfs_only(tmp_path))),
        capture_output=True, text=True, timeout=120, env=env(), check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert {"typer", "ibmon.cli.app", "rich"} <= set(banned(imported(modules)))
