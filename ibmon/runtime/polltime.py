"""How long one poll of a source may take: one number the pipeline enforces and sources plan by.

The pipeline abandons a poll that runs past ``poll_timeout(interval)`` (the source counts as
failed for that poll, and every port it would have read is lost for it). A source that runs
its own timeouts inside a poll (the ``diags`` source's per-command and discovery limits) derives
them from the same number, so a part that hangs is cut off before the whole poll is.
"""

from __future__ import annotations

from typing import Final

__all__ = ["MIN_POLL_TIMEOUT", "POLL_TIMEOUT_INTERVALS", "poll_timeout"]

#: A poll that takes longer than this many intervals (and at least MIN_POLL_TIMEOUT) has hung.
POLL_TIMEOUT_INTERVALS: Final = 5
MIN_POLL_TIMEOUT: Final = 10.0


def poll_timeout(interval: float) -> float:
    """Seconds a poll of a source polled every ``interval`` seconds may take."""
    return max(interval * POLL_TIMEOUT_INTERVALS, MIN_POLL_TIMEOUT)
