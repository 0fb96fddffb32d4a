"""Configuration: a TOML file, overridden by ``IBMON_*`` environment, overridden by CLI flags.

Validation happens once, here, at the boundary; everything downstream gets typed, checked values.
A bad value becomes a ``ConfigError`` whose message names the field and the problem in one line,
which the CLI prints before exiting 2.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

from ibmon.config.env import (
    ENV_NESTING,
    ENV_PREFIX,
    EnvJsonError,
    deep_merge,
    environment_tree,
    is_setting_variable,
    section_model,
)
from ibmon.detect.engine import parse_detect_tables
from ibmon.jobs.slurm import SlurmConfig

__all__ = [
    "ConfigError",
    "DetectConfig",
    "Duration",
    "EventsConfig",
    "MqttConfig",
    "MqttTlsConfig",
    "PrometheusConfig",
    "Settings",
    "SourceConfig",
    "SourceConfigBase",
    "check_environment",
    "field_origin",
    "load_settings",
    "parse_duration",
    "parse_listen",
    "unknown_setting",
]


class ConfigError(Exception):
    """A configuration problem, phrased for the operator who has to fix it."""


#: ASCII digits only: ``float()`` reads Arabic-Indic or fullwidth digits too, which no config
#: means and no reviewer reads as a number.
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$", re.ASCII)
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
#: The shortest duration anything accepts. TOML has ``nan`` and ``inf`` and floats like
#: ``1e-9``: a NaN or infinite poll interval stops polling silently (while ``/readyz`` says
#: ready) and a nanosecond one spins a core, so neither is "a duration" here.
MIN_DURATION = 0.001


def parse_duration(value: Any) -> float:
    """Accept ``10s``, ``500ms``, ``5m``, ``1h``, ``2d`` or a bare number of seconds (at least
    ``MIN_DURATION``, finite)."""
    if isinstance(value, bool):
        raise ValueError("a duration, not a boolean")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION_RE.match(value)):
        seconds = float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    else:
        raise ValueError(f"invalid duration {value!r} (use e.g. 500ms, 10s, 5m, 1h)")
    if not math.isfinite(seconds):
        raise ValueError(f"duration must be a finite number of seconds, got {value!r}")
    if seconds <= 0:
        raise ValueError(f"duration must be positive, got {value!r}")
    if seconds < MIN_DURATION:
        raise ValueError(f"duration {value!r} is below the 1ms minimum")
    return seconds


Duration = Annotated[float, BeforeValidator(parse_duration)]


def parse_listen(listen: str) -> tuple[str, int]:
    """``host:port`` or ``[v6addr]:port`` to ``(host, port)``; ValueError with a usable message.

    The one listen-address rule, used by config validation and by the exporter alike, so a
    value ``check-config`` accepts is one the server can bind. An empty host is refused rather
    than read as "every interface": exposing metrics (node descriptions, topology) to the
    network should be written down, e.g. ``0.0.0.0:9683``. IPv6 addresses go in brackets (a
    bare ``::1:9683`` is ambiguous); port 0 asks the kernel for a free port.
    """
    host, sep, port_text = listen.rpartition(":")
    if (
        not sep
        or not (port_text.isascii() and port_text.isdigit())
        or int(port_text) > 65535
        or any(ch.isspace() for ch in listen)
    ):
        raise ValueError(f"listen address {listen!r}: expected host:port or [ipv6]:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(
                f"listen address {listen!r}: brackets hold an IPv6 address, e.g. [::1]:9683"
            ) from None
    elif ":" in host:
        raise ValueError(f"listen address {listen!r}: put IPv6 addresses in brackets, [::1]:9683")
    elif "[" in host or "]" in host:
        raise ValueError(f"listen address {listen!r}: unbalanced brackets")
    if not host:
        raise ValueError(f"listen address {listen!r}: give a host, e.g. 0.0.0.0:9683 for all")
    return host, int(port_text)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PrometheusConfig(_Section):
    listen: str = "127.0.0.1:9683"
    tls_cert: Path | None = None
    tls_key: Path | None = None
    basic_auth_file: Path | None = None
    #: Open connections the listener keeps (lowered to fit RLIMIT_NOFILE; exporters.http).
    max_connections: int = Field(default=256, ge=1, le=1_000_000)

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, v: str) -> str:
        parse_listen(v)
        return v

    @model_validator(mode="after")
    def _cert_and_key(self) -> PrometheusConfig:
        if (self.tls_cert is None) != (self.tls_key is None):
            given, missing = (
                ("tls_cert", "tls_key") if self.tls_key is None else ("tls_key", "tls_cert")
            )
            raise ValueError(f"{given} needs {missing} (HTTPS takes a certificate and its key)")
        return self


class SourceConfigBase(_Section):
    """What every ``[[sources]]`` table has. Each source type's model extends it in the
    source's own module and is found through ``ibmon.sources.registry.SOURCES``."""

    type: str
    name: str | None = Field(default=None, pattern=r"^[a-zA-Z0-9_.-]{1,64}$")
    interval: Duration = 10.0
    #: Whether the source polls a fabric (thousands of ports) rather than one host's HCAs:
    #: its daemon tunes the allocator for large polls (``ibmon.runtime.tuning``).
    fabric_scale: ClassVar[bool] = True
    #: A simulated fabric: nothing real to check before it starts, and its state (a clock that
    #: restarts with the process) is never saved.
    simulated: ClassVar[bool] = False

    @property
    def label(self) -> str:
        """The ``source`` label value: the configured name, else the type."""
        return self.name or self.type


