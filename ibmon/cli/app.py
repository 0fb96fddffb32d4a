"""The ``ibmon`` command.

Usage and config mistakes exit 2 with one line on stderr, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, NoReturn

import typer
from pydantic import ValidationError

from ibmon import __version__
from ibmon.cli.terminal import printable
from ibmon.config import (
    ConfigError,
    Settings,
    SourceConfig,
    load_settings,
    parse_listen,
)
from ibmon.runtime.launch import CliUsageError, run_command
from ibmon.runtime.launch import configure_logging_for as _configure_logging
from ibmon.runtime.launch import run_daemon as _run_daemon
from ibmon.runtime.launch import settings_for_run as _settings_for_run
from ibmon.runtime.log import Level
from ibmon.sources.registry import SOURCES

if TYPE_CHECKING:
    SourceName = str
else:
    # The --source choices are the registered source types: a new source needs no edit here.
    SourceName = Literal[tuple(SOURCES)]

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


def _die(message: str) -> NoReturn:
    raise CliUsageError(message)


def _one_line(message: str) -> str:
    """A multi-line message (a scenario's validation errors) as the one line errors get."""
    return "; ".join(line.strip() for line in message.splitlines() if line.strip())


def _load(config: Path | None, **overrides: Any) -> Settings:
    try:
        return load_settings(config, **overrides)
    except ConfigError as exc:
        _die(str(exc))


def _number(low: float, high: float | None = None) -> Callable[[Any], float]:
    """A float option's parser: a finite number from ``low`` to ``high``, else a usage error.

    typer's own bounds check says "should be less than or equal to 10000" for ``nan`` (which
    fails every comparison) and lets ``inf`` through an open upper bound; both are no number a
    user meant, and saying so is the useful answer.
    """
    span = f"from {low:g} to {high:g}" if high is not None else f"at least {low:g}"

    def parse(value: Any) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise typer.BadParameter(f"{value!r} is not a number") from None
        if not math.isfinite(number):
            raise typer.BadParameter(f"must be a finite number, got {value}")
        if number < low or (high is not None and number > high):
            raise typer.BadParameter(f"must be {span}, got {value}")
        return number

    parse.__name__ = "FLOAT"  # the metavar typer shows in --help
    return parse


LogLevelOption = Annotated[
    Level | None,
    typer.Option("--log-level", help="Log level (default: the config's [log] level, else info)."),
]


def _source_config(name: str, **options: Any) -> SourceConfig:
    """A source config from CLI options, validated by the config model.

    Only options the source type has are passed (``--ca``/``--port`` mean nothing to sysfs), and
    only when given, so everything else takes the model's default.
    """
    from ibmon.sources.registry import source_type

    model = source_type(name).config
    data = {k: v for k, v in options.items() if v is not None and k in model.model_fields}
    try:
        return model.model_validate({"type": name, **data})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = str(err["loc"][-1]) if err["loc"] else name
        _die(f"--source {name}: {where}: {err['msg'].removeprefix('Value error, ')}")


def _require_devices(cfg: SourceConfig) -> None:
    """A sysfs root without devices is a usage mistake: say so before sampling nothing."""
    from ibmon.sources.sysfs import SysfsSourceConfig, has_devices

    if isinstance(cfg, SysfsSourceConfig) and not has_devices(cfg.root):
        _die(f"no InfiniBand devices under {cfg.root}/class/infiniband")


@app.command()
def run(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="TOML config file.")] = None,
    listen: Annotated[
        str | None, typer.Option(help="Override prometheus.listen (host:port).")
    ] = None,
    log_level: LogLevelOption = None,
) -> None:
    """Run the daemon (default: the sysfs source on this host)."""
    run_command(config, listen, log_level)


Format = Literal["table", "json", "prom"]


