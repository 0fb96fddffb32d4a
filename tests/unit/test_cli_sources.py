"""The CLI's --source choices and options come from the source registry and the config model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ibmon.cli.app import CliUsageError, _source_config
from ibmon.sources.registry import SOURCES
from ibmon.sources.sysfs import SysfsSourceConfig


def test_source_choices_are_the_registered_types() -> None:
    proc = subprocess.run([sys.executable, "-m", "ibmon", "scan", "--source", "bogus"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    assert "--source" in line
    for name in SOURCES:
        assert repr(name) in line


def test_options_reach_only_the_source_types_that_have_them() -> None:
    sysfs = _source_config("sysfs", root=Path("/srv/sys"), ca="mlx5_0", port=2,
                           scenario="healthy")
    assert isinstance(sysfs, SysfsSourceConfig) and sysfs.root == Path("/srv/sys")
    mad = _source_config("mad", root=Path("/sys"), ca="mlx5_0", port=2, scenario="healthy")
    assert (mad.type, getattr(mad, "ca", None), getattr(mad, "port", None)) == ("mad", "mlx5_0", 2)
    mock = _source_config("mock", root=Path("/sys"), scenario="flap", ca=None, port=None)
    assert getattr(mock, "scenario", None) == "flap"


def test_an_unset_port_takes_the_model_default() -> None:
    diags = _source_config("diags", ca=None, port=None)
    default = _source_config("diags")
    assert getattr(diags, "port", "x") == getattr(default, "port", "y")


def test_a_bad_option_value_is_a_usage_error() -> None:
    with pytest.raises(CliUsageError, match="--source mad: port"):
        _source_config("mad", port=100_000)