def _source_from(value: Any) -> SourceConfigBase:
    """Validate one ``[[sources]]`` table with the model its ``type`` names.

    The model's module is imported only now, so a sysfs-only configuration never imports the
    MAD bindings, the diags runner or the simulator. A nested ValidationError keeps its field
    path (``sources.0.interval``).
    """
    from ibmon.sources.registry import SOURCES, source_type

    if isinstance(value, SourceConfigBase):
        return value
    if not isinstance(value, dict):
        raise ValueError("a source must be a table with a type key")
    kinds = ", ".join(SOURCES)
    if "type" not in value:
        raise ValueError(f"a source needs a type (one of {kinds})")
    kind = value["type"]
    if not isinstance(kind, str) or kind not in SOURCES:
        raise ValueError(f"unknown source type {kind!r} (one of {kinds})")
    return source_type(kind).config.model_validate(value)


def _source_dump(value: SourceConfigBase, info: core_schema.SerializationInfo) -> Any:
    return value.model_dump(mode=info.mode)


class _SourceByType:
    """Pydantic hook that makes ``SourceConfig`` a union built from the source registry."""

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            _source_from,
            serialization=core_schema.plain_serializer_function_ser_schema(
                _source_dump, info_arg=True
            ),
        )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {"type": "object", "required": ["type"]}


#: Any source's config, validated by the model its ``type`` names (see ``_source_from``).
#: ``TypeAdapter(SourceConfig).validate_python({"type": "mad"})`` builds one by name.
SourceConfig = Annotated[SourceConfigBase, _SourceByType]


class DetectConfig(_Section):
    """Detector settings; each detector validates its own table (see ibmon.detect)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _no_tick_seconds(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "tick_seconds" in data:
            raise ValueError(
                "tick_seconds was removed: a PortXmitWait count is bytes, decided per port "
                "(see docs/infiniband.md); set a sysfs source's xmit_wait_units to override")
        return data

    @model_validator(mode="after")
    def _check_tables(self) -> DetectConfig:
        parse_detect_tables(self.tables())  # detectors own their settings
        return self

    def tables(self) -> dict[str, Any]:
        """The ``[detect.<name>]`` tables, by detector name."""
        return dict(self.model_extra or {})


class EventsConfig(_Section):
    """``[events]``: the optional JSON-lines event file and the bus's bounds."""

    file: Path | None = None
    max_bytes: int = Field(default=10_000_000, ge=4096)
    backups: int = Field(default=3, ge=0, le=100)
    queue_size: int = Field(default=10_000, ge=1, le=1_000_000)
    history: int = Field(default=1000, ge=0, le=100_000)