@app.command()
def scan(
    source: Annotated[SourceName, typer.Option(help="Which source to sample.")] = "sysfs",
    sysfs_root: Annotated[Path, typer.Option(help="sysfs root (tests, containers).")] = Path(
        "/sys"
    ),
    interval: Annotated[
        float, typer.Option(parser=_number(0.0, 3600.0),
                            help="Seconds between the two samples (0 to 3600).")
    ] = 1.0,
    fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = "table",
    output_arg: Annotated[
        str | None,
        typer.Option(
            "--output", "-o",
            help="Write to FILE atomically (temp file + rename, mode 0644) instead of stdout:"
            " with --format prom, a node_exporter textfile collector file (name it *.prom)."
            " Only a regular file (or a new one) is replaced, never a device, FIFO or symlink.",
        ),
    ] = None,
    ca: Annotated[str | None, typer.Option(help="Local CA for mad/diags.")] = None,
    port: Annotated[
        int | None,
        typer.Option(help="Local CA port for mad/diags (default: the CA's first active port)."),
    ] = None,
    scenario: Annotated[str, typer.Option(help="Scenario for --source mock.")] = "healthy",
    log_level: LogLevelOption = None,
) -> None:
    """Poll twice, INTERVAL apart, and print what the daemon would show: totals, rates,
    conditions and BER."""
    from ibmon.cli.scan import Scan, ScanError, run_scan

    settings = _load(None)
    _configure_logging(settings, log_level)
    cfg = _source_config(str(source), root=sysfs_root, scenario=scenario, ca=ca, port=port)
    _require_devices(cfg)
    output = None if output_arg is None else _output_path(output_arg)  # before the INTERVAL

    def render(result: Scan) -> bytes:
        if fmt == "prom":
            return result.prom()
        return (result.json() if fmt == "json" else result.table()).encode()

    try:
        result = asyncio.run(run_scan(cfg, settings, interval=interval))
    except ScanError as exc:
        # A textfile must say the source is down, not keep serving the last good numbers.
        if output is not None and fmt == "prom":
            _write_output(output, exc.scan.prom())
        _die(f"scan failed: {exc}")
    except (OSError, RuntimeError, ValueError) as exc:
        _die(f"scan failed: {exc}")
    if output is not None:
        _write_output(output, render(result))
    elif fmt == "prom":
        sys.stdout.buffer.write(result.prom())
    else:
        sys.stdout.write(result.json() if fmt == "json" else result.table())
    sys.stdout.flush()


def _output_path(text: str) -> Path:
    """``scan --output``'s path, or exit 2 saying why it cannot be replaced."""
    if not text:
        _die("--output: the path is empty; give a file name, e.g. ibmon.prom")
    path = Path(text)
    if not path.parent.is_dir():
        _die(f"--output: {path.parent} is not a directory")
    _refuse_special(path)
    return path


def _refuse_special(path: Path) -> None:
    """Only a regular file (or nothing) at ``path`` may be replaced.

    The rename of an atomic write replaces whatever has the name: ``/dev/null`` under a root
    cron job, someone's FIFO, a symlink that points elsewhere. The state file refuses the same
    (``ibmon.state.persist``).
    """
    import os
    import stat

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        _die(f"--output: cannot check {path}: {exc.strerror or exc}")
    if not stat.S_ISREG(st.st_mode):
        _die(f"--output: {path} is a {_file_kind(st.st_mode)}, not a regular file;"
             " not replacing it")


def _file_kind(mode: int) -> str:
    import stat

    kinds = {
        stat.S_IFDIR: "directory",
        stat.S_IFIFO: "FIFO",
        stat.S_IFSOCK: "socket",
        stat.S_IFCHR: "character device",
        stat.S_IFBLK: "block device",
        stat.S_IFLNK: "symlink",
    }
    return kinds.get(stat.S_IFMT(mode), "special file")


def _write_output(path: Path, data: bytes) -> None:
    """``scan --output``: replace ``path`` atomically; a failure is one line and exit 2.

    Checked again here: the scan took INTERVAL, and the path may have changed meanwhile."""
    from ibmon.state.atomicfile import write_atomic

    _refuse_special(path)
    try:
        write_atomic(path, data)
    except OSError as exc:
        _die(f"cannot write {path}: {exc.strerror or exc}")


