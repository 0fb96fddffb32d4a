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
