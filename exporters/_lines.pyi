"""Stub of the optional C module ``exporters._lines`` (``_lines.c``)."""

from typing import Any

def lines(labels: list[str], columns: tuple[tuple[bytes, bytes, Any], ...],
          per_chunk: int, /) -> list[bytes]: ...
