"""In-process source over the simulated fabric (``mocks/``): the demo's source and the tests'.

Snapshots carry *simulated* time in ``monotonic`` (and ``wall`` = a fixed epoch + simulated
time), so every rate and window downstream is in simulated seconds: at ``--speed 10`` a
10-minute BER window passes in one real minute, and the scenario's answer key holds unchanged.
Each ``sample`` first advances the model (and the scenario, if any) to the clock's time.

Each port's identity says what one of its PortXmitWait counts means (``xmit_wait``, source
"family": the simulated node's device ID, ``mocks.topology.DEVICE_IDS``), and the counts are in
that unit, so the stall fraction ibmon computes is the one the scenario states.

Discovery reports every cabled port with its link, also while the link is down (the key of
every scenario assumes no ``topology_changed``); for a degraded link the maximum width and speed
are what both ends support, the active ones what the link runs at now.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar, Literal, TypeVar

from pydantic import Field

from ibmon.config import Duration, SourceConfigBase
from ibmon.infiniband.model import Snapshot, Topology
from ibmon.runtime.gcpause import paused_gc
from ibmon.runtime.sizes import fabric_sized, run_bulk

if TYPE_CHECKING:  # the simulator (and YAML) load only when a mock source is built
    from mocks.scenario import ScenarioPlayer
    from mocks.traffic import FabricModel

_T = TypeVar("_T")

__all__ = ["Config", "MockSource", "MockSourceConfig", "build"]


class MockSourceConfig(SourceConfigBase):
    """``type = "mock"``: a simulated fabric playing a shipped scenario (or a YAML file)."""

    type: Literal["mock"] = "mock"
    simulated: ClassVar[bool] = True
    interval: Duration = 1.0
    scenario: str = "demo"
    hosts: int | None = Field(default=None, ge=1, le=200_000)
    speed: float = Field(default=1.0, gt=0, le=10_000)
    seed: int | None = None  # None: the scenario's own seed
    #: Synthetic jobs on consecutive hosts, besides the scenario's own (scale runs).
    jobs: int = Field(default=0, ge=0, le=1_000_000)


Config = MockSourceConfig


def build(cfg: MockSourceConfig) -> MockSource:
    return MockSource.from_scenario(
        cfg.scenario, hosts=cfg.hosts, speed=cfg.speed, seed=cfg.seed, name=cfg.label,
        jobs=cfg.jobs,
    )


class MockSource:
    """The Source protocol over a :class:`~mocks.traffic.FabricModel`."""

    def __init__(
        self,
        *,
        model: FabricModel,
        player: ScenarioPlayer | None = None,
        clock: Callable[[], float] | None = None,
        name: str = "mock",
        epoch: float | None = None,
    ) -> None:
        self.name = name
        self.model = model
        self.player = player
        if clock is None:
            from mocks.scenario import SimClock

            clock = SimClock(1.0)
        self.clock: Callable[[], float] = clock
        self.epoch = time.time() if epoch is None else epoch
        #: One model step at a time: a sample abandoned by a poll timeout keeps its thread.
        self._lock = threading.Lock()
        #: Synthetic running jobs, as ``squeue --json`` entries (``mocks.scenario.synthetic_jobs``).
        self.synthetic_jobs = ""

    @classmethod
    def from_scenario(
        cls,
        scenario: str,
        *,
        hosts: int | None = None,
        speed: float = 1.0,
        seed: int | None = None,
        name: str = "mock",
        clock: Callable[[], float] | None = None,
        jobs: int = 0,
    ) -> MockSource:
        """A source playing a shipped scenario (or a YAML path) on its topology, or on a
        bigger tree with at least ``hosts`` HCAs, with ``jobs`` synthetic jobs besides the
        scenario's; raises ScenarioError (a ValueError)."""
        from mocks.scenario import (
            ScenarioPlayer,
            SimClock,
            build_fabric,
            load_scenario,
            synthetic_jobs,
        )
        from mocks.traffic import FabricModel

        sc = load_scenario(scenario)
        fabric = build_fabric(sc, hosts=hosts)
        model = FabricModel(fabric, seed=sc.seed if seed is None else seed, load=sc.load)
        player = ScenarioPlayer(sc, model)
        source = cls(model=model, player=player, clock=clock or SimClock(speed), name=name)
        source.synthetic_jobs = synthetic_jobs(fabric, jobs) if jobs else ""
        return source

    @property
    def places_jobs(self) -> bool:
        return self.player is not None and bool(self.player.scenario.jobs or self.synthetic_jobs)

    def squeue_json(self) -> str | None:
        """The scenario's scheduler: its jobs running now, printed as Slurm's ``squeue --json``
        prints them (the daemon parses them as it parses Slurm's); None when the scenario
        places no jobs."""
        if self.player is None or not self.places_jobs:
            return None
        from mocks.scenario import running_jobs, squeue_json

        sc = self.player.scenario
        return squeue_json(running_jobs(sc, self.clock()),
                           started=self.epoch + self.player.loop_start,
                           extra=self.synthetic_jobs)

    def _advance(self) -> float:
        t = self.clock()
        if self.player is not None:
            self.player.run_until(t)
        else:
            self.model.advance_to(t)
        return self.model.now

    async def discover(self) -> Topology:
        return await self._run(self._discover_sync)

    async def sample(self) -> Snapshot:
        return await self._run(self._sample_sync)

    async def _run(self, step: Callable[[], _T]) -> _T:
        """A large simulated fabric steps in a worker thread, like a real fabric's sweep in
        its MAD worker, so the simulator does not hold the event loop (``ibmon demo`` at
        100,000 ports), and with the cyclic GC paused (``ibmon.runtime.gcpause``); a node-sized one
        (``ibmon.runtime.sizes``) inline."""
        if not fabric_sized(len(self.model.keys)):
            return step()

        def paused() -> _T:
            with paused_gc():  # a real source's sweep runs so too (``ibmon.sources.mad``)
                return step()

        return await run_bulk(paused)

    def _discover_sync(self) -> Topology:
        with self._lock:
            topo = Topology(source=self.name)
            keys = self.model.port_keys(self.name)
            for key, sample in zip(keys, self.model.samples(self.name), strict=True):
                topo.ports[key] = sample.identity
                if sample.link is not None:
                    topo.links[key] = sample.link
            return topo

    def _sample_sync(self) -> Snapshot:
        with self._lock:
            now = self._advance()
            snap = Snapshot(source=self.name, monotonic=now, wall=self.epoch + now)
            keys = self.model.port_keys(self.name)
            samples = self.model.samples(self.name)
            if len(keys) != len(samples):
                raise ValueError(f"{len(keys)} port keys for {len(samples)} samples")
            snap.ports.update(zip(keys, samples, strict=True))
            return snap

    async def close(self) -> None:
        return None
