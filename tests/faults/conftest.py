"""Teardown check shared by the fault tests: the never-decrease watch really checked scrapes.

A daemon helper that stopped feeding its ``TotalsWatch`` would leave every fault test green
without the promise ever being looked at; this fails the test instead (only a test that
passed: one that already failed needs no second report).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.faults.promise import LIVE

_CALL_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.stash[_CALL_FAILED] = report.failed


@pytest.fixture(autouse=True)
def _totals_watch_really_scraped(request: pytest.FixtureRequest) -> Iterator[None]:
    LIVE.clear()
    yield
    idle = [w for w in LIVE if w.expect_scrapes and w.scrapes == 0]
    LIVE.clear()
    if request.node.stash.get(_CALL_FAILED, True):
        return  # failed, or never ran its body (an error in setup): reported already
    assert not idle, (f"{len(idle)} TotalsWatch never checked a scrape: the totals-never-"
                      "decrease promise was not checked")
