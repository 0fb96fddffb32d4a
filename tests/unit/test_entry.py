"""The console script's fast path for ``ibmon run``: it takes only what typer reads the same way.

``ibmon.cli.entry`` skips building the typer app for a plain ``run`` (memory on every compute node),
so it must never decide anything a user could see differently: every command line it does not
take goes to typer, and a mistake it does take is reported exactly as the typer command reports
it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ibmon.cli.entry import RunArgs, parse_run


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["run"], RunArgs(None, None, None)),
        (["run", "-c", "a.toml"], RunArgs(Path("a.toml"), None, None)),
        (["run", "--config=a.toml", "--listen", "127.0.0.1:9", "--log-level", "debug"],
         RunArgs(Path("a.toml"), "127.0.0.1:9", "debug")),
        (["run", "--log-level=error", "--config", "b.toml"],
         RunArgs(Path("b.toml"), None, "error")),
    ],
)
def test_plain_runs_take_the_fast_path(argv: list[str], expected: RunArgs) -> None:
    assert parse_run(argv) == expected


@pytest.mark.parametrize(
    "argv",
    [
        [], ["scan"], ["check-config", "a.toml"], ["run", "--help"], ["run", "-h"],
        ["run", "extra"], ["run", "-c"], ["run", "--config="], ["run", "-c=a.toml"],
        ["run", "-c", "a", "-c", "b"], ["run", "--config", "a", "-c", "b"],
        ["run", "--log-level", "loud"], ["run", "--config", "-x"], ["run", "--listen"],
        ["run", "--unknown", "x"], ["--help"], ["run", "--", "-c", "a"],
    ],
)
def test_everything_else_goes_to_typer(argv: list[str]) -> None:
    assert parse_run(argv) is None


def ibmon(*args: str, via_typer: bool) -> subprocess.CompletedProcess[str]:
    """``ibmon ARGS`` through the console script's entry, or straight into the typer app."""
    code = ("from ibmon.cli.app import main; main(sys.argv[1:])" if via_typer
            else "from ibmon.cli.entry import main; main(sys.argv[1:])")
    env = {k: v for k, v in os.environ.items() if not k.startswith("IBMON_")}
    return subprocess.run([sys.executable, "-c", f"import sys; {code}", *args],
                          capture_output=True, text=True, timeout=60, env=env, check=False)


@pytest.mark.parametrize(
    "problem", ["missing file", "bad toml", "bad listen"],
)
def test_a_mistake_reads_the_same_on_both_paths(tmp_path: Path, problem: str) -> None:
    cfg = tmp_path / "ibmon.toml"
    args = ["run", "--config", str(cfg)]
    if problem == "bad toml":
        cfg.write_text("[prometheus\n")
    elif problem == "bad listen":
        cfg.write_text("")
        args += ["--listen", "nowhere:port"]
    fast, typer = ibmon(*args, via_typer=False), ibmon(*args, via_typer=True)
    assert fast.returncode == typer.returncode == 2
    assert fast.stderr == typer.stderr
    assert fast.stderr.startswith("ibmon: error: ") and fast.stderr.count("\n") == 1
