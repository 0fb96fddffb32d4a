"""The ``ibmon`` console script and ``python -m ibmon``: a plain ``run`` skips the typer app.

A compute node runs ``ibmon run`` next to its jobs all day. Building the typer app imports typer
(and its click fork), and structlog imports rich whenever it is installed (typer installs it):
together about 5 MB of resident memory the daemon never uses. So when the command line is
``run`` with nothing but ``--config``/``-c``, ``--listen`` and ``--log-level`` (each at most
once, values given as ``--opt VALUE`` or ``--opt=VALUE``), this module calls
``ibmon.runtime.launch.run_command`` itself. Every other command line, including anything unusual
about a ``run`` (``--help``, an unknown option, a missing or invalid value, a repeated option), goes
to the typer app in ``ibmon.cli.app``, which owns every usage message; the fast path decides nothing
a user could see differently.

On the fast path structlog is imported with rich hidden (``sys.modules["rich"] = None``, the
import system's documented way to make an import fail), so its console renderer prints plain
tracebacks on a terminal; under systemd logs are JSON either way. Before that, asyncio and
hashlib are imported without OpenSSL when the config cannot use TLS (``ibmon.runtime.sslgate``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NamedTuple

__all__ = ["RunArgs", "main", "parse_run"]

_LEVELS = ("debug", "info", "warning", "error")  # runtime.log.LEVELS, no structlog import
_OPTIONS = {"--config": "config", "-c": "config", "--listen": "listen", "--log-level": "log_level"}


class RunArgs(NamedTuple):
    config: Path | None
    listen: str | None
    log_level: str | None


def parse_run(argv: list[str]) -> RunArgs | None:
    """``run`` and its options when the command line is exactly that, else None (typer's turn).

    Only what typer would read the same way is accepted; anything it might read differently
    or reject returns None, so typer parses it and says what is wrong.
    """
    if not argv or argv[0] != "run":
        return None
    values: dict[str, str] = {}
    rest = argv[1:]
    i = 0
    while i < len(rest):
        arg = rest[i]
        name, eq, value = arg.partition("=")
        if name not in _OPTIONS or (eq and name == "-c"):
            return None
        if not eq:
            if i + 1 >= len(rest):
                return None
            value = rest[i + 1]
            i += 1
        i += 1
        key = _OPTIONS[name]
        if key in values or not value or value.startswith("-"):
            return None
        values[key] = value
    level = values.get("log_level")
    if level is not None and level not in _LEVELS:
        return None
    config = values.get("config")
    return RunArgs(Path(config) if config is not None else None, values.get("listen"), level)


def _import_structlog_without_rich() -> None:
    """Import structlog while ``rich`` cannot be imported, then make rich importable again."""
    if "structlog" in sys.modules or "rich" in sys.modules:
        return
    sys.modules["rich"] = None  # type: ignore[assignment]
    try:
        import structlog  # noqa: F401
    finally:
        del sys.modules["rich"]


def main(argv: list[str] | None = None) -> None:
    """Entry point: usage errors become one line on stderr and exit code 2, never a traceback."""
    args = sys.argv[1:] if argv is None else argv
    run = parse_run(args)
    if run is None:
        from ibmon.cli.app import main as cli_main

        cli_main(args)
        return
    from ibmon.runtime.sslgate import import_without_openssl

    import_without_openssl(run.config)  # before structlog and config import asyncio and hashlib
    _import_structlog_without_rich()
    from ibmon.runtime.log import configure_from_environment

    configure_from_environment()  # stderr only, before anything can log
    from ibmon.runtime.launch import CliUsageError, run_command

    try:
        run_command(run.config, run.listen, run.log_level)
    except CliUsageError as exc:
        from ibmon.cli.terminal import printable

        print(f"ibmon: error: {printable(exc.format_message())}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(0)
