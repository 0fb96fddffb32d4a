"""The README's metric table is generated from the catalogue; this keeps it from drifting."""

from __future__ import annotations

from pathlib import Path

from ibmon.infiniband.counters import markdown_table

README = Path(__file__).resolve().parents[2] / "README.md"


def test_metric_table_matches_catalogue() -> None:
    text = README.read_text()
    start = text.index("<!-- metric-table:start -->\n") + len("<!-- metric-table:start -->\n")
    end = text.index("<!-- metric-table:end -->")
    # Regenerate with:
    # python -c 'from ibmon.infiniband.counters import markdown_table as t; print(t())'
    assert text[start:end] == markdown_table()



def test_readme_scenario_example_is_valid_and_its_answer_key_holds(tmp_path: Path) -> None:
    """The scenario shown to users parses, and the detectors raise exactly its expected events."""
    from tests.detect_harness import mismatches, play

    text = README.read_text()
    start = text.index("```yaml\nname: my-ber") + len("```yaml\n")
    path = tmp_path / "my-ber.yaml"
    path.write_text(text[start : text.index("```", start)])
    scenario, source, seen = play(str(path))
    assert scenario.name == "my-ber"
    assert seen, "the example's fault raised nothing"
    assert mismatches(scenario, source, seen) == []
