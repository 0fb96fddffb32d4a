"""Config: TOML + env + overrides, durations, and one-line errors naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from ibmon.config import (
    MAX_CONFIG_BYTES,
    ConfigError,
    Settings,
    check_environment,
    load_settings,
    parse_duration,
    parse_listen,
)
from ibmon.sources.mad import MadSourceConfig
from ibmon.sources.sysfs import SysfsSourceConfig


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("10s", 10.0),
        ("500ms", 0.5),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("2d", 172800.0),
        (3, 3.0),
        ("1.5s", 1.5),
        (" 7 ", 7.0),
    ],
)
def test_durations(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["abc", "10x", "-1s", "0s", "", True])
def test_bad_durations(bad: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(bad)


def test_listen_forms() -> None:
    assert parse_listen("127.0.0.1:9683") == ("127.0.0.1", 9683)
    assert parse_listen("[::1]:9100") == ("::1", 9100)
    with pytest.raises(ValueError, match="host:port"):
        parse_listen("9683")


def test_toml_env_and_override_priority(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "ibmon.toml"
    cfg.write_text(
        'fabric = "lab"\n[prometheus]\nlisten = "[::1]:9100"\n'
        '[[sources]]\ntype = "sysfs"\ninterval = "500ms"\ninclude = ["mlx5_*"]\n'
        '[[sources]]\ntype = "mad"\nca = "mlx5_0"\ninterval = "10s"\ntopology_interval = "5m"\n'
    )
    s = load_settings(cfg)
    assert s.fabric == "lab"
    assert s.prometheus.listen == "[::1]:9100"
    assert isinstance(s.sources[0], SysfsSourceConfig)
    assert s.sources[0].interval == 0.5
    assert s.sources[0].include == ["mlx5_*"]
    assert isinstance(s.sources[1], MadSourceConfig)
    assert s.sources[1].topology_interval == 300.0
    monkeypatch.setenv("IBMON_FABRIC", "envfab")
    assert load_settings(cfg).fabric == "envfab"
    assert load_settings(cfg, fabric="clifab").fabric == "clifab"


@pytest.mark.parametrize(
    ("body", "expect"),
    [
        (
            '[[sources]]\ntype = "sysfs"\ninterval = "soon"\n',
            "sources.0.interval: invalid duration",
        ),
        ('[[sources]]\ntype = "magic"\n', "sources.0"),
        ('[prometheus]\nlisten = "nowhere"\n', "prometheus.listen"),
        ("fabric = 'a/b'\n", "fabric"),
        ("[detect\n", "TOML syntax error"),
        ("unknown_key = 1\n", "unknown_key"),
        ('[[sources]]\ntype = "sysfs"\n[[sources]]\ntype = "sysfs"\n', "share the name"),
        # a source's name is a label value, an event id part and a state file key
        ('[[sources]]\ntype = "sysfs"\nname = "rack 1/a"\n', "sources.0.name"),
        ("[prometheus]\nmax_connections = 0\n", "prometheus.max_connections"),
        ("[events]\nmax_bytes = 100\n", "events.max_bytes"),
        ("[events]\nqueue_size = 0\n", "events.queue_size"),
        ('[mqtt]\ntls = {key_file = "/etc/ibmon/key.pem"}\n', "key_file needs cert_file"),
        ('[mqtt]\nkeepalive = "500ms"\n', "keepalive must be between 1s and 65535s"),
        ('[mqtt]\npassword_file = "/etc/ibmon/mqtt"\n', "password_file needs a username"),
        ('[mqtt]\nprefix = "ibmon/#"\n', "mqtt.prefix"),  # a wildcard is no topic to publish to
    ],
)
def test_bad_config_names_the_field(tmp_path: Path, body: str, expect: str) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(body)
    with pytest.raises(ConfigError) as info:
        load_settings(cfg)
    msg = str(info.value)
    assert expect in msg
    assert "\n" not in msg
    assert str(cfg) in msg


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="no such config file"):
        load_settings(Path("/nonexistent/ibmon.toml"))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf"), 1e-9, "0.5ms"])
def test_durations_are_finite_and_at_least_a_millisecond(bad: object) -> None:
    """NaN or infinite intervals stopped polling silently; 1e-9 would spin a core."""
    with pytest.raises(ValueError, match="duration"):
        parse_duration(bad)
    assert parse_duration("1ms") == 0.001


@pytest.mark.parametrize("name", ["IBMON_BOGUS", "IBMON_PROMETHEUS_LISTEN", "ibmon_bogus",
                                  "IBMON_"])
def test_unknown_ibmon_variables_are_refused(name: str) -> None:
    with pytest.raises(ConfigError, match=f"environment variable {name}: no such setting"):
        check_environment({name: "1"})


def test_setting_variables_are_accepted() -> None:
    check_environment({"IBMON_STATE__PATH": "/x", "IBMON_FABRIC": "a", "ibmon_log__level": "info",
                       "IBMON_PROMETHEUS": "{}", "HOME": "/root", "IBMONX": "1"})


@pytest.mark.parametrize("name", ["IBMON_PASSWORD", "IBMON_TOOL_SCOPE", "ibmon_password"])
def test_variables_of_ibmons_commands_are_no_settings(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator who exported the API password for ``ibmon top`` (or a diags tool's scope
    token, inherited) can still run, scan and check a config: neither is read as a setting."""
    monkeypatch.setenv(name, "secret")
    check_environment({name: "secret"})
    cfg = tmp_path / "ibmon.toml"
    cfg.write_text('fabric = "lab"\n')
    assert load_settings(cfg).fabric == "lab"


