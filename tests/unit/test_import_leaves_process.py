"""Importing ibmon changes nothing process-wide: a library user, a test or ``ibmon scan`` keeps
CPython's and glibc's defaults; only a daemon tunes its own process (``ibmon.runtime.tuning``)."""

from __future__ import annotations

import subprocess
import sys

from tests.faults.daemonproc import REPO

PROBE = r"""
import gc, os, pkgutil, sys, threading, importlib
def state():
    return (sys.getswitchinterval(), gc.get_threshold(), gc.isenabled(), gc.get_freeze_count(),
            dict(os.environ), threading.active_count())
before = state()
import ibmon, exporters
names = [m.name for pkg in (ibmon, exporters)
         for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")
         if not m.name.endswith("__main__")]
for name in names:
    importlib.import_module(name)
after = state()
assert len(names) > 40, names
for what, a, b in zip(("switch interval", "gc thresholds", "gc enabled", "frozen objects",
                       "environment", "threads"), before, after):
    assert a == b, (what, a, b)
print("ok", len(names))
"""


def test_importing_every_module_leaves_the_interpreter_as_it_was() -> None:
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok")
