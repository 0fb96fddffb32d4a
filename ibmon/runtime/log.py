"""Logging, set up once per process: stderr only, JSON under systemd or a pipe, console on a TTY.

stdout belongs to the command's output (a table, JSON, an exposition piped into promtool or the
node_exporter textfile collector), so no log line may ever reach it. structlog's unconfigured
default prints to stdout, and a source logs as soon as it reads sysfs, which is why
``ibmon.cli.app`` calls ``configure_logging`` first thing in ``main()``, before any command code
runs, and again once a command knows its configured level. Libraries that log through the standard
``logging`` module (asyncio, paho) are routed to the same stream and format.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Final, Literal, TextIO, get_args

import structlog

__all__ = ["LEVELS", "Format", "Level", "configure_from_environment", "configure_logging"]

Level = Literal["debug", "info", "warning", "error"]
Format = Literal["auto", "json", "console"]
LEVELS: Final[tuple[str, ...]] = get_args(Level)
FORMATS: Final[tuple[str, ...]] = get_args(Format)


class _StderrHandler(logging.StreamHandler[TextIO]):
    """Marks the root handler we installed, so reconfiguring replaces it and nothing else."""


def configure_logging(level: str = "info", fmt: str = "auto") -> None:
    """Send every log record, structlog's and the standard library's, to stderr at ``level``."""
    stream = sys.stderr
    use_json = fmt == "json" or (fmt == "auto" and not stream.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=stream.isatty())
    )
    levelno = logging.getLevelNamesMapping()[level.upper()]
    stamp = structlog.processors.TimeStamper(fmt="iso", utc=True)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            stamp,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(levelno),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )
    handler = _StderrHandler(stream)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=[structlog.stdlib.add_log_level, stamp],
        )
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(levelno)


def configure_from_environment() -> None:
    """The setup before any config file is read: ``IBMON_LOG__LEVEL``/``__FORMAT`` when valid.

    An invalid value is not reported here: loading the settings reports it as a config error.
    """
    level = os.environ.get("IBMON_LOG__LEVEL", "").strip().lower()
    fmt = os.environ.get("IBMON_LOG__FORMAT", "").strip().lower()
    configure_logging(level if level in LEVELS else "info", fmt if fmt in FORMATS else "auto")