@app.command("check-config")
def check_config(
    file: Annotated[Path, typer.Argument(help="TOML config file to validate.")],
) -> None:
    """Validate a config file as `ibmon run --config FILE` would on this host (files,
    addresses, scenarios included); exit 0 if good, 2 with the problem if not."""
    try:
        settings = _settings_for_run(file)
    except ConfigError as exc:
        _die(str(exc))
    n = len(settings.sources)
    typer.echo(f"{file}: OK ({n} source(s), listen {settings.prometheus.listen})")


@app.command()
def version() -> None:
    """Print the version."""
    typer.echo(f"ibmon {__version__}")


UrlOption = Annotated[
    str, typer.Option(help="A running daemon's listener (its JSON API).")
]
UserOption = Annotated[
    str | None, typer.Option("--user", help="Basic auth user of the daemon's listener.")
]
PasswordFileOption = Annotated[
    Path | None,
    typer.Option("--password-file",
                 help="File whose first line is the basic auth password (else $IBMON_PASSWORD)."),
]
CaFileOption = Annotated[
    Path | None, typer.Option("--ca-file", help="CA certificate(s) to trust for an https:// URL.")
]
DEFAULT_URL = "http://127.0.0.1:9683"


def _client(url: str, user: str | None, password_file: Path | None,
            ca_file: Path | None) -> Any:
    """An ApiClient, or exit 2 with the problem (bad URL, unreadable password or CA file)."""
    from ibmon.cli.apiclient import ApiClient, ApiError, read_password

    try:
        password = read_password(password_file)
        return ApiClient(url, user=user, password=password if user else None, ca_file=ca_file)
    except ApiError as exc:
        _die(str(exc))


@app.command()
def explain(
    port: Annotated[str, typer.Argument(
        help='GUID/PORT, "node description"[port], hostname/device (e.g. gpu031/mlx5_0), '
             'or a CA by its GUID, description or host name (gpu031): its first active port.')],
    url: UrlOption = DEFAULT_URL,
    user: UserOption = None,
    password_file: PasswordFileOption = None,
    ca_file: CaFileOption = None,
    fmt: Annotated[Literal["text", "json"], typer.Option("--format", help="Output format.")] = (
        "text"),
) -> None:
    """Explain one port from a running daemon: both ends of its link, what is firing, the
    likely cause, the error breakdown, what to check first and the recent events."""
    import json

    from ibmon.cli.apiclient import ApiError
    from ibmon.cli.explain import render_report, resolve

    client = _client(url, user, password_file, ca_file)
    try:
        guid, number = resolve(client, port)
        detail = client.get(f"/api/v1/ports/{guid}/{number}")
    except ValueError as exc:
        _die(str(exc))
    except ApiError as exc:
        _die(str(exc))
    if fmt == "json":
        sys.stdout.write(json.dumps(detail, indent=2) + "\n")
    else:
        sys.stdout.write(render_report(detail))
    sys.stdout.flush()


@app.command()
def jobs(
    job_id: Annotated[str | None, typer.Argument(
        metavar="[ID]", help="A job id: its hosts, ports, conditions and rates.")] = None,
    url: UrlOption = DEFAULT_URL,
    user: UserOption = None,
    password_file: PasswordFileOption = None,
    ca_file: CaFileOption = None,
    fmt: Annotated[Literal["text", "json"], typer.Option("--format", help="Output format.")] = (
        "text"),
) -> None:
    """The running jobs from a running daemon (rates, conditions on their links), or one job's
    hosts, their ports and the links with a condition it uses."""
    import json
    import urllib.parse

    from ibmon.cli.apiclient import ApiError
    from ibmon.cli.jobs import render_job, render_jobs

    client = _client(url, user, password_file, ca_file)
    try:
        if job_id is None:
            doc = client.get("/api/v1/jobs")
        else:
            doc = client.get("/api/v1/jobs/" + urllib.parse.quote(job_id, safe=""))
    except ApiError as exc:
        _die(str(exc))
    if fmt == "json":
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        sys.stdout.write(render_jobs(doc) if job_id is None else render_job(doc))
    sys.stdout.flush()


