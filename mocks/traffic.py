"""Counter evolution on a simulated clock: load, congestion, errors, flaps, resets.

The model keeps, for every connected port, the raw values a PMA would report: data counters in
4-octet words, narrow PortCounters fields that saturate at their catalogue width, and 64-bit
PortCountersExtended copies of the data/packet counters that do not (exactly what an mlx5 HCA
shows in sysfs: ``counters/`` data from the extended table, errors from the narrow one).

Physics the tests rely on:

- per port and direction, load is a fraction of the *current* link rate, at most 0.98 and at
  most ``1 - xmit_wait_ratio`` (a port cannot send and wait in the same tick), so no port ever
  exceeds its link rate;
- what one end transmits its peer receives in the same step (words and packets);
- packets follow bytes: each port has an average packet size between 256 bytes and the 4096-byte
  MTU plus headers; multicast is a fixed small share of packets;
- PortXmitWait rises with load on healthy links (a tiny baseline) and by the fault's ratio under
  congestion, in the unit of the port's device family (``ibmon.infiniband.xmitwait``): a port
  stalled a fraction f of dt seconds gains ``xmitwait.counts_for(f, bytes_per_count, rate_bytes,
  dt)`` counts, so ``xmitwait.stall_fraction`` of them gives f back. Counts are 8 bytes of the
  port's data rate on the Quantum-class switches and ConnectX HCAs of ``mocks.topology.DEVICE_IDS``
  and 32 bytes per lane on its Switch-IB 2 spines. The model keeps PortXmitWait as the 64-bit
  PortCountersExtended copy current devices have (a congested 4X EDR port at 8 bytes a count
  fills 32 bits in seconds), except on a port ``narrow_wait`` gives the 32-bit PortCounters
  field only, which saturates;
- a down link carries nothing, both ends report Down/Polling, and each transition to Down adds
  one to LinkDowned on both ends;
- every receive error and transmit discard has a cause: raising PortRcvErrors or
  PortXmitDiscards raises one of its detail counters (PortRcvErrorDetails,
  PortXmitDiscardDetails) by the same amount, the one a fault names or ``DEFAULT_DETAIL``, and
  raising a detail counter raises its aggregate (each saturates at its own 16 bits).

Randomness (per-port load factors and per-step noise) comes from one ``random.Random(seed)``, so
a run is reproducible for a given seed and sequence of ``advance`` calls. Hot loops use plain
lists indexed by port number: advancing 20,000 ports takes tens of milliseconds.
"""

from __future__ import annotations

import math
import random
from array import array
from dataclasses import dataclass

from ibmon.infiniband.counters import CATALOGUE, DETAILS, EXTENDED
from ibmon.infiniband.model import LinkInfo, PhysState, PortIdentity, PortSample, PortState
from ibmon.infiniband.xmitwait import DEFAULT_UNIT, WaitUnit, counts_for, family_of
from ibmon.track.totals import Totals
from mocks.topology import SPEEDS, WIDTHS, Fabric, Link, link_rate_bps

__all__ = [
    "COUNTER_NAMES",
    "DEFAULT_DETAIL",
    "MTU_BYTES",
    "WIDE_COUNTERS",
    "FabricModel",
    "ca_device_names",
    "counter_max",
    "hca_type",
    "wait_unit_of",
]

#: Catalogue order; every port's raw values are a list in this order.
COUNTER_NAMES: tuple[str, ...] = tuple(c.name for c in CATALOGUE)
_IX: dict[str, int] = {n: i for i, n in enumerate(COUNTER_NAMES)}

#: Counters the simulated HCAs and switches report from 64-bit PortCountersExtended fields.
WIDE_COUNTERS: frozenset[str] = EXTENDED
_MAX: tuple[int, ...] = tuple(
    (1 << 64) - 1 if c.name in WIDE_COUNTERS else c.max_value for c in CATALOGUE
)
MTU_BYTES = 4096
_HEADER_BYTES = 126  # LRH+BTH+GRH+ICRC+VCRC upper bound, so bytes/packet <= MTU + headers
_MULTICAST_SHARE = 0.001
_HEALTHY_WAIT_MAX = 0.0008  # baseline xmit-wait ratio at full load: far below any threshold
_LOAD_PERIOD_S = 900.0  # slow load swing, so graphs move

