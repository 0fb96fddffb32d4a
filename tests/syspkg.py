"""Find a system binary a test needs: skip locally when it is missing, fail in CI."""

from __future__ import annotations

import os
import shutil

import pytest

__all__ = ["require_binary"]

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
}


def require_binary(name: str) -> str:
    """The binary's path; a missing binary skips the test, or fails it when CI is set."""
    path = shutil.which(name)
    if path:
        return path
    message = f"{name} not installed (apt package {_PACKAGES.get(name, name)})"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)
