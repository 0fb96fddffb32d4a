"""The promise checker itself must be able to fail, or every fault test built on it is hollow."""

from __future__ import annotations

import pytest

from tests.faults.promise import TotalsWatch, parse_exposition

BODY = """# HELP ibmon_port_receive_errors_total Received packets with errors.
# TYPE ibmon_port_receive_errors_total counter
ibmon_port_receive_errors_total{{guid="0x0000000000000001",port="1"}} {value}
# HELP ibmon_source_up 1 if the source's latest poll succeeded.
# TYPE ibmon_source_up gauge
ibmon_source_up{{source="mad"}} {up}
"""


def test_watch_fails_when_a_port_total_goes_down() -> None:
    watch = TotalsWatch()
    watch.check(parse_exposition(BODY.format(value=560, up=1)))
    watch.check(parse_exposition(BODY.format(value=560, up=1)))
    with pytest.raises(AssertionError, match="went down: 560 -> 400"):
        watch.check(parse_exposition(BODY.format(value=400, up=0)))


def test_watch_ignores_gauges_and_reads_values() -> None:
    watch = TotalsWatch()
    first = watch.check(parse_exposition(BODY.format(value=1, up=1)))
    second = watch.check(parse_exposition(BODY.format(value=2, up=0)))
    assert first.value("ibmon_source_up", source="mad") == 1
    assert second.value("ibmon_source_up", source="mad") == 0
    assert second.value("ibmon_port_receive_errors_total", port="1") == 2


def test_duplicate_series_are_refused() -> None:
    with pytest.raises(AssertionError, match="duplicate series"):
        parse_exposition(BODY.format(value=1, up=1) + 'ibmon_source_up{source="mad"} 1\n')
