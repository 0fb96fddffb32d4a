"""The version is written once, in pyproject.toml, and every output reports that one."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest

import ibmon

REPO = Path(__file__).resolve().parents[2]


def project_version() -> str:
    data = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    version: str = data["project"]["version"]
    return version


def test_ibmon_reports_the_pyproject_version() -> None:
    assert ibmon.__version__ == project_version()


def test_no_python_module_writes_the_version_again() -> None:
    """A release bumps one line: no module of the package spells the version itself."""
    spelled = re.compile(rf"""["']{re.escape(project_version())}["']""")
    offenders = [str(path.relative_to(REPO))
                 for package in ("ibmon", "exporters", "mocks")
                 for path in (REPO / package).rglob("*.py")
                 if spelled.search(path.read_text(encoding="utf-8"))]
    assert offenders == []


def test_an_uninstalled_tree_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.delattr(ibmon, "__version__")  # forget the value looked up before
    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert ibmon.__version__ == "0+unknown"


def test_version_command_prints_it() -> None:
    from typer.testing import CliRunner

    from ibmon.cli.app import app

    result = CliRunner().invoke(app, ["version"])
    assert result.exit_code == 0
    assert result.output == f"ibmon {project_version()}\n"
