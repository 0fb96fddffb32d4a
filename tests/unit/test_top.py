"""`ibmon top`: one frame from a directly sampled source; usage errors exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rich.console import Console

from ibmon.cli.top import render

REPO = Path(__file__).resolve().parents[2]


def test_render_escapes_markup_in_node_descriptions() -> None:
    port = {"guid": "0x0002c90300a1b2c3", "port": "1", "node_desc": "[bold]evil[/bold]",
            "state": 4, "utilization": {"transmit": 0.94, "receive": 0.1},
            "transmit_wait_ratio": 0.38, "symbol_error_ber": 3e-11,
            "conditions": ["congestion", "high_ber"],
            "active": [{"severity": "critical"}]}
    console = Console(record=True, width=160, color_system=None)
    console.print(render([port], [{"time": "2026-01-01T10:11:12Z", "status": "firing",
                                   "severity": "critical", "type": "congestion",
                                   "message": "hotspot [red]x[/red]"}], "t"))
    text = console.export_text()
    assert "[bold]evil[/bold] [1]" in text and "hotspot [red]x[/red]" in text
    assert " 94.0%" in text and " 38.0%" in text and "3.0e-11" in text
    assert "congestion, high_ber" in text and "10:11:12" in text


def test_top_samples_the_simulated_fabric_once() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ibmon", "top", "--source", "mock", "--scenario", "healthy",
         "--once", "--interval", "0.1", "--limit", "5"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert "288 ports" in out.stdout and "recent events" in out.stdout


def test_top_rejects_a_non_http_url() -> None:
    out = subprocess.run([sys.executable, "-m", "ibmon", "top", "--url", "file:///etc/passwd"],
                         cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2
    assert "--url must start with http" in out.stderr
    assert "Traceback" not in out.stderr


def test_every_port_and_event_is_one_line_on_an_80_column_terminal() -> None:
    """A wrapped row would push the worst ports off the screen: each port and each event keeps
    one line, the port's name whole, a stale port marked where the width does not cut it."""
    ports = [{"guid": "0x1", "port": "1", "node_desc": "gpu-node-0421 mlx5_3", "state": 4,
              "utilization": {"transmit": 0.5, "receive": 1.0}, "transmit_wait_ratio": 0.3,
              "symbol_error_ber": 1e-9, "active": [{"severity": "critical"}],
              "conditions": ["link_degraded_width", "high_ber", "congestion"]},
             {"guid": "0x2", "port": "3", "node_desc": "leaf02", "state": 1, "phys_state": 2,
              "stale": True, "conditions": ["link_down"], "active": [{"severity": "critical"}]}]
    message = ("leaf02 port 3 (to host021 mlx5_0 port 1) runs at 2X of 4X (width): cable or "
               "transceiver fault on this link: reseat or replace the cable")
    events = [{"time": "2026-01-01T10:11:12Z", "status": "firing", "severity": "critical",
               "type": "link_degraded", "message": message}] * 3
    console = Console(record=True, width=80, color_system=None)
    console.print(render(ports, events, "ibmon top - http://127.0.0.1:9683 - 118400 ports"))
    lines = console.export_text().splitlines()
    assert all(len(line) <= 80 for line in lines)
    (first,) = [line for line in lines if "gpu-node-0421 mlx5_3 [1]" in line]
    assert "50.0%" in first and "100.0%" in first and "30.0%" in first and "1.0e-09" in first
    (second,) = [line for line in lines if "leaf02 [3]" in line]
    assert "stale: DOWN" in second
    rows = [line for line in lines if "10:11:12" in line]
    assert len(rows) == 3 and all(row.rstrip().endswith("…") for row in rows)
    assert lines.index(second) == lines.index(first) + 1  # no continuation line between
