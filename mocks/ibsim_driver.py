"""Drive ibsim from the same FabricModel + ScenarioPlayer the in-process mock uses.

The in-process mock (``ibmon.sources.mock``) and the sysfs renderer show a scenario to ibmon's
own code; this driver shows it to the *real* tools (perfquery, ibnetdiscover, iblinkinfo, and
ibmon's ``mad`` source through libibmad), by pushing the model's state into ibsim after every
step of the simulated clock:

- every counter value that changed since the last push becomes one ``PerformanceSet`` console
  line. The four data/packet counters exist twice in the PMA: a 32-bit copy in PortCounters
  (set to the model's value saturated at 2**32-1, as real hardware does) and the 64-bit copy in
  PortCountersExtended (the model's value), so ``perfquery`` and ``perfquery -x`` both show what
  the model says. Unicast/multicast packets exist only in PortCountersExtended, error counters
  only in PortCounters (the model saturates them at their catalogue width), PortXmitWait in
  PortCounters' 32-bit field (ibsim has no 64-bit copy; the model counts in the unit of each
  node's device family, which the net file gives ibsim as NodeInfo.DeviceID, and the 32-bit copy
  is saturated at 2**32-1: a congested 4X EDR port at 8 bytes a count fills it in seconds), and
  the error and
  discard details in PortRcvErrorDetails / PortXmitDiscardDetails (the model raises a detail
  counter with its aggregate, so ibsim's details add up the way a real PMA's do);
- a link the model took down becomes ``Unlink`` (on its switch end) and one it brought back
  ``ReLink``, each followed by an opensm resweep, as a subnet manager reacts to a trap in a real
  fabric. ibsim's Unlink does not bump LinkDownedCounter: the model's own increment reaches
  ibsim as an ordinary counter change.

Not expressible through ibsim's console: a degraded link (no command retrains a live link at a
lower width or speed); the model changes it, ibsim keeps the net file's rate. ibsim 0.10 accepts
``PortCountersExtended.PortMultiCastRcvPkts`` but always answers 0 for it (observed with
perfquery -x), so multicast_receive_packets reads 0 whatever the model says.

ibsim itself adds 72 words and one packet to the data/packet counters of every port a MAD
crosses (sim_mad.c), including the pollers' own queries: between two pushes those counters run
ahead of the model by that much. Every push overwrites them with the model's value, so the error
never accumulates and the model's (much larger) per-step traffic keeps the counters monotonic.

``MadSourceProcess`` runs ibmon's ``mad`` source in a child process with the simulator's
environment (``LD_PRELOAD`` of libumad2sim cannot be applied to a running interpreter) and
behaves as a ``Source`` in this process: tests poll it like any other source.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from array import array
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from ibmon.infiniband.counters import DETAIL_ATTRIBUTES
from ibmon.infiniband.model import (
    LinkInfo,
    PortIdentity,
    PortSample,
    Snapshot,
    SourceError,
    Topology,
)
from ibmon.infiniband.xmitwait import WaitUnit
from ibmon.track.totals import packed_counters
from mocks.ibsim import MAX_CONSOLE_LINE, IbSim, IbSimError, ibsim_field
from mocks.scenario import Scenario, ScenarioPlayer, SimClock, build_fabric, load_scenario
from mocks.topology import Fabric, to_ibsim_netfile
from mocks.traffic import COUNTER_NAMES, FabricModel

__all__ = [
    "IbSimDriver",
    "MadSourceProcess",
    "PushStats",
    "ibsim_node_id",
    "run_ibsim",
    "snapshot_from_json",
    "snapshot_to_json",
    "topology_from_json",
    "topology_to_json",
]

_MAX32 = (1 << 32) - 1
_MAX64 = (1 << 64) - 1
# ibsim 0.10 spells the multicast fields with a capital C.
_MC_X, _MC_R = "PortMultiCastXmitPkts", "PortMultiCastRcvPkts"

#: catalogue counter -> the ibsim fields that hold it, each with the value it saturates at.
_FIELDS: dict[str, tuple[tuple[str, int], ...]] = {
    "transmit_data": (("PortCountersExtended.PortXmitData", _MAX64),
                      ("PortCounters.PortXmitData", _MAX32)),
    "receive_data": (("PortCountersExtended.PortRcvData", _MAX64),
                     ("PortCounters.PortRcvData", _MAX32)),
    "transmit_packets": (("PortCountersExtended.PortXmitPkts", _MAX64),
                         ("PortCounters.PortXmitPkts", _MAX32)),
    "receive_packets": (("PortCountersExtended.PortRcvPkts", _MAX64),
                        ("PortCounters.PortRcvPkts", _MAX32)),
    "unicast_transmit_packets": (("PortCountersExtended.PortUnicastXmitPkts", _MAX64),),
    "unicast_receive_packets": (("PortCountersExtended.PortUnicastRcvPkts", _MAX64),),
    "multicast_transmit_packets": ((f"PortCountersExtended.{_MC_X}", _MAX64),),
    "multicast_receive_packets": ((f"PortCountersExtended.{_MC_R}", _MAX64),),
    "symbol_errors": (("PortCounters.SymbolErrorCounter", _MAX64),),
    "link_error_recovery": (("PortCounters.LinkErrorRecoveryCounter", _MAX64),),
    "link_downed": (("PortCounters.LinkDownedCounter", _MAX64),),
    "receive_errors": (("PortCounters.PortRcvErrors", _MAX64),),
    "receive_remote_physical_errors": (("PortCounters.PortRcvRemotePhysicalErrors", _MAX64),),
    "receive_switch_relay_errors": (("PortCounters.PortRcvSwitchRelayErrors", _MAX64),),
    "transmit_discards": (("PortCounters.PortXmitDiscards", _MAX64),),
    "transmit_constraint_errors": (("PortCounters.PortXmitConstraintErrors", _MAX64),),
    "receive_constraint_errors": (("PortCounters.PortRcvConstraintErrors", _MAX64),),
    "local_link_integrity_errors": (("PortCounters.LocalLinkIntegrityErrors", _MAX64),),
    "excessive_buffer_overrun_errors": (("PortCounters.ExcessiveBufferOverrunErrors", _MAX64),),
    "vl15_dropped": (("PortCounters.VL15Dropped", _MAX64),),
    # ibsim's PMA has only the 32-bit field (no CapMask2 64-bit copy): the model's count,
    # saturated there as a real 32-bit PortXmitWait is
    "transmit_wait": (("PortCounters.PortXmitWait", _MAX32),),
    # qp1_dropped: ibsim has no settable field for it (perfquery shows VL15Dropped's slot).
    # The error and discard details (16-bit, saturated by the model like every narrow field).
    **{
        spec.name: ((f"{attr}.{ibsim_field(spec.pma)}", _MAX64),)
        for attr, specs in DETAIL_ATTRIBUTES.items()
        for spec in specs
    },
}
#: Per catalogue index (COUNTER_NAMES order): the fields to set, empty when ibsim has none.
_PLAN: tuple[tuple[tuple[str, int], ...], ...] = tuple(_FIELDS.get(n, ()) for n in COUNTER_NAMES)


def ibsim_node_id(fabric: Fabric, guid: str) -> str:
    """The node id ``to_ibsim_netfile`` gave the node (what console commands name)."""
    return ("S-" if fabric.nodes[guid].kind == "switch" else "H-") + guid[2:]


@dataclass(slots=True)
class PushStats:
    """What one push sent to ibsim and how long it took (wall seconds)."""

    lines: int = 0
    unlinks: int = 0
    relinks: int = 0
    seconds: float = 0.0


class IbSimDriver:
    """Keeps one running ``IbSim`` in step with a ``FabricModel`` (see module docstring).

    ``ports`` limits counter pushes to those model keys (a test that looks at a few ports of a
    big fabric saves the console lines of the others); link changes are always pushed. The
    driver does not own ``sim`` unless built by ``start``.
    """

    def __init__(
        self,
        sim: IbSim,
        model: FabricModel,
        player: ScenarioPlayer | None = None,
        *,
        ports: Iterable[tuple[str, int]] | None = None,
        resweep: bool = True,
    ) -> None:
        self.sim = sim
        self.model = model
        self.player = player
        self.resweep = resweep
        self._owns_sim = False
        fabric = model.fabric
        self._indices = (
            list(range(len(model.keys)))
            if ports is None
            else sorted({model.port_index(k) for k in ports})
        )
        self._prefix: list[str] = []
        longest = max(len(f) for fields in _PLAN for f, _ in fields) + 1 + 20  # "=" + 2**64-1
        for guid, port in model.keys:
            target = f'"{ibsim_node_id(fabric, guid)}"[{port}]'
            self._prefix.append(f"PerformanceSet {target} ")
            if len(self._prefix[-1]) + longest > MAX_CONSOLE_LINE:
                raise ValueError(f"node id of {guid} makes console lines too long")
        self._pushed: dict[int, array[int]] = {}
        self._up: list[bool] = [True] * len(model.links)  # ibsim starts with every link up
        self._link_end: list[tuple[str, int]] = []
        for lk in model.links:
            end = lk.a if fabric.nodes[lk.a[0]].kind == "switch" else lk.b
            self._link_end.append((ibsim_node_id(fabric, end[0]), end[1]))
        self.pushes = 0

    # ------------------------------------------------------------------ construction

    @classmethod
    def start(
        cls,
        scenario: str | Scenario,
        *,
        hosts: int | None = None,
        seed: int | None = None,
        ports: Iterable[tuple[str, int]] | None = None,
        fabric: Fabric | None = None,
        **sim_kw: Any,
    ) -> IbSimDriver:
        """Start ibsim + opensm for the scenario's topology and push the model's t=0 state."""
        sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
        fab = fabric or build_fabric(sc, hosts=hosts)
        model = FabricModel(fab, seed=sc.seed if seed is None else seed, load=sc.load)
        player = ScenarioPlayer(sc, model)
        sim = IbSim(to_ibsim_netfile(fab), **sim_kw).start()
        try:
            drv = cls(sim, model, player, ports=ports)
            drv._owns_sim = True
            drv.push()
        except BaseException:
            sim.stop()
            raise
        return drv

    def stop(self) -> None:
        if self._owns_sim:
            self.sim.stop()

    def __enter__(self) -> IbSimDriver:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ stepping

    def step_to(self, t: float) -> PushStats:
        """Play the scenario (or just the model) to simulated time ``t`` and push the result."""
        if self.player is not None:
            self.player.run_until(t)
        else:
            self.model.advance_to(t)
        return self.push()

    def counter_lines(self) -> list[str]:
        """PerformanceSet lines for every driven counter that changed since the last push."""
        row = self.model.row
        pushed = self._pushed
        prefix = self._prefix
        lines: list[str] = []
        add = lines.append
        for i in self._indices:
            cur = row(i)
            last = pushed.get(i)
            if last is not None and last == cur:
                continue
            pre = prefix[i]
            for ci, fields in enumerate(_PLAN):
                v = cur[ci]
                if last is not None and last[ci] == v:
                    continue
                for name, cap in fields:
                    w = v if v < cap else cap
                    if last is not None and cap != _MAX64 and min(last[ci], cap) == w:
                        continue  # the saturated 32-bit copy did not move
                    add(f"{pre}{name}={w}")
            pushed[i] = cur  # a copy already
        return lines

    def push(self) -> PushStats:
        """Send link changes, then changed counters; resweep opensm after link changes."""
        t0 = time.perf_counter()
        stats = PushStats()
        sim = self.sim
        up = self.model.up
        for li, now_up in enumerate(up):
            if now_up == self._up[li]:
                continue
            node, port = self._link_end[li]
            if now_up:
                sim.relink(node, port)
                stats.relinks += 1
            else:
                sim.unlink(node, port)
                stats.unlinks += 1
            self._up[li] = now_up
        lines = self.counter_lines()
        if lines:
            answer = sim.console(lines)
            ok = answer.count("has been set to")
            if ok != len(lines):
                raise IbSimError(
                    f"PerformanceSet failed ({ok}/{len(lines)} applied): {answer[-500:]}"
                )
        if self.resweep and (stats.unlinks or stats.relinks):
            sim.resweep()
        stats.lines = len(lines)
        stats.seconds = time.perf_counter() - t0
        self.pushes += 1
        return stats


# ---------------------------------------------------------------------------------------------
# The CLI loop


async def run_ibsim(
    scenario: str,
    *,
    speed: float = 1.0,
    hosts: int | None = None,
    interval: float = 1.0,
    clock: Callable[[], float] | None = None,
    stop: asyncio.Event | None = None,
    on_ready: Callable[[IbSimDriver], None] | None = None,
    on_step: Callable[[IbSimDriver, PushStats], None] | None = None,
) -> None:
    """Start the fabric, then push the model every ``interval`` real seconds until ``stop`` is
    set or the task is cancelled (Ctrl-C); simulated time runs ``speed`` times faster."""
    drv = await asyncio.to_thread(IbSimDriver.start, scenario, hosts=hosts)
    try:
        if on_ready is not None:
            on_ready(drv)
        tick = clock or SimClock(speed)
        stop = stop or asyncio.Event()
        while True:
            stats = await asyncio.to_thread(drv.step_to, tick())
            if on_step is not None:
                on_step(drv, stats)
            try:
                async with asyncio.timeout(interval):
                    await stop.wait()
            except TimeoutError:
                continue
            return
    finally:
        await asyncio.to_thread(drv.stop)


# ---------------------------------------------------------------------------------------------
# The mad source in a child process


def topology_to_json(t: Topology) -> dict[str, Any]:
    return {
        "source": t.source,
        "ports": [[g, p, asdict(v)] for (g, p), v in t.ports.items()],
        "links": [[g, p, asdict(v)] for (g, p), v in t.links.items()],
    }


def _identity_from_json(d: Mapping[str, Any]) -> PortIdentity:
    """A ``PortIdentity`` from ``asdict``'s dict (its PortXmitWait unit a dict as well)."""
    fields = dict(d)
    unit = fields.get("xmit_wait")
    if isinstance(unit, Mapping):
        fields["xmit_wait"] = WaitUnit(**unit)
    return PortIdentity(**fields)


