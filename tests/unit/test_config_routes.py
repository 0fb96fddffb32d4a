"""A job source turns on the fabric sources' forwarding tables, unless the config says no:
an inter-switch link's jobs come from its routes, and without a job source nobody pays for
reading (and holding) every switch's table."""

from __future__ import annotations

from ibmon.config import Settings


def _tables(settings: Settings) -> list[object]:
    return [getattr(s, "forwarding_tables", None) for s in settings.sources]


def test_a_job_source_reads_the_routes_unless_a_source_says_otherwise() -> None:
    sources = [{"type": "mad"}, {"type": "diags", "name": "d", "forwarding_tables": False},
               {"type": "sysfs"}]
    assert _tables(Settings(sources=sources, slurm={})) == [True, False, None]


def test_without_a_job_source_no_tables_are_read_unless_asked() -> None:
    sources = [{"type": "mad"}, {"type": "diags", "name": "d", "forwarding_tables": True}]
    assert _tables(Settings(sources=sources)) == [False, True]
