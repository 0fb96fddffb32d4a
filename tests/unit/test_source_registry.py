"""Source types are declared once (module + registry line) and load only when used."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pydantic import TypeAdapter

import ibmon.config
from ibmon.config import ConfigError, SourceConfig, SourceConfigBase, load_settings
from ibmon.sources import registry
from ibmon.sources.registry import SOURCES, SourceType, build_source

REPO = Path(__file__).resolve().parents[2]


def test_sysfs_only_config_loads_no_other_source() -> None:
    """A node-local daemon must not pay for ctypes/libibmad, the diags runner, the simulator."""
    code = textwrap.dedent(
        """
        import json, sys
        import ibmon.config
        s = ibmon.config.load_settings(None, sources=[{"type": "sysfs", "root": "/nonexistent"}])
        assert type(s.sources[0]).__name__ == "SysfsSourceConfig"
        print(json.dumps(sorted(sys.modules)))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    loaded = set(json.loads(out.stdout))
    for heavy in ("ibmon.sources.mad", "ibmon.sources.libibmad", "ibmon.sources.diags",
                  "ibmon.sources.mock", "mocks", "yaml", "ctypes"):
        assert heavy not in loaded, heavy
    assert "ibmon.sources.sysfs" in loaded


@pytest.mark.parametrize("name", list(SOURCES))
def test_every_type_validates_by_name(name: str) -> None:
    cfg = TypeAdapter(SourceConfig).validate_python({"type": name})
    assert isinstance(cfg, SOURCES[name].config)
    assert cfg.type == name
    assert cfg.label == name
    # each model lives with its source, and only there (no alias in ibmon.config)
    assert type(cfg).__module__ == SOURCES[name].module
    assert not hasattr(ibmon.config, type(cfg).__name__)


def test_registry_order_is_the_cli_order() -> None:
    assert list(SOURCES) == ["sysfs", "mad", "diags", "mock"]
    assert all(t.help for t in SOURCES.values())


def test_fabric_port_is_optional(tmp_path: Path) -> None:
    cfg = tmp_path / "ibmon.toml"
    cfg.write_text('[[sources]]\ntype = "mad"\n[[sources]]\ntype = "diags"\nname = "d"\nport = 2\n')
    s = load_settings(cfg)
    assert s.sources[0].port is None  # type: ignore[attr-defined]
    assert s.sources[1].port == 2  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("body", "expect"),
    [
        ('[[sources]]\ntype = "magic"\n',
         "sources.0: unknown source type 'magic' (one of sysfs, mad, diags, mock)"),
        ('[[sources]]\ninterval = "1s"\n', "sources.0: a source needs a type"),
        ('[[sources]]\ntype = "mad"\nport = 300\n', "sources.0.port: Input should be less"),
        ('[[sources]]\ntype = "sysfs"\nca = "mlx5_0"\n', "sources.0.ca: unknown setting"),
        ('[[sources]]\ntype = "sysfs"\n[[sources]]\ntype = "mock"\nspeed = 0\n',
         "sources.1.speed: Input should be greater than 0"),
    ],
)
def test_errors_are_one_line_naming_the_field(tmp_path: Path, body: str, expect: str) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(body)
    with pytest.raises(ConfigError) as info:
        load_settings(cfg)
    msg = str(info.value)
    assert expect in msg
    assert "\n" not in msg


def test_settings_round_trip_through_dump(tmp_path: Path) -> None:
    s = load_settings(None, sources=[{"type": "mad", "ca": "mlx5_0", "name": "fab"}])
    dumped = s.model_dump()
    assert dumped["sources"][0]["ca"] == "mlx5_0"
    assert load_settings(None, sources=dumped["sources"]).sources == s.sources


def test_build_source_sysfs(tmp_path: Path) -> None:
    cfg = TypeAdapter(SourceConfig).validate_python({"type": "sysfs", "root": str(tmp_path)})
    src = build_source(cfg)
    assert src.name == "sysfs"
    assert SOURCES["sysfs"](cfg).name == "sysfs"  # the registry values are still factories


def test_a_new_source_is_one_module_and_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "h2_extra_source.py").write_text(textwrap.dedent(
        """
        from typing import Literal
        from ibmon.config import SourceConfigBase
        from ibmon.infiniband.model import Snapshot, Topology

        class Config(SourceConfigBase):
            type: Literal["extra"] = "extra"
            answer: int = 42

        class Extra:
            def __init__(self, cfg):
                self.name, self.answer = cfg.label, cfg.answer
            async def discover(self): return Topology(source=self.name)
            async def sample(self): return Snapshot(source=self.name, monotonic=0.0, wall=0.0)
            async def close(self): return None

        def build(cfg):
            return Extra(cfg)
        """
    ))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(SOURCES, "extra", SourceType("extra", "h2_extra_source", "test only"))
    s = load_settings(None, sources=[{"type": "extra", "answer": 7}])
    src = build_source(s.sources[0])
    assert (src.name, src.answer) == ("extra", 7)  # type: ignore[attr-defined]


def test_a_registration_that_does_not_match_its_module_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(SOURCES, "wrong", SourceType("wrong", "ibmon.sources.sysfs", "x"))
    with pytest.raises(TypeError, match="must default to 'wrong'"):
        registry.source_type("wrong").config  # noqa: B018


def test_base_is_shared() -> None:
    assert all(issubclass(t.config, SourceConfigBase) for t in SOURCES.values())
