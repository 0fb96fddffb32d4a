"""The README's metric table is generated from the catalogue, and its command table names every
command and option the CLI has; these keep them from drifting."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer

from ibmon.cli.app import app
from ibmon.infiniband.counters import markdown_table

README = Path(__file__).resolve().parents[2] / "README.md"


def test_metric_table_matches_catalogue() -> None:
    text = README.read_text()
    start = text.index("<!-- metric-table:start -->\n") + len("<!-- metric-table:start -->\n")
    end = text.index("<!-- metric-table:end -->")
    # Regenerate with:
    # python -c 'from ibmon.infiniband.counters import markdown_table as t; print(t())'
    assert text[start:end] == markdown_table()


def _commands(group: Any, prefix: str) -> Iterator[tuple[str, set[str]]]:
    """(``ibmon sim sysfs``, its ``--`` options) of every command under a typer group."""
    for name, command in group.commands.items():
        if hasattr(command, "commands"):  # a group: ``ibmon sim``
            yield from _commands(command, f"{prefix} {name}")
        else:
            yield (f"{prefix} {name}",
                   {opt for p in command.params for opt in p.opts if opt.startswith("--")})


def test_the_command_table_lists_every_command_with_all_its_options() -> None:
    """What an operator reads in the README is what ``--help`` would tell them."""
    rows = {m.group(1): set(re.findall(r"--[a-z][a-z-]*", m.group(2))) for m in re.finditer(
        r"^\| `(ibmon(?: (?!--)[a-z-]+)+)(.*?)` \|", README.read_text(), re.M)}
    cli = dict(_commands(typer.main.get_command(app), "ibmon"))
    assert set(rows) == set(cli)
    for name, options in cli.items():
        assert rows[name] == options, name


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
