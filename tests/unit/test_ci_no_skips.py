"""Nothing the suite needs can be missing under CI without failing the run.

Locally a missing tool, library or real capture skips the test (with the reason); under ``CI``
it fails it, and the session guard in ``tests/conftest.py`` fails the whole run on any skip that
got past the helpers (a bare ``pytest.skip`` or ``skipif``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import fixtures
from tests.syspkg import require_library, unavailable

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("ci", ["", "1"])
def test_unavailable_skips_locally_and_fails_in_ci(
    ci: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", ci)
    expected = pytest.fail.Exception if ci else pytest.skip.Exception
    with pytest.raises(expected, match="widget missing"):
        unavailable("widget missing")


def test_missing_library_names_its_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception, match=r"libnope\.so\.9 .*apt package libnope9"):
        require_library("libnope.so.9", "libnope9")
    assert require_library("libc.so.6", "libc6") is not None


def test_absent_fixture_root_skips_locally_and_fails_in_ci(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fixtures, "REAL_FIXTURES", tmp_path / "nowhere")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="real fixtures absent"):
        fixtures.real_fixture("procfs")
    with pytest.raises(pytest.skip.Exception, match="real fixtures absent"):
        fixtures.real_fixtures("ibsim/net*")
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception, match="real fixtures absent"):
        fixtures.real_fixture("procfs")


def test_a_missing_entry_under_a_present_root_is_a_failure_even_locally(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "procfs").mkdir()
    monkeypatch.setattr(fixtures, "REAL_FIXTURES", tmp_path)
    monkeypatch.delenv("CI", raising=False)
    assert fixtures.real_fixture("procfs") == tmp_path / "procfs"
    with pytest.raises(pytest.fail.Exception, match="real fixture missing"):
        fixtures.real_fixture("procfz")
    with pytest.raises(pytest.fail.Exception, match="no real fixture matches"):
        fixtures.real_fixtures("ibsim/net*")


_INNER = '''
import pytest

def test_runs():
    pass

def test_skips():
    pytest.skip("optional thing absent")

@pytest.mark.skipif(True, reason="not on this machine")
def test_skipif():
    pass
'''


def _inner_run(tmp_path: Path, ci: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_inner.py").write_text(_INNER)
    env = {**os.environ, "CI": ci, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "-p", "no:asyncio", "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )


def test_session_with_a_skip_passes_locally(tmp_path: Path) -> None:
    proc = _inner_run(tmp_path, "")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed, 2 skipped" in proc.stdout


def test_session_with_a_skip_fails_under_ci_and_names_each_skip(tmp_path: Path) -> None:
    proc = _inner_run(tmp_path, "1")
    assert proc.returncode == pytest.ExitCode.TESTS_FAILED, proc.stdout + proc.stderr
    assert "skipped tests fail the run under CI" in proc.stdout
    assert "test_inner.py::test_skips: optional thing absent" in proc.stdout
    assert "test_inner.py::test_skipif: not on this machine" in proc.stdout
