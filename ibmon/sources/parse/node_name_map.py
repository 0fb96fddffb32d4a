"""rdma-core's node-name-map file: friendlier names for nodes, by GUID.

Read strictly (``ibmon.sources.parse.errors``): a line that is not a comment, a blank line or
``<guid> "name"``, or a GUID given two different names, rejects the whole file. rdma-core skips
what it cannot read; ibmon refuses instead, because a map that is half read silently shows some
switches under their raw descriptions and an operator takes the map for applied.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ibmon.infiniband.model import normalize_guid
from ibmon.sources.parse.errors import ParseError

__all__ = ["load_node_name_map", "parse_node_name_map"]

_NNM_LINE = re.compile(r'^\s*(?P<guid>(?:0x)?[0-9a-fA-F]{1,16})\s+"(?P<name>.*)"\s*$')


def parse_node_name_map(text: str) -> dict[str, str]:
    """rdma-core node-name-map: ``<guid> "name"`` per line, ``#`` comments, blank lines.

    Returns GUID (key form) -> name; raises ParseError for the whole file on an unreadable line
    or a GUID named twice with different names (the same name twice is harmless).
    """
    out: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _NNM_LINE.match(line)
        if not m:
            raise ParseError('not a node-name-map line (<guid> "name")', line=lineno, text=raw)
        guid = normalize_guid(m.group("guid"))
        if out.setdefault(guid, m.group("name")) != m.group("name"):
            raise ParseError(f"{guid} is named twice, differently", line=lineno, text=raw)
    return out


def load_node_name_map(path: str | os.PathLike[str] | None) -> dict[str, str]:
    """The map in ``path`` (none: empty). ParseError names the file and the line."""
    if path is None:
        return {}
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    try:
        return parse_node_name_map(text)
    except ParseError as exc:
        raise ParseError(f"{path}: {exc.problem}", line=exc.line, text=exc.text) from None
