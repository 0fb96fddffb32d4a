"""require_binary: a missing tool skips a test locally but fails it in CI."""

from __future__ import annotations

import pytest

from tests.syspkg import require_binary


def test_present_binary_returns_its_path() -> None:
    assert require_binary("sh").endswith("/sh")


def test_missing_binary_skips_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no-such-tool-xyz not installed"):
        require_binary("no-such-tool-xyz")


def test_missing_binary_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "1")
    monkeypatch.setenv("PATH", "/nonexistent")
    expected = r"ibsim not installed \(apt package ibsim-utils\)"
    with pytest.raises(pytest.fail.Exception, match=expected):
        require_binary("ibsim")