def topology_from_json(d: Mapping[str, Any]) -> Topology:
    topo = Topology(source=d["source"])
    for g, p, v in d["ports"]:
        topo.ports[(g, p)] = _identity_from_json(v)
    for g, p, v in d["links"]:
        topo.links[(g, p)] = LinkInfo(**v)
    return topo


def snapshot_to_json(s: Snapshot) -> dict[str, Any]:
    ports = []
    for (g, p), v in s.ports.items():
        d = asdict(v)
        d["counters"] = dict(v.counters.items())  # packed by the source: a dict for JSON
        d["wide"] = sorted(v.wide)
        ports.append([g, p, d])
    return {
        "source": s.source,
        "monotonic": s.monotonic,
        "wall": s.wall,
        "ports": ports,
        "errors": [[e.reason, e.detail, list(e.key) if e.key else None] for e in s.errors],
    }


def snapshot_from_json(d: Mapping[str, Any]) -> Snapshot:
    snap = Snapshot(source=d["source"], monotonic=d["monotonic"], wall=d["wall"])
    for g, p, v in d["ports"]:
        link = v.pop("link")
        ident = v.pop("identity")
        snap.ports[(g, p)] = PortSample(
            identity=_identity_from_json(ident),
            link=LinkInfo(**link) if link is not None else None,
            counters=packed_counters(v.pop("counters")),  # as the source made them
            wide=frozenset(v.pop("wide")),
            **v,
        )
    for reason, detail, key in d["errors"]:
        snap.errors.append(SourceError(reason, detail, tuple(key) if key else None))
    return snap


