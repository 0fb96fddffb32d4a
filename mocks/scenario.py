"""Named fault timelines for the simulated fabric, with the answer key a monitor is tested against.

A scenario file (``mocks/scenarios/<name>.yaml``) states a topology (fat-tree parameters), a
timeline of faults on ports named ``<node description>[<port>]`` (``leaf03[12]``,
``host042 mlx5_0[1]``), and under ``expect:`` every event a correct monitor raises, each with a
time window in simulated seconds. Files are validated by pydantic; errors name the file, the line
and the field.

Answer-key conventions (what "correct" means; the detection tests follow them):

- The monitor polls every ``poll_interval`` simulated seconds (default 1 s) from t=0 and uses the
  docs/infiniband.md §4 defaults. A stall fraction in a fault (``wait_ratio``) is what the
  monitor must report: the simulator turns it into PortXmitWait counts in the unit of the port's
  device family (``mocks.traffic``), so the key holds for 8-byte-per-port and 32-byte-per-lane
  devices alike. Windows are generous enough for either
  reasonable reading of a rule (e.g. a BER window over the full 10 minutes or over the history
  available so far), but tight enough that a late or missing event fails.
- A fault on a link (down, flap, degraded) raises one event per link, on its carrying end: the
  switch end of a host link, the end with the lower GUID between two switches (the event's
  ``peer`` names the other end). A fault on one port's counters (BER, receive errors,
  discards, congestion, integrity, reset, saturation) raises events on that port only.
- Fault events state ``details.cause`` (``ibmon.detect.cause``); keys give it on firing events.
- ``port_down`` fires at the first poll that finds a port that was Active not Active, and resolves
  at the first poll that finds it Active again. A LinkDowned increase is reported through
  ``port_down`` and ``link_flapping``, not as an event of its own (flaps stay down for several
  polls, so every one is seen).
- ``link_flapping`` fires when 3 LinkDowned increments fall within 600 s and resolves once fewer
  than 3 remain in the trailing 600 s.
- ``high_ber`` fires with severity warning at 1e-12 and escalates to critical at 1e-10 (a second
  ``firing`` event, severity critical); it resolves once, below 1e-12. Dropping from critical to
  warning is not an event. A condition that crosses both levels at the same poll fires once at
  the higher severity (also for congestion).
- ``link_integrity`` fires at the first poll that sees LocalLinkIntegrityErrors or
  ExcessiveBufferOverrunErrors increase and resolves after 600 s without a further increase.
- ``receive_errors`` (> 10/s) and ``discards`` (> 100/s) fire while the rate is above the
  threshold; faults use several times the threshold.
- ``congestion``: details ``kind`` is ``hotspot`` (transmit utilization high, 0.6 here) or
  ``backpressure`` (utilization near zero).
- ``counter_reset`` is a one-shot ``firing`` event (severity info) per port and poll in which any
  counter decreased. ``counter_saturated`` fires when a narrow counter pins at its maximum and
  resolves when it leaves it (a reset).
- Discovery keeps cabled links while they are down, so no ``topology_changed`` is expected.
"""

from __future__ import annotations

import importlib.resources
import math
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from hostlist import BadHostlist, expand_hostlist  # type: ignore[import-untyped]
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from ibmon.detect.events import EVENT_TYPES, EventType
from ibmon.infiniband.counters import BY_NAME
from mocks.topology import SPEEDS, WIDTHS, Fabric, fabric_for_hosts, fat_tree
from mocks.traffic import WIDE_COUNTERS, FabricModel, counter_max

__all__ = [
    "EVENT_TYPES",
    "Expected",
    "ManualClock",
    "Scenario",
    "ScenarioError",
    "ScenarioJob",
    "ScenarioPlayer",
    "SimClock",
    "TopologySpec",
    "build_fabric",
    "iter_expected",
    "list_scenarios",
    "load_scenario",
    "parse_port_ref",
    "parse_scenario",
    "resolve_port",
    "running_jobs",
    "squeue_json",
    "synthetic_jobs",
]

# The answer key speaks the daemon's event vocabulary: one list, in ibmon.detect.events.

_PORT_REF = re.compile(r"^(?P<desc>.+?)\s*\[(?P<port>\d+)\]$")
_NUMBERED = re.compile(r"^(?P<pre>\D*?)(?P<num>\d+)(?P<post>.*)$")


