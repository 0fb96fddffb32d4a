"""`make test` runs the suite in pytest-xdist workers; the suite's rules must hold there too.

Under ``CI`` any skip fails the run (``tests/conftest.py``). With workers, tests run in other
processes and only their reports reach the controller, which decides the exit status: a guard
that only looked at its own process would let a CI run with skipped tests go green. And the
Makefile's pytest options must be ones the test extra installs, or a fresh clone's `make test`
stops at "unrecognized arguments".
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

_INNER = '''
import pytest

def test_runs():
    pass

def test_skips():
    pytest.skip("optional thing absent")
'''

_OTHER = '''
import pytest

@pytest.mark.skipif(True, reason="not on this machine")
def test_skipif():
    pass
'''


def _run_in_workers(tmp_path: Path, ci: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_inner.py").write_text(_INNER)
    (tmp_path / "test_other.py").write_text(_OTHER)
    env = {**os.environ, "CI": ci, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "-p", "no:asyncio", "-n", "2", "--dist", "loadfile", "--rootdir", str(tmp_path),
         str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )


def test_a_skip_in_a_worker_fails_the_run_under_ci_and_is_named(tmp_path: Path) -> None:
    proc = _run_in_workers(tmp_path, "1")
    out = proc.stdout + proc.stderr
    assert "bringing up nodes" in out, out  # xdist ran the tests in workers
    assert proc.returncode == pytest.ExitCode.TESTS_FAILED, out
    assert "skipped tests fail the run under CI" in proc.stdout, out
    assert "test_inner.py::test_skips: optional thing absent" in proc.stdout, out
    assert "test_other.py::test_skipif: not on this machine" in proc.stdout, out


def test_a_skip_in_a_worker_passes_locally(tmp_path: Path) -> None:
    proc = _run_in_workers(tmp_path, "")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed, 2 skipped" in proc.stdout


def _make_test_pytest_args() -> list[str]:
    """The options of the pytest line in the Makefile's ``test`` recipe, make variables
    resolved from the Makefile's own ``NAME ?= value`` defaults."""
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    defaults = dict(re.findall(r"(?m)^([A-Z_]+)\s*\?=\s*(\S+)\s*$", text))
    recipe = re.search(r"(?m)^test:.*\n((?:\t.*\n)+)", text)
    assert recipe, "no test target in the Makefile"
    (line,) = [ln for ln in recipe.group(1).splitlines() if "/pytest" in ln]
    line = re.sub(r"\$\(([A-Z_]+)\)", lambda m: defaults.get(m.group(1), m.group(0)), line)
    args = shlex.split(line)[1:]
    assert "-n" in args, f"make test runs in one process: {line}"
    return args


def test_make_test_options_are_installed_by_the_test_extra() -> None:
    """Every option `make test` gives pytest parses with the installed plugins (a collection
    of one small module, in two workers as `make test` runs it)."""
    args = _make_test_pytest_args()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *args, "-p", "no:cacheprovider", "--collect-only",
         "tests/unit/test_atomicfile.py"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    extra = pyproject.split("[project.optional-dependencies]", 1)[1].split("\n]\n", 1)[0]
    assert re.search(r'"pytest-xdist[>=~]', extra), "pytest-xdist is not in the test extra"
