"""The ``ibmon`` command.

Usage and config mistakes exit 2 with one line on stderr, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, NoReturn

import typer

from ibmon import __version__
from ibmon.config import (
    ConfigError,
    MockSourceConfig,
    PrometheusConfig,
    Settings,
    SourceConfig,
    SysfsSourceConfig,
    load_settings,
)
from ibmon.model import PortView
from ibmon.state import FabricState, SourceStatus

__all__ = ["app", "main"]

app = typer.Typer(
    name="ibmon",
    help="InfiniBand fabric monitor: counters, faults, congestion; Prometheus and MQTT.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
sim_app = typer.Typer(
    help="Run the simulated fabric for other programs to read.", no_args_is_help=True
)
app.add_typer(sim_app, name="sim")


class CliUsageError(Exception):
    """A user mistake detected after parsing (bad config, no devices): exit 2, one line."""

    exit_code = 2

    def format_message(self) -> str:
        return str(self)


def _die(message: str) -> NoReturn:
    raise CliUsageError(message)


def _load(config: Path | None, **overrides: Any) -> Settings:
    try:
        return load_settings(config, **overrides)
    except ConfigError as exc:
        _die(str(exc))


def _run_daemon(settings: Settings, config_path: Path | None, banner: str | None = None) -> None:
    from ibmon.daemon import Daemon
    from ibmon.log import configure_logging

    configure_logging(settings.log.level, settings.log.format)

    async def _main() -> None:
        daemon = Daemon(settings, config_path=config_path)
        task = asyncio.create_task(daemon.run())
        if banner:
            await daemon.ready.wait()
            exporter = daemon.exporter
            port = exporter.port if exporter else 0
            print(banner.format(port=port), file=sys.stderr, flush=True)
        await task

    try:
        asyncio.run(_main())
    except OSError as exc:  # e.g. listen address in use: an operator problem, not a crash
        _die(f"cannot start: {exc.strerror or exc}")


@app.command()
def run(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="TOML config file.")] = None,
    listen: Annotated[
        str | None, typer.Option(help="Override prometheus.listen (host:port).")
    ] = None,
) -> None:
    """Run the daemon (default: the sysfs source on this host)."""
    overrides: dict[str, Any] = {}
    if listen is not None:
        base = _load(config)
        overrides["prometheus"] = base.prometheus.model_copy(update={"listen": listen})
        overrides["prometheus"] = PrometheusConfig.model_validate(
            overrides["prometheus"].model_dump()
        )
    settings = _load(config, **overrides)
    if not settings.sources:
        from ibmon.sources.sysfs import has_devices

        if not has_devices(Path("/sys")):
            _die(
                "no InfiniBand devices under /sys/class/infiniband; "
                "configure a fabric source in --config, or try `ibmon demo`"
            )
        settings = settings.model_copy(update={"sources": [SysfsSourceConfig()]})
    _run_daemon(settings, config)


class ScanSource(StrEnum):
    sysfs = "sysfs"
    mock = "mock"
    mad = "mad"
    diags = "diags"


class ScanFormat(StrEnum):
    table = "table"
    json = "json"
    prom = "prom"


def _scan_state(cfg: SourceConfig, interval: float) -> tuple[FabricState, bytes]:
    from exporters.prometheus import exposition
    from ibmon.selfmetrics import SelfMetrics
    from ibmon.sources.registry import build_source
    from ibmon.tracker import Tracker

    async def _two_samples() -> tuple[FabricState, bytes]:
        source = build_source(cfg)
        metrics = SelfMetrics()
        tracker = Tracker()
        try:
            await source.discover()
            views: dict[Any, PortView] = {}
            for i in range(2):
                if i:
                    await asyncio.sleep(interval)
                started = time.monotonic()
                snap = await source.sample()
                views = tracker.update(snap)
                metrics.poll_duration.labels(cfg.label).observe(time.monotonic() - started)
                for err in snap.errors:
                    metrics.poll_errors.labels(cfg.label, err.reason).inc()
        finally:
            await source.close()
        metrics.source_up.labels(cfg.label).set(1)
        metrics.last_success.labels(cfg.label).set(snap.wall)
        metrics.source_ports.labels(cfg.label).set(len(views))
        state = FabricState(
            generated=snap.wall,
            ports=MappingProxyType(views),
            sources=MappingProxyType(
                {cfg.label: SourceStatus(cfg.label, cfg.type, True, snap.wall, len(views))}
            ),
        )
        return state, exposition(metrics, state)

    return asyncio.run(_two_samples())


def _port_order(v: PortView) -> tuple[str, int]:
    """GUID, then port number as a number (2 before 10), as /metrics orders them."""
    return (v.identity.guid, int(v.identity.port) if v.identity.port.isdigit() else 0)


def _port_json(v: PortView) -> dict[str, Any]:
    ident = v.identity
    return {
        "guid": ident.guid,
        "port": ident.port,
        "device": ident.device,
        "node_desc": ident.node_desc,
        "node_type": ident.node_type,
        "lid": ident.lid,
        "link_layer": ident.link_layer,
        "state": v.state,
        "phys_state": v.phys_state,
        "rate_bytes_per_second": v.rate_bytes_per_second,
        "active_width": v.active_width,
        "active_speed": v.active_speed,
        "totals": v.totals,
        "rates": v.rates,
        "saturated": sorted(v.saturated),
        "resets": v.resets,
        "hw_totals": v.hw_totals,
        "utilization": {"transmit": v.utilization_tx, "receive": v.utilization_rx},
        "transmit_wait_ratio": v.xmit_wait_ratio,
    }


def _fmt_rate(bps: float | None) -> str:
    if bps is None:
        return "-"
    for unit in ("B/s", "kB/s", "MB/s", "GB/s"):
        if abs(bps) < 1000:
            return f"{bps:.1f} {unit}"
        bps /= 1000
    return f"{bps:.1f} TB/s"


def _table(state: FabricState) -> str:
    rows = [("GUID", "PORT", "NAME", "STATE", "RATE", "TX", "RX", "ERRORS", "SATURATED")]
    for v in sorted(state.ports.values(), key=_port_order):
        ident = v.identity
        errors = sum(
            n
            for name, n in v.totals.items()
            if name not in {"transmit_data", "receive_data", "transmit_wait"}
            and "packets" not in name
        )
        rows.append(
            (
                ident.guid,
                ident.port,
                (ident.node_desc or ident.device)[:32],
                str(v.state if v.state is not None else "-"),
                _fmt_rate(v.rate_bytes_per_second),
                _fmt_rate(v.rates.get("transmit_data")),
                _fmt_rate(v.rates.get("receive_data")),
                str(errors),
                ",".join(sorted(v.saturated)),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return (
        "\n".join(
            "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
        )
        + "\n"
    )


@app.command()
def scan(
    source: Annotated[ScanSource, typer.Option(help="Which source to sample.")] = ScanSource.sysfs,
    sysfs_root: Annotated[Path, typer.Option(help="sysfs root (tests, containers).")] = Path(
        "/sys"
    ),
    interval: Annotated[
        float, typer.Option(min=0.0, max=3600.0, help="Seconds between the two samples.")
    ] = 1.0,
    fmt: Annotated[ScanFormat, typer.Option("--format", help="Output format.")] = ScanFormat.table,
    ca: Annotated[str | None, typer.Option(help="Local CA for mad/diags.")] = None,
    scenario: Annotated[str, typer.Option(help="Scenario for --source mock.")] = "healthy",
) -> None:
    """Sample twice, INTERVAL apart, and print ports with totals and rates."""
    cfg: SourceConfig
    if source is ScanSource.sysfs:
        cfg = SysfsSourceConfig(root=sysfs_root)
    elif source is ScanSource.mock:
        cfg = MockSourceConfig(scenario=scenario)
    else:
        from ibmon.config import DiagsSourceConfig, MadSourceConfig

        cls = MadSourceConfig if source is ScanSource.mad else DiagsSourceConfig
        cfg = cls(ca=ca)
    if source is ScanSource.sysfs:
        from ibmon.sources.sysfs import has_devices

        if not has_devices(sysfs_root):
            _die(f"no InfiniBand devices under {sysfs_root}/class/infiniband")
    try:
        state, body = _scan_state(cfg, interval)
    except (OSError, RuntimeError, ValueError) as exc:
        _die(f"scan failed: {exc}")
    if fmt is ScanFormat.prom:
        sys.stdout.buffer.write(body)
    elif fmt is ScanFormat.json:
        ports = [_port_json(v) for v in sorted(state.ports.values(), key=_port_order)]
        json.dump({"source": cfg.label, "ports": ports}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(_table(state))


@app.command("check-config")
def check_config(
    file: Annotated[Path, typer.Argument(help="TOML config file to validate.")],
) -> None:
    """Validate a config file; exit 0 if good, 2 with the problem if not."""
    settings = _load(file)
    n = len(settings.sources) or 1
    typer.echo(f"{file}: OK ({n} source(s), listen {settings.prometheus.listen})")


@app.command()
def version() -> None:
    """Print the version."""
    typer.echo(f"ibmon {__version__}")


@app.command()
def top(
    url: Annotated[
        str, typer.Option(help="A running daemon's listener (its JSON API).")
    ] = "http://127.0.0.1:9683",
    source: Annotated[
        ScanSource | None,
        typer.Option(help="Sample this source directly instead of reading a daemon."),
    ] = None,
    sysfs_root: Annotated[Path, typer.Option(help="sysfs root for --source sysfs.")] = Path("/sys"),
    scenario: Annotated[str, typer.Option(help="Scenario for --source mock.")] = "demo",
    ca: Annotated[str | None, typer.Option(help="Local CA for --source mad/diags.")] = None,
    interval: Annotated[float, typer.Option(min=0.1, max=3600.0, help="Refresh, seconds.")] = 2.0,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="Ports to show.")] = 20,
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit.")] = False,
) -> None:
    """Live view of the worst ports, active conditions and recent events."""
    from ibmon.top import ApiReader, DirectSampler, run_top

    reader: ApiReader | DirectSampler
    if source is None:
        if not url.startswith(("http://", "https://")):
            _die(f"--url must start with http:// or https://, got {url!r}")
        reader = ApiReader(url, limit=limit)
    else:
        cfg: SourceConfig
        if source is ScanSource.sysfs:
            from ibmon.sources.sysfs import has_devices

            if not has_devices(sysfs_root):
                _die(f"no InfiniBand devices under {sysfs_root}/class/infiniband")
            cfg = SysfsSourceConfig(root=sysfs_root)
        elif source is ScanSource.mock:
            cfg = MockSourceConfig(scenario=scenario)
        else:
            from ibmon.config import DiagsSourceConfig, MadSourceConfig

            cfg = (MadSourceConfig if source is ScanSource.mad else DiagsSourceConfig)(ca=ca)
        try:
            reader = DirectSampler(cfg, limit=limit)
        except (OSError, RuntimeError, ValueError) as exc:
            _die(f"cannot sample {cfg.type}: {exc}")
    try:
        asyncio.run(run_top(reader, interval=interval, once=once, limit=limit))
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        _die(f"cannot read {url}: {getattr(exc, 'reason', None) or exc}")


@app.command()
def demo(
    scenario: Annotated[
        str, typer.Option(help="Shipped scenario name (mocks/scenarios) or a YAML file.")
    ] = "demo",
    hosts: Annotated[int | None, typer.Option(min=1, help="Host ports in the fat tree.")] = None,
    listen: Annotated[str, typer.Option(help="Metrics listen address.")] = "127.0.0.1:9683",
    speed: Annotated[
        float, typer.Option(min=0.01, max=10000.0, help="Simulated seconds per real second.")
    ] = 10.0,
    interval: Annotated[float, typer.Option(min=0.05, help="Poll interval, real seconds.")] = 1.0,
) -> None:
    """Run the full daemon on the built-in simulated fabric with a scenario playing."""
    from mocks.scenario import ScenarioError, load_scenario

    try:
        load_scenario(scenario)  # a shipped name or a YAML file of your own
    except ScenarioError as exc:
        _die(str(exc))
    src = MockSourceConfig(
        name="demo", scenario=scenario, hosts=hosts, speed=speed, interval=interval
    )
    settings = _load(
        None,
        prometheus={"listen": listen},
        sources=[src.model_dump()],
    )
    host = listen.rsplit(":", 1)[0]
    banner = (
        f"ibmon demo: scenario {scenario!r}, simulated time x{speed:g}.\n"
        f"  metrics:   http://{host}:{{port}}/metrics\n"
        f"  events:    http://{host}:{{port}}/api/v1/events\n"
        f"  live view: ibmon top --url http://{host}:{{port}}   (in another terminal)\n"
        "  stop with Ctrl-C"
    )
    _run_daemon(settings, None, banner)


@sim_app.command("sysfs")
def sim_sysfs(
    out: Annotated[Path, typer.Option(help="Directory to render the sysfs tree into.")],
    scenario: Annotated[str, typer.Option(help="Scenario to play.")] = "demo",
    speed: Annotated[
        float, typer.Option(min=0.01, help="Simulated seconds per real second.")
    ] = 1.0,
    hosts: Annotated[int | None, typer.Option(min=1, help="Host ports in the fat tree.")] = None,
) -> None:
    """Render the simulated fabric's HCAs as a live sysfs tree (read it with --sysfs-root)."""
    from mocks.sysfs import run_sysfs

    print(
        f"ibmon sim: rendering sysfs under {out}/class/infiniband (Ctrl-C to stop)", file=sys.stderr
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run_sysfs(out, scenario, speed=speed, hosts=hosts))