class ScenarioError(ValueError):
    """A scenario that cannot be loaded; the message names the file, line and field."""


def parse_port_ref(ref: str) -> tuple[str, int]:
    """``"leaf03[12]"`` -> ``("leaf03", 12)``."""
    m = _PORT_REF.match(ref.strip())
    if not m:
        raise ValueError(f"port reference {ref!r} is not '<node description>[<port>]'")
    return m.group("desc"), int(m.group("port"))


def _numbered_key(desc: str) -> tuple[str, int, str] | None:
    m = _NUMBERED.match(desc)
    return (m.group("pre"), int(m.group("num")), m.group("post")) if m else None


def resolve_port(fabric: Fabric, ref: str) -> tuple[str, int]:
    """The ``(guid, port)`` a reference names, for a connected port of ``fabric``.

    A description matches exactly, or by number when zero padding differs (``leaf03`` is
    ``leaf003`` in a fabric with 100+ leaves), so a scenario survives ``--hosts``.
    """
    desc, port = parse_port_ref(ref)
    try:
        node = fabric.node_by_desc(desc)
    except KeyError:
        want = _numbered_key(desc)
        hits = [n for n in fabric.nodes.values()
                if want is not None and _numbered_key(n.desc) == want]
        if len(hits) != 1:
            raise ValueError(f"no node {desc!r} in the topology") from None
        node = hits[0]
    if fabric.link_of(node.guid, port) is None:
        raise ValueError(f"{desc}[{port}] is not a connected port (node has {node.nports})")
    return node.guid, port


# ---------------------------------------------------------------------------------------------
# Model


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def _link_kind(text: str) -> tuple[str, str]:
    parts = text.replace("x", "X", 1).split()
    if len(parts) == 1:
        m = re.match(r"^(\d+X)([A-Z0-9]+)$", parts[0])
        parts = [m.group(1), m.group(2)] if m else parts
    if len(parts) != 2 or parts[0] not in WIDTHS or parts[1] not in SPEEDS:
        raise ValueError(f"link {text!r} is not '<width> <speed>' like '4X EDR' "
                         f"(widths {', '.join(WIDTHS)}; speeds {', '.join(SPEEDS)})")
    return parts[0], parts[1]


class TopologySpec(_Strict):
    """Parameters of :func:`mocks.topology.fat_tree`; links as ``"4X EDR"``."""

    levels: int = Field(default=2, ge=1, le=3)
    radix: int = Field(default=36, ge=2, le=255)
    leaves: int = Field(default=4, ge=1)
    spines: int | None = Field(default=None, ge=1)
    cores: int | None = Field(default=None, ge=1)
    hosts_per_leaf: int = Field(default=18, ge=0)
    hcas_per_host: int = Field(default=1, ge=1)
    host_link: str = "4X EDR"
    leaf_link: str = "4X EDR"
    spine_link: str = "4X EDR"

    @field_validator("host_link", "leaf_link", "spine_link")
    @classmethod
    def _kind(cls, v: str) -> str:
        _link_kind(v)
        return v

    def build(self) -> Fabric:
        return fat_tree(
            levels=self.levels, radix=self.radix, leaves=self.leaves, spines=self.spines,
            cores=self.cores, hosts_per_leaf=self.hosts_per_leaf,
            hcas_per_host=self.hcas_per_host, host_link=_link_kind(self.host_link),
            leaf_link=_link_kind(self.leaf_link), spine_link=_link_kind(self.spine_link),
        )


class _Entry(_Strict):
    at: float = Field(ge=0, description="simulated seconds since start")
    port: str
    duration: float | None = Field(default=None, alias="for", gt=0,
                                   description="seconds until the fault clears; absent = never")

    @field_validator("port")
    @classmethod
    def _port(cls, v: str) -> str:
        parse_port_ref(v)
        return v


class Congestion(_Entry):
    fault: Literal["congestion"]
    kind: Literal["hotspot", "backpressure"]
    wait_ratio: float | None = Field(default=None, ge=0, le=1)
    utilization: float | None = Field(default=None, ge=0, le=1)

    def levels(self) -> tuple[float, float]:
        hot = self.kind == "hotspot"
        wait = self.wait_ratio if self.wait_ratio is not None else (0.35 if hot else 0.8)
        util = self.utilization if self.utilization is not None else (0.6 if hot else 0.03)
        return wait, util

    @model_validator(mode="after")
    def _fits(self) -> Congestion:
        wait, util = self.levels()
        if wait + util > 1.0:
            raise ValueError("wait_ratio + utilization must not exceed 1 (a port cannot "
                             "transmit and wait in the same tick)")
        return self