class StateConfig(_Section):
    path: Path = Path("/var/lib/ibmon/state.json")
    save_interval: Duration = 60.0


class LogConfig(_Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = "auto"


class MqttTlsConfig(_Section):
    """TLS to the broker; present means on. Without ``ca_file`` the system CAs are trusted."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    verify: bool = True

    @field_validator("key_file")
    @classmethod
    def _key_needs_cert(cls, v: Path | None, info: ValidationInfo) -> Path | None:
        if v is not None and info.data.get("cert_file") is None:
            raise ValueError("key_file needs cert_file (the client certificate)")
        return v


class MqttConfig(_Section):
    """``[mqtt]``: absent means MQTT is off.

    There is deliberately no ``password`` key: a password in the config file or on a command
    line ends up in backups, ``ps`` and logs, so it is read from ``password_file`` at connect time.
    ``prefix`` and the fabric name become topic levels, hence the strict patterns.
    """

    host: str = Field(default="127.0.0.1", min_length=1, max_length=253)
    port: int = Field(default=1883, ge=1, le=65535)
    tls: MqttTlsConfig | None = None
    username: str | None = Field(default=None, min_length=1, max_length=256)
    password_file: Path | None = None
    client_id: str | None = Field(default=None, pattern=r"^[a-zA-Z0-9_.-]{1,64}$")
    keepalive: Duration = 30.0
    qos: Literal[0, 1, 2] = 1
    prefix: str = Field(
        default="ibmon", pattern=r"^[a-zA-Z0-9_-]{1,64}(/[a-zA-Z0-9_-]{1,64}){0,3}$"
    )
    queue_size: int = Field(default=10_000, ge=1, le=1_000_000)

    @field_validator("keepalive")
    @classmethod
    def _check_keepalive(cls, v: float) -> float:
        if not 1 <= v <= 65535:
            raise ValueError("keepalive must be between 1s and 65535s")
        return v

    @field_validator("password_file")
    @classmethod
    def _password_needs_user(cls, v: Path | None, info: ValidationInfo) -> Path | None:
        if v is not None and not info.data.get("username"):
            raise ValueError("password_file needs a username (MQTT sends no password without one)")
        return v


class Settings(BaseModel):
    """The whole daemon configuration. See deploy/ibmon.toml for an annotated example.

    Built by ``load_settings`` from the file, the ``IBMON_*`` environment and flags; the class
    itself reads nothing, so ``Settings()`` is the defaults.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    fabric: str = Field(default="main", pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    prometheus: PrometheusConfig = PrometheusConfig()
    sources: list[SourceConfig] = Field(default_factory=list)
    detect: DetectConfig = DetectConfig()
    state: StateConfig = StateConfig()
    events: EventsConfig = EventsConfig()
    log: LogConfig = LogConfig()
    mqtt: MqttConfig | None = None
    slurm: SlurmConfig | None = None

    @field_validator("sources")
    @classmethod
    def _unique_labels(cls, v: list[Any]) -> list[Any]:
        labels = [s.label for s in v]
        dupes = sorted({x for x in labels if labels.count(x) > 1})
        if dupes:
            raise ValueError(f"two sources share the name {dupes[0]!r}; give each a unique name")
        return v

    @model_validator(mode="after")
    def _routes_for_jobs(self) -> Settings:
        """With a job source, the fabric sources read the switches' forwarding tables unless
        their ``forwarding_tables`` is set: an inter-switch link's jobs come from its routes.
        Without one they are not read (at 20,000 hosts the tables are tens of MB)."""
        if self.slurm is None:
            return self
        sources = [
            s.model_copy(update={"forwarding_tables": True})
            if "forwarding_tables" in type(s).model_fields
            and "forwarding_tables" not in s.model_fields_set else s
            for s in self.sources]
        object.__setattr__(self, "sources", sources)
        return self



#: A config file larger than this is refused unread: real ones are a few kB, and the TOML
#: parser's time and memory grow faster than the file (see ``_too_deep``).
MAX_CONFIG_BYTES = 4 * 1024 * 1024
#: Deepest key nesting a config may use; real configs use three (``[detect.high_ber]``).
MAX_KEY_DEPTH = 32


def _too_deep(text: str) -> int | None:
    """The first line whose dotted key (``a.b.c = 1`` or ``[a.b.c]``) nests too deep, if any.

    Python's TOML parser creates one dict per dotted part in time quadratic in their number
    (10,000 parts: 5 s and 400 MB), and bracket nesting beyond about 300 levels raises
    RecursionError: both are refused with one line instead of a hang or a traceback. The count
    is generous (a dot inside a quoted key or value counts too), so no real config comes near.
    """
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.lstrip()
        key = stripped.partition("]")[0] if stripped.startswith("[") else stripped.partition("=")[0]
        if key.count(".") >= MAX_KEY_DEPTH:
            return number
    return None


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Refuse ``IBMON_*`` variables that name no setting, as unknown keys in a file are.

    ``IBMON_<KEY>`` and ``IBMON_<SECTION>__<KEY>`` (any case, as pydantic-settings reads them)
    are settings; whatever follows a known section is checked by that section's model. A typo
    (``IBMON_PROMETHEUS_LISTEN`` with one underscore, ``IBMON_BOGUS``) would otherwise be
    ignored without a word while the operator believes it applies. ``NOT_SETTINGS`` (the API
    client's ``IBMON_PASSWORD``) are not settings and are skipped.
    """
    env = os.environ if environ is None else environ
    known = set(Settings.model_fields)
    for name in sorted(env):
        if not is_setting_variable(name):
            continue
        top = name[len(ENV_PREFIX):].split(ENV_NESTING, 1)[0].lower()
        if top not in known:
            raise ConfigError(
                f"environment variable {name}: no such setting (use IBMON_<key> or "
                f"IBMON_<section>__<key>, e.g. IBMON_PROMETHEUS__LISTEN; known: "
                f"{', '.join(sorted(known))})"
            )


def _env_origin(loc: tuple[int | str, ...], environ: Mapping[str, str]) -> str | None:
    """The ``IBMON_*`` variable a failing field came from, if one did (env beats the file).

    The most specific one: ``IBMON_PROMETHEUS__MAX_CONNECTIONS`` overrides the same key in
    ``IBMON_PROMETHEUS``'s JSON, so it is the one that set a bad value there."""
    want = [str(p).lower() for p in loc]
    best: tuple[int, str] | None = None
    for name in sorted(environ):
        if not is_setting_variable(name):
            continue
        parts = name[len(ENV_PREFIX):].lower().split(ENV_NESTING)
        if parts == want[: len(parts)] and (best is None or len(parts) > best[0]):
            best = (len(parts), name)
    return None if best is None else best[1]


def field_origin(loc: tuple[int | str, ...], path: Path | None) -> str:
    """The ``"<where>: "`` prefix of an error about field ``loc``: the ``IBMON_*`` variable
    that set it (the environment beats the file), else the config file, else nothing."""
    origin = _env_origin(loc, os.environ)
    if origin is not None:
        return f"environment variable {origin}: "
    return f"{path}: " if path else ""


def unknown_setting(key: str, names: Iterable[str]) -> str:
    """What a key no model knows is called, with the closest real one: a typo (``listn``,
    ``intervall``) is the usual cause, and pydantic's "Extra inputs are not permitted" names
    neither the problem nor the fix."""
    close = difflib.get_close_matches(key, list(names), n=1, cutoff=0.7)
    return "unknown setting" + (f" (did you mean {close[0]!r}?)" if close else "")


def _names_at(path: tuple[int | str, ...], data: Mapping[str, Any]) -> Iterable[str]:
    """The keys the table at ``path`` of the settings takes (none when it cannot be told)."""
    from ibmon.sources.registry import SOURCES

    if len(path) == 2 and path[0] == "sources":  # a source: the keys its type takes
        try:
            kind = data["sources"][path[1]]["type"]
            return SOURCES[kind].config.model_fields
        except (KeyError, IndexError, TypeError):
            return ()
    model: type[BaseModel] | None = Settings
    for part in path:
        field = model.model_fields.get(str(part)) if model is not None else None
        model = section_model(field.annotation) if field is not None else None
    return model.model_fields if model is not None else ()


def _format_validation_error(
    exc: ValidationError, path: Path | None, environ: Mapping[str, str],
    data: Mapping[str, Any],
) -> str:
    errors = exc.errors()
    err = errors[0]
    loc = ".".join(str(p) for p in err["loc"]) or "config"
    msg = err["msg"].removeprefix("Value error, ")
    bad = err.get("input")
    if isinstance(bad, float) and not math.isfinite(bad):
        # nan fails every bound, so the bound's words ("should be <= 10000") would mislead
        msg = f"must be a finite number, got {bad}"
    if err["type"] == "extra_forbidden" and err["loc"]:
        msg = unknown_setting(str(err["loc"][-1]), _names_at(err["loc"][:-1], data))
    others = [".".join(str(p) for p in e["loc"]) or "config" for e in errors[1:]]
    more = (f" (and {len(others)} more: {', '.join(others[:3])}"
            f"{', ...' if len(others) > 3 else ''})") if others else ""
    origin = _env_origin(err["loc"], environ)
    if origin is not None:
        where = f"environment variable {origin}: "
    else:
        where = f"{path}: " if path else ""
    return f"{where}{loc}: {msg}{more}"


def _read_toml(path: Path) -> dict[str, Any]:
    """The file's tables; ConfigError naming the file for every way it can be unusable."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a config file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: config file larger than {MAX_CONFIG_BYTES // 1024} KiB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: config file is not UTF-8 text") from None
    if (line := _too_deep(text)) is not None:
        raise ConfigError(f"{path}:{line}: keys nested deeper than {MAX_KEY_DEPTH} levels")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: TOML syntax error: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{path}: arrays or tables nested too deeply") from None


def load_settings(path: Path | None = None, **overrides: Any) -> Settings:
    """Build Settings from an optional TOML file, the environment and explicit overrides.

    Every problem is a ``ConfigError`` of one line that names where the bad value came from
    (the file, or the ``IBMON_*`` variable) and the field. This checks values only; whether the
    daemon can start with them (files, addresses, scenarios) is ``ibmon.runtime.preflight``'s job.
    """
    data = _read_toml(path) if path is not None else {}
    environ = dict(os.environ)
    check_environment(environ)
    try:
        data = deep_merge(data, environment_tree(Settings, environ))
        data = deep_merge(data, {k: v for k, v in overrides.items() if v is not None})
        return Settings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc, path, environ, data)) from None
    except EnvJsonError as exc:
        if isinstance(exc.cause, str):
            raise ConfigError(f"environment variable {exc.name}: {exc.cause}") from None
        raise ConfigError(
            f"environment variable {exc.name}: not valid JSON ({exc.cause}); sections and lists "
            f"take JSON, or set single keys with IBMON_<SECTION>__<KEY>"
        ) from None
    except RecursionError:
        raise ConfigError(f"{path or 'config'}: values nested too deeply") from None
