"""rdma-core's node-name-map file: friendlier names for nodes, by GUID."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ibmon.model import normalize_guid

__all__ = ["load_node_name_map", "parse_node_name_map"]

_NNM_LINE = re.compile(r'^\s*(?P<guid>(?:0x)?[0-9a-fA-F]{1,16})\s+"(?P<name>.*)"\s*$')


def parse_node_name_map(text: str) -> tuple[dict[str, str], list[str]]:
    """rdma-core node-name-map: ``<guid> "name"`` per line, ``#`` comments, blank lines.

    Returns GUID (key form) -> name and the lines that could not be read.
    """
    out: dict[str, str] = {}
    bad: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _NNM_LINE.match(line)
        if not m:
            bad.append(raw)
            continue
        out[normalize_guid(m.group("guid"))] = m.group("name")
    return out, bad


def load_node_name_map(path: str | os.PathLike[str] | None) -> dict[str, str]:
    """The map in ``path`` (none: empty). Unreadable lines are skipped, as rdma-core does."""
    if path is None:
        return {}
    names, _bad = parse_node_name_map(Path(path).read_text(encoding="utf-8", errors="replace"))
    return names