def test_json_nested_past_the_parser_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A variable's JSON nested deeper than Python's parser can go is a ConfigError naming
    the variable, not a RecursionError's traceback."""
    monkeypatch.setenv("IBMON_SOURCES", "[" * 200_000)
    with pytest.raises(ConfigError, match=r"IBMON_SOURCES.*nested deeper than the JSON parser"):
        load_settings(None)


def test_errors_name_the_variable_that_set_the_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "ibmon.toml"
    cfg.write_text('[prometheus]\nlisten = "127.0.0.1:1"\n')
    monkeypatch.setenv("IBMON_PROMETHEUS__LISTEN", "nowhere")
    with pytest.raises(ConfigError) as info:
        load_settings(cfg)
    assert str(info.value).startswith(
        "environment variable IBMON_PROMETHEUS__LISTEN: prometheus.listen: listen address")
    monkeypatch.setenv("IBMON_SOURCES", "[{")
    with pytest.raises(ConfigError, match=r"^environment variable IBMON_SOURCES: not valid JSON"):
        load_settings(cfg)


def test_cert_needs_key_and_key_needs_cert(tmp_path: Path) -> None:
    for key in ("tls_cert", "tls_key"):
        cfg = tmp_path / f"{key}.toml"
        cfg.write_text(f'[prometheus]\n{key} = "/etc/ibmon/x.pem"\n')
        with pytest.raises(ConfigError, match=f"prometheus: {key} needs "):
            load_settings(cfg)


@pytest.mark.parametrize(
    ("body", "expect"),
    [
        ("x = " + "[" * 3000 + "]" * 3000 + "\n", "arrays or tables nested too deeply"),
        ("a = 1\n" + "b." * 40 + "c = 1\n", ":2: keys nested deeper than 32 levels"),
        ("[" + "t." * 40 + "u]\n", ":1: keys nested deeper than 32 levels"),
    ],
)
def test_deep_toml_is_one_line_not_a_recursion_error(
    tmp_path: Path, body: str, expect: str
) -> None:
    cfg = tmp_path / "deep.toml"
    cfg.write_text(body)
    with pytest.raises(ConfigError, match=expect):
        load_settings(cfg)


@pytest.mark.parametrize(
    ("body", "expect"),
    [
        ("[detect.high_ber]\nwarning = 1e-10\ncritical = 1e-12\n",
         "detect: high_ber: critical must not be below warning"),
        ("[detect.congestion]\nwarning = 0.6\ncritical = 0.5\n",
         "detect: congestion: need clear <= warning <= critical"),
        ("[detect.congestion]\nclear = 0.2\n",  # above the default warning, 0.10
         "detect: congestion: need clear <= warning <= critical"),
        ("[detect.congestion]\nroce_clear = 5000\n",
         "detect: congestion: need roce_clear <= roce_warning <= roce_critical"),
    ],
)
def test_thresholds_out_of_order_are_refused(tmp_path: Path, body: str, expect: str) -> None:
    """A warning level above its critical one (or a clear level above the warning) would
    page at the wrong level or never resolve: refused by name, not run."""
    cfg = tmp_path / "levels.toml"
    cfg.write_text(body)
    with pytest.raises(ConfigError, match=expect):
        load_settings(cfg)
    cfg.write_text(body.replace("1e-12", "1e-10").replace("0.5", "0.6").replace("0.2", "0.1")
                   .replace("5000", "1000"))
    load_settings(cfg)  # levels that meet are allowed


