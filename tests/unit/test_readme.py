"""The README's metric table is generated from the catalogue; this keeps it from drifting."""

from __future__ import annotations

from pathlib import Path

from ibmon.counters import markdown_table

README = Path(__file__).resolve().parents[2] / "README.md"


def test_metric_table_matches_catalogue() -> None:
    text = README.read_text()
    start = text.index("<!-- metric-table:start -->\n") + len("<!-- metric-table:start -->\n")
    end = text.index("<!-- metric-table:end -->")
    # Regenerate with: python -c 'from ibmon.counters import markdown_table as t; print(t())'
    assert text[start:end] == markdown_table()
