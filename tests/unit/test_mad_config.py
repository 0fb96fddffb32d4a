"""A ``mad`` source's settings, from the config file to what it does: the MAD worker it starts
(CA, port, timeout, retries, MADs in flight), the forwarding tables its sweep reads and how
often a poll re-reads port state."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from ibmon.config import load_settings
from ibmon.sources import mad
from ibmon.sources.libibmad import ATTR_SWITCH_INFO, MadError, MadRequest, MadResult
from ibmon.sources.mad import MadSource, SweepResult
from ibmon.sources.parse import NodeInfo
from ibmon.sources.registry import build_source


def _source(tmp_path: Path, extra: str) -> MadSource:
    path = tmp_path / "ibmon.toml"
    path.write_text(f'[[sources]]\ntype = "mad"\n{extra}')
    src = build_source(load_settings(path).sources[0])
    assert isinstance(src, MadSource)
    return src


async def _worker_args(src: MadSource, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What the source starts its MAD worker with (the worker is refused, so none runs)."""
    got: dict[str, Any] = {}

    def refuse(**kwargs: Any) -> None:
        got.update(kwargs)
        raise OSError("not in this test")

    monkeypatch.setattr(mad, "MadWorker", refuse)
    try:
        with pytest.raises(MadError, match="cannot start the MAD worker: not in this test"):
            await src.discover()
    finally:
        await src.close()
    return got


def _asks_switch_info(src: MadSource) -> bool:
    """Whether the sweep asks a new switch's SwitchInfo (which bounds its forwarding table)."""
    sent: list[MadRequest] = []

    def results(reqs: Sequence[MadRequest], *, keep: bool = True) -> Iterator[MadResult]:
        sent.extend(reqs)
        return iter([MadResult(None, "timeout")] * len(reqs))

    src._results = results  # type: ignore[method-assign]
    switch = NodeInfo("switch", 4, "0x01", "0x01", "0x01", 1, 0, 0)
    src._describe(SweepResult(), [(switch, (), 0)])
    return any(r.attr_id == ATTR_SWITCH_INFO for r in sent)


async def test_the_configured_settings_reach_the_worker_and_the_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = _source(tmp_path, 'ca = "mlx5_1"\nport = 2\ntimeout = "250ms"\nretries = 0\n'
                            'concurrency = 3\nstate_interval = "30s"\nforwarding_tables = true\n')
    assert _asks_switch_info(src)
    src._state.discovered(0.0, 1.0)
    assert not src._state.due(11.0)  # 10 s after a discovery: within the 30 s
    assert src._state.due(31.0)
    # concurrency is the window as configured, however small: an operator may mean to be gentle
    assert await _worker_args(src, monkeypatch) == {
        "ca": "mlx5_1", "port": 2, "timeout": 0.25, "retries": 0, "window": 3}


async def test_the_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _source(tmp_path, "")
    assert not _asks_switch_info(src)
    src._state.discovered(0.0, 1.0)
    assert src._state.due(11.0)  # port state on every poll
    assert await _worker_args(src, monkeypatch) == {
        "ca": None, "port": 0, "timeout": 1.0, "retries": 2, "window": 64}
