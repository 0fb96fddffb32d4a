"""The one lookup for real hardware captures in ``../shared/real-fixtures``.

The captures (sysfs trees, perfquery and ibnetdiscover output from public projects) are not
copied into the repository, so a checkout on its own may lack them. Without the folder the tests
that need them skip with the missing path, and under ``CI`` they fail
(``tests.syspkg.unavailable``): a CI run that silently skipped every real-capture test would
prove nothing about real hardware. With the folder present, a missing entry is a typo or an
incomplete copy, and fails everywhere.
"""

from __future__ import annotations

import glob
from pathlib import Path

import pytest

from tests.syspkg import unavailable

__all__ = ["REAL_FIXTURES", "real_fixture", "real_fixtures"]

REAL_FIXTURES = Path(__file__).resolve().parents[1].parent / "shared" / "real-fixtures"
"""``<repo>/../shared/real-fixtures``: where the shared captures live beside the checkout."""


def _root() -> Path:
    if not REAL_FIXTURES.is_dir():
        unavailable(f"real fixtures absent: {REAL_FIXTURES}")
    return REAL_FIXTURES


def real_fixture(relative: str | Path) -> Path:
    """The capture at ``relative`` (file or directory) under the real-fixture root."""
    path = _root() / relative
    if not path.exists():
        pytest.fail(f"real fixture missing: {path}")
    return path


def real_fixtures(pattern: str) -> list[Path]:
    """Every capture matching the glob ``pattern`` under the root, sorted; at least one."""
    root = _root()
    found = sorted(Path(p) for p in glob.glob(str(root / pattern)))
    if not found:
        pytest.fail(f"no real fixture matches {root / pattern}")
    return found