class Ber(_Entry):
    fault: Literal["ber"]
    ber: float = Field(gt=0, lt=1e-3)
    ramp: float = Field(default=0.0, ge=0, description="seconds to reach ber linearly")


class Flap(_Entry):
    fault: Literal["flap"]
    count: int = Field(default=3, ge=1, le=255)
    every: float = Field(default=60.0, gt=0)
    down_for: float = Field(default=5.0, gt=0)

    @model_validator(mode="after")
    def _spacing(self) -> Flap:
        if self.duration is not None:
            raise ValueError("'for' is not used by flap: its length is count x every")
        if self.count > 1 and self.every <= self.down_for:
            raise ValueError("every must be longer than down_for")
        return self


class LinkDown(_Entry):
    fault: Literal["link_down"]


class Degraded(_Entry):
    fault: Literal["degraded"]
    width: str | None = None
    speed: str | None = None

    @model_validator(mode="after")
    def _something(self) -> Degraded:
        if self.width is None and self.speed is None:
            raise ValueError("degraded needs width and/or speed")
        if self.width is not None and self.width not in WIDTHS:
            raise ValueError(f"width {self.width!r} is not one of {', '.join(WIDTHS)}")
        if self.speed is not None and self.speed not in SPEEDS:
            raise ValueError(f"speed {self.speed!r} is not one of {', '.join(SPEEDS)}")
        return self


class ReceiveErrors(_Entry):
    fault: Literal["receive_errors"]
    per_second: float = Field(default=50.0, gt=0)


class Discards(_Entry):
    fault: Literal["discards"]
    per_second: float = Field(default=400.0, gt=0)


class Integrity(_Entry):
    fault: Literal["integrity"]
    counter: Literal["local_link_integrity_errors", "excessive_buffer_overrun_errors"] = (
        "local_link_integrity_errors"
    )
    count: int = Field(default=1, ge=1, le=15)
    every: float = Field(default=60.0, gt=0)

    @model_validator(mode="after")
    def _no_for(self) -> Integrity:
        if self.duration is not None:
            raise ValueError("'for' is not used by integrity: it adds count increments")
        return self


class CounterReset(_Entry):
    fault: Literal["counter_reset"]
    counters: list[str] = Field(default_factory=list, description="empty = all")

    @field_validator("counters")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        bad = [c for c in v if c not in BY_NAME]
        if bad:
            raise ValueError(f"unknown counters {bad}")
        return v

    @model_validator(mode="after")
    def _instant(self) -> CounterReset:
        if self.duration is not None:
            raise ValueError("'for' is not used by counter_reset: a reset is instantaneous")
        return self


class Saturate(_Entry):
    """A narrow counter whose history left it ``seconds`` of headroom when monitoring starts.

    Only at t=0: a later jump would be an increment a monitor must count, not saturation.
    For ``transmit_wait`` the port has only the 32-bit PortXmitWait and waits 0.2 % of the time
    (far below every congestion level): counted in bytes, even that fills 32 bits in about 23
    minutes at 4X EDR and 8 bytes a count, so after a reset the counter stays unpinned for the
    rest of a 15-minute scenario.
    """

    fault: Literal["saturate"]
    counter: str = "transmit_wait"
    seconds: float = Field(default=60.0, gt=0)
    per_second: float = Field(default=1.0, gt=0,
                              description="increments/s (not for transmit_wait)")

    @model_validator(mode="after")
    def _check(self) -> Saturate:
        if self.counter not in BY_NAME or self.counter in WIDE_COUNTERS:
            raise ValueError(f"{self.counter!r} is not a narrow counter "
                             "(the simulated data/packet counters are 64-bit)")
        if self.at != 0:
            raise ValueError("saturate describes history before monitoring and needs at: 0")
        if self.duration is not None:
            raise ValueError("'for' is not used by saturate; reset the counter instead")
        return self


