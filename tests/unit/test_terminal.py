"""Untrusted text in tables: control characters are shown as escapes, everything else stays."""

from __future__ import annotations

import io
import time
from types import MappingProxyType

import pytest
from rich.console import Console

from ibmon.cli.scan import render_table
from ibmon.cli.terminal import ber_text, printable, rate_text, time_text
from ibmon.cli.top import render
from ibmon.infiniband.model import PortIdentity, PortView
from ibmon.state import FabricState

HOSTILE = "a\x1b[2J\x1b]0;t\x07b\x00c\x7fd\x9b31me\u202ef\u2066g\u2028h\ti\nj"


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("leaf07 ü HCA-1", "leaf07 ü HCA-1"),  # non-ASCII names are left alone
        ("spine\u00a001", "spine\u00a001"),
        ("\x1b[31mred", "\\x1b[31mred"),
        ("nul\x00", "nul\\x00"),
        ("csi\x9b2J", "csi\\x9b2J"),
        ("del\x7f", "del\\x7f"),
        ("bidi\u202eexe.txt", "bidi\\u202eexe.txt"),
        ("line\u2028two\nthree\r", "line\\u2028two\\x0athree\\x0d"),
    ],
)
def test_printable(raw: str, shown: str) -> None:
    assert printable(raw) == shown


def _unsafe(text: str) -> list[str]:
    return [ch for ch in text if ch != "\n" and printable(ch) != ch]


def test_scan_table_sends_no_control_character() -> None:
    view = PortView(identity=PortIdentity(guid="0x0000000000000001", port="1",
                                          node_desc=HOSTILE), state=4, phys_state=5)
    table = render_table([view])
    assert _unsafe(table) == []
    assert table.count("\n") == 2  # header and one row: a newline in a name splits nothing
    assert "a\\x1b[2J" in table


def test_top_screen_sends_no_control_character() -> None:
    view = PortView(identity=PortIdentity(guid="0x0000000000000001", port="1\x1b[H",
                                          node_desc=HOSTILE), state=4, phys_state=5,
                    conditions=frozenset({"congestion\x1b[5m"}))
    state = FabricState(generated=time.time(), ports=MappingProxyType({view.key: view}))
    from exporters.ports import port_json

    ports = [port_json(v) for v in state.ports.values()]
    events = [{"time": "2026-01-01T00:00:00Z", "status": "firing\x1b[8m", "severity": "info",
               "type": "x\x00", "message": HOSTILE}]
    out = io.StringIO()
    console = Console(file=out, width=300, color_system=None, force_terminal=False)
    console.print(render(ports, events, "title \x1b]0;x\x07"))
    screen = out.getvalue()
    assert _unsafe(screen) == []
    assert "\\x1b[2J" in screen and "\\u202e" in screen


@pytest.mark.parametrize(
    ("bps", "shown"),
    [
        (None, "-"),
        (0, "0 B/s"),
        (12.345, "12.3 B/s"),
        (999.4, "999 B/s"),
        (999.96, "1 kB/s"),  # rounds up into the next unit: never "1e+03 B/s" or "1000.0 B/s"
        (999_500.0, "1 MB/s"),
        (1.25e9, "1.25 GB/s"),
        (12.5e9, "12.5 GB/s"),
        (999.96e9, "1 TB/s"),
        (50e12, "50 TB/s"),
    ],
)
def test_a_rate_has_three_digits_and_the_unit_it_rounds_into(bps: float | None, shown: str) -> None:
    assert rate_text(bps) == shown


def test_a_ber_and_a_time_read_the_same_in_every_table() -> None:
    assert [ber_text(x) for x in (None, 0, 0.0, 1.24e-11, "2e-10")] == [
        "-", "0", "0", "1.2e-11", "2.0e-10"]
    assert time_text(1_796_596_662) == "2026-12-06 22:37:42 UTC"
    assert time_text("2026-12-06T22:37:42.556Z") == "2026-12-06 22:37:42 UTC"  # an event's
    assert time_text("2026-12-06T23:37:42+01:00") == "2026-12-06 22:37:42 UTC"
    assert [time_text(x) for x in (None, "soon", "T", 1e300)] == ["?", "?", "?", "?"]