@app.command()
def topology(
    url: UrlOption = DEFAULT_URL,
    user: UserOption = None,
    password_file: PasswordFileOption = None,
    ca_file: CaFileOption = None,
    fmt: Annotated[Literal["json", "dot"], typer.Option(
        "--format", help="json: nodes with ports and links; dot: Graphviz (dot -Tsvg).")] = "json",
) -> None:
    """The fabric's nodes and links from a running daemon, with link state, width and speed
    against the best both ends support, and active conditions; DOT colours faulty (red) and
    congested (orange) links."""
    import json

    from ibmon.cli.apiclient import ApiError
    from ibmon.state.topology import to_dot

    client = _client(url, user, password_file, ca_file)
    try:
        pages = list(client.pages("/api/v1/topology"))
    except ApiError as exc:
        _die(str(exc))
    nodes = [n for page in pages for n in page.get("nodes", [])]
    if fmt == "dot":
        sys.stdout.write(to_dot(nodes))
    else:
        generated = pages[-1].get("generated") if pages else None
        links = sum(len(n.get("links", [])) for n in nodes)
        sys.stdout.write(json.dumps({"generated": generated, "nodes": nodes, "links": links},
                                    indent=2) + "\n")
    sys.stdout.flush()


@app.command()
def top(
    url: UrlOption = DEFAULT_URL,
    user: UserOption = None,
    password_file: PasswordFileOption = None,
    ca_file: CaFileOption = None,
    source: Annotated[
        SourceName | None,
        typer.Option(help="Sample this source directly instead of reading a daemon."),
    ] = None,
    sysfs_root: Annotated[Path, typer.Option(help="sysfs root for --source sysfs.")] = Path("/sys"),
    scenario: Annotated[str, typer.Option(help="Scenario for --source mock.")] = "demo",
    ca: Annotated[str | None, typer.Option(help="Local CA for --source mad/diags.")] = None,
    port: Annotated[
        int | None,
        typer.Option(help="Local CA port for mad/diags (default: the CA's first active port)."),
    ] = None,
    interval: Annotated[float, typer.Option(
        parser=_number(0.1, 3600.0), help="Refresh, seconds (0.1 to 3600).")] = 2.0,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="Ports to show.")] = 20,
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit.")] = False,
    log_level: LogLevelOption = None,
) -> None:
    """Live view of the worst ports, active conditions and recent events."""
    from ibmon.cli.apiclient import ApiError
    from ibmon.cli.top import ApiReader, DirectSampler, run_top

    settings = _load(None)
    _configure_logging(settings, log_level)
    reader: ApiReader | DirectSampler
    if source is None:
        reader = ApiReader(url, limit=limit, client=_client(url, user, password_file, ca_file))
        where = url
    else:
        cfg = _source_config(str(source), root=sysfs_root, scenario=scenario, ca=ca, port=port)
        _require_devices(cfg)
        try:
            reader = DirectSampler(cfg, limit=limit, settings=settings)
        except (OSError, RuntimeError, ValueError) as exc:
            _die(f"cannot sample {cfg.type}: {exc}")
        where = f"source {cfg.label}"
    try:
        asyncio.run(run_top(reader, interval=interval, once=once, limit=limit))
    except KeyboardInterrupt:
        pass
    except ApiError as exc:  # names the URL itself
        _die(str(exc))
    except OSError as exc:
        _die(f"cannot read {where}: {getattr(exc, 'reason', None) or exc}")


