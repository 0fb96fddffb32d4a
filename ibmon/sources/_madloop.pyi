"""Stub of the optional C module ``ibmon.sources._madloop`` (``_madloop.c``)."""

from collections.abc import Callable, Sequence
from typing import Any

def run(
    requests: Sequence[Sequence[Any]],
    fns: tuple[int, ...],
    fd: int,
    agents: tuple[int, int, int],
    bufs: tuple[int, int, int],
    timeout: float,
    retries: int,
    window: int,
    tid: int,
    emit: Callable[[list[tuple[bytes | None, str | None]]], None] | None,
    chunk: int,
    /,
) -> tuple[list[tuple[bytes | None, str | None]], int, int, int]: ...