Fault = Annotated[
    Congestion | Ber | Flap | LinkDown | Degraded | ReceiveErrors | Discards | Integrity
    | CounterReset | Saturate,
    Field(discriminator="fault"),
]


class Expected(_Strict):
    """One event a correct monitor raises, within ``window`` (simulated seconds, inclusive)."""

    type: EventType  # every type a detector emits, from the one list
    port: str
    status: Literal["firing", "resolved"]
    window: tuple[float, float]
    severity: Literal["info", "warning", "critical"] | None = None
    details: dict[str, str] = Field(default_factory=dict)

    @field_validator("port")
    @classmethod
    def _port(cls, v: str) -> str:
        parse_port_ref(v)
        return v

    @field_validator("window")
    @classmethod
    def _ordered(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not 0 <= v[0] <= v[1]:
            raise ValueError("window must be [from, to] with 0 <= from <= to")
        return v


class ScenarioJob(_Strict):
    """A job the scenario's scheduler runs from ``start`` to ``end`` (simulated seconds of each
    loop; no end: to the loop's end) on ``hosts``, a Slurm host list (``host[001-004]``)."""

    id: int = Field(ge=1)
    name: str = Field(min_length=1, max_length=128)
    user: str = Field(default="demo", min_length=1, max_length=64)
    partition: str = Field(default="gpu", min_length=1, max_length=64)
    hosts: str = Field(min_length=1)
    start: float = Field(default=0.0, ge=0)
    end: float | None = None

    @model_validator(mode="after")
    def _ordered(self) -> ScenarioJob:
        if self.end is not None and self.end <= self.start:
            raise ValueError("end must be after start")
        return self


class Scenario(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    description: str
    topology: TopologySpec = TopologySpec()
    load: float = Field(default=0.3, ge=0, le=0.9)
    seed: int = 0
    duration: float = Field(gt=0, description="simulated seconds (one loop for loop: true)")
    loop: bool = False
    poll_interval: float = Field(default=1.0, gt=0,
                                 description="poll interval the answer key assumes")
    timeline: list[Fault] = Field(default_factory=list)
    expect: list[Expected] = Field(default_factory=list)
    jobs: list[ScenarioJob] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _no_tick_seconds(cls, data: Any) -> Any:
        if isinstance(data, dict) and "tick_seconds" in data:
            raise ValueError(
                "tick_seconds: no longer a scenario setting: a PortXmitWait count is bytes of "
                "the port's device family (8 per port on Quantum and ConnectX, 32 per lane on "
                "Switch-IB), not a fixed time; delete the line")
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        try:
            fabric = self.topology.build()
        except ValueError as exc:
            raise ValueError(f"topology: {exc}") from None
        for i, entry in enumerate(self.timeline):
            try:
                resolve_port(fabric, entry.port)
            except ValueError as exc:
                raise ValueError(f"timeline[{i}].port: {exc}") from None
            if entry.at >= self.duration:
                raise ValueError(f"timeline[{i}].at: {entry.at} is not before duration "
                                 f"{self.duration}")
            end = _end_of(entry)
            if self.loop and end is not None and end > self.duration:
                raise ValueError(f"timeline[{i}]: ends at {end}, after the loop's duration")
        for i, exp in enumerate(self.expect):
            try:
                resolve_port(fabric, exp.port)
            except ValueError as exc:
                raise ValueError(f"expect[{i}].port: {exc}") from None
            if exp.window[0] > self.duration:
                raise ValueError(f"expect[{i}].window: starts after duration {self.duration}")
        hosts = {n.desc.split()[0] for n in fabric.hosts()}
        for i, job in enumerate(self.jobs):
            try:
                missing = set(expand_hostlist(job.hosts)) - hosts
            except BadHostlist as exc:
                raise ValueError(f"jobs[{i}].hosts: {exc}") from None
            if missing:
                raise ValueError(f"jobs[{i}].hosts: no such host: {sorted(missing)[0]}")
        if self.loop and any(isinstance(e, Saturate) for e in self.timeline):
            raise ValueError("a looping scenario cannot use saturate (it models history)")
        return self

    def expected_for(self, fabric: Fabric, keys: set[tuple[str, int]]) -> list[Expected]:
        """The part of the key about ports a source can see (sysfs sees only HCAs)."""
        return [e for e in self.expect if resolve_port(fabric, e.port) in keys]


def _end_of(entry: Any) -> float | None:
    if isinstance(entry, Flap):
        return entry.at + (entry.count - 1) * entry.every + entry.down_for
    if isinstance(entry, Integrity):
        return entry.at + (entry.count - 1) * entry.every
    if entry.duration is not None:
        return float(entry.at + entry.duration)
    return None


# ---------------------------------------------------------------------------------------------
# Loading

_PACKAGE_DIR = "scenarios"


def _scenario_dir() -> Path:
    return Path(str(importlib.resources.files("mocks").joinpath(_PACKAGE_DIR)))


def list_scenarios() -> list[str]:
    """Names of the shipped scenarios."""
    return sorted(p.stem for p in _scenario_dir().glob("*.yaml"))


def _line_of(node: yaml.Node | None, loc: tuple[int | str, ...]) -> int | None:
    """1-based line of the YAML node at a pydantic error location (best effort)."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            nxt = next((v for k, v in node.value if getattr(k, "value", None) == part), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            nxt = node.value[part] if 0 <= part < len(node.value) else None
        else:
            nxt = None
        if nxt is None:
            break  # e.g. a union tag: keep the last real node
        node = nxt
        line = node.start_mark.line + 1
    return line


_FAULT_TAGS = frozenset({"congestion", "ber", "flap", "link_down", "degraded", "receive_errors",
                         "discards", "integrity", "counter_reset", "saturate"})
_PATH_IN_MSG = re.compile(r"^(?P<path>[a-z_]+(?:\[\d+\])?(?:\.[a-z_]+)?): (?P<msg>.*)$", re.S)


def _clean_loc(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """Drop the union tag pydantic inserts after ``timeline[i]``."""
    out: list[int | str] = []
    for n, part in enumerate(loc):
        if (n >= 2 and loc[n - 2] == "timeline" and isinstance(loc[n - 1], int)
                and part in _FAULT_TAGS):
            continue
        out.append(part)
    return tuple(out)


def _loc_text(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out or "(top level)"


def _path_to_loc(path: str) -> tuple[int | str, ...]:
    loc: list[int | str] = []
    for name, index, field in re.findall(r"([a-z_]+)(?:\[(\d+)\])?(?:\.([a-z_]+))?", path):
        loc.append(name)
        if index:
            loc.append(int(index))
        if field:
            loc.append(field)
    return tuple(loc)


def parse_scenario(text: str, *, source: str = "<string>") -> Scenario:
    """Validate YAML text; ScenarioError with ``source:line: field: problem`` on failure."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        raise ScenarioError(f"{where}: YAML syntax error: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{source}: YAML error: {exc}") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: a scenario is a mapping (name:, duration:, ...)")
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = _clean_loc(tuple(err["loc"]))
            msg = err["msg"].removeprefix("Value error, ")
            inner = _PATH_IN_MSG.match(msg) if not loc else None
            if inner:  # cross-field checks name their field in the message
                loc, msg = _path_to_loc(inner.group("path")), inner.group("msg")
            line = _line_of(node, loc)
            where = f"{source}:{line}" if line else source
            lines.append(f"{where}: {_loc_text(loc)}: {msg}")
        raise ScenarioError("\n".join(lines)) from None


def load_scenario(name_or_path: str | Path) -> Scenario:
    """A shipped scenario by name (``congestion``) or a YAML file by path."""
    text_ref = str(name_or_path)
    path = Path(text_ref)
    if not (path.suffix in {".yaml", ".yml"} or path.exists() or "/" in text_ref):
        path = _scenario_dir() / f"{text_ref}.yaml"
        if not path.is_file():
            raise ScenarioError(f"unknown scenario {text_ref!r}; shipped: "
                                f"{', '.join(list_scenarios())}")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return parse_scenario(text, source=str(path))


def build_fabric(scenario: Scenario, *, hosts: int | None = None) -> Fabric:
    """The scenario's topology, or a bigger tree of the same shape with at least ``hosts``
    HCAs (scenario ports resolve by name in both)."""
    if hosts is None:
        return scenario.topology.build()
    t = scenario.topology
    fabric = fabric_for_hosts(hosts, radix=t.radix, hosts_per_leaf=t.hosts_per_leaf,
                              hcas_per_host=t.hcas_per_host,
                              host_link=_link_kind(t.host_link),
                              leaf_link=_link_kind(t.leaf_link),
                              spine_link=_link_kind(t.spine_link))
    for entry in scenario.timeline:
        try:
            resolve_port(fabric, entry.port)
        except ValueError as exc:
            raise ScenarioError(f"--hosts {hosts}: scenario {scenario.name!r} uses "
                                f"{entry.port}: {exc}") from None
    return fabric


# ---------------------------------------------------------------------------------------------
# Playing


def running_jobs(scenario: Scenario, t: float) -> list[ScenarioJob]:
    """The scenario's jobs running at simulated time ``t`` (each loop starts them again)."""
    at = t % scenario.duration if scenario.loop else t
    return [j for j in scenario.jobs
            if j.start <= at and (at < j.end if j.end is not None else at < scenario.duration)]


def synthetic_jobs(fabric: Fabric, count: int) -> str:
    """``count`` jobs on consecutive hosts of ``fabric``, one to four hosts each, running for
    the whole loop (scale runs: ``jobs`` of a mock source), as the entries of a ``squeue
    --json`` job list (``squeue_json``'s ``extra``): text, because 10,000 job models would
    weigh 13 MB of the simulator, where their JSON is 2."""
    import json

    names = [n.desc.split()[0] for n in fabric.hosts()]
    entries = []
    at = 0
    for i in range(count if names else 0):
        size = 1 + i % 4
        hosts = ",".join(names[(at + k) % len(names)] for k in range(size))
        at += size
        entries.append(json.dumps(
            {"job_id": 100_000 + i, "array_job_id": 0, "array_task_id": None,
             "user_name": f"user{i % 97}", "name": f"train-{i}", "partition": "gpu",
             "job_state": "RUNNING", "start_time": 1, "nodes": hosts}))
    return ",".join(entries)


def squeue_json(jobs: list[ScenarioJob], *, started: float, extra: str = "") -> str:
    """``jobs`` as Slurm 22.05's ``squeue --json`` prints running jobs (the fields ibmon reads),
    each started ``started`` + its start (wall-clock seconds), then the entries ``extra``."""
    import json

    listed = [json.dumps(
        {"job_id": j.id, "array_job_id": 0, "array_task_id": None, "user_name": j.user,
         "name": j.name, "partition": j.partition, "job_state": "RUNNING",
         "start_time": int(started + j.start), "nodes": j.hosts}) for j in jobs]
    if extra:
        listed.append(extra)
    return '{"meta": {}, "errors": [], "jobs": [' + ",".join(listed) + "]}"


class SimClock:
    """Simulated seconds since creation, running ``speed`` times faster than real time."""

    def __init__(self, speed: float = 1.0, *, start: float = 0.0) -> None:
        if not speed > 0:
            raise ValueError("speed must be > 0")
        self.speed = speed
        self.start = start
        self._t0 = time.monotonic()

    def __call__(self) -> float:
        return self.start + (time.monotonic() - self._t0) * self.speed


class ManualClock:
    """A simulated clock tests move by hand."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> float:
        self.t += dt
        return self.t


@dataclass(slots=True)
class _Action:
    at: float
    seq: int
    apply: bool
    entry: Any
    key: tuple[str, int]
    extra: int = 0  # integrity: which increment


class ScenarioPlayer:
    """Applies a scenario's timeline to a FabricModel as simulated time passes.

    ``run_until(t)`` advances the model to ``t`` and applies every fault exactly at its time
    (the model is stepped to each fault time first). A looping scenario clears whatever is
    still active at the end of each loop and starts its timeline again.
    """

    def __init__(self, scenario: Scenario, model: FabricModel) -> None:
        self.scenario = scenario
        self.model = model
        self._keys = [resolve_port(model.fabric, e.port) for e in scenario.timeline]
        self._base: float = model.now
        self._actions: list[_Action] = []
        self._active: dict[int, _Action] = {}
        self._arm(self._base)

    @property
    def loop_start(self) -> float:
        return self._base

    def active(self) -> list[str]:
        """Human-readable faults in force now (for the demo's banner)."""
        return [f"{a.entry.fault} on {a.entry.port}" for a in self._active.values()]

    def _arm(self, base: float) -> None:
        acts: list[_Action] = []
        seq = 0
        for n, entry in enumerate(self.scenario.timeline):
            key = self._keys[n]
            if isinstance(entry, Integrity):
                for k in range(entry.count):
                    acts.append(_Action(base + entry.at + k * entry.every, seq, True, entry, key,
                                        k))
                    seq += 1
                continue
            acts.append(_Action(base + entry.at, seq, True, entry, key))
            seq += 1
            if entry.duration is not None:
                acts.append(_Action(base + entry.at + entry.duration, seq, False, entry, key))
                seq += 1
        # clears before applies at the same instant, then timeline order
        acts.sort(key=lambda a: (a.at, a.apply, a.seq))
        self._actions = acts

    def run_until(self, t: float) -> None:
        model = self.model
        while True:
            loop_end = self._base + self.scenario.duration if self.scenario.loop else math.inf
            while self._actions and self._actions[0].at <= min(t, loop_end):
                act = self._actions.pop(0)
                model.advance_to(act.at)
                self._do(act)
            if t < loop_end:
                break
            model.advance_to(loop_end)
            for act in list(self._active.values()):
                self._undo(act)
            self._active.clear()
            self._base = loop_end
            self._arm(self._base)
        model.advance_to(t)

    def _do(self, act: _Action) -> None:
        if act.apply:
            self._apply(act)
            if not isinstance(act.entry, CounterReset | Integrity):  # those have no undo
                self._active[id(act.entry)] = act
        else:
            self._undo(act)
            self._active.pop(id(act.entry), None)

    def _apply(self, act: _Action) -> None:
        m, e, key = self.model, act.entry, act.key
        if isinstance(e, Congestion):
            wait, util = e.levels()
            m.congest(key, wait_ratio=wait, utilization=util)
        elif isinstance(e, Ber):
            m.set_ber(key, e.ber, ramp=e.ramp)
        elif isinstance(e, Flap):
            m.flap(key, count=e.count, every=e.every, down_for=e.down_for)
        elif isinstance(e, LinkDown):
            m.link_down(key)
        elif isinstance(e, Degraded):
            m.degrade(key, width=e.width, speed=e.speed)
        elif isinstance(e, ReceiveErrors):
            m.set_error_rate(key, "receive_errors", e.per_second)
        elif isinstance(e, Discards):
            m.set_error_rate(key, "transmit_discards", e.per_second)
        elif isinstance(e, Integrity):
            m.bump(key, e.counter, 1)
        elif isinstance(e, CounterReset):
            m.reset_counters(key, tuple(e.counters))
        elif isinstance(e, Saturate):
            if e.counter == "transmit_wait":
                ratio = 0.002
                # a 32-bit PortXmitWait (the 64-bit copy never fills), counting in the port's
                # own unit
                m.narrow_wait(key)
                per_s = m.wait_counts_per_second(m.port_index(key), ratio)
                m.congest(key, wait_ratio=ratio, utilization=m.load)
                # keep the port's normal load: congest() pins utilization, which is fine here
            else:
                per_s = e.per_second
                m.set_error_rate(key, e.counter, per_s)
            headroom = round(per_s * e.seconds)
            m.set_value(key, e.counter, counter_max(e.counter) - headroom)

    def _undo(self, act: _Action) -> None:
        m, e, key = self.model, act.entry, act.key
        if isinstance(e, Congestion):
            m.clear_congestion(key)
        elif isinstance(e, Ber):
            m.clear_ber(key)
        elif isinstance(e, Flap):
            m.cancel_flaps(key)
        elif isinstance(e, LinkDown):
            m.link_up(key)
        elif isinstance(e, Degraded):
            m.restore(key)
        elif isinstance(e, ReceiveErrors):
            m.clear_error_rate(key, "receive_errors")
        elif isinstance(e, Discards):
            m.clear_error_rate(key, "transmit_discards")
        elif isinstance(e, Saturate):
            if e.counter == "transmit_wait":
                m.clear_congestion(key)
            else:
                m.clear_error_rate(key, e.counter)


def iter_expected(scenario: Scenario, loops: int = 1) -> Iterator[Expected]:
    """The key for ``loops`` consecutive loops of a looping scenario (shifted windows)."""
    for k in range(loops if scenario.loop else 1):
        shift = k * scenario.duration
        for e in scenario.expect:
            yield e.model_copy(update={"window": (e.window[0] + shift, e.window[1] + shift)})
