"""The ``mad`` source: in-process MADs through rdma-core's libibmad (ctypes, no extension).

Topology is a directed-route SMP sweep from the local port, breadth first, one batch of MADs
per hop level: NodeInfo for every neighbour, then NodeDescription and PortInfo (every switch
port, the CA ports we arrived on) for every new node. Counters are LID-routed PMA Gets:
ClassPortInfo once per LID per topology refresh (its CapMask/CapMask2 say which fields are
valid), then PortCountersExtended and, when the 64-bit error copies are missing, PortCounters
for every port. The same decoding and the same rules as the ``diags`` source (``parse`` and
``fabric`` modules) make both report identical topologies and snapshots.

Each port's PortXmitWait unit (``fabric.WaitUnits``) is decided by the discovery: from its
node's NodeInfo.DeviceID when that is a documented ASIC family, else from a PortSamplesControl
Get (PMA attribute 0x10, PortSelect = port) whose Tick decides. Only ports of other devices are
asked, one Get each, in the discovery's last batch (below), except at the master SM's LID
(``fabric.WaitUnits``: ibsim hands that Get to opensm, which exits): a PMA that refuses or
drops it (ibsim answers it with status 110 at once, so its retries cost round trips, not
timeouts) leaves the port with its last Tick's unit or the default, and costs no error.

The discovery's last batch is the first poll's reads: as its sweep ends it sends ClassPortInfo
for every LID and then both counter attributes of every port (which ones a port has is known
only from its ClassPortInfo; the answers to the other are dropped, at most one spare MAD per
port and discovery), and the worker sends them while this thread builds the view. The poll that
directly follows the discovery (within ``DISCOVERY_STATE_FRESH``, as the daemon's does) takes
those counters and their time, and sends only its detail reads.

Forwarding tables (``forwarding_tables``, off by default; ``Topology.forwarding``): the sweep
asks every new switch's SwitchInfo in its NodeDescription batch, and the discovery's last batch
carries LinearForwardingTable Gets (LID-routed, attribute modifier = block) for blocks
0..LinearFDBTop/64 of every swept switch, read after the counters: MADs, no extra round trip.
A switch whose SwitchInfo or any block is lost is left out, with a SourceError (the routes keep
its previous table: ``ibmon.jobs.routes.ForwardingTables``).

Error and discard details (PortRcvErrorDetails, PortXmitDiscardDetails) follow
``fabric.DetailReads``: baselines of new ports and re-reads of failed reads go out in the poll's
MAD batch; once the counters are decoded, the ports whose PortRcvErrors or PortXmitDiscards moved
get their detail Gets in one more, small batch (sent as a one-off, so the next poll's batch is
still the worker's ``again``). A healthy fabric's poll sends not one MAD more. A detail Get
answered with an error status means the port does not support the attribute.

Port state is refreshed on every poll (``state_interval`` 0, the default), not only at discovery:
a LID-routed SMP PortInfo per port (attribute modifier = port number) goes out in the same MAD
batch as the PMA Gets, so a port that goes down is seen at the next poll instead of the next
topology refresh (5 min), and a link that retrains narrower or slower shows its new active width
and speed. It costs one more MAD per port, sent in the same window, so its timeouts overlap the
PMA ones (measured in benchmarks/README.md). Peers and links still change only at discovery.
The poll that directly follows a discovery (the daemon samples right after each one) skips it:
the sweep read every PortInfo less than a second before.

FDR10 hides behind QDR in PortInfo: a port of a device that has Mellanox's ExtendedPortInfo
(``parse.has_mlnx_ext_port_info``) which is LinkUp at QDR with no extended speed
(``parse.may_be_fdr10``) is asked that attribute too, after the sweep and after each state
refresh, in a batch of its own (none on a fabric without such ports). An unanswered one leaves
the port as it was (``FabricView.refresh_port``).

The umad port lives in a worker process (``madworker``: one ``MadEngine`` on one umad port),
which keeps ``window`` MADs in flight (``concurrency``); building the requests and decoding the
answers happens here, on one thread bridged to asyncio with ``run_in_executor``. The worker
streams a big batch's answers in parts, and this thread decodes each part while the worker is
still sending the rest (``_results``), so a sweep costs about the MADs' time, not that plus
the decoding. A MAD that is not answered within ``timeout`` is retried ``retries`` times and
then reported as a SourceError with reason "timeout" for that port only: a dead switch costs
its own ports one timeout, never the sweep.

The source heals its own MAD port, without a reload: when a poll is cancelled (the daemon's poll
timeout: a frozen fabric) its worker is killed at once, so the thread waiting on it is free and
the next poll runs on time with a fresh worker; when sends fail (the device went away, or under
ibsim the simulator died) or the worker dies, the worker is closed and a new one opens the port
again on the next poll, after a backoff (``REOPEN_BACKOFF``: 0 s, then 1, 2, 4 ... up to 30 s
while it keeps failing; reset by the first batch that gets an answer). A worker that is still
opening (ibsim's client waits for its simulator) is waited for ``OPEN_WAIT`` seconds per poll,
then the poll fails and the worker keeps trying in the background, for up to ``OPEN_GIVE_UP``.

One umad port is enough: the window, not the number of ports, gives the concurrency (and
under ibsim, umad2sim routes responses by management class to one file descriptor per process,
so a second port in one daemon would not work there).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import os
import time
from collections.abc import Callable, Container, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import structlog
from pydantic import Field

from ibmon.infiniband.model import PortKey, Snapshot, SourceError, Topology
from ibmon.runtime.gcpause import paused_gc
from ibmon.sources.fabric import (
    DETAIL_BASELINES_PER_POLL,
    DISCOVERY_STATE_FRESH,
    DetailRead,
    FabricSource,
    FabricSourceConfig,
    FabricView,
    TickOutcome,
    WaitUnits,
)
from ibmon.sources.libibmad import (
    ATTR_CLASS_PORT_INFO,
    ATTR_LINEAR_FWD_TBL,
    ATTR_MLNX_EXT_PORT_INFO,
    ATTR_NODE_DESC,
    ATTR_NODE_INFO,
    ATTR_PORT_COUNTERS,
    ATTR_PORT_COUNTERS_EXT,
    ATTR_PORT_INFO,
    ATTR_PORT_RCV_ERROR_DETAILS,
    ATTR_PORT_SAMPLES_CONTROL,
    ATTR_PORT_XMIT_DISCARD_DETAILS,
    ATTR_SWITCH_INFO,
    CLASS_PMA,
    CLASS_SMI,
    MadError,
    MadRequest,
    MadResult,
)
from ibmon.sources.madworker import MadWorker
from ibmon.sources.parse import (
    CPI_CAP2_ADDL_EXT,
    CPI_CAP_EXT_WIDTH,
    CPI_CAP_EXT_WIDTH_NOIETF,
    ClassPortInfo,
    NodeInfo,
    ParseError,
    PortCounterValues,
    PortInfo,
    decode_class_port_info,
    decode_counters,
    decode_details,
    decode_node_desc,
    decode_node_info,
    decode_port_info,
    decode_samples_control_tick,
    has_mlnx_ext_port_info,
    may_be_fdr10,
    with_mlnx_speeds,
)

__all__ = ["Config", "MadSource", "MadSourceConfig", "SweepResult", "build"]


class MadSourceConfig(FabricSourceConfig):
    """``type = "mad"``: the whole fabric over in-process MADs."""

    type: Literal["mad"] = "mad"
    # MADs in flight at once (the libibumad window); cheap in-process, unlike diags' processes.
    concurrency: int = Field(default=64, ge=1, le=256)
    #: read every switch's LinearForwardingTable at discovery (``Topology.forwarding``: job
    #: attribution by route); on by default with a ``[slurm]``
    #: section (``Settings``); off, attribution falls back to leaf spans
    forwarding_tables: bool = False


Config = MadSourceConfig


def build(cfg: MadSourceConfig) -> MadSource:
    return MadSource.from_config(cfg)

log = structlog.get_logger("ibmon.sources.mad")

_MAX_HOPS = 63
#: Per poll, how long a worker that is still opening its port is waited for.
OPEN_WAIT = 5.0
#: A worker that has not opened its port after this long is killed and started again.
OPEN_GIVE_UP = 60.0
#: Delays before reopening a MAD port that failed again: first reopen at once, then these.
REOPEN_BACKOFF = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
#: PMA attribute id of each detail attribute.
_DETAIL_ATTR_ID = {
    "PortRcvErrorDetails": ATTR_PORT_RCV_ERROR_DETAILS,
    "PortXmitDiscardDetails": ATTR_PORT_XMIT_DISCARD_DETAILS,
}


@dataclass(slots=True)
class _Node:
    info: NodeInfo
    path: tuple[int, ...]
    desc: str = ""
    ports: dict[int, PortInfo] = field(default_factory=dict)
    #: a switch's SwitchInfo.LinearFDBTop (None: not read), which bounds its table's blocks
    fdb_top: int | None = None


#: ``_describe``'s target "port" for a switch's SwitchInfo (NodeDescription is None).
_SWITCH_INFO = -1
#: LIDs a LinearForwardingTable block holds (one byte, the egress port, per LID).
LFT_BLOCK = 64
#: The last unicast LID (IB_MAX_UCAST_LID): a LinearFDBTop above it is not believed.
_MAX_UCAST_LID = 0xBFFF


#: ``bytes.translate`` tables by switch port count: a port past it becomes 0xff (no route).
_PORT_OR_NONE = [bytes(v if v <= n else 0xFF for v in range(256)) for n in range(256)]


def _fdb_top(data: bytes) -> int:
    """SwitchInfo.LinearFDBTop: bits 48-63, big-endian (libibmad fields.c ``LinearFdbTop``)."""
    return int.from_bytes(data[6:8], "big")


#: The counter attributes of a port, in the order a port's Gets go out, by the name
#: ``decode_counters`` takes them under.
_COUNTER_ATTRS = (("ext", ATTR_PORT_COUNTERS_EXT), ("narrow", ATTR_PORT_COUNTERS))


def _kinds(cpi: ClassPortInfo) -> tuple[str, ...]:
    """Which counter attributes a port behind ``cpi`` is read with: PortCountersExtended when
    it has it, PortCounters when it has no extended set or no 64-bit error copies (CapMask2
    bit 1)."""
    ext = bool(cpi.cap_mask & (CPI_CAP_EXT_WIDTH | CPI_CAP_EXT_WIDTH_NOIETF))
    if not ext:
        return ("narrow",)
    return ("ext",) if cpi.cap_mask2 & CPI_CAP2_ADDL_EXT else ("ext", "narrow")


@dataclass(slots=True)
class _FirstSweep:
    """The counters a discovery read for the poll that follows it (``MadSource.discover``)."""

    monotonic: float  # when its batch went out: the poll's sample time
    wall: float
    done: float = 0.0  # when its answers were all in
    asked: dict[PortKey, int] = field(default_factory=dict)  # port -> the LID it was read at
    values: dict[PortKey, PortCounterValues] = field(default_factory=dict)
    failed: dict[PortKey, SourceError] = field(default_factory=dict)


#: ClassPortInfo masks by LID, and why by LID for the LIDs that did not answer.
_Learned = tuple[dict[int, ClassPortInfo], dict[int, str]]
#: A node reached in a sweep round: its NodeInfo, the directed route to it, the port entered by.
_Arrival = tuple[NodeInfo, tuple[int, ...], int]


@dataclass(slots=True)
class SweepResult:
    """Raw result of a DR sweep: nodes by GUID, links by (guid, port) both ways, failures."""

    nodes: dict[str, _Node] = field(default_factory=dict)
    links: dict[tuple[str, int], tuple[str, int]] = field(default_factory=dict)
    errors: list[SourceError] = field(default_factory=list)
    mads: int = 0


class MadSource(FabricSource):
    """Fabric-wide source over in-process MADs (see module docstring)."""

    def __init__(
        self,
        *,
        name: str = "mad",
        ca: str | None = None,
        port: int | None = None,
        timeout: float = 1.0,
        retries: int = 2,
        window: int = 64,
        include: Sequence[str] = (),
        exclude: Sequence[str] = (),
        shard: str | None = None,
        node_name_map: str | os.PathLike[str] | None = None,
        state_interval: float = 0.0,
        topology_interval: float = 300.0,
        unreachable_discoveries: int = 3,
        details: bool = True,
        detail_baselines_per_poll: int = DETAIL_BASELINES_PER_POLL,
        forwarding_tables: bool = False,
    ) -> None:
        super().__init__(
            name=name,
            include=include,
            exclude=exclude,
            shard=shard,
            node_name_map=node_name_map,
            state_interval=state_interval,
            topology_interval=topology_interval,
            unreachable_discoveries=unreachable_discoveries,
            details=details,
            detail_baselines_per_poll=detail_baselines_per_poll,
        )
        self._ca = ca
        self._port = port or 0
        self._timeout = timeout
        self._retries = retries
        self._window = window
        #: read every switch's LinearForwardingTable at discovery (``Topology.forwarding``)
        self._tables = forwarding_tables
        # One thread: batches (and the view they update) are handled strictly one at a time.
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="ibmon-mad"
        )
        self._worker: MadWorker | None = None
        #: Workers killed or closed that have not exited yet: while one lives, none is started.
        self._dying: list[MadWorker] = []
        #: Why the worker must be replaced before the next batch (sends failed, it died...).
        self._broken: str | None = None
        self._reopen_at = 0.0
        self._failures = 0  # consecutive reopen attempts that did not end in an answered batch
        self._cpi: dict[int, ClassPortInfo] = {}
        #: LIDs whose ClassPortInfo the last discovery asked in vain, and why (the next poll's)
        self._cpi_failed: dict[int, str] = {}
        #: the counters the last discovery read, until the poll that follows it takes them
        self._first: _FirstSweep | None = None
        #: nodes whose device answers ExtendedPortInfo, asked for FDR10 (``may_be_fdr10``)
        self._epi_nodes: frozenset[str] = frozenset()
        self.last_sweep_mads = 0
        #: of ``last_sweep_mads``, the detail Gets (PortRcvErrorDetails, PortXmitDiscardDetails)
        self.last_detail_mads = 0

    @classmethod
    def from_config(cls, cfg: MadSourceConfig) -> MadSource:
        return cls(
            name=cfg.label,
            ca=cfg.ca,
            port=cfg.port,
            timeout=cfg.timeout,
            retries=cfg.retries,
            window=cfg.concurrency,
            include=cfg.include,
            exclude=cfg.exclude,
            shard=cfg.shard,
            state_interval=cfg.state_interval if cfg.state_interval is not None else 0.0,
            topology_interval=cfg.topology_interval,
            unreachable_discoveries=cfg.unreachable_discoveries,
            forwarding_tables=cfg.forwarding_tables,
        )

    # ------------------------------------------------------------------ MAD plumbing

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the MAD workers (alive or not yet reaped), for tests and logs."""
        live = [self._worker] if self._worker is not None else []
        return [w.pid for w in live + self._dying]

    async def _ensure_worker(self) -> None:
        """A worker that has opened its port, or MadError saying why there is none yet.

        Runs on the event loop's thread (a worker must be forked there: see ``madworker``).
        """
        if self._broken is not None:
            why, self._broken = self._broken, None
            await self._retire(why)
        await self._reap_dying()
        if self._dying:
            pids = ", ".join(str(w.pid) for w in self._dying)
            raise MadError(
                f"the previous MAD worker (pid {pids}) does not exit; not opening the MAD port "
                "a second time while it may still hold it"
            )
        now = time.monotonic()
        worker = self._worker
        if worker is None:
            if now < self._reopen_at:
                raise MadError(f"MAD port closed; reopening in {self._reopen_at - now:.1f}s")
            try:
                worker = self._worker = MadWorker(
                    ca=self._ca, port=self._port, timeout=self._timeout,
                    retries=self._retries, window=self._window)
            except OSError as exc:
                await self._retire(f"cannot start the MAD worker: {exc}")
                raise MadError(f"cannot start the MAD worker: {exc}") from None
        if worker.ready:
            return
        try:
            ready = await self._in_thread(worker.wait_ready, OPEN_WAIT, kill_on_cancel=False)
        except MadError as exc:  # it could not open the port: the reason is the message
            await self._retire(str(exc))
            raise
        if not ready:
            waited = time.monotonic() - worker.started
            if waited > OPEN_GIVE_UP:
                await self._retire(f"the MAD port did not open within {OPEN_GIVE_UP:.0f}s")
            raise MadError(f"MAD port not open yet after {waited:.0f}s (still trying)")

    async def _retire(self, why: str) -> None:
        """Close the worker (it ends; under ibsim it detaches) and schedule the reopen."""
        worker, self._worker = self._worker, None
        if worker is not None:
            if worker.ready:  # a port that could not open is the poll's error
                log.warning("mad_port_closed", source=self.name, reason=why, pid=worker.pid)
            self._dying.append(worker)
        delay = 0.0 if self._failures == 0 else REOPEN_BACKOFF[
            min(self._failures - 1, len(REOPEN_BACKOFF) - 1)]
        self._failures += 1
        self._reopen_at = time.monotonic() + delay
        await self._reap_dying()

    async def _reap_dying(self, grace: float = 0.5) -> None:
        """Wait (off the loop) for closed or killed workers to exit; keep those that do not."""
        if not self._dying:
            return
        dying = self._dying
        gone = await asyncio.gather(*(asyncio.to_thread(w.close, grace, 2.0 * grace)
                                      for w in dying))
        self._dying = [w for w, ok in zip(dying, gone, strict=True) if not ok]

    def _kill_worker(self, why: str) -> None:
        """Kill the worker now (any thread): whatever waits on it gives up at once."""
        worker = self._worker
        if worker is not None:
            worker.kill()
            self._broken = why

    def _run_sync(self, reqs: Sequence[MadRequest], *, keep: bool = True) -> list[MadResult]:
        """Blocking: the results of ``reqs``. ``keep=False``: a one-off batch, which does not
        replace the batch the worker repeats on ``again``."""
        return list(self._results(reqs, keep=keep))

    def _results(self, reqs: Sequence[MadRequest], *, keep: bool = True) -> Iterator[MadResult]:
        """Blocking: send ``reqs`` now; the iterator returned gives their results in request
        order, each as soon as the worker has sent the part it is in, so the caller decodes the
        first answers while later MADs are still in flight (a cold start's batches are bound by
        the worker's send loop on one CPU and this thread's decoding on the other), or does
        other work before it reads any. Read it to the end before the next batch: a caller that
        stops early (it raised) leaves answers in the worker's pipe, so the worker is
        replaced."""
        worker = self._worker  # this one: a verdict on it must not hit its successor
        if worker is None or not worker.ready:
            raise MadError("MAD port not open")
        if not reqs:  # nothing to ask (the sweep's last round): no round trip to the worker
            return iter(())
        try:
            worker.send(reqs, keep=keep)
        except MadError as exc:
            if self._worker is worker:
                self._broken = str(exc)
            raise
        return self._answers(worker)

    def _answers(self, worker: MadWorker) -> Iterator[MadResult]:
        """The results of the batch ``worker`` was sent, one by one; the verdict on the worker
        once all are in."""
        answered = False
        failed = total = 0
        finished = False
        try:
            for part in worker.stream():
                total += len(part)
                for r in part:
                    if r.data is not None:
                        answered = True
                    elif r.error == "send_failed":
                        failed += 1
                yield from part
            finished = True
        except MadError as exc:
            if self._worker is worker:
                self._broken = str(exc)
            raise
        finally:
            if not finished and self._worker is worker and self._broken is None:
                self._broken = "a batch was not read to its end"
        if answered:
            self._failures = 0
        if failed and self._worker is worker:
            self._broken = f"{failed} of {total} MADs could not be sent"

    async def _in_thread(
        self, fn: Callable[..., object], *args: object, kill_on_cancel: bool = True
    ) -> object:
        """``fn(*args)`` on the MAD thread. Cancelled (the poll's deadline passed): the worker
        is killed, so the thread stops waiting on it now, not whenever the fabric answers,
        and the next poll starts with a fresh one."""

        def call() -> object:
            with paused_gc():  # the sweep's answers: no collections, frozen after
                return fn(*args)

        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, call)
        except asyncio.CancelledError:
            if kill_on_cancel:
                self._kill_worker("the poll was cancelled (deadline passed) mid-batch")
            raise

    # ------------------------------------------------------------------ discovery

    def sweep_sync(self) -> SweepResult:
        """The directed-route sweep (blocking; runs on the MAD thread), one hop level a round."""
        res = SweepResult()
        first = self._run_sync([MadRequest(CLASS_SMI, ATTR_NODE_INFO, path=())])[0]
        res.mads += 1
        if first.data is None:
            raise MadError(f"local NodeInfo failed: {first.error}")
        local = decode_node_info(first.data)
        new: list[_Arrival] = [(local, (), local.local_port)]
        while new:
            self._describe(res, new)
            new = self._next_level(res, new)
        self._epi_nodes = frozenset(
            guid for guid, node in res.nodes.items()
            if has_mlnx_ext_port_info(node.info.vendor_id, node.info.device_id)
        )
        asks = [(node, p) for guid, node in res.nodes.items() if guid in self._epi_nodes
                for p, pi in node.ports.items() if p and may_be_fdr10(pi)]
        answers = self._run_sync(
            [MadRequest(CLASS_SMI, ATTR_MLNX_EXT_PORT_INFO, attr_mod=p, path=node.path)
             for node, p in asks], keep=False) if asks else []
        res.mads += len(asks)
        for (node, p), r in zip(asks, answers, strict=True):
            if r.data is not None:  # else QDR, as PortInfo says (rdma-core ignores the miss too)
                node.ports[p] = with_mlnx_speeds(node.ports[p], r.data)
        return res

    def _describe(self, res: SweepResult, new: list[_Arrival]) -> None:
        """NodeDescription and PortInfo (every switch port, the CA port arrived on) for the nodes
        and CA ports reached in the last round."""
        reqs: list[MadRequest] = []
        targets: list[tuple[str, int | None]] = []
        for info, path, entry in new:
            node = res.nodes.get(info.node_guid)
            if node is None:
                node = res.nodes[info.node_guid] = _Node(info=info, path=path)
                reqs.append(MadRequest(CLASS_SMI, ATTR_NODE_DESC, path=path))
                targets.append((info.node_guid, None))
                if self._tables and info.node_type == "switch":  # bounds its forwarding table
                    reqs.append(MadRequest(CLASS_SMI, ATTR_SWITCH_INFO, path=path))
                    targets.append((info.node_guid, _SWITCH_INFO))
                ports: list[int] = (
                    list(range(info.num_ports + 1)) if info.node_type == "switch" else [entry]
                )
            else:
                ports = [entry] if entry not in node.ports else []
            for p in ports:
                reqs.append(MadRequest(CLASS_SMI, ATTR_PORT_INFO, attr_mod=p, path=path))
                targets.append((info.node_guid, p))
        results = self._results(reqs)  # decoded as they arrive
        res.mads += len(reqs)
        for (guid, pnum), r in zip(targets, results, strict=True):
            node = res.nodes[guid]
            if r.data is None:
                what = ("NodeDescription" if pnum is None else "SwitchInfo"
                        if pnum == _SWITCH_INFO else f"PortInfo port {pnum}")
                res.errors.append(SourceError(r.error or "timeout", f"{guid}: {what}"))
            elif pnum is None:
                node.desc = decode_node_desc(r.data)
            elif pnum == _SWITCH_INFO:
                node.fdb_top = _fdb_top(r.data)
            else:
                node.ports[pnum] = decode_port_info(r.data)

    def _next_level(self, res: SweepResult, new: list[_Arrival]) -> list[_Arrival]:
        """NodeInfo through every live port of the new switches (and the local CA port): the
        links, and the nodes and CA ports the next round must describe."""
        reqs: list[MadRequest] = []
        hops: list[tuple[str, int, tuple[int, ...]]] = []
        for info, path, entry in new:
            node = res.nodes[info.node_guid]
            if info.node_type == "switch":
                outs = [p for p in range(1, info.num_ports + 1) if p != entry or not path]
            elif not path:
                outs = [entry]
            else:
                continue
            if len(path) >= _MAX_HOPS:
                continue
            for p in outs:
                pi = node.ports.get(p)
                if pi is None or pi.phys_state != 5 or pi.state < 2:
                    continue
                if (info.node_guid, p) in res.links:
                    continue
                reqs.append(MadRequest(CLASS_SMI, ATTR_NODE_INFO, path=(*path, p)))
                hops.append((info.node_guid, p, (*path, p)))
        results = self._results(reqs)  # decoded as they arrive
        res.mads += len(reqs)
        arrivals: list[_Arrival] = []
        # Already in ``arrivals``: a switch by GUID (it is described whole, whichever port it
        # was entered by: a second cable to it adds nothing to ask), a CA port by (GUID, port).
        queued: set[tuple[str, int]] = set()
        for (guid, p, path), r in zip(hops, results, strict=True):
            if r.data is None:
                res.errors.append(
                    SourceError(r.error or "timeout", f"{guid} port {p}: NodeInfo of the peer")
                )
                continue
            peer = decode_node_info(r.data)
            res.links[(guid, p)] = (peer.node_guid, peer.local_port)
            res.links[(peer.node_guid, peer.local_port)] = (guid, p)
            switch = peer.node_type == "switch"
            known = res.nodes.get(peer.node_guid)
            if known is not None and (switch or peer.local_port in known.ports):
                continue
            entered = (peer.node_guid, 0 if switch else peer.local_port)
            if entered not in queued:
                queued.add(entered)
                arrivals.append((peer, path, peer.local_port))
        return arrivals

    def _known_lid(self, guid: str) -> int | None:
        """The LID the current view has for a node (None when it has none)."""
        if self._view is not None:
            for key, fp in self._view.ports.items():
                if key[0] == guid and fp.lid:
                    return fp.lid
        return None

    def _view_from(self, sweep: SweepResult) -> FabricView:
        """The filtered, linked and sharded view of a sweep (on the MAD thread, GC paused)."""
        view = FabricView(source=self.name)
        for guid, node in sweep.nodes.items():
            if not self._filter.keep(guid, node.desc):
                continue
            is_switch = node.info.node_type == "switch"
            switch_lid: int | None = None
            if is_switch:  # every port of a switch answers on the base LID of port 0
                port0 = node.ports.get(0)
                # Port 0's PortInfo lost: the LID it had (a lost MAD must not stop the polls).
                switch_lid = port0.lid if port0 is not None else self._known_lid(guid)
                numbers: list[int] = list(range(1, node.info.num_ports + 1))
            else:
                numbers = sorted(p for p in node.ports if p > 0)
            for p in numbers:
                pi = node.ports.get(p)
                if pi is None:
                    continue
                lid = switch_lid if is_switch else pi.lid
                key, fp = view.add(
                    guid,
                    p,
                    desc=self._desc(guid, node.desc),
                    node_type=node.info.node_type,
                    lid=lid,
                )
                view.apply_port_info(key, pi)
                fp.remote = sweep.links.get((guid, p))
        peer_desc = {g: self._desc(g, n.desc) for g, n in sweep.nodes.items()}
        return self._finish(view, peer_desc)

    async def discover(self) -> Topology:
        await self._ensure_worker()
        started = time.monotonic()
        self._first = None

        def sweep_and_view() -> tuple[
            SweepResult, FabricView, _Learned, int, _FirstSweep, dict[str, bytes]
        ]:
            sweep = self.sweep_sync()
            # The first poll's PMA reads go out now, in one batch: ClassPortInfo per LID, then
            # both counter attributes of every port (which of them a port has is known only
            # once its ClassPortInfo is in; the spare one costs a MAD per port a discovery),
            # then the Tick of every port whose family does not decide its unit.
            # The worker sends them while this thread builds the view (tens of ms at 2,000
            # ports), and the poll that follows the discovery takes the counters from here.
            targets = self._poll_targets(sweep)
            devices = {guid: node.info.device_id for guid, node in sweep.nodes.items()}
            lids = list(targets)
            plan: list[tuple[PortKey, str, MadRequest]] = [
                (key, kind, MadRequest(CLASS_PMA, attr, lid=lid, port_select=int(key[1])))
                for lid, keys in targets.items()
                for key in keys
                for kind, attr in _COUNTER_ATTRS
            ]
            sm_lids = {pi.sm_lid for n in sweep.nodes.values() for pi in n.ports.values()}
            ticks = self._tick_plan(targets, devices, sm_lids)
            blocks = self._table_plan(sweep)
            first = _FirstSweep(time.monotonic(), time.time())
            pending = self._results(
                [MadRequest(CLASS_PMA, ATTR_CLASS_PORT_INFO, lid=lid) for lid in lids]
                + [req for _key, _kind, req in plan]
                + [req for _key, req in ticks]
                + [req for _guid, req in blocks]
            )
            try:
                view = self._view_from(sweep)
            except BaseException:
                self._broken = self._broken or "a batch was not read to its end"
                raise
            learned: _Learned = ({}, {})
            for lid, r in zip(lids, itertools.islice(pending, len(lids)), strict=True):
                self._book_class_port_info(lid, r, learned)
            first.values, first.failed = self._decode_plan(plan, pending, learned[0])
            outcomes = self._read_ticks(ticks, pending)
            first.done = time.monotonic()
            tables = self._read_tables(sweep, blocks, pending)
            next(pending, None)  # the end of the batch: its verdict on the worker
            first.asked = {key: lid for lid, keys in targets.items() for key in keys}
            mads = len(lids) + len(plan) + len(ticks) + len(blocks)
            if self._shard is not None:  # no first-poll batch: the Ticks of this shard's ports
                ticks = self._tick_plan(view.by_lid(), devices, sm_lids)
                answers = self._results([req for _k, req in ticks])
                outcomes = self._read_ticks(ticks, answers)
                next(answers, None)  # the end of the batch: its verdict on the worker
                mads += len(ticks)
            sweep.errors += self.wait_units.decide(self.name, view, devices, outcomes)
            return sweep, view, learned, mads, first, tables

        got = await self._in_thread(sweep_and_view)
        assert isinstance(got, tuple)
        sweep: SweepResult = got[0]
        view: FabricView = got[1]
        self._cpi, self._cpi_failed = got[2]
        self.last_sweep_mads = sweep.mads + got[3]
        topo = self._adopt(view, sweep.errors, started, reached=len(sweep.nodes))
        self._first = got[4]
        topo.forwarding = got[5]
        return topo

    def _table_plan(self, sweep: SweepResult) -> list[tuple[str, MadRequest]]:
        """LinearForwardingTable Gets (LID-routed SMP, attribute modifier = block) for blocks
        0..LinearFDBTop/64 of every switch swept whose SwitchInfo and LID are known, in switch
        then block order. Every switch, filtered or not: a route crosses them all."""
        out: list[tuple[str, MadRequest]] = []
        for guid, node in sweep.nodes.items():
            top = node.fdb_top
            port0 = node.ports.get(0)
            if node.info.node_type != "switch" or top is None or port0 is None or not port0.lid:
                continue
            if top > _MAX_UCAST_LID:
                sweep.errors.append(SourceError(
                    "bad_value", f"{guid}: SwitchInfo.LinearFDBTop {top} past the unicast LIDs"))
                continue
            out += [(guid, MadRequest(CLASS_SMI, ATTR_LINEAR_FWD_TBL, attr_mod=b, lid=port0.lid))
                    for b in range(top // LFT_BLOCK + 1)]
        return out

    @staticmethod
    def _read_tables(
        sweep: SweepResult, blocks: list[tuple[str, MadRequest]], answers: Iterator[MadResult]
    ) -> dict[str, bytes]:
        """Each switch's table from its block answers: egress port per LID 0..LinearFDBTop,
        a port past the switch's port count as 0xff (no route, as ibroute shows it). A switch
        with a block unanswered is left out (one SourceError)."""
        got: dict[str, bytearray] = {}
        lost: set[str] = set()
        for (guid, req), r in zip(blocks, itertools.islice(answers, len(blocks)), strict=True):
            if r.data is None:
                if guid not in lost:
                    lost.add(guid)
                    sweep.errors.append(SourceError(
                        r.error or "timeout",
                        f"{guid}: LinearForwardingTable block {req.attr_mod}"))
                continue
            got.setdefault(guid, bytearray()).extend(r.data[:LFT_BLOCK])
        out: dict[str, bytes] = {}
        for guid, table in got.items():
            node = sweep.nodes[guid]
            if guid in lost or node.fdb_top is None:
                continue
            n = node.info.num_ports
            del table[node.fdb_top + 1:]
            out[guid] = bytes(table).translate(_PORT_OR_NONE[n]) if n < 0xFF else bytes(table)
        return out

    def _poll_targets(self, sweep: SweepResult) -> dict[int, list[PortKey]]:
        """The ports the view of ``sweep`` will poll by LID (the rules of ``_view_from`` and
        ``FabricView.by_lid``: LIDs ascending, ports in numeric order), for the reads that go
        out with the discovery. Empty with a shard: it drops ports by the finished topology,
        and a port it drops must not cost a MAD."""
        if self._shard is not None:
            return {}
        groups: dict[int, list[PortKey]] = {}
        for guid, node in sweep.nodes.items():
            if not self._filter.keep(guid, node.desc):
                continue
            if node.info.node_type == "switch":
                numbers = [p for p in range(1, node.info.num_ports + 1) if p in node.ports]
                if numbers:
                    port0 = node.ports.get(0)
                    lid = port0.lid if port0 is not None else self._known_lid(guid)
                    if lid:
                        groups.setdefault(lid, []).extend((guid, str(p)) for p in numbers)
            else:
                for p in sorted(node.ports):
                    if p > 0 and node.ports[p].lid:
                        groups.setdefault(node.ports[p].lid, []).append((guid, str(p)))
        return {lid: groups[lid] for lid in sorted(groups)}

    @staticmethod
    def _tick_plan(
        groups: Mapping[int, Sequence[PortKey]],
        devices: Mapping[str, int],
        sm_lids: Container[int] = (),
    ) -> list[tuple[PortKey, MadRequest]]:
        """A PortSamplesControl Get for every port in ``groups`` (by the LID its PMA answers
        on) whose node's device ID is no documented family (``WaitUnits.needs_tick``), but
        none at a subnet manager's LID (``fabric.WaitUnits``)."""
        return [
            (key, MadRequest(CLASS_PMA, ATTR_PORT_SAMPLES_CONTROL, lid=lid,
                             port_select=int(key[1])))
            for lid, keys in groups.items()
            if lid not in sm_lids
            for key in keys
            if WaitUnits.needs_tick(devices.get(key[0]))
        ]

    @staticmethod
    def _read_ticks(
        plan: Sequence[tuple[PortKey, MadRequest]], results: Iterator[MadResult]
    ) -> dict[PortKey, TickOutcome]:
        """The answers to ``plan`` (as many as it has, from ``results``): each port's Tick, or
        why there is none ("unread": no answer or an error status; "parse_error")."""
        out: dict[PortKey, TickOutcome] = {}
        for (key, _req), r in zip(plan, itertools.islice(results, len(plan)), strict=True):
            if r.data is None:
                out[key] = ("unread", r.error or "timeout")
                continue
            try:
                out[key] = decode_samples_control_tick(r.data, port=int(key[1]))
            except ParseError as exc:
                out[key] = ("parse_error", str(exc))
        return out

    @staticmethod
    def _book_class_port_info(lid: int, r: MadResult, learned: _Learned) -> None:
        """One ClassPortInfo answer into (masks by LID, why by LID for those that failed): a
        malformed one costs that LID's counters this poll, like a lost one, not the poll."""
        if r.data is None:
            learned[1][lid] = r.error or "timeout"
            return
        try:
            learned[0][lid] = decode_class_port_info(r.data)
        except ParseError:
            learned[1][lid] = "parse_error"

    # ------------------------------------------------------------------ counters

    def _counters_sync(
        self, view: FabricView, refresh_state: bool = True, first: _FirstSweep | None = None
    ) -> tuple[dict[PortKey, PortCounterValues], list[SourceError], int]:
        """Every port's counters (and, with ``refresh_state``, its PortInfo) in one MAD batch,
        then the detail Gets of the ports whose aggregates moved (``fabric.DetailReads``).
        ``first``: what the discovery already read; only the ports it did not ask at the LID
        they have now are asked again.

        Returns counters by port (detail values included), the errors (one per port and
        poll, plus one per failed detail read), and the MADs sent.
        """
        by_lid = view.by_lid()
        errors, mads = self._learn_class_port_info(by_lid)
        had: list[PortKey] = []
        if first is not None:
            ports = view.ports
            had = [k for k, lid in first.asked.items() if k in ports and ports[k].lid == lid]
        plan = self._pma_plan(by_lid, skip=set(had))
        state = [(k, lid) for lid, keys in by_lid.items() for k in keys] if refresh_state else []
        details = self.details
        # baselines and owed re-reads are known now: they ride in the poll's batch
        early = details.planned(dict.fromkeys(
            itertools.chain(had, (k for k, _kind, _r in plan))))
        reqs = [req for _key, _kind, req in plan]
        reqs += [MadRequest(CLASS_SMI, ATTR_PORT_INFO, attr_mod=int(k[1]), lid=lid)
                 for k, lid in state]
        reqs += [self._detail_request(view, read) for read in early]
        results = self._results(reqs)  # decoded as they arrive, while later MADs are out
        mads += len(reqs)
        out: dict[PortKey, PortCounterValues] = {}
        failed: dict[PortKey, SourceError] = {}
        if first is not None:
            for k in had:
                if k in first.values:
                    out[k] = first.values[k]
                elif k in first.failed:
                    failed[k] = first.failed[k]
        more, more_failed = self._decode_plan(plan, results, self._cpi)
        out.update(more)
        failed.update(more_failed)
        fdr10: list[tuple[PortKey, int, PortInfo]] = []  # refreshed once their answer is in
        for (k, lid), r in zip(state, itertools.islice(results, len(state)), strict=True):
            if r.data is not None:
                info = decode_port_info(r.data)
                if k[0] in self._epi_nodes and may_be_fdr10(info):
                    fdr10.append((k, lid, info))
                else:
                    view.refresh_port(k, info)
            elif k in out:
                # one error per port and poll: report the state miss only when the PMA answered
                errors.append(
                    SourceError(r.error or "timeout", f"{k[0]} port {k[1]}: PortInfo", k)
                )
        errors.extend(failed.values())
        detail_mads = len(early)
        self._record_details(early, list(results), out, errors)
        if fdr10:
            answers = self._run_sync(
                [MadRequest(CLASS_SMI, ATTR_MLNX_EXT_PORT_INFO, attr_mod=int(k[1]), lid=lid)
                 for k, lid, _info in fdr10], keep=False)
            mads += len(fdr10)
            for (k, _lid, info), r in zip(fdr10, answers, strict=True):
                view.refresh_port(k, info if r.data is None else with_mlnx_speeds(info, r.data))
        late = details.moved(out, set(early))
        if late:
            more_reqs = [self._detail_request(view, read) for read in late]
            answers = self._run_sync(more_reqs, keep=False)
            detail_mads += len(late)
            mads += len(late)
            self._record_details(late, answers, out, errors)
        details.fill(out)
        details.report_learned(self.name)
        self.last_detail_mads = detail_mads
        return out, errors, mads

    @staticmethod
    def _detail_request(view: FabricView, read: DetailRead) -> MadRequest:
        key, attr = read
        lid = view.ports[key].lid
        assert lid is not None
        return MadRequest(CLASS_PMA, _DETAIL_ATTR_ID[attr], lid=lid, port_select=int(key[1]))

    def _record_details(
        self,
        reads: Sequence[DetailRead],
        results: Sequence[MadResult],
        answered: Mapping[PortKey, PortCounterValues],
        errors: list[SourceError],
    ) -> None:
        """Book detail answers: values, an error status (unsupported), or a miss (owed)."""
        details = self.details
        for read, r in zip(reads, results, strict=True):
            key, attr = read
            where = f"{key[0]} port {key[1]}: {attr}"
            if r.data is not None:
                try:
                    details.answered(read, decode_details(attr, r.data, port=int(key[1])))
                except ParseError as exc:
                    details.missed(read, port_answered=key in answered)
                    errors.append(SourceError("parse_error", f"{where}: {exc}", key))
            elif r.error is not None and r.error.startswith("status_"):
                details.refused(read)
            else:
                details.missed(read, port_answered=key in answered)
                errors.append(SourceError(r.error or "timeout", where, key))

    def _learn_class_port_info(
        self, by_lid: dict[int, list[PortKey]]
    ) -> tuple[list[SourceError], int]:
        """ClassPortInfo of every LID not asked since discovery (its masks say which counter
        attributes and fields are valid); a LID that does not answer costs its ports' counters
        this poll and is asked again next poll."""
        # LIDs the discovery asked and that did not answer are this poll's failures, not asked
        # twice in a row (one attempt per poll, as when the poll asks them itself)
        failed, self._cpi_failed = self._cpi_failed, {}
        missing = [lid for lid in by_lid if lid not in self._cpi and lid not in failed]
        results = self._run_sync(
            [MadRequest(CLASS_PMA, ATTR_CLASS_PORT_INFO, lid=lid) for lid in missing]
        )
        learned: _Learned = (self._cpi, failed)
        for lid, r in zip(missing, results, strict=True):
            self._book_class_port_info(lid, r, learned)
        errors = [
            SourceError(failed[lid], f"lid {lid}: ClassPortInfo", key)
            for lid, keys in by_lid.items()
            if lid in failed
            for key in keys
        ]
        return errors, len(missing)

    def _pma_plan(
        self, by_lid: Mapping[int, Sequence[PortKey]], skip: Container[PortKey] = ()
    ) -> list[tuple[PortKey, str, MadRequest]]:
        """The counter Gets per port (``_kinds``), a port's Gets adjacent, ports in ``skip``
        left out; LIDs without known ClassPortInfo too (their error is the ClassPortInfo's)."""
        plan: list[tuple[PortKey, str, MadRequest]] = []
        for lid, keys in by_lid.items():
            cpi = self._cpi.get(lid)
            if cpi is None:
                continue
            kinds = _kinds(cpi)
            for key in keys:
                if key in skip:
                    continue
                sel = int(key[1])
                for kind, attr in _COUNTER_ATTRS:
                    if kind in kinds:
                        plan.append(
                            (key, kind, MadRequest(CLASS_PMA, attr, lid=lid, port_select=sel))
                        )
        return plan

    @staticmethod
    def _decode_plan(
        plan: Sequence[tuple[PortKey, str, MadRequest]],
        results: Iterator[MadResult],
        cpi: Mapping[int, ClassPortInfo],
    ) -> tuple[dict[PortKey, PortCounterValues], dict[PortKey, SourceError]]:
        """The answers to ``plan`` (as many as it has, taken from ``results``), decoded per port
        under its LID's capability masks: values by port, and the error of each port that failed
        (no answer, or an answer whose PortSelect is another port's: ``parse_error``). Answers
        to attributes the masks say the port does not have are ignored (the discovery asks both
        before it knows); a port whose LID has no masks is in neither."""
        out: dict[PortKey, PortCounterValues] = {}
        failed: dict[PortKey, SourceError] = {}

        def finish(key: PortKey, lid: int, got: dict[str, MadResult]) -> None:
            masks = cpi.get(lid)
            if masks is None:
                return
            what = f"{key[0]} port {key[1]}"
            parts: dict[str, bytes] = {}
            for kind in _kinds(masks):
                r = got[kind]
                if r.data is None:
                    failed[key] = SourceError(r.error or "timeout", f"{what}: PMA", key)
                    return
                parts[kind] = r.data
            try:
                out[key] = decode_counters(parts.get("narrow"), parts.get("ext"),
                                           masks.cap_mask, masks.cap_mask2, port=int(key[1]))
            except ParseError as exc:  # another port's reply (its PortSelect): this port's miss
                failed[key] = SourceError("parse_error", f"{what}: PMA: {exc}", key)

        # a port's counter Gets are adjacent in the plan: decode it once its last one is in
        key: PortKey | None = None
        lid = 0
        got: dict[str, MadResult] = {}
        for (k, kind, req), r in zip(plan, itertools.islice(results, len(plan)), strict=True):
            if k != key:
                if key is not None:
                    finish(key, lid, got)
                key, lid, got = k, req.lid, {}
            got[kind] = r
        if key is not None:
            finish(key, lid, got)
        return out, failed

    def _sample_sync(self, view: FabricView, refresh_state: bool) -> Snapshot:
        """One poll on the MAD thread, PortSamples included (built with GC paused, off the loop).
        The poll that directly follows a discovery (``DISCOVERY_STATE_FRESH``) takes the
        counters that discovery read, and their time."""
        first, self._first = self._first, None
        if first is not None and time.monotonic() - first.done >= DISCOVERY_STATE_FRESH:
            first = None
        if first is not None:
            snap = Snapshot(source=self.name, monotonic=first.monotonic, wall=first.wall)
        else:
            snap = Snapshot(source=self.name, monotonic=time.monotonic(), wall=time.time())
        values, errors, mads = self._counters_sync(view, refresh_state, first)
        self.last_sweep_mads = mads
        snap.errors.extend(errors)
        self._fill(snap, view, values)
        return snap

    async def sample(self) -> Snapshot:
        await self._ensure_worker()
        view, discover_errors, refresh = await self._prepare_sample()
        snap = await self._in_thread(self._sample_sync, view, refresh)
        assert isinstance(snap, Snapshot)
        snap.errors[:0] = discover_errors
        return snap

    async def close(self) -> None:
        """End the worker (closing its port; one still busy is killed after a short grace)
        and the MAD thread. Never waits on the fabric."""
        if self._worker is not None:
            self._dying.append(self._worker)
            self._worker = None
        await self._reap_dying(grace=0.3)  # inside the daemon's 1 s budget for a close
        self._executor.shutdown(wait=False)