_TXD, _RXD = _IX["transmit_data"], _IX["receive_data"]
_TXP, _RXP = _IX["transmit_packets"], _IX["receive_packets"]
_UTX, _URX = _IX["unicast_transmit_packets"], _IX["unicast_receive_packets"]
_MTX, _MRX = _IX["multicast_transmit_packets"], _IX["multicast_receive_packets"]
#: Per counter: the index of the aggregate a detail counter is part of, else -1.
_PARENT: tuple[int, ...] = tuple(_IX[c.part_of] if c.part_of else -1 for c in CATALOGUE)
#: The cause a fault on an aggregate gets when it names none: receive errors are most often a
#: bad cable or transceiver (local physical errors), discards a congested path downstream
#: (head-of-queue lifetime).
DEFAULT_DETAIL: dict[str, str] = {
    "receive_errors": "receive_local_physical_errors",
    "transmit_discards": "transmit_sw_hoq_lifetime_limit_discards",
}
_XW = _IX["transmit_wait"]
#: PortXmitWait's 64-bit copy (PortCountersExtended with ClassPortInfo CapMask2 bit 1), what the
#: model keeps unless a port has only the 32-bit field (``narrow_wait``).
_XW_WIDE_MAX = (1 << 64) - 1
#: What a sample of a port with the 64-bit PortXmitWait declares 64-bit.
_WIDE_WITH_WAIT: frozenset[str] = WIDE_COUNTERS | {"transmit_wait"}
_WIDTH = len(COUNTER_NAMES)  # values a port in ``FabricModel.flat``
_LD = _IX["link_downed"]
_SYM = _IX["symbol_errors"]

FW_VER = "20.35.2000"  # ConnectX-6 firmware (major 20)
BOARD_ID = "MT_0000000010"
SM_LID = 1

#: One string per port number, shared by every identity and link that names it (a node has at
#: most 255 ports): a fresh ``str(port)`` per port was 3.7 MB at 36,720 ports.
_PORT_NAMES: tuple[str, ...] = tuple(str(p) for p in range(256))
#: The driver counters and gauges of every sample: the PMA has none (shared, never mutated;
#: ``PortSample``'s default would be a new dict a port a poll, 2.3 MB at 36,720 ports).
_NO_HW: dict[str, int] = {}


def hca_type(device_id: int) -> str:
    """An mlx4/mlx5 HCA's sysfs ``hca_type``: ``MT`` and the PCI device ID in decimal
    (ConnectX-6, 0x101b, is ``MT4123``); empty when the ID is unknown."""
    return f"MT{device_id}" if device_id else ""


def wait_unit_of(device_id: int) -> WaitUnit:
    """What one PortXmitWait count means on a simulated node: its family's unit, else the
    default a monitor falls back to (``ibmon.infiniband.xmitwait.DEFAULT_UNIT``)."""
    return family_of(device_id) or DEFAULT_UNIT


def ca_device_names(fabric: Fabric) -> dict[str, str]:
    """The sysfs device name of every CA (``mlx5_<n>`` in node order), shared by all renderers.

    One simulated sysfs tree holds every host's HCAs, so names are numbered fabric-wide; the
    node description still says which host and local device it is (``host042 mlx5_0``).
    """
    return {n.guid: f"mlx5_{i}" for i, n in enumerate(fabric.hosts())}


@dataclass(slots=True)
class _Ber:
    ber: float
    start: float
    ramp: float