@app.command()
def demo(
    scenario: Annotated[
        str, typer.Option(help="Shipped scenario name (mocks/scenarios) or a YAML file.")
    ] = "demo",
    hosts: Annotated[int | None, typer.Option(min=1, help="Host ports in the fat tree.")] = None,
    listen: Annotated[str, typer.Option(help="Metrics listen address.")] = "127.0.0.1:9683",
    speed: Annotated[
        float, typer.Option(parser=_number(0.01, 10000.0),
                            help="Simulated seconds per real second (0.01 to 10000).")
    ] = 10.0,
    interval: Annotated[float, typer.Option(
        parser=_number(0.05), help="Poll interval, real seconds (at least 0.05).")] = 1.0,
    log_level: LogLevelOption = None,
) -> None:
    """Run the full daemon on the built-in simulated fabric with a scenario playing."""
    from ibmon.runtime.preflight import check_startable

    try:
        parse_listen(listen)
    except ValueError as exc:
        _die(f"--listen: {exc}")
    src = {"type": "mock", "name": "demo", "scenario": scenario, "hosts": hosts,
           "speed": speed, "interval": interval}
    settings = _load(None, prometheus={"listen": listen}, sources=[src])
    try:
        check_startable(
            settings,
            flags={("prometheus", "listen"): "--listen", ("sources", 0, "scenario"): "--scenario"},
        )
    except ConfigError as exc:
        _die(str(exc))
    _configure_logging(settings, log_level)
    host = listen.rsplit(":", 1)[0]
    banner = (
        f"ibmon demo: scenario {scenario!r}, simulated time x{speed:g}.\n"
        f"  metrics:   http://{host}:{{port}}/metrics\n"
        f"  events:    http://{host}:{{port}}/api/v1/events\n"
        f"  live view: ibmon top --url http://{host}:{{port}}   (in another terminal)\n"
        "  stop with Ctrl-C"
    )
    _run_daemon(settings, None, None, banner)


@sim_app.command("sysfs")
def sim_sysfs(
    out: Annotated[Path, typer.Option(help="Directory to render the sysfs tree into.")],
    scenario: Annotated[str, typer.Option(help="Scenario to play.")] = "demo",
    speed: Annotated[
        float, typer.Option(parser=_number(0.01),
                            help="Simulated seconds per real second (at least 0.01).")
    ] = 1.0,
    hosts: Annotated[int | None, typer.Option(min=1, help="Host ports in the fat tree.")] = None,
) -> None:
    """Render the simulated fabric's HCAs as a live sysfs tree (read it with --sysfs-root)."""
    from mocks.scenario import ScenarioError, build_fabric, load_scenario
    from mocks.sysfs import run_sysfs

    try:
        build_fabric(load_scenario(scenario), hosts=hosts)  # the mistakes, before any output
    except ScenarioError as exc:
        _die(_one_line(str(exc)))
    print(
        f"ibmon sim: rendering sysfs under {out}/class/infiniband (Ctrl-C to stop)", file=sys.stderr
    )
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(run_sysfs(out, scenario, speed=speed, hosts=hosts))
    except OSError as exc:
        _die(f"cannot render under {exc.filename or out}: {exc.strerror or exc}")


@sim_app.command("ibsim")
def sim_ibsim(
    scenario: Annotated[str, typer.Option(help="Scenario to play.")] = "demo",
    speed: Annotated[
        float, typer.Option(parser=_number(0.01),
                            help="Simulated seconds per real second (at least 0.01).")
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
        _die(_one_line(str(exc)))


def main(argv: list[str] | None = None) -> None:
    """Entry point: usage errors become one line on stderr and exit code 2, never a traceback.

    Typer vendors its click fork privately, so its usage errors are recognised by their public
    shape (``format_message`` and ``exit_code``) rather than by importing a private class.
    Logging is configured first of all (stderr only), before any command code can log; commands
    that know their configured level configure it again.
    """
    from ibmon.runtime.log import configure_from_environment

    configure_from_environment()
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
            # one line, whatever it quotes: a daemon's or a tool's words, a path, a value
            print(fmt() if no_args else f"ibmon: error: {printable(fmt())}", file=sys.stderr)
            sys.exit(code)
        raise
    sys.exit(rc if isinstance(rc, int) else 0)