_REPLY = "@@ibmon-mad "


async def _child_main(opts: Mapping[str, Any]) -> None:
    """Serve discover/sample requests from stdin with a MadSource (runs under LD_PRELOAD)."""
    from ibmon.sources.mad import MadSource

    src = MadSource(**opts)
    loop = asyncio.get_running_loop()
    try:
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            op = line.strip()
            if not op or op == "close":
                return
            try:
                if op == "discover":
                    out: dict[str, Any] = {"topology": topology_to_json(await src.discover())}
                elif op == "sample":
                    out = {"snapshot": snapshot_to_json(await src.sample())}
                else:
                    out = {"error": f"unknown op {op!r}"}
            except Exception as exc:  # reported to the parent, which raises it there
                out = {"error": f"{type(exc).__name__}: {exc}"}
            sys.stdout.write(_REPLY + json.dumps(out) + "\n")
            sys.stdout.flush()
    finally:
        await src.close()


class MadSourceProcess:
    """ibmon's ``mad`` source, running in a child with the simulator's environment.

    A ``Source`` for this process: ``discover``/``sample`` forward to the child's MadSource and
    decode its Topology/Snapshot. Keyword arguments go to ``MadSource``.
    """

    def __init__(self, sim: IbSim, *, name: str = "mad", call_timeout: float = 120.0,
                 **source: Any) -> None:
        self.name = name
        self._timeout = call_timeout
        repo = str(Path(__file__).resolve().parents[1])
        env = sim.tool_env()
        env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH")) if p)
        self._stderr = open(sim.workdir / f"mad-child-{id(self)}.log", "w+b")  # noqa: SIM115
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "mocks.ibsim_driver", "--mad-child",
             json.dumps({"name": name, **source})],
            env=env,
            cwd=sim.workdir,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            start_new_session=True,
        )
        self._lock = asyncio.Lock()

    def _call_sync(self, op: str) -> dict[str, Any]:
        proc = self._proc
        assert proc.stdin is not None
        assert proc.stdout is not None
        proc.stdin.write(op.encode() + b"\n")
        proc.stdin.flush()
        while True:
            line = proc.stdout.readline()
            if not line:
                self._stderr.seek(0)
                tail = self._stderr.read().decode("utf-8", "replace")[-2000:]
                raise RuntimeError(f"mad child exited ({proc.poll()}): {tail}")
            text = line.decode("utf-8", "replace")
            if text.startswith(_REPLY):
                out: dict[str, Any] = json.loads(text[len(_REPLY):])
                if "error" in out:
                    raise RuntimeError(f"mad child: {out['error']}")
                return out

    async def _call(self, op: str) -> dict[str, Any]:
        async with self._lock:
            async with asyncio.timeout(self._timeout):
                return await asyncio.to_thread(self._call_sync, op)

    async def discover(self) -> Topology:
        return topology_from_json((await self._call("discover"))["topology"])

    async def sample(self) -> Snapshot:
        return snapshot_from_json((await self._call("sample"))["snapshot"])

    def close_sync(self) -> None:
        proc = self._proc
        if proc.poll() is None and proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.write(b"close\n")
                proc.stdin.flush()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
                proc.wait(timeout=5)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self._stderr.close()

    async def close(self) -> None:
        await asyncio.to_thread(self.close_sync)


if __name__ == "__main__":  # pragma: no cover - the child side of MadSourceProcess
    if len(sys.argv) == 3 and sys.argv[1] == "--mad-child":
        asyncio.run(_child_main(json.loads(sys.argv[2])))
    else:
        sys.exit("usage: python -m mocks.ibsim_driver --mad-child JSON")