def test_oversized_or_special_config_files_are_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.toml"
    big.write_bytes(b"# " + b"x" * MAX_CONFIG_BYTES + b"\n")
    with pytest.raises(ConfigError, match="larger than"):
        load_settings(big)
    with pytest.raises(ConfigError, match="is a directory"):
        load_settings(tmp_path)


def test_shard_must_name_one_of_n(tmp_path: Path) -> None:
    cfg = tmp_path / "shard.toml"
    cfg.write_text('[[sources]]\ntype = "diags"\nshard = "3/3"\n')
    with pytest.raises(ConfigError, match=r"sources\.0\.shard: shard '3/3'"):
        load_settings(cfg)
    cfg.write_text('[[sources]]\ntype = "diags"\nshard = "2/3"\n')
    assert load_settings(cfg).sources[0].shard == "2/3"  # type: ignore[attr-defined]


def test_environment_merges_key_by_key_between_file_and_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """File, then environment, then flags, merged per key: a variable that sets one key of a
    section keeps the file's other keys, and a flag beats both."""
    cfg = tmp_path / "ibmon.toml"
    cfg.write_text('fabric = "filefab"\n[prometheus]\nlisten = "127.0.0.1:1"\n'
                   'max_connections = 7\n[mqtt]\nhost = "file-broker"\nport = 1884\n')
    monkeypatch.setenv("IBMON_PROMETHEUS__LISTEN", "127.0.0.1:2")
    monkeypatch.setenv("ibmon_mqtt__port", "8883")
    s = load_settings(cfg)
    assert (s.fabric, s.prometheus.listen, s.prometheus.max_connections) == (
        "filefab", "127.0.0.1:2", 7)
    assert s.mqtt is not None and (s.mqtt.host, s.mqtt.port) == ("file-broker", 8883)
    s = load_settings(cfg, prometheus={"listen": "127.0.0.1:3"})
    assert (s.prometheus.listen, s.prometheus.max_connections) == ("127.0.0.1:3", 7)


def test_json_sections_lists_and_tables_from_the_environment(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sections, lists and nested tables take JSON; the single keys of a section beat the
    section's JSON; plain keys stay strings that the model checks as it checks the file."""
    monkeypatch.setenv("IBMON_SOURCES", '[{"type": "sysfs", "interval": "2s"}]')
    monkeypatch.setenv("IBMON_PROMETHEUS", '{"listen": "127.0.0.1:5", "max_connections": 9}')
    monkeypatch.setenv("IBMON_PROMETHEUS__MAX_CONNECTIONS", "11")
    monkeypatch.setenv("IBMON_MQTT__TLS", '{"verify": false}')
    s = load_settings(None)
    assert isinstance(s.sources[0], SysfsSourceConfig) and s.sources[0].interval == 2.0
    assert (s.prometheus.listen, s.prometheus.max_connections) == ("127.0.0.1:5", 11)
    assert s.mqtt is not None and s.mqtt.tls is not None and s.mqtt.tls.verify is False
    monkeypatch.setenv("IBMON_MQTT__TLS", "{verify")
    with pytest.raises(ConfigError, match=r"^environment variable IBMON_MQTT__TLS: not valid JSON"):
        load_settings(None)
    monkeypatch.delenv("IBMON_MQTT__TLS")
    monkeypatch.setenv("IBMON_PROMETHEUS__MAX_CONNECTIONS", "many")
    with pytest.raises(ConfigError, match=r"^environment variable IBMON_PROMETHEUS__MAX_CONN"):
        load_settings(None)
    monkeypatch.setenv("IBMON_PROMETHEUS__MAX_CONNECTIONS", "11")
    monkeypatch.setenv("IBMON_PROMETHEUS__NOPE", "1")
    with pytest.raises(ConfigError, match=r"^environment variable IBMON_PROMETHEUS__NOPE: "):
        load_settings(None)


def test_settings_class_alone_is_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only ``load_settings`` reads the environment: a bare ``Settings()`` is the defaults."""
    monkeypatch.setenv("IBMON_FABRIC", "envfab")
    assert Settings().fabric == "main"
    assert load_settings(None).fabric == "envfab"
