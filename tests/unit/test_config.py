"""Config: TOML + env + overrides, durations, and one-line errors naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from ibmon.config import (
    ConfigError,
    MadSourceConfig,
    SysfsSourceConfig,
    load_settings,
    parse_duration,
    parse_listen,
)


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
