"""The diags source's timeouts: derived from the poll's own limit, configurable, validated, and
a warning at load time when one hung node would still cost the whole poll."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from ibmon.config import ConfigError, load_settings
from ibmon.runtime.pipeline import Pipeline
from ibmon.runtime.selfmetrics import SelfMetrics
from ibmon.sources.diags import DiagsSource, DiagsSourceConfig, budget_for
from tests.ibsim_fixtures import REPO


def _cfg(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "ibmon.toml"
    path.write_text(f'[[sources]]\ntype = "diags"\n{extra}')
    return path


@pytest.mark.parametrize(
    ("interval", "command", "poll", "per_command", "discovery"),
    [
        (1.0, None, 10.0, 2.5, 5.0),  # a 1 s interval: a 10 s poll limit
        (10.0, None, 50.0, 12.5, 25.0),
        (1.0, 4.0, 10.0, 4.0, 3.5),
        (1.0, 9.0, 10.0, 9.0, 2.5),  # a discovery keeps at least a quarter of the poll
    ],
)
def test_timeouts_come_from_the_poll_limit(
    interval: float, command: float | None, poll: float, per_command: float, discovery: float
) -> None:
    b = budget_for(interval, command)
    assert (b.poll, b.command, b.discovery) == (poll, per_command, discovery)
    cfg = DiagsSourceConfig(interval=interval, command_timeout=command)
    assert Pipeline(cfg, metrics=SelfMetrics()).timeout == poll  # one number, both places
    src = DiagsSource.from_config(cfg)
    assert src.command_timeout == per_command and src.budget.discovery == discovery
    # a hung command plus a discovery in the same poll end before the poll's limit
    assert b.command + b.discovery < b.poll or not b.fits


def test_the_default_fits_and_the_old_default_would_not() -> None:
    b = budget_for(1.0)
    assert b.fits and b.command < b.poll
    assert b.poll < 13.0  # a hung perfquery under the old 13 s timeout outlived the poll


def test_a_command_timeout_that_cannot_fit_is_warned_at_load(tmp_path: Path) -> None:
    with capture_logs() as logs:
        s = load_settings(_cfg(tmp_path, 'interval = "1s"\ncommand_timeout = "8s"\n'))
    assert s.sources[0].command_timeout == 8.0  # a warning, not a refusal: the operator decides
    warned = [e for e in logs if e["event"] == "diags_command_timeout"]
    assert len(warned) == 1 and warned[0]["log_level"] == "warning"
    assert "over half the 10s poll timeout" in warned[0]["problem"]
    assert "use at most 5s" in warned[0]["problem"]
    with capture_logs() as logs:
        load_settings(_cfg(tmp_path, 'interval = "1s"\ncommand_timeout = "5s"\n'))
        load_settings(_cfg(tmp_path, 'interval = "1s"\n'))
    assert not [e for e in logs if e["event"] == "diags_command_timeout"]


def test_a_command_timeout_shorter_than_a_mad_is_warned(tmp_path: Path) -> None:
    with capture_logs() as logs:
        load_settings(_cfg(tmp_path, 'timeout = "3s"\ncommand_timeout = "2s"\n'))
    (warned,) = [e for e in logs if e["event"] == "diags_command_timeout"]
    assert "shorter than one MAD timeout (3s)" in warned["problem"]


@pytest.mark.parametrize("bad", ['"0s"', '"-1s"', '"2h"', '"soon"', "true"])
def test_bad_command_timeouts_are_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ConfigError, match=r"sources\.0\.command_timeout"):
        load_settings(_cfg(tmp_path, f"command_timeout = {bad}\n"))


def test_check_config_shows_the_warning_on_stderr(tmp_path: Path) -> None:
    path = _cfg(tmp_path, 'interval = "1s"\ncommand_timeout = "9s"\n')
    out = subprocess.run(
        [sys.executable, "-m", "ibmon", "check-config", str(path)],
        capture_output=True, text=True, timeout=60, check=False, cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    assert "OK" in out.stdout and "diags_command_timeout" not in out.stdout
    assert "diags_command_timeout" in out.stderr and "Traceback" not in out.stderr
