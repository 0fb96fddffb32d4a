"""Find what a test needs from the machine: skip locally when it is missing, fail in CI.

A developer without ibsim or promtool still gets a useful local run; CI installs everything
(``.ci/run`` sets ``CI=1``), so there a missing piece is a broken setup and must fail loudly
rather than turn into a green run that tested nothing. Every "is it installed / is it there"
check in the suite goes through ``unavailable`` so the rule lives in one place.
"""

from __future__ import annotations

import ctypes
import os
import shutil
from typing import NoReturn

import pytest

__all__ = ["require_binary", "require_library", "unavailable"]

#: Debian package that ships each binary, for the skip message.
_PACKAGES = {
    "prometheus-node-exporter": "prometheus-node-exporter",
    "promtool": "prometheus",
    "prometheus": "prometheus",
    "ibsim": "ibsim-utils",
    "opensm": "opensm",
    "perfquery": "infiniband-diags",
    "ibnetdiscover": "infiniband-diags",
    "iblinkinfo": "infiniband-diags",
    "ibqueryerrors": "infiniband-diags",
    "mosquitto": "mosquitto",
    "mosquitto_passwd": "mosquitto",
    "mosquitto_sub": "mosquitto-clients",
    "openssl": "openssl",
    "alertmanager": "prometheus-alertmanager",
    "prometheus-alertmanager": "prometheus-alertmanager",
    "amtool": "prometheus-alertmanager",
    "systemd-analyze": "systemd",
    "gcc": "gcc",
    "munged": "munge",
    "mungekey": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "sbatch": "slurm-client",
    "squeue": "slurm-client",
    "scancel": "slurm-client",
    "sinfo": "slurm-client",
}


def unavailable(message: str) -> NoReturn:
    """Something the test needs is missing: skip the test, or fail it when CI is set."""
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def require_binary(name: str) -> str:
    """The binary's path; a missing binary skips the test, or fails it when CI is set."""
    path = shutil.which(name)
    if path:
        return path
    unavailable(f"{name} not installed (apt package {_PACKAGES.get(name, name)})")


def require_library(soname: str, package: str) -> ctypes.CDLL:
    """The loaded shared library; a missing one skips the test, or fails it when CI is set."""
    try:
        return ctypes.CDLL(soname)
    except OSError:
        unavailable(f"{soname} not installed (apt package {package})")
