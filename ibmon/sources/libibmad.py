"""ctypes bindings to rdma-core's libibmad/libibumad and a pipelined MAD engine.

libibmad opens the umad port and registers the SMI, directed-route SMI and PMA agents
(``mad_rpc_open_port``); MADs are then built here as 256-byte buffers and sent with
``umad_send``, with up to ``window`` requests in flight and responses matched by transaction
ID. That is how libibnetdisc sweeps fast, and what keeps a Python sweep of thousands of ports
well under a second: the per-MAD cost is a ctypes call, not a round trip.

Each MAD has its own deadline and is re-sent up to ``retries`` times with a fresh TID; a MAD
that never comes back (a dead switch, ibsim's ``Error`` command) ends as a "timeout" result for
that request only. The kernel may also report a timeout itself (umad status ETIMEDOUT).

Only the stable C ABI (``umad_*``, ``mad_rpc_*``) is used, plus the ``status`` word of
``struct ib_user_mad`` (kernel uAPI ``rdma/ib_user_mad.h``, what ``umad_status`` returns), read
from the receive buffer to save a call per MAD. Under ibsim a MAD costs the worker about 10 us
of CPU (a 20,000-port poll: 62,000 MADs, 0.65 s), and the sweep is as fast as
``ibqueryerrors``'s or faster.
"""

from __future__ import annotations

import ctypes
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from ibmon.sources.localport import LocalCA

#: A batch's answers as the loop makes them: (payload or None, error or None), request order.
RawResult = tuple[bytes | None, str | None]

# Imported where used: the MAD worker process imports this module on every start, and only
# needs ``localport`` (dataclasses and all) to explain a port that would not open.

__all__ = [
    "ATTR_CLASS_PORT_INFO",
    "ATTR_LINEAR_FWD_TBL",
    "ATTR_MLNX_EXT_PORT_INFO",
    "ATTR_NODE_DESC",
    "ATTR_NODE_INFO",
    "ATTR_PORT_COUNTERS",
    "ATTR_PORT_COUNTERS_EXT",
    "ATTR_PORT_INFO",
    "ATTR_PORT_RCV_ERROR_DETAILS",
    "ATTR_PORT_SAMPLES_CONTROL",
    "ATTR_PORT_XMIT_DISCARD_DETAILS",
    "ATTR_SWITCH_INFO",
    "CLASS_PMA",
    "CLASS_SMI",
    "CLASS_SMI_DIRECT",
    "MadEngine",
    "MadError",
    "MadRequest",
    "MadResult",
    "RawResult",
    "answer",
    "load_libraries",
    "local_cas",
]

CLASS_SMI = 0x01
CLASS_SMI_DIRECT = 0x81
CLASS_PMA = 0x04
ATTR_CLASS_PORT_INFO = 0x0001
ATTR_NODE_DESC = 0x0010
ATTR_NODE_INFO = 0x0011
ATTR_PORT_INFO = 0x0015
# Mellanox's vendor ExtendedPortInfo SMP (FDR10): libibmad mad.h IB_ATTR_MLNX_EXT_PORT_INFO
ATTR_MLNX_EXT_PORT_INFO = 0xFF90
# SMP SwitchInfo (its LinearFDBTop bounds the table) and LinearForwardingTable (64 one-byte
# egress ports a block, attribute modifier = block number): libibmad mad.h
ATTR_SWITCH_INFO = 0x0012
ATTR_LINEAR_FWD_TBL = 0x0019
ATTR_PORT_COUNTERS = 0x0012
ATTR_PORT_COUNTERS_EXT = 0x001D
# libibmad mad.h IB_GSI_PORT_RCV_ERROR_DETAILS / IB_GSI_PORT_XMIT_DISCARD_DETAILS
ATTR_PORT_RCV_ERROR_DETAILS = 0x0015
ATTR_PORT_XMIT_DISCARD_DETAILS = 0x0016
# PMA PortSamplesControl: its Tick field says what one PortXmitWait count stands for
ATTR_PORT_SAMPLES_CONTROL = 0x0010

_METHOD_GET = 0x01
_MAD_SIZE = 256
_QP1_QKEY = 0x80010000
_PERMISSIVE_LID = 0xFFFF
_ETIMEDOUT = 110
_ZERO_MAD = bytes(_MAD_SIZE)
_TID = struct.Struct(">Q")
_STATUS = struct.Struct(">H")
_U32 = struct.Struct("=I")


