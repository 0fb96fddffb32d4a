"""Can the daemon start with this config? Every check ``run`` makes, before it opens anything.

``load_settings`` checks values; this checks what those values point at on this host: that the
listen host resolves to an address of this machine, that TLS certificates, keys, CA files,
basic-auth and password files exist and parse, and that a simulated fabric's scenario loads
and fits its host count. ``ibmon check-config``, ``ibmon run``, ``ibmon demo`` and a SIGHUP
reload all call ``check_startable``, so a config ``check-config`` accepts is one ``run``
accepts, and a reload that would fail is refused while the running config keeps working.

Each problem is one ``ConfigError`` line naming the file (or ``IBMON_*`` variable), the field
and the path of the file it could not use. Nothing here binds the configured port (a running
daemon may hold it): the listen address is probed on port 0.
"""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ibmon.config import ConfigError, Settings, SourceConfigBase, field_origin, parse_listen

__all__ = ["check_startable"]

Loc = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class _Origin:
    """Where the settings came from, so an error names the file, variable or flag to fix."""

    path: Path | None
    flags: Mapping[Loc, str] = field(default_factory=dict)

    def fail(self, loc: Loc, problem: str) -> ConfigError:
        name = ".".join(str(p) for p in loc)
        flag = self.flags.get(loc)
        where = f"{flag}: " if flag else f"{field_origin(loc, self.path)}{name}: "
        return ConfigError(f"{where}{problem}")


def check_startable(
    settings: Settings, *, path: Path | None = None, flags: Mapping[Loc, str] | None = None
) -> None:
    """Raise ``ConfigError`` for the first thing that would stop ``settings`` from starting.

    ``path`` is the config file and ``flags`` maps fields to the command-line flags that set
    them (``{("prometheus", "listen"): "--listen"}``), for the error message only.
    """
    origin = _Origin(path, flags or {})
    _check_prometheus(settings, origin)
    _check_mqtt(settings, origin)
    for index, source in enumerate(settings.sources):
        _check_source(source, index, origin)
    # a directory at the state path is not refused: like a FIFO there, it costs the saved
    # state, never the monitoring (ibmon.state.persist reports it and refuses every save)
    if settings.events.file is not None:
        _check_not_directory(settings.events.file, ("events", "file"), origin)


def _readable(file: Path, loc: Loc, origin: _Origin) -> None:
    """A regular file this process can read (never blocks: a FIFO is refused, not opened for
    a writer that never comes)."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise origin.fail(loc, f"cannot read {file}: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise origin.fail(loc, f"{file} is not a regular file")
        os.read(fd, 1)
    except OSError as exc:
        raise origin.fail(loc, f"cannot read {file}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def _check_not_directory(file: Path, loc: Loc, origin: _Origin) -> None:
    if file.is_dir():
        raise origin.fail(loc, f"{file} is a directory; give a file path")


def _check_prometheus(settings: Settings, origin: _Origin) -> None:
    from exporters.http import BasicAuth, tls_context

    cfg = settings.prometheus
    _check_listen(cfg.listen, origin)
    if cfg.tls_cert is not None and cfg.tls_key is not None:
        import ssl  # only here: a node daemon without TLS never loads OpenSSL (sslgate)

        _readable(cfg.tls_cert, ("prometheus", "tls_cert"), origin)
        _readable(cfg.tls_key, ("prometheus", "tls_key"), origin)
        _check_certificate(cfg.tls_cert, ("prometheus", "tls_cert"), origin)
        try:
            tls_context(cfg.tls_cert, cfg.tls_key)  # what the exporter does at start
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise origin.fail(
                ("prometheus", "tls_key"),
                f"{cfg.tls_key} is not the PEM private key of {cfg.tls_cert} ({_ssl_reason(exc)})",
            ) from None
    if cfg.basic_auth_file is not None:
        loc: Loc = ("prometheus", "basic_auth_file")
        _readable(cfg.basic_auth_file, loc, origin)
        try:
            BasicAuth.from_file(cfg.basic_auth_file)  # what the exporter does at start
        except UnicodeDecodeError:
            raise origin.fail(loc, f"{cfg.basic_auth_file} is not UTF-8 text") from None
        except (OSError, ValueError) as exc:
            raise origin.fail(loc, str(exc)) from None


def _check_listen(listen: str, origin: _Origin) -> None:
    """The host resolves, and to addresses of this machine (probed on port 0, so a running
    daemon holding the configured port does not make ``check-config`` fail)."""
    loc: Loc = ("prometheus", "listen")
    host, port = parse_listen(listen)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else str(exc)
        raise origin.fail(loc, f"cannot resolve host {host!r} of {listen}: {reason}") from None
    for family, kind, proto, _name, address in infos:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.bind((address[0], 0, *address[2:]))
        except OSError as exc:
            raise origin.fail(
                loc, f"cannot listen on {listen} ({address[0]}): {exc.strerror or exc}"
            ) from None


def _check_certificate(file: Path, loc: Loc, origin: _Origin) -> None:
    import ssl

    try:
        ssl.create_default_context().load_verify_locations(cafile=str(file))
    except (ssl.SSLError, ValueError) as exc:
        raise origin.fail(loc, f"{file} holds no PEM certificate ({_ssl_reason(exc)})") from None


def _ssl_reason(exc: BaseException) -> str:
    import ssl

    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason).lower().replace("_", " ")
    return str(exc) or type(exc).__name__


def _check_mqtt(settings: Settings, origin: _Origin) -> None:
    cfg = settings.mqtt
    if cfg is None:
        return
    if cfg.password_file is not None:
        _readable(cfg.password_file, ("mqtt", "password_file"), origin)
    tls = cfg.tls
    if tls is None:
        return
    import ssl

    if tls.ca_file is not None:
        _readable(tls.ca_file, ("mqtt", "tls", "ca_file"), origin)
        _check_certificate(tls.ca_file, ("mqtt", "tls", "ca_file"), origin)
    if tls.cert_file is not None:
        _readable(tls.cert_file, ("mqtt", "tls", "cert_file"), origin)
        if tls.key_file is not None:
            _readable(tls.key_file, ("mqtt", "tls", "key_file"), origin)
        _check_certificate(tls.cert_file, ("mqtt", "tls", "cert_file"), origin)
        key = tls.key_file or tls.cert_file
        try:
            ssl.create_default_context().load_cert_chain(str(tls.cert_file), str(key))
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise origin.fail(
                ("mqtt", "tls", "key_file" if tls.key_file else "cert_file"),
                f"no PEM private key for {tls.cert_file} in {key} ({_ssl_reason(exc)})",
            ) from None


def _check_source(cfg: SourceConfigBase, index: int, origin: _Origin) -> None:
    """What building the source would find wrong, for sources that open nothing to build."""
    if cfg.simulated:
        from mocks.scenario import ScenarioError, build_fabric, load_scenario

        try:
            build_fabric(load_scenario(getattr(cfg, "scenario", "demo")),
                         hosts=getattr(cfg, "hosts", None))
        except ScenarioError as exc:
            problem = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
            raise origin.fail(("sources", index, "scenario"), problem) from None