@sim_app.command("ibsim")
def sim_ibsim(
    scenario: Annotated[str, typer.Option(help="Scenario to play.")] = "demo",
    speed: Annotated[
        float, typer.Option(min=0.01, help="Simulated seconds per real second.")
    ] = 1.0,
    hosts: Annotated[int | None, typer.Option(min=1, help="Host ports in the fat tree.")] = None,
) -> None:
    """Run ibsim + opensm driven by the scenario, for perfquery, ibnetdiscover and the mad source.

    Prints the environment the tools need (they talk to the simulator through libumad2sim);
    Ctrl-C stops the simulator and removes its files.
    """
    import shlex
    import signal

    from mocks.ibsim import IbSimError
    from mocks.ibsim_driver import IbSimDriver, run_ibsim
    from mocks.scenario import ScenarioError

    def ready(drv: IbSimDriver) -> None:
        env = drv.sim.env
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
        print(
            f"ibmon sim: ibsim is running scenario {scenario!r} "
            f"({len(drv.model.keys)} ports, simulated time x{speed:g}); Ctrl-C to stop.\n"
            f"Run the tools from {drv.sim.workdir} (umad2sim writes a sys-<pid> tree there) "
            "with this environment:\n"
            f"  cd {shlex.quote(str(drv.sim.workdir))} && export {exports}\n"
            "  perfquery -x <lid> <port>    ibnetdiscover -p    iblinkinfo\n"
            "  ibmon scan --source mad",
            flush=True,
        )

    async def run() -> None:
        # SIGTERM (systemd, timeout) stops like Ctrl-C, so ibsim and opensm are cleaned up
        stop = asyncio.Event()
        with contextlib.suppress(NotImplementedError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await run_ibsim(scenario, speed=speed, hosts=hosts, on_ready=ready, stop=stop)

    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(run())
    except (ScenarioError, IbSimError) as exc:
        _die(str(exc))


def main(argv: list[str] | None = None) -> None:
    """Entry point: usage errors become one line on stderr and exit code 2, never a traceback.

    Typer vendors its click fork privately, so its usage errors are recognised by their public
    shape (``format_message`` and ``exit_code``) rather than by importing a private class.
    """
    try:
        rc = app(args=argv, standalone_mode=False, prog_name="ibmon")
    except (typer.Exit, typer.Abort) as exc:
        sys.exit(getattr(exc, "exit_code", 130))
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:
        fmt = getattr(exc, "format_message", None)
        code = getattr(exc, "exit_code", None)
        if callable(fmt) and isinstance(code, int):
            no_args = type(exc).__name__ == "NoArgsIsHelpError"
            print(fmt() if no_args else f"ibmon: error: {fmt()}", file=sys.stderr)
            sys.exit(code)
        raise
    sys.exit(rc if isinstance(rc, int) else 0)
