"""Starting the daemon from the command line: settings, logging, the event loop, exit codes.

``ibmon run`` is what every compute node runs all day, so what it costs in memory is paid 10,000
times over. This module holds everything ``run`` needs and nothing the other commands need: it
imports neither typer nor rich, and the daemon's own imports stay lazy about everything a
sysfs-only node never uses (MAD bindings, MQTT, YAML, the simulator). ``ibmon.cli.entry`` calls
``run_command`` directly when the command line is a plain ``run``; the typer command in
``ibmon.cli.app`` calls the same function, and ``check-config`` and ``demo`` share the helpers, so
the two ways in cannot drift apart.

Usage and config mistakes raise ``CliUsageError``: one line on stderr and exit 2, never a
traceback (the callers print it).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from ibmon.config import ConfigError, Settings, load_settings, parse_listen
from ibmon.sources.sysfs import SysfsSourceConfig

__all__ = [
    "CliUsageError",
    "configure_logging_for",
    "die",
    "run_command",
    "run_daemon",
    "settings_for_run",
]


class CliUsageError(Exception):
    """A user mistake detected after parsing (bad config, no devices): exit 2, one line.

    ``format_message`` and ``exit_code`` are the shape the CLI's entry point recognises (the
    same as typer's own usage errors)."""

    exit_code = 2

    def format_message(self) -> str:
        return str(self)


def die(message: str) -> NoReturn:
    raise CliUsageError(message)


def configure_logging_for(settings: Settings, level: str | None) -> None:
    """Logs go to stderr at the configured level: the flag, else the config, else info."""
    from ibmon.runtime.log import configure_logging

    configure_logging(level or settings.log.level, settings.log.format)


def settings_for_run(config: Path | None, listen: str | None = None) -> Settings:
    """The settings ``run`` starts with, and every reload re-reads: the file, the environment,
    the flags given at start (so a SIGHUP never drops ``--listen``), the default sysfs source,
    and every check ``ibmon.runtime.preflight`` makes. ``check-config`` calls this too.
    ConfigError on any problem."""
    from ibmon.runtime.preflight import check_startable

    overrides: dict[str, Any] = {}
    flags: dict[tuple[str | int, ...], str] = {}
    if listen is not None:
        try:
            parse_listen(listen)
        except ValueError as exc:
            raise ConfigError(f"--listen: {exc}") from None
        base = load_settings(config)
        overrides["prometheus"] = {**base.prometheus.model_dump(), "listen": listen}
        flags[("prometheus", "listen")] = "--listen"
    settings = load_settings(config, **overrides)
    check_startable(settings, path=config, flags=flags)
    if not settings.sources:
        from ibmon.sources.sysfs import has_devices

        if not has_devices(Path("/sys")):
            raise ConfigError(
                "no InfiniBand devices under /sys/class/infiniband; "
                "configure a fabric source in --config, or try `ibmon demo`"
            )
        settings = settings.model_copy(update={"sources": [SysfsSourceConfig()]})
    return settings


def run_command(config: Path | None, listen: str | None, log_level: str | None) -> None:
    """``ibmon run``: validate, configure logging, run until SIGTERM/SIGINT."""
    try:
        settings = settings_for_run(config, listen)
    except ConfigError as exc:
        die(str(exc))
    configure_logging_for(settings, log_level)
    reload = (lambda: settings_for_run(config, listen)) if config is not None else None
    run_daemon(settings, config, reload)


def run_daemon(
    settings: Settings,
    config: Path | None,
    reload: Callable[[], Settings] | None,
    banner: str | None = None,
) -> None:
    """Run the daemon until SIGTERM/SIGINT; a start it cannot make is one line and exit 2."""
    from ibmon.runtime.daemon import Daemon, StartError

    async def _main() -> None:
        daemon = Daemon(settings, config_path=config, reload_settings=reload)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(daemon.run(), name="daemon")
            if banner:
                await daemon.ready.wait()
                exporter = daemon.exporter
                port = exporter.port if exporter else 0
                print(banner.format(port=port), file=sys.stderr, flush=True)

    try:
        asyncio.run(_main())
    except* StartError as group:  # e.g. the listen address is taken: an operator problem
        die(str(_first(group)))
    except* OSError as group:
        exc = _first(group)
        where = f" {exc.filename}" if isinstance(exc, OSError) and exc.filename else ""
        die(f"cannot start:{where} {getattr(exc, 'strerror', None) or exc}")


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc
