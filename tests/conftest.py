"""Suite-wide isolation: no test reads or writes the real /var/lib/ibmon state file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _private_state_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A daemon restores totals from its state file; tests must not share one (or touch /var)."""
    monkeypatch.setenv("IBMON_STATE__PATH", str(tmp_path / "ibmon-state.json"))
    return