class MadError(RuntimeError):
    """The MAD layer cannot be used at all (library missing, no umad device, no permission).

    ``cause`` says which when it is known: ``absent`` (no such CA or port, library missing),
    ``permission`` or ``unknown``.
    """

    def __init__(self, message: str, cause: str | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class MadRequest(NamedTuple):
    """One Get. ``path`` (hop ports) means directed route from the local port; else ``lid``.

    A named tuple, not a dataclass: a sweep builds thousands per poll, and a tuple is built
    several times faster than a frozen dataclass.
    """

    mgmt_class: int
    attr_id: int
    attr_mod: int = 0
    lid: int = 0
    path: tuple[int, ...] | None = None
    port_select: int | None = None  # PMA PortSelect


class MadResult(NamedTuple):
    """The attribute payload (SMP 64 bytes, PMA 192 bytes) or why there is none."""

    data: bytes | None
    error: str | None = None  # timeout | busy | redirect | status_0xNNNN | send_failed


_CA_NAME_LEN = 20  # UMAD_CA_NAME_LEN
_CA_MAX_PORTS = 10  # UMAD_CA_MAX_PORTS
_MAX_CAS = 32  # UMAD_MAX_DEVICES


class _UmadPort(ctypes.Structure):
    """``umad_port_t`` from libibumad's umad.h (public, stable ABI of libibumad.so.3)."""

    _fields_ = (
        ("ca_name", ctypes.c_char * _CA_NAME_LEN),
        ("portnum", ctypes.c_int),
        ("base_lid", ctypes.c_uint),
        ("lmc", ctypes.c_uint),
        ("sm_lid", ctypes.c_uint),
        ("sm_sl", ctypes.c_uint),
        ("state", ctypes.c_uint),
        ("phys_state", ctypes.c_uint),
        ("rate", ctypes.c_uint),
        ("capmask", ctypes.c_uint32),
        ("gid_prefix", ctypes.c_uint64),
        ("port_guid", ctypes.c_uint64),
        ("pkeys_size", ctypes.c_uint),
        ("pkeys", ctypes.POINTER(ctypes.c_uint16)),
        ("link_layer", ctypes.c_char * _CA_NAME_LEN),
    )


class _UmadCA(ctypes.Structure):
    """``umad_ca_t`` from libibumad's umad.h."""

    _fields_ = (
        ("ca_name", ctypes.c_char * _CA_NAME_LEN),
        ("node_type", ctypes.c_uint),
        ("numports", ctypes.c_int),
        ("fw_ver", ctypes.c_char * 20),
        ("ca_type", ctypes.c_char * 40),
        ("hw_ver", ctypes.c_char * 20),
        ("node_guid", ctypes.c_uint64),
        ("system_guid", ctypes.c_uint64),
        ("ports", ctypes.POINTER(_UmadPort) * _CA_MAX_PORTS),
    )


def _cdll(soname: str, name: str) -> ctypes.CDLL:
    """The library by the soname whose ABI the prototypes here are for; ``find_library`` only
    when the loader does not know that name (it runs ``ldconfig -p``: a few ms on every start
    of the MAD worker, plus importing ``ctypes.util``)."""
    try:
        return ctypes.CDLL(soname, use_errno=True)
    except OSError:
        from ctypes.util import find_library  # the fallback only

        found = find_library(name)
        if not found:
            raise
        return ctypes.CDLL(found, use_errno=True)


_libs: tuple[ctypes.CDLL, ctypes.CDLL] | None = None
_libs_lock = threading.Lock()


def load_libraries() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    """libibmad.so.5 and libibumad.so.3 with the prototypes used here (loaded once)."""
    global _libs  # noqa: PLW0603 - loaded once per process, under _libs_lock
    with _libs_lock:
        if _libs is not None:
            return _libs
        try:
            mad = _cdll("libibmad.so.5", "ibmad")
            umad = _cdll("libibumad.so.3", "ibumad")
        except OSError as exc:
            raise MadError(
                f"libibmad/libibumad not loadable (apt package libibmad5): {exc}", "absent"
            ) from exc
        vp, ci, cu = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint
        mad.mad_rpc_open_port.restype = vp
        mad.mad_rpc_open_port.argtypes = [ctypes.c_char_p, ci, ctypes.POINTER(ci), ci]
        mad.mad_rpc_close_port.restype = None
        mad.mad_rpc_close_port.argtypes = [vp]
        mad.mad_rpc_portid.restype = ci
        mad.mad_rpc_portid.argtypes = [vp]
        mad.mad_rpc_class_agent.restype = ci
        mad.mad_rpc_class_agent.argtypes = [vp, ci]
        mad.mad_decode_field.restype = None
        mad.mad_decode_field.argtypes = [vp, ci, vp]
        mad.mad_field_name.restype = ctypes.c_char_p
        mad.mad_field_name.argtypes = [ci]
        umad.umad_size.restype = ctypes.c_size_t
        umad.umad_size.argtypes = []
        umad.umad_get_mad.restype = vp
        umad.umad_get_mad.argtypes = [vp]
        umad.umad_set_addr.restype = ci
        umad.umad_set_addr.argtypes = [vp, ci, ci, ci, ci]
        umad.umad_send.restype = ci
        umad.umad_send.argtypes = [ci, ci, vp, ci, ci, ci]
        umad.umad_recv.restype = ci
        umad.umad_recv.argtypes = [ci, vp, ctypes.POINTER(ci), ci]
        umad.umad_get_cas_names.restype = ci
        umad.umad_get_cas_names.argtypes = [vp, ci]
        umad.umad_get_ca.restype = ci
        umad.umad_get_ca.argtypes = [ctypes.c_char_p, ctypes.POINTER(_UmadCA)]
        umad.umad_release_ca.restype = ci
        umad.umad_release_ca.argtypes = [ctypes.POINTER(_UmadCA)]
        del cu
        _libs = (mad, umad)
        return _libs


def local_cas() -> list[LocalCA]:
    """The local CAs and their ports as libibumad sees them (what infiniband-diags use).

    Read through the library rather than sysfs directly, so the answer is the one the MAD
    layer acts on (and, under ibsim's umad2sim shim, the simulated CA).
    """
    from ibmon.sources.localport import LocalCA, LocalPort  # see the imports

    _mad, umad = load_libraries()
    names = (ctypes.c_char * (_CA_NAME_LEN * _MAX_CAS))()
    n = umad.umad_get_cas_names(names, _MAX_CAS)
    out: list[LocalCA] = []
    for i in range(max(0, n)):
        raw = names.raw[i * _CA_NAME_LEN : (i + 1) * _CA_NAME_LEN].split(b"\0", 1)[0]
        ca = _UmadCA()
        if umad.umad_get_ca(raw, ctypes.byref(ca)) < 0:
            continue
        try:
            ports: dict[int, LocalPort] = {}
            for pnum in range(min(ca.numports, _CA_MAX_PORTS - 1) + 1):
                ptr = ca.ports[pnum]
                if not ptr:
                    continue
                p = ptr.contents
                ports[pnum] = LocalPort(
                    number=pnum,
                    state=p.state,
                    phys_state=p.phys_state,
                    link_layer=p.link_layer.decode("ascii", "replace") or "InfiniBand",
                )
            out.append(LocalCA(raw.decode("ascii", "replace"), ca.node_type == 2, ports))
        finally:
            umad.umad_release_ca(ctypes.byref(ca))
    return out


def _open_failure(ca: str | None, port: int, os_errno: int) -> MadError:
    """The MadError for a port that would not open: what was tried and what the host has."""
    from ibmon.sources.localport import (  # see the imports
        explain_open_failure,
        umad_access_problem,
    )

    try:
        cas = local_cas()
    except (OSError, MadError):
        cas = []
    failure = explain_open_failure(
        cas, ca, port or None, os_errno=os_errno, access_problem=umad_access_problem()
    )
    return MadError(failure.message, failure.cause)


def _build_into(buf: bytearray | memoryview, req: MadRequest, tid: int) -> None:
    """Write the Get MAD for ``req`` over a zeroed 256-byte buffer (IBA 13.4.3, 14.2.1.2 DR SMP)."""
    directed = req.path is not None
    buf[0] = 1  # BaseVersion
    buf[1] = CLASS_SMI_DIRECT if directed else req.mgmt_class
    buf[2] = 1  # ClassVersion
    buf[3] = _METHOD_GET
    struct.pack_into(">QHHI", buf, 8, tid, req.attr_id, 0, req.attr_mod)
    if directed:
        path = req.path or ()
        buf[7] = len(path)  # hop count; hop pointer (byte 6) stays 0
        struct.pack_into(">HH", buf, 32, _PERMISSIVE_LID, _PERMISSIVE_LID)
        for i, port in enumerate(path, start=1):
            buf[128 + i] = port
    if req.mgmt_class == CLASS_PMA and req.port_select is not None:
        buf[64 + 1] = req.port_select


#: MAD status words that say "not now" rather than "not supported" (IBA MAD status field:
#: bit 0 busy, bit 1 redirect; libibmad mad.h ``IB_MAD_STS_BUSY``, ``IB_MAD_STS_REDIRECT``).
_NOT_NOW = {0x0001: "busy", 0x0002: "redirect"}


def answer(mad: memoryview | bytes) -> RawResult:
    """A response MAD's attribute, or why there is none.

    Any status but 0 is an error, as in libibmad's ``mad_rpc`` (what perfquery reports): a busy
    or redirecting responder sends no attribute, and reading its payload as counters would
    count a reset that never happened. ``busy`` and ``redirect`` say "not now" (the next poll
    asks again; redirects are not followed); ``status_0xNNNN`` with bits 2-4 set (bad version,
    method, attribute or value) says the responder does not support the request. The D bit
    (15) of a directed-route SMP's status says which way it travelled.
    """
    status = _STATUS.unpack_from(mad, 4)[0]
    if mad[1] == CLASS_SMI_DIRECT:
        status &= 0x7FFF
    if status:
        return None, _NOT_NOW.get(status) or f"status_0x{status:04x}"
    return bytes(mad[64:]), None


class MadEngine:
    """One umad port with a window of outstanding MADs; ``run`` is blocking (use a thread).

    Not thread-safe: one engine per thread. ``close`` releases the port.

    The per-MAD path is kept to one ``umad_send`` and one ``umad_recv`` ctypes call: MADs are
    packed straight into the umad send buffer, the address is set only when it changes, replies
    are read through a memoryview, and expiry looks only at the oldest outstanding MAD (sends
    happen in deadline order). Under ibsim the sweep is bound by this loop, not by the fabric.
    """

    def __init__(
        self,
        *,
        ca: str | None = None,
        port: int = 0,
        timeout: float = 1.0,
        retries: int = 2,
        window: int = 64,
    ) -> None:
        self._mad, self._umad = load_libraries()
        classes = (ctypes.c_int * 3)(CLASS_SMI, CLASS_SMI_DIRECT, CLASS_PMA)
        ctypes.set_errno(0)
        # port 0 = any: libibumad picks a switch's port 0, else the first active port
        handle = self._mad.mad_rpc_open_port(ca.encode() if ca else None, port, classes, 3)
        if not handle:
            raise _open_failure(ca, port, ctypes.get_errno())
        self._handle: int | None = handle
        self._fd = self._mad.mad_rpc_portid(handle)
        self._agents = {
            c: self._mad.mad_rpc_class_agent(handle, c)
            for c in (CLASS_SMI, CLASS_SMI_DIRECT, CLASS_PMA)
        }
        self.timeout = timeout
        self._tmo_ms = 1
        self.retries = retries
        self.window = max(1, window)
        self._usize = int(self._umad.umad_size())
        self._tid = int(time.monotonic_ns()) & 0x7FFFFFFF
        self._send_buf = ctypes.create_string_buffer(self._usize + _MAD_SIZE)
        self._recv_buf = ctypes.create_string_buffer(self._usize + _MAD_SIZE)
        # plain addresses: ctypes converts an int argument faster than a buffer object
        self._send_addr = ctypes.addressof(self._send_buf)
        self._recv_addr = ctypes.addressof(self._recv_buf)
        # where the MAD starts in a umad buffer (after struct ib_user_mad's header)
        self._mad_offset = int(self._umad.umad_get_mad(self._send_buf)) - self._send_addr
        self._send_view = self._mad_view(self._send_buf)
        self._recv_view = self._mad_view(self._recv_buf)
        # struct ib_user_mad starts {u32 agent_id; u32 status; ...}: what umad_status() reads
        self._recv_head = memoryview(self._recv_buf).cast("B")[:8]
        self._addr: tuple[int, int, int] | None = None

    def _mad_view(self, buf: ctypes.Array[ctypes.c_char]) -> memoryview:
        """The 256 MAD bytes inside a umad buffer, writable in place (no memmove per MAD)."""
        offset = self._mad_offset
        return memoryview(buf).cast("B")[offset : offset + _MAD_SIZE]

    def close(self) -> None:
        if self._handle:
            self._mad.mad_rpc_close_port(self._handle)
            self._handle = None

    def __enter__(self) -> MadEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _next_tid(self) -> int:
        self._tid = (self._tid + 1) & 0xFFFFFFFF or 1
        return self._tid

    def _send(self, req: MadRequest, tid: int) -> bool:
        view = self._send_view
        view[:] = _ZERO_MAD
        _build_into(view, req, tid)
        if req.path is not None:
            addr, agent = (_PERMISSIVE_LID, 0, 0), self._agents[CLASS_SMI_DIRECT]
        elif req.mgmt_class == CLASS_PMA:
            addr, agent = (req.lid, 1, _QP1_QKEY), self._agents[CLASS_PMA]
        else:
            addr, agent = (req.lid, 0, 0), self._agents[CLASS_SMI]
        if addr != self._addr:
            self._umad.umad_set_addr(self._send_addr, addr[0], addr[1], 0, addr[2])
            self._addr = addr
        rc = self._umad.umad_send(self._fd, agent, self._send_addr, _MAD_SIZE, self._tmo_ms, 0)
        return bool(rc >= 0)

    def run(
        self,
        requests: Sequence[MadRequest],
        emit: Callable[[list[MadResult]], None] | None = None,
        chunk: int = 512,
    ) -> list[MadResult]:
        """Send every request (``window`` at a time) and return results in request order.

        With ``emit``, every time the answered prefix of the batch has grown by ``chunk``
        results, that part goes to ``emit`` (in request order) and is left out of the returned
        list, which then holds only the rest: the caller can decode the first answers while
        later MADs are still in flight.
        """

        def emit_results(part: list[RawResult]) -> None:
            assert emit is not None
            emit(list(map(MadResult._make, part)))

        raw = self.run_raw(requests, emit_results if emit is not None else None, chunk)
        return list(map(MadResult._make, raw))

    def run_raw(
        self,
        requests: Sequence[MadRequest],
        emit: Callable[[list[RawResult]], None] | None = None,
        chunk: int = 512,
    ) -> list[RawResult]:
        """``run`` with plain (payload, error) tuples: what the MAD worker ships as they are."""
        if not self._handle:
            raise MadError("MAD port closed")
        n = len(requests)
        results: list[RawResult | None] = [None] * n
        done = emitted = 0  # results[:done] are all in; results[:emitted] went to ``emit``
        tries = [0] * len(requests)
        todo: deque[int] = deque(range(len(requests)))
        pending: dict[int, int] = {}  # tid -> request index
        deadlines: deque[tuple[float, int]] = deque()  # (deadline, tid), oldest first
        length = ctypes.c_int(_MAD_SIZE)
        length_p = ctypes.pointer(length)
        umad_recv = self._umad.umad_recv
        recv_buf, view, head, fd = self._recv_addr, self._recv_view, self._recv_head, self._fd
        timeout, window, send, next_tid = self.timeout, self.window, self._send, self._next_tid
        self._tmo_ms = max(1, int(timeout * 1000))  # the kernel's own timeout for each send

        def retry_or_fail(idx: int) -> None:
            if tries[idx] < self.retries:
                tries[idx] += 1
                todo.appendleft(idx)
            else:
                results[idx] = (None, "timeout")

        while todo or pending:
            now = time.monotonic()
            while todo and len(pending) < window:
                idx = todo.popleft()
                tid = next_tid()
                if not send(requests[idx], tid):
                    results[idx] = (None, "send_failed")
                    continue
                pending[tid] = idx
                deadlines.append((now + timeout, tid))
            if not pending:
                continue
            while deadlines[0][1] not in pending:  # answered: drop from the expiry queue
                deadlines.popleft()
            wait_ms = max(0, min(50, int((deadlines[0][0] - now) * 1000)))
            length.value = _MAD_SIZE
            if umad_recv(fd, recv_buf, length_p, wait_ms) >= 0:
                tid = _TID.unpack_from(view, 8)[0] & 0xFFFFFFFF
                idx = pending.pop(tid, -1)
                if idx >= 0:
                    if _U32.unpack_from(head, 4)[0] == _ETIMEDOUT or not view[3] & 0x80:
                        retry_or_fail(idx)  # the kernel returned our own send: it timed out
                    else:
                        results[idx] = answer(view)
                now = time.monotonic()
            while deadlines and deadlines[0][0] <= now:
                idx = pending.pop(deadlines.popleft()[1], -1)
                if idx >= 0:
                    retry_or_fail(idx)
            if emit is not None and done < n and results[done] is not None:
                done += 1
                while done < n and results[done] is not None:
                    done += 1
                if done - emitted >= chunk:
                    emit(results[emitted:done])  # type: ignore[arg-type]  # all answered
                    emitted = done
        return [r if r is not None else (None, "timeout") for r in results[emitted:]]