class FabricModel:
    """Raw PMA state of every connected port of ``fabric``, advanced on a simulated clock.

    Fault methods take a port key ``(guid, port)`` and act on that port or its link; each has an
    inverse (``clear_*``, ``link_up``, ``restore``). ``now`` is simulated seconds since start.
    """

    def __init__(self, fabric: Fabric, *, seed: int = 0, load: float = 0.3) -> None:
        if not 0.0 <= load <= 0.98:
            raise ValueError(f"load must be within [0, 0.98], got {load}")
        self.fabric = fabric
        self.seed = seed
        self.load = load
        self.now = 0.0
        self._rng = random.Random(seed)  # noqa: S311 - a simulation, not cryptography
        keys = fabric.ports()
        self.keys: list[tuple[str, int]] = keys
        self.index: dict[tuple[str, int], int] = {k: i for i, k in enumerate(keys)}
        self.links: list[Link] = list(fabric.links)
        link_no = {id(lk): n for n, lk in enumerate(self.links)}
        self._peer: list[int] = []
        self._link_of: list[int] = []
        for k in keys:
            lk = fabric.link_of(*k)
            assert lk is not None  # ports() lists connected ports only
            other = lk.b if lk.a == k else lk.a
            self._peer.append(self.index[other])
            self._link_of.append(link_no[id(lk)])
        # Per link: configured (max) and active width/speed, rate, up.
        self.max_width: list[str] = [lk.width for lk in self.links]
        self.max_speed: list[str] = [lk.speed for lk in self.links]
        self.width: list[str] = list(self.max_width)
        self.speed: list[str] = list(self.max_speed)
        self._rate: list[float] = [lk.rate_bps for lk in self.links]
        self.up: list[bool] = [True] * len(self.links)
        # Per port: state, counters, load shape.
        n = len(keys)
        rng = self._rng
        self.state: list[int] = [int(PortState.ACTIVE)] * n
        self.phys: list[int] = [int(PhysState.LINK_UP)] * n
        # array('d') columns, not lists: 8 bytes a port instead of a float object and a pointer
        # (7 MB at 36,720 ports, and the simulator's memory counts against the demo's)
        self._factor = array("d", [0.4 + 1.2 * rng.random() for _ in range(n)])
        self._phase = array("d", [rng.random() * 2 * math.pi for _ in range(n)])
        self._pkt = array("d", [256.0 + (MTU_BYTES - 256.0) * rng.random() for _ in range(n)])
        self._wait = array("d", [_HEALTHY_WAIT_MAX * rng.random() for _ in range(n)])
        self._carry_words = array("d", bytes(8 * n))
        self._carry_pkts = array("d", bytes(8 * n))
        self._carry_wait = array("d", bytes(8 * n))
        # PortXmitWait: each port's unit (its node's family) and the counts it reports per
        # second stalled at its link's current width and rate (``_wait_rates``).
        units = {g: wait_unit_of(node.device_id) for g, node in fabric.nodes.items()}
        self._unit: list[WaitUnit] = [units[g] for g, _ in keys]
        self._wait_per_s = array("d", bytes(8 * n))
        self._xw_cap = array("Q", [_XW_WIDE_MAX]) * n
        for li in range(len(self.links)):
            self._wait_rates(li)
        # Every port's row (``COUNTER_NAMES`` order) end to end in one array('Q'): unsigned
        # 64-bit like the PMA fields, invisible to the cyclic GC, and no array object a port
        # (8.5 MB at 118,400 ports); a poll's snapshot is one copy (``samples``).
        self.flat: array[int] = array("Q")
        for i in range(n):
            self.flat.extend(self._history(i))
        # Faults.
        self._load_override: dict[int, float] = {}
        self._wait_override: dict[int, float] = {}
        self._err_rates: dict[int, dict[int, float]] = {}
        self._err_carry: dict[tuple[int, int], float] = {}
        self._ber: dict[int, _Ber] = {}
        self._schedule: list[tuple[float, int, bool]] = []  # (time, link, up)
        # Caches for samples.
        self._ca_dev = ca_device_names(fabric)
        self._identity: dict[str, list[PortIdentity]] = {}
        self._port_keys: dict[str, list[tuple[str, str]]] = {}
        self._linkinfo: list[LinkInfo | None] = [None] * n
        self._narrow: set[int] = set()  # ports with the 32-bit PortXmitWait only

    def _history(self, i: int) -> list[int]:
        """Plausible counters of a fabric that has been up a while (totals start there)."""
        rng = self._rng
        vals = [0] * len(COUNTER_NAMES)
        words = int(rng.random() * 2e12)
        pkts = int(words * 4 / self._pkt[i])
        mc = int(pkts * _MULTICAST_SHARE)
        for d, p, u, m in ((_TXD, _TXP, _UTX, _MTX), (_RXD, _RXP, _URX, _MRX)):
            vals[d], vals[p], vals[u], vals[m] = words, pkts, pkts - mc, mc
        vals[_XW] = int(rng.random() * 5e7)
        return vals

    # ------------------------------------------------------------------ clock

    def advance(self, dt: float) -> None:
        """Move the clock ``dt`` simulated seconds, applying scheduled link transitions exactly
        at their times."""
        if dt < 0 or not math.isfinite(dt):
            raise ValueError(f"dt must be a finite non-negative number, got {dt}")
        end = self.now + dt
        while self._schedule and self._schedule[0][0] <= end:
            at, link, up = self._schedule.pop(0)
            if at > self.now:
                self._step(at - self.now)
                self.now = at
            self._set_link(link, up)
        if end > self.now:
            self._step(end - self.now)
            self.now = end

    def advance_to(self, t: float) -> None:
        if t > self.now:
            self.advance(t - self.now)

    def _step(self, dt: float) -> None:
        if dt <= 0:
            return
        flat = self.flat
        width = _WIDTH
        peer = self._peer
        link_of = self._link_of
        up = self.up
        rate = self._rate
        factor = self._factor
        phase = self._phase
        pkt = self._pkt
        wait = self._wait
        cw, cp, cx = self._carry_words, self._carry_pkts, self._carry_wait
        lo, wo = self._load_override, self._wait_override
        rnd = self._rng.random
        sin = math.sin
        base = self.load
        omega = 2 * math.pi * (self.now + dt / 2) / _LOAD_PERIOD_S
        wait_per_s = self._wait_per_s
        xw_cap = self._xw_cap
        words_per_bps = dt / 32.0
        share = _MULTICAST_SHARE
        for i in range(len(link_of)):
            li = link_of[i]
            if not up[li]:
                continue
            if i in lo:  # congested: send + wait <= 1 (``congest``)
                f = lo[i]
                w = wo[i]
            else:  # the baseline wait is under 0.1 % of the time: it fits beside 0.98
                f = base * factor[i] * (1.0 + 0.25 * sin(omega + phase[i])) * (0.9 + 0.2 * rnd())
                w = wait[i] * f
            # an explicit comparison: min() costs a call per port per step on the hot path
            if f > 0.98:  # noqa: PLR1730
                f = 0.98
            c = i * width  # the port's row in ``flat``
            if f > 0:
                words_f = f * rate[li] * words_per_bps + cw[i]
                words = int(words_f)
                cw[i] = words_f - words
                pkts_f = words * 4.0 / pkt[i] + cp[i]
                pkts = int(pkts_f)
                if pkts == 0 and words > 0:
                    # bytes without a packet would break bytes <= packets x (MTU + headers):
                    # the packet counts now, and is not owed back (a debt carried into the
                    # next steps made a negative count, a packet counter going down)
                    pkts = 1
                    cp[i] = 0.0
                else:
                    cp[i] = pkts_f - pkts
                mc = int(pkts * share)
                r = peer[i] * width
                # 64-bit fields: 2**64 words at 800 Gb/s take decades, so no wrap handling
                flat[c + _TXD] += words
                flat[c + _TXP] += pkts
                flat[c + _UTX] += pkts - mc
                flat[c + _MTX] += mc
                flat[r + _RXD] += words
                flat[r + _RXP] += pkts
                flat[r + _URX] += pkts - mc
                flat[r + _MRX] += mc
            if w > 0:
                # xmitwait.counts_for(w, bytes_per_count, rate_bytes, dt), its per-second
                # factor cached per port (it is linear in the fraction and the seconds)
                t_f = w * wait_per_s[i] * dt + cx[i]
                t = int(t_f)
                cx[i] = t_f - t
                v = flat[c + _XW] + t
                cap = xw_cap[i]
                flat[c + _XW] = v if v < cap else cap
        if self._err_rates:
            self._errors(dt)
        if self._ber:
            self._symbol_errors(dt)

    def _bump(self, i: int, ci: int, amount: int) -> None:
        """Add to a counter (saturating); a detail counter raises its aggregate too."""
        flat = self.flat
        at = i * _WIDTH
        v = flat[at + ci] + amount
        m = self._xw_cap[i] if ci == _XW else _MAX[ci]
        flat[at + ci] = v if v < m else m
        parent = _PARENT[ci]
        if parent >= 0:
            v = flat[at + parent] + amount
            m = _MAX[parent]
            flat[at + parent] = v if v < m else m

    def _errors(self, dt: float) -> None:
        carry = self._err_carry
        for i, rates in self._err_rates.items():
            if not self.up[self._link_of[i]]:
                continue
            for ci, per_s in rates.items():
                f = per_s * dt + carry.get((i, ci), 0.0)
                n = int(f)
                carry[(i, ci)] = f - n
                if n:
                    self._bump(i, ci, n)

    def _symbol_errors(self, dt: float) -> None:
        carry = self._err_carry
        mid = self.now + dt / 2
        for i, b in self._ber.items():
            li = self._link_of[i]
            if not self.up[li]:
                continue
            frac = 1.0 if b.ramp <= 0 else max(0.0, min(1.0, (mid - b.start) / b.ramp))
            f = b.ber * frac * self._rate[li] * dt + carry.get((i, _SYM), 0.0)
            n = int(f)
            carry[(i, _SYM)] = f - n
            if n:
                self._bump(i, _SYM, n)

    # ------------------------------------------------------------------ lookups

    def port_index(self, key: tuple[str, int]) -> int:
        try:
            return self.index[key]
        except KeyError:
            raise KeyError(f"port {key[0]}[{key[1]}] is not a connected port of the fabric") \
                from None

    def link_index(self, key: tuple[str, int]) -> int:
        return self._link_of[self.port_index(key)]

    def peer_index(self, i: int) -> int:
        return self._peer[i]

    def link_index_of(self, i: int) -> int:
        return self._link_of[i]

    def rate_bps(self, i: int) -> float:
        """Current effective data rate of port ``i``'s link, bits/s."""
        return self._rate[self._link_of[i]]

    def wait_unit(self, i: int) -> WaitUnit:
        """What one PortXmitWait count of port ``i`` means (its node's device family)."""
        return self._unit[i]

    def bytes_per_count(self, i: int) -> float:
        """Bytes one PortXmitWait count of port ``i`` stands for at its link's current width."""
        bpc = self._unit[i].bytes_per_count(self.width[self._link_of[i]])
        assert bpc is not None  # the model's widths are all known
        return bpc

    def wait_counts_per_second(self, i: int, fraction: float) -> float:
        """PortXmitWait counts a second port ``i`` reports while stalled ``fraction`` of the
        time, at its link's current rate (``ibmon.infiniband.xmitwait.counts_for``)."""
        return counts_for(fraction, self.bytes_per_count(i), self.rate_bps(i) / 8.0, 1.0)

    def _wait_rates(self, li: int) -> None:
        """Both ends' counts per second fully stalled, for link ``li``'s width and rate now."""
        lk = self.links[li]
        for end in (lk.a, lk.b):
            i = self.index[end]
            self._wait_per_s[i] = self.wait_counts_per_second(i, 1.0)

    def value(self, key: tuple[str, int], counter: str) -> int:
        return self.flat[self.port_index(key) * _WIDTH + _IX[counter]]

    def row(self, i: int) -> array[int]:
        """A copy of port ``i``'s raw values, in ``COUNTER_NAMES`` order."""
        return self.flat[i * _WIDTH : (i + 1) * _WIDTH]

    def rows(self) -> list[array[int]]:
        """A copy of every port's raw values, in ``keys`` order (for tests)."""
        return [self.row(i) for i in range(len(self.keys))]

    # ------------------------------------------------------------------ faults

    def congest(self, key: tuple[str, int], *, wait_ratio: float, utilization: float) -> None:
        """Transmit at ``utilization`` of line rate while stalled ``wait_ratio`` of the time.

        High utilization with high wait is a hotspot; low utilization with high wait is
        backpressure from downstream.
        """
        if not (0 <= wait_ratio <= 1 and 0 <= utilization <= 1):
            raise ValueError("wait_ratio and utilization must be within [0, 1]")
        if wait_ratio + utilization > 1.0 + 1e-9:
            raise ValueError("a port cannot transmit and wait more than 100 % of the time")
        i = self.port_index(key)
        self._load_override[i] = min(utilization, 1.0 - wait_ratio)  # rounding past 1
        self._wait_override[i] = wait_ratio

    def clear_congestion(self, key: tuple[str, int]) -> None:
        i = self.port_index(key)
        self._load_override.pop(i, None)
        self._wait_override.pop(i, None)

    def set_ber(self, key: tuple[str, int], ber: float, *, ramp: float = 0.0) -> None:
        """Symbol errors on this port's receive side at ``ber`` (reached linearly over ``ramp``
        seconds), counted against the link's current rate."""
        if not 0 < ber < 1 or ramp < 0:
            raise ValueError("ber must be within (0, 1) and ramp >= 0")
        self._ber[self.port_index(key)] = _Ber(ber, self.now, ramp)

    def clear_ber(self, key: tuple[str, int]) -> None:
        self._ber.pop(self.port_index(key), None)

    @staticmethod
    def _cause(counter: str, detail: str | None) -> int:
        """The counter index an error on ``counter`` really increments: for PortRcvErrors and
        PortXmitDiscards, one of their details (``detail``, else ``DEFAULT_DETAIL``), which
        raises the aggregate with it; any other counter itself."""
        if counter not in _IX:
            raise ValueError(f"unknown counter {counter!r}")
        parts = DETAILS.get(counter)
        if parts is None:
            if detail is not None:
                raise ValueError(f"{counter!r} has no detail counters")
            return _IX[counter]
        cause = detail or DEFAULT_DETAIL[counter]
        if cause not in parts:
            raise ValueError(f"{cause!r} is not a detail of {counter!r} (one of {parts})")
        return _IX[cause]

    def set_error_rate(
        self, key: tuple[str, int], counter: str, per_second: float, *, detail: str | None = None
    ) -> None:
        """Increase a (narrow) error counter at ``per_second`` while the link is up.

        Receive errors and transmit discards go through one of their detail counters
        (``detail``, default ``DEFAULT_DETAIL``); naming a detail counter raises its aggregate.
        """
        if counter not in _IX or counter in WIDE_COUNTERS:
            raise ValueError(f"{counter!r} is not an error counter")
        if per_second < 0:
            raise ValueError("per_second must be >= 0")
        i = self.port_index(key)
        self._err_rates.setdefault(i, {})[self._cause(counter, detail)] = per_second

    def clear_error_rate(self, key: tuple[str, int], counter: str) -> None:
        """Stop an error rate; for an aggregate, every cause of it."""
        i = self.port_index(key)
        rates = self._err_rates.get(i)
        if rates is not None:
            drop = {_IX[counter], *(_IX[d] for d in DETAILS.get(counter, ()))}
            for ci in drop:
                rates.pop(ci, None)
            if not rates:
                del self._err_rates[i]

    def bump(
        self, key: tuple[str, int], counter: str, amount: int = 1, *, detail: str | None = None
    ) -> None:
        """Add ``amount`` to a counter now (saturating), e.g. one LocalLinkIntegrity event.
        Receive errors and discards are added through a detail counter, as in
        ``set_error_rate``."""
        self._bump(self.port_index(key), self._cause(counter, detail), amount)

    def link_down(self, key: tuple[str, int]) -> None:
        self._set_link(self.link_index(key), False)

    def link_up(self, key: tuple[str, int]) -> None:
        self._set_link(self.link_index(key), True)

    def flap(self, key: tuple[str, int], *, count: int = 1, every: float = 30.0,
             down_for: float = 5.0) -> None:
        """Take the link down ``count`` times, every ``every`` s, each time for ``down_for`` s."""
        if count < 1 or down_for <= 0 or (count > 1 and every <= down_for):
            raise ValueError("flap needs count >= 1, down_for > 0 and every > down_for")
        li = self.link_index(key)
        for k in range(count):
            t = self.now + k * every
            if k == 0:
                self._set_link(li, False)
            else:
                self._schedule.append((t, li, False))
            self._schedule.append((t + down_for, li, True))
        self._schedule.sort(key=lambda e: e[0])

    def cancel_flaps(self, key: tuple[str, int]) -> None:
        """Drop pending transitions of this link and bring it up."""
        li = self.link_index(key)
        self._schedule = [e for e in self._schedule if e[1] != li]
        self._set_link(li, True)

    def degrade(self, key: tuple[str, int], *, width: str | None = None,
                speed: str | None = None) -> None:
        """Retrain the link narrower and/or slower than both ends support (a bad lane, a bad
        cable): active drops below max, load follows the new rate."""
        li = self.link_index(key)
        if width is not None and width not in WIDTHS:
            raise ValueError(f"unknown width {width!r}")
        if speed is not None and speed not in SPEEDS:
            raise ValueError(f"unknown speed {speed!r}")
        self.width[li] = width or self.width[li]
        self.speed[li] = speed or self.speed[li]
        self._rate[li] = link_rate_bps(self.width[li], self.speed[li])
        self._wait_rates(li)
        self._invalidate_link(li)

    def restore(self, key: tuple[str, int]) -> None:
        li = self.link_index(key)
        self.width[li] = self.max_width[li]
        self.speed[li] = self.max_speed[li]
        self._rate[li] = link_rate_bps(self.width[li], self.speed[li])
        self._wait_rates(li)
        self._invalidate_link(li)

    def reset_counters(self, key: tuple[str, int], counters: tuple[str, ...] = ()) -> None:
        """A third party (``perfquery -x -R``, opensm PerfMgr) zeroes the port's counters."""
        at = self.port_index(key) * _WIDTH
        for name in counters or COUNTER_NAMES:
            self.flat[at + _IX[name]] = 0

    def set_value(self, key: tuple[str, int], counter: str, value: int) -> None:
        """Set a raw value (saturating), for history that predates the simulation."""
        ci = _IX[counter]
        i = self.port_index(key)
        top = self._xw_cap[i] if ci == _XW else _MAX[ci]
        self.flat[i * _WIDTH + ci] = max(0, min(value, top))

    def narrow_wait(self, key: tuple[str, int]) -> None:
        """Give the port only the 32-bit PortCounters.PortXmitWait (a PMA without the 64-bit
        copy, as the kernel's sysfs ``port_xmit_wait`` and ibsim show it): from now on it
        saturates at 2**32-1, and samples declare it narrow."""
        i = self.port_index(key)
        cap = _MAX[_XW]
        self._xw_cap[i] = cap
        at = i * _WIDTH + _XW
        self.flat[at] = min(self.flat[at], cap)
        self._narrow.add(i)

    def wait_is_wide(self, i: int) -> bool:
        """Whether port ``i`` reports the 64-bit PortXmitWait (see ``narrow_wait``)."""
        return i not in self._narrow

    def _set_link(self, li: int, up: bool) -> None:
        if self.up[li] == up:
            return
        self.up[li] = up
        lk = self.links[li]
        for end in (lk.a, lk.b):
            i = self.index[end]
            if up:
                self.state[i] = int(PortState.ACTIVE)
                self.phys[i] = int(PhysState.LINK_UP)
            else:
                self.state[i] = int(PortState.DOWN)
                self.phys[i] = int(PhysState.POLLING)
                self._bump(i, _LD, 1)

    def _invalidate_link(self, li: int) -> None:
        lk = self.links[li]
        for end in (lk.a, lk.b):
            self._linkinfo[self.index[end]] = None

    # ------------------------------------------------------------------ samples

    def _identities(self, source: str) -> list[PortIdentity]:
        cached = self._identity.get(source)
        if cached is not None:
            return cached
        out: list[PortIdentity] = []
        nodes = self.fabric.nodes
        units = self._unit
        for i, (guid, port) in enumerate(self.keys):
            node = nodes[guid]
            ca = node.kind == "ca"
            out.append(PortIdentity(
                guid=guid, port=_PORT_NAMES[port], device=self._ca_dev.get(guid, ""),
                node_desc=node.desc, node_type=node.kind, lid=node.lid,
                link_layer="InfiniBand", source=source,
                fw_ver=FW_VER if ca else "", hca_type=hca_type(node.device_id) if ca else "",
                board_id=BOARD_ID if ca else "", sm_lid=SM_LID if ca else None,
                xmit_wait=units[i],
            ))
        self._identity[source] = out
        return out

    def port_keys(self, source: str = "mock") -> list[tuple[str, str]]:
        """The ``PortKey`` of every connected port, in ``keys`` order: the same tuples on every
        poll, so the daemon's tables share one key object per port instead of one per table
        (and a poll builds none)."""
        keys = self._port_keys.get(source)
        if keys is None:
            keys = self._port_keys[source] = [ident.key for ident in self._identities(source)]
        return keys

    def link_info(self, i: int) -> LinkInfo:
        """The far end of port ``i`` with active versus maximum width and speed.

        The maximum is the configured link (what both ends support and enable); a down link keeps
        its last-known peer so its series and events still name the far end.
        """
        info = self._linkinfo[i]
        if info is None:
            li = self._link_of[i]
            pg, pp = self.keys[self._peer[i]]
            info = LinkInfo(
                remote_guid=pg, remote_port=_PORT_NAMES[pp],
                remote_node_desc=self.fabric.nodes[pg].desc,
                active_width=self.width[li], active_speed=self.speed[li],
                max_width=self.max_width[li], max_speed=self.max_speed[li],
            )
            self._linkinfo[i] = info
        return info

    def sample_index(self, i: int, source: str = "mock") -> PortSample:
        li = self._link_of[i]
        return PortSample(
            self._identities(source)[i],
            self.state[i],
            self.phys[i],
            self._rate[li],
            self.width[li],
            self.speed[li],
            Totals(_IX, self.row(i)),
            WIDE_COUNTERS if i in self._narrow else _WIDE_WITH_WAIT,
            _NO_HW,
            self.link_info(i),
            _NO_HW,
        )

    def port_sample(self, guid: str, port: int, *, source: str = "mock") -> PortSample:
        """The port's raw state now, as a source would report it."""
        return self.sample_index(self.port_index((guid, port)), source)

    def samples(self, source: str = "mock") -> list[PortSample]:
        """Every connected port, in ``keys`` order (the hot path of every mock poll)."""
        ids = self._identities(source)
        infos = self._linkinfo
        link_of = self._link_of
        rate, width, speed = self._rate, self.width, self.speed
        state, phys = self.state, self.phys
        index = _IX
        wide, narrow = _WIDE_WITH_WAIT, self._narrow
        out: list[PortSample] = []
        append = out.append
        # Packed, as the PMA sends them, and every port's row in one array for the poll (one
        # copy of the model's rows): the tracker reads them without a dict, an int object or
        # an array per port (``ibmon.track.columns._raw``), and the poll's values are one
        # block of memory, returned to the system when the poll is done.
        flat = self.flat[:]
        step = _WIDTH
        for i in range(len(link_of)):
            li = link_of[i]
            info = infos[i]
            if info is None:
                info = self.link_info(i)
            append(PortSample(ids[i], state[i], phys[i], rate[li], width[li], speed[li],
                              Totals(index, flat, i * step),
                              WIDE_COUNTERS if narrow and i in narrow else wide, _NO_HW, info,
                              _NO_HW))
        return out


def counter_max(name: str) -> int:
    """The value at which the model pins ``name`` (narrow maximum, or 2**64-1 when wide;
    for ``transmit_wait`` the 32-bit field's, where a port has only that: ``narrow_wait``)."""
    return _MAX[_IX[name]]
