"""Prometheus text format 0.0.4 for every port series, fast enough for 20,000-port fabrics.

prometheus_client escapes every label of every sample on every scrape; a fabric of 20,000 ports
has half a million samples, which costs seconds. Here each port's escaped ``guid``/``port`` label
text is built once and cached until the port's identity changes, the descriptive ``_info``
families are kept as encoded bytes until the topology changes, and every other family is one list
comprehension of f-strings joined and encoded once (the counter families' values read as columns
of the ports' packed totals, ``_Block``; the lines of those that change every poll put together
by C passes, ``_joined_lines``). The exporter renders once per
FabricState, not per scrape.

Format rules this module keeps (promtool checks them in the tests):
- one ``# HELP``/``# TYPE`` pair per family and all samples of a family together;
- counter families carry their ``_total`` name in HELP/TYPE lines too: in text format 0.0.4 the
  family name must equal the sample name, otherwise promtool reports "no help text";
- label values escape backslash, double quote and newline, and are valid UTF-8 (lone surrogates,
  which ``os.fsdecode`` can produce from sysfs, become U+FFFD);
- floats use Go's spelling for non-finite values: ``NaN``, ``+Inf``, ``-Inf``;
- no family name contains a type word (promtool's lint): which hardware counter a saturation or
  reset series is about is its ``counter`` label, and driver ``hw_counters`` are "stats"
  (``ibmon_port_hw_stat_total`` for counts, ``ibmon_port_hw_stat`` for settings and levels).
"""

from __future__ import annotations

import hashlib
import re
import threading
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import compress
from math import isfinite
from operator import attrgetter, is_not, itemgetter
from typing import TYPE_CHECKING, Any

from exporters.valuetext import (
    NO_TEXT,
    array_texts,
    float_texts,
    int_texts,
)
from ibmon.infiniband.counters import CATALOGUE
from ibmon.infiniband.model import LinkInfo, PortIdentity, PortKey, PortView
from ibmon.runtime.sizes import fabric_sized
from ibmon.track.rowview import (
    RowView,
    Span,
    as_run,
    packed,
    ratio_arrays,
    ratio_columns,
    span_ratio_arrays,
    store_numpy,
)
from ibmon.track.totals import Totals

if TYPE_CHECKING:
    from exporters.http import Deflated

__all__ = [
    "SEGMENT_PORTS",
    "SLICE_LINES",
    "PortRenderer",
    "escape_help",
    "escape_label_value",
    "format_float",
    "render_ports",
]

#: Ports per cached, separately compressed block of a family (``series_deflated``): a block
#: size, not a switch between ways of rendering (every state, a node's 16 HCAs too, is
#: rendered in cached blocks; a state under it is one block). Small enough that a change on
#: one port re-renders a few percent of a family, large enough that the per-block overhead
#: (a CRC combine, a flush marker) stays in the noise.
SEGMENT_PORTS = 8192
#: Lines of a block joined, encoded and compressed at a time. Each slice's text and bytes (a
#: series line is under 130 bytes) stay under glibc's 128 KiB mmap threshold, which the systemd
#: unit and the column store fix: glibc serves them from its free lists, reused slice after
#: slice. A whole block's text and bytes (about 740 KB each) were mapped afresh for every block
#: of every family that moved and faulted in page by page: 24,000 page faults a publish at
#: 36,720 ports, a sixth of its time.
SLICE_LINES = 512

_SURROGATE = re.compile("[\ud800-\udfff]")
_NON_FINITE = {"nan": "NaN", "inf": "+Inf", "-inf": "-Inf"}


def escape_label_value(value: str) -> str:
    """Make an untrusted string a valid label value (without the surrounding quotes)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = _SURROGATE.sub("\ufffd", value)
    if "\\" in value or '"' in value or "\n" in value:
        value = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def escape_help(text: str) -> str:
    """HELP text escapes only backslash and newline (quotes are literal there)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_float(value: float) -> str:
    """Shortest round-tripping spelling; Go's ParseFloat reads Python's repr except non-finite."""
    text = repr(float(value))
    return _NON_FINITE.get(text, text)


def _fix_non_finite(text: str) -> str:
    """Respell Python's ``inf``/``nan`` sample values the Go way in rendered float lines.

    Float families are rendered with ``repr`` inline (a function call per value costs about a tenth
    of the render), and only lines of a column that has a value that is not finite (``_finite``)
    are passed here. Raw newlines end samples only (label values escape them), so `` inf``
    followed by a newline can only be a value.
    """
    if "inf\n" in text or "nan\n" in text:
        text = text.replace(" inf\n", " +Inf\n").replace(" -inf\n", " -Inf\n")
        text = text.replace(" nan\n", " NaN\n")
    return text


def _header(name: str, kind: str, help_: str) -> str:
    return f"# HELP {name} {escape_help(help_)}\n# TYPE {name} {kind}\n"


class _EscapeMemo(dict[str, str]):
    """Escaped label values of the few distinct strings used as extra labels (counter names)."""

    def __missing__(self, key: str) -> str:
        if len(self) > 4096:  # bounded: these come from hardware, which could misbehave
            self.clear()
        value = escape_label_value(key)
        self[key] = value
        return value


def _info_line(ident: PortIdentity, labels: str) -> str:
    e = escape_label_value
    lid = "" if ident.lid is None else str(ident.lid)
    return (
        f'ibmon_port_info{{{labels},device="{e(ident.device)}",node_desc="{e(ident.node_desc)}",'
        f'node_type="{e(ident.node_type)}",lid="{e(lid)}",link_layer="{e(ident.link_layer)}",'
        f'source="{e(ident.source)}"}} 1\n'
    )


def _link_line(labels: str, link: LinkInfo, active_width: str, active_speed: str) -> str:
    """The view's width/speed come from the latest poll; the link's from the last discovery."""
    e = escape_label_value
    width = active_width or link.active_width
    speed = active_speed or link.active_speed
    return (
        f'ibmon_link_info{{{labels},remote_guid="{e(link.remote_guid)}",'
        f'remote_port="{e(link.remote_port)}",remote_node_desc="{e(link.remote_node_desc)}",'
        f'active_width="{e(width)}",active_speed="{e(speed)}",max_width="{e(link.max_width)}",'
        f'max_speed="{e(link.max_speed)}"}} 1\n'
    )


def _link_lines(labels: Sequence[str], links: Sequence[LinkInfo | None],
                widths: Sequence[str], speeds: Sequence[str]) -> list[str]:
    """The ``_link_info`` lines of a run of ports (columns of ``prepare``), ports without a
    known link skipped."""
    return [_link_line(lb, link, w, sp)
            for lb, link, w, sp in zip(labels, links, widths, speeds, strict=True)
            if link is not None]


def _device_lines(idents: Iterable[PortIdentity]) -> list[str]:
    """One ``ibmon_device_info`` line per device (a CA's ports share it) that has a firmware
    version, type or board, sorted by source, device and GUID."""
    e = escape_label_value
    devices = sorted({(i.source, i.device, i.guid, i.fw_ver, i.hca_type, i.board_id)
                      for i in idents if i.device and (i.fw_ver or i.hca_type or i.board_id)})
    return [f'ibmon_device_info{{board_id="{e(board)}",device="{e(device)}",fw_ver="{e(fw)}",'
            f'guid="{e(guid)}",hca_type="{e(hca)}",source="{e(source)}"}} 1.0\n'
            for source, device, guid, fw, hca, board in devices]


def _labels(ident: PortIdentity) -> str:
    return f'guid="{escape_label_value(ident.guid)}",port="{escape_label_value(ident.port)}"'


_DEVICE_HEADER = _header(
    "ibmon_device_info", "gauge",
    "Always 1; one series per device a source read its firmware, type or board from (sysfs), "
    "as node_exporter's node_infiniband_info.")
_INFO_HEADER = _header("ibmon_port_info", "gauge",
                       "Descriptive data of a port; always 1. Join on (guid, port).")
_LINK_HEADER = _header("ibmon_link_info", "gauge",
                       "The far end of a port's link and its active and best width and speed; "
                       "always 1.")
_STATE_HEADER = _header("ibmon_port_state", "gauge",
                        "IBA PortState: 1 down, 2 init, 3 armed, 4 active, 5 active defer.")
_PHYS_HEADER = _header("ibmon_port_physical_state", "gauge",
                       "IBA PortPhysicalState: 1 sleep, 2 polling, 3 disabled, 4 training, "
                       "5 link up, 6 link error recovery, 7 phy test.")
_RATE_HEADER = _header("ibmon_port_rate_bytes_per_second", "gauge",
                       "Effective data rate of the link (after encoding), bytes per second.")
_COUNTER_HEADERS = tuple(
    (spec.name, spec.metric + "{", _header(spec.metric, "counter", spec.help))
    for spec in CATALOGUE
)
_HW_HEADER = _header("ibmon_port_hw_stat_total", "counter",
                     "Driver hw_counters of the port that count (sysfs), software-accumulated.")
_HW_GAUGE_HEADER = _header("ibmon_port_hw_stat", "gauge",
                           "Driver hw_counters of the port that are settings or levels (sysfs), "
                           "as read, e.g. lifespan in milliseconds.")
_UTIL_HEADER = _header("ibmon_port_utilization_ratio", "gauge",
                       "Data rate over link rate, 0 to 1, per direction.")
_WAIT_HEADER = _header("ibmon_port_transmit_wait_ratio", "gauge",
                       "Fraction of time the port had data to send but could not (PortXmitWait).")
_WAIT_SECONDS_HEADER = _header(
    "ibmon_port_transmit_wait_seconds_total", "counter",
    "Seconds the port had data to send but sent nothing (PortXmitWait in the port's unit over "
    "its data rate), software-accumulated: rate() is the stall fraction.")
_WAIT_UNIT_HEADER = _header(
    "ibmon_port_transmit_wait_unit_bytes", "gauge",
    "Bytes of lost transmission one PortXmitWait count stands for on the port at its width; "
    "per: the rule counts per port or per lane; source: tick, family, default or config.")
_BER_HEADER = _header("ibmon_port_symbol_error_ber", "gauge",
                      "Symbol errors per bit received over the detector's window.")
_COND_HEADER = _header("ibmon_port_condition", "gauge",
                       "1 while a detector reports the condition on the port.")
_CAUSE_HEADER = _header("ibmon_port_condition_cause", "gauge",
                        "1 while a condition fires on the port that carries it (a link fault: "
                        "one end of the link), labelled with its likely cause: physical, "
                        "buffer_overrun, routing, mtu_mismatch, congestion_victim, link_down, "
                        "speed_negotiation or unknown.")
_SAT_HEADER = _header("ibmon_port_saturated", "gauge",
                      "1 while the hardware counter is stuck at its maximum (rate unknown).")
_STALE_HEADER = _header("ibmon_port_stale", "gauge",
                        "1 while the port did not answer its source's latest poll: its series "
                        "are the last values read, without rates. Absent otherwise.")
_RESETS_HEADER = _header("ibmon_port_resets_total", "counter",
                         "Hardware counter resets ibmon observed and accumulated across.")


class PortRenderer:
    """Renders port views, caching each port's escaped label text between renders.

    Chunks are encoded family by family, one chunk per non-empty metric family, in a fixed family
    order and in the order of the given views inside each family; ``iter_chunks`` yields them one
    at a time so a consumer (the exporter's compressor) never needs the whole body in memory.
    With ``keep_descriptive`` the ``_info`` families are kept as bytes until the topology changes;
    the exporter turns that off and keeps them compressed instead. Not re-entrant: callers that
    render from several threads hold ``lock``.
    """

    def __init__(self, *, keep_descriptive: bool = True) -> None:
        # Aligned with the last views rendered (sorted, so usually the same ports in the same
        # order): a port's escaped labels are found by position, no per-port key or dict is
        # kept. ``_seen`` holds the columns of those views they were made from (identity,
        # link, active width, active speed), which the ``_info`` families are rendered from.
        self._labels: list[str] = []
        self._seen: tuple[list[Any], ...] = ([], [], [], [])
        self._keep = keep_descriptive
        # The descriptive families change only with topology; reusing last render's encoded
        # chunks saves both the work and a second copy of the longest lines in memory.
        self._device: bytes | None = None
        self._info: bytes | None = None
        self._link: bytes | None = None
        self._names = _EscapeMemo()
        # series_deflated's cache: per (family index, first port of the block), the
        # ``_fingerprint`` of the values the block's lines were rendered from and its
        # compressed segment (None: no lines).
        self._segs: dict[tuple[int, int], tuple[object, Deflated | None]] = {}
        self._seg_labels: list[str] = []
        self._seg_level: int | None = None
        self._seg_headers: dict[int, Deflated] = {}
        # descriptive_deflated's cache: per (0 info / 1 link, first port of the block), its
        # compressed segment (None: no lines), and the positions prepare found changed since.
        self._desc_segs: dict[tuple[int, int], Deflated | None] = {}
        self._desc_level: int | None = None
        self._device_seg: list[Deflated] | None = None  # the device family's; None: to make
        self._moved: set[int] = set()  # another port, or its identity changed: both families
        self._relinked: set[int] = set()  # the same port, its link line changed
        self.lock = threading.Lock()

    def prepare(self, views: Sequence[PortView]) -> bool:
        """Refresh the label cache for ``views``; True when the ``_info`` families changed.

        The first call always returns True. ``descriptive_chunks`` and ``series_chunks`` render
        the views last prepared.
        """
        # What the labels were made from, as columns: a poll that changed no port's identity,
        # link, width or speed (nearly every poll of a fabric) is found with four C comparisons
        # of lists (identity first, like the loop below) instead of a Python step per port
        # (23 -> 6 ms at 36,720 ports). The columns are all that is kept of a port besides its
        # labels (an object a port cost 9.5 MB at 118,400 ports).
        seen = (list(map(_IDENTITY, views)), list(map(_LINK, views)),
                list(map(_WIDTH, views)), list(map(_SPEED, views)))
        old = self._labels
        unchanged = bool(old) and seen == self._seen
        old_idents, old_links, old_widths, old_speeds = self._seen
        self._seen = seen  # the newest objects: the next poll's comparisons are by identity
        if unchanged:
            return False
        idents, links, widths, speeds = seen
        by_key: dict[PortKey, int] | None = None
        labels: list[str] = []
        moved: list[int] = []  # positions that hold another port, or a new identity
        dirty = not old
        relinked = self._relinked
        for i, ident in enumerate(idents):
            j = i  # where this port was in the last render, or -1 when it was not
            if i >= len(old) or (old_idents[i] is not ident and old_idents[i] != ident):
                # Not the port at this position last time: ports came or went, or this one's
                # identity changed. Only then pay for an index of the previous render.
                if by_key is None:
                    by_key = {(t.guid, t.port): k for k, t in enumerate(old_idents)}
                j = by_key.get((ident.guid, ident.port), -1)
                if j >= 0 and old_idents[j] is not ident and old_idents[j] != ident:
                    j = -1
            if j < 0:
                labels.append(_labels(ident))
                moved.append(i)
                dirty = True
                continue
            labels.append(old[j])
            if j != i:
                moved.append(i)
            link = links[i]
            if not (
                (old_links[j] is link or old_links[j] == link)
                and old_widths[j] == widths[i]
                and old_speeds[j] == speeds[i]
            ):
                dirty = True
                relinked.add(i)
        same = not moved and len(labels) == len(old)
        dirty = dirty or not same
        self._labels = labels
        if dirty:
            self._info = self._link = None
            if moved or len(labels) != len(old):  # identities changed: devices may have
                self._device = self._device_seg = None
            if len(labels) != len(old):  # ports came or went: every block moved
                self._desc_segs.clear()
                self._moved.clear()
                relinked.clear()
            else:
                self._moved.update(moved)
        return dirty

    def descriptive_chunks(self) -> Iterator[bytes]:
        """The ``_info`` families of the views last prepared (from the cache when unchanged).

        Lazily, one family at a time: without the cache, the first is released before the
        second is built.
        """
        device = self._device
        if device is None:
            device = _family(_DEVICE_HEADER, _device_lines(self._seen[0]))
            if self._keep:
                self._device = device
        yield from _some(device)
        device = b""
        info, link = self._info, self._link
        if info is None or link is None:
            labels = self._labels
            idents, links, widths, speeds = self._seen
            info = _family(_INFO_HEADER, list(map(_info_line, idents, labels)))
            if self._keep:
                self._info = info
            yield from _some(info)
            info = b""
            link = _family(_LINK_HEADER, _link_lines(labels, links, widths, speeds))
            if self._keep:
                self._link = link
            yield from _some(link)
            return
        yield from _some(info)
        yield from _some(link)

    def descriptive_deflated(self, level: int) -> Deflated:
        """``descriptive_chunks`` of the views last prepared as a non-final raw-deflate
        segment, building and compressing again only the blocks of ``SEGMENT_PORTS`` ports
        where a port's identity or link changed since the last call.

        A link that changes width or speed (a degraded or flapping link) then costs its block
        of the ``_link_info`` family, not both families of every port (15 against 129 ms at
        36,720 ports, on every poll such a link changed). The decompressed segment equals
        ``b"".join(descriptive_chunks())``.
        """
        from exporters.http import deflate_chunks

        labels = self._labels
        idents, links, widths, speeds = self._seen
        segs = self._desc_segs
        moved, relinked = self._moved, self._relinked
        if level != self._desc_level:
            segs.clear()
            self._device_seg = None
            self._desc_level = level
        for i in moved:
            start = i - i % SEGMENT_PORTS
            segs.pop((0, start), None)
            segs.pop((1, start), None)
        for i in relinked:
            segs.pop((1, i - i % SEGMENT_PORTS), None)
        moved.clear()
        relinked.clear()

        def deflate(lines: _Text) -> Deflated | None:
            if not lines:
                return None
            return deflate_chunks(_encoded(lines), level, final=False)

        if self._device_seg is None:  # one block: a fabric has far fewer devices than ports
            lines = _device_lines(idents)
            seg = deflate([_DEVICE_HEADER, *lines]) if lines else None
            self._device_seg = [seg] if seg is not None else []
        out: list[Deflated] = list(self._device_seg)
        for fam, header in enumerate((_INFO_HEADER, _LINK_HEADER)):
            body: list[Deflated] = []
            for start in range(0, len(labels), SEGMENT_PORTS):
                if (fam, start) not in segs:
                    cut = slice(start, start + SEGMENT_PORTS)
                    segs[(fam, start)] = deflate(
                        list(map(_info_line, idents[cut], labels[cut])) if fam == 0 else
                        _link_lines(labels[cut], links[cut], widths[cut], speeds[cut]))
                seg = segs[(fam, start)]
                if seg is not None:
                    body.append(seg)
            if body:
                head = segs.get((fam, -1))  # the family's header, kept with its blocks
                if head is None:
                    head = segs[(fam, -1)] = deflate_chunks(
                        (header.encode("utf-8"),), level, final=False)
                out.append(head)
                out.extend(body)
        return _joined(out, final=False)

    def series_chunks(self, views: Sequence[PortView]) -> Iterator[bytes]:
        """Every other family of the views last prepared, encoded one family at a time."""
        block = _Block(views, self._labels)
        names = self._names
        for fam in _FAMILIES:
            yield from _some(_family(fam.header, fam.render(block, names)))

    def series_deflated(self, views: Sequence[PortView], level: int, span: Span | None = None,
                        order: Sequence[int] | None = None) -> Deflated:
        """``series_chunks`` of the views last prepared as one final raw-deflate stream,
        rendering and compressing again only the blocks whose values changed.

        Each family is cut into blocks of ``SEGMENT_PORTS`` ports, each compressed on its own
        as a sync-flushed segment (``exporters.http.concat``'s rule). A block is kept from the
        previous call when its ports are the same (same labels in the same order) and every
        value its lines are made of (``_Family.keys``) compares equal; then its text would be
        the same, so its segment is too. On a fabric most counters are error counters that
        rarely move, so most blocks are reused (CPU per poll at fabric scale; on a node's 16
        HCAs the blocks cost no more than one stream, within 0.02 ms a poll). ``span``, when
        ``views`` are its views (in ``order``, a position in it a view: ``Span.positions``),
        says where their rows are. The decompressed stream equals
        ``b"".join(self.series_chunks(views))``.
        """
        from exporters.http import deflate_chunks

        labels = self._labels
        segs = self._segs
        if labels != self._seg_labels or level != self._seg_level:
            segs.clear()
            self._seg_headers.clear()
            self._seg_labels = labels
            self._seg_level = level
        names = self._names
        n = len(labels)
        at = None if span is None else span.positions(views, order)
        if at is None:
            span = None
        bodies: list[list[Deflated]] = [[] for _ in _FAMILIES]
        out: list[Deflated] = []

        def deflate(lines: _Text) -> Deflated | None:
            if not lines:
                return None
            return deflate_chunks(_encoded(lines), level, final=False)

        # Block by block, every family of a block before the next block: the block's views
        # are read while they are in the CPU's cache, and its columns are listed once. The
        # segments are then put together family by family. Families that change every poll
        # are rendered block by block too: each join, encode and free of a block's text is C
        # code that holds the GIL, and a whole family's (6 MB at 36,720 ports) made every
        # scrape wait for it.
        for start in range(0, n, SEGMENT_PORTS):
            stop = start + SEGMENT_PORTS
            block = _Block(views[start:stop], labels[start:stop], span,
                           None if at is None else at[start:stop])
            for fi, fam in enumerate(_FAMILIES):
                if fam.keys is None:  # changes every poll: render every block, keep none
                    seg = deflate(fam.render(block, names))
                else:
                    block_keys = fam.keys(block)
                    kept = _fingerprint(block_keys)
                    cached = segs.get((fi, start))
                    if cached is not None and cached[0] == kept:
                        seg = cached[1]
                    else:
                        seg = deflate(fam.render(block, names, block_keys))
                        segs[(fi, start)] = (kept, seg)
                if seg is not None:
                    bodies[fi].append(seg)
            del block
        for fi, (fam, body) in enumerate(zip(_FAMILIES, bodies, strict=True)):
            if body:
                head = self._seg_headers.get(fi)
                if head is None:
                    head = self._seg_headers[fi] = deflate_chunks(
                        (fam.header.encode("utf-8"),), level, final=False)
                out.append(head)
                out.extend(body)
        out.append(deflate_chunks((), level))  # the final (empty) block ends the stream
        return _joined(out, final=True)

    def iter_chunks(self, views: Iterable[PortView]) -> Iterator[bytes]:
        """Prepare ``views`` and yield every family's chunk, descriptive families first."""
        views = list(views)
        self.prepare(views)
        yield from self.descriptive_chunks()
        yield from self.series_chunks(views)

    def render(self, views: Iterable[PortView]) -> bytes:
        return b"".join(self.iter_chunks(views))


_UNIFORM = object()  # marks a fingerprint of a block whose ports all have one value


def _fingerprint(keys: Sequence[object] | None) -> object:
    """What ``series_deflated`` keeps of a block's keys until the next poll, equal (``==``)
    to the next poll's fingerprint exactly when the keys are.

    The keys themselves cost 8 bytes a port a family (19 MB at 118,400 ports) and are mostly
    one value repeated (no conditions, state active, no driver counters) or a counter column
    that moves every poll. A column of totals is kept as its SHA-256 (35-110 us a block of
    8,192 ports, against 2-3 ms to render it again; comparing the digest stands for comparing
    every value, as a collision is not a practical event) unless it is the shared all-zero
    column, which costs nothing to keep; a block of one repeated value is kept as that value
    and the block's length.
    """
    if isinstance(keys, array):
        if keys is _ZEROS.get(len(keys)):
            return keys
        return (keys.typecode, hashlib.sha256(keys).digest())
    if isinstance(keys, list) and keys and keys.count(keys[0]) == len(keys):
        return (_UNIFORM, keys[0], len(keys))
    return keys


def _encoded(lines: _Text) -> Iterator[bytes]:
    """A block's lines as encoded text, ``SLICE_LINES`` at a time; ``lines`` ends empty."""
    if type(lines) is _Joined:
        for text in lines:
            yield text.encode("utf-8")
        lines.clear()
        return
    for at in range(0, len(lines), SLICE_LINES):
        yield "".join(lines[at : at + SLICE_LINES]).encode("utf-8")
    lines.clear()


def _joined(segments: list[Deflated], *, final: bool) -> Deflated:
    """Deflate segments one after the other as one stream, without recompressing any."""
    from exporters.http import Deflated, crc32_combine

    parts: list[bytes] = []
    crc = 0
    size = 0
    for seg in segments:
        parts.extend(seg.parts)
        crc = crc32_combine(crc, seg.crc, seg.size)
        size += seg.size
    return Deflated(tuple(parts), crc, size, final)


_Pairs = Sequence[tuple[str, PortView]]  # (cached guid/port label text, view)
#: A block's lines of a family: text, a line an item (or ``_Joined``).
_Text = list[str]
_Lines = Callable[["_Block", "_EscapeMemo"], _Text]
_Keys = Callable[["_Block"], Sequence[object] | None]
_KeyLines = Callable[[Sequence[str], Sequence[object] | None], _Text]


class _Block:
    """The views of one block of ``series_deflated`` and the columns its families read.

    The 32 counter families all read ``totals``, and a pass per family read every port's
    totals 32 times a poll, bound by cache misses (155 ms at 36,720 ports). The tracker's
    views share one name index per counter set (``ibmon.track.totals.Totals``): their packed
    totals are then laid end to end and each family's column is a strided slice, in C
    (about 2 ms a block of 8,192 ports). Other blocks read each port's mapping once for all
    families (``itemgetter``, 60 ms at 36,720 ports).
    """

    __slots__ = ("_arrays", "_counters", "_pairs", "_ratio_texts", "_ratios",
                 "at", "labels", "span", "views")

    def __init__(self, views: Sequence[PortView], labels: Sequence[str],
                 span: Span | None = None, at: Any = None) -> None:
        self.views = views
        self.labels = labels
        #: the views are ``span``'s at ``at`` (a part of ``Span.positions``): their rows are
        #: found without reading them
        self.span = span
        self.at = at
        self._pairs: _Pairs | None = None
        self._counters: dict[str, Sequence[int | None]] | None = None
        self._ratios: tuple[list[float | None], ...] | None = None
        self._ratio_texts: tuple[list[str] | None, ...] | None = None
        self._arrays: tuple[Any, ...] | bool | None = False  # False: not read yet

    def ratios(self) -> tuple[list[float | None], ...]:
        """Each port's transmit and receive utilization and transmit-wait ratio (columns)."""
        if self._ratios is None:
            self._ratios = ratio_columns(self.views)
        return self._ratios

    def ratio_texts(self) -> tuple[list[str] | None, ...]:
        """The texts of ``ratios`` (``NO_TEXT`` for None) spelled in C straight from the
        tracker's arrays (``ratio_arrays``), without a float object a value; a column that
        must be spelled the Python way (``ratios``) is None."""
        if self._ratio_texts is None:
            arrays = self._ratio_arrays()
            self._ratio_texts = ((None, None, None) if arrays is None
                                 else tuple(map(array_texts, arrays)))
        return self._ratio_texts

    def _ratio_arrays(self) -> tuple[Any, ...] | None:
        if self._arrays is False:
            n = len(self.views)
            if not fabric_sized(n):
                self._arrays = None
            elif self.span is not None:
                self._arrays = span_ratio_arrays(self.span, self.at)
            else:
                self._arrays = ratio_arrays(self.views)
        assert self._arrays is not True
        return self._arrays

    @property
    def pairs(self) -> _Pairs:
        if self._pairs is None:
            self._pairs = list(zip(self.labels, self.views, strict=True))
        return self._pairs

    def counter(self, name: str) -> Sequence[int | None] | None:
        """Each port's total of ``name`` (None where the port does not count it), or None when
        no port of the block counts it."""
        if self._counters is None:
            if self.span is not None:
                self._counters = _span_columns(self.span, self.at)
            if self._counters is None:
                self._counters = _packed_columns(self.views)
            if self._counters is None:
                self._counters = _columns(list(map(_TOTALS, self.views)))
        return self._counters.get(name)


def _packed_columns(views: Sequence[PortView]) -> dict[str, Sequence[int | None]] | None:
    """The columns of the views' totals when they are all packed on one index (rows of the
    tracker's store: ``RowView``, or ``Totals``) in 64 bits; else None."""
    if not views:
        return {}
    first = packed(views[0], Totals)
    if first is None:
        return None
    index = first[0]
    width = len(index)
    # Ports in exposition order are consecutive rows of the tracker's column store (its rows
    # are reserved in the order a source reports ports, which is this order): a block is then
    # one or a few runs of one array, cut as slices, instead of a copy of every port's row.
    runs: list[tuple[Sequence[int], int, int]] = []
    rows_of: Sequence[int] = ()
    start = end = -1
    for v in views:
        # A RowView's rows read in place; any other view's totals must be a Totals.
        if type(v) is RowView:
            store = v.rows
            if store.index is not index:
                return None
            array_of, base = store.totals, v.row * store.width
        else:
            t = v.totals
            if type(t) is not Totals or t.index is not index:
                return None
            array_of, base = t.packed, t.base
        if array_of is rows_of and base == end:
            end += width
            continue
        runs.append((rows_of, start, end))
        rows_of = array_of
        start = base
        end = start + width
    runs.append((rows_of, start, end))
    del runs[0]  # the empty run before the first port
    return _run_columns(index, width, runs, len(views))


def _span_columns(span: Span, at: Any) -> dict[str, Sequence[int | None]] | None:
    """The columns of the totals of the views of ``span`` at ``at`` (``Span.positions``, a
    part of it), found without reading a view: slices of a run of its store's rows where they
    are consecutive (a block of the exporter's port order nearly always is), else each column
    gathered (numpy) on its own, a block's worth of rows being larger than glibc's mmap
    threshold (fresh pages every block)."""
    store = span.store
    width = store.width
    totals = store.totals
    n = len(at)
    run = as_run(at)
    if run is not None:
        lo = (span.first + run.start) * width
        return _run_columns(store.index, width, [(totals, lo, lo + n * width)], n)
    if type(totals) is not array or totals.typecode != "Q":
        return None  # a total outgrew 64 bits: the views' own
    np = store_numpy()  # a span is a part of the column store
    table = np.frombuffer(totals, dtype=np.uint64).reshape(-1, width)
    rows = at + span.first
    zeros = _zeros(n)
    columns: dict[str, Sequence[int | None]] = {}
    for name, i in store.index.items():
        column = array("Q")
        column.frombytes(table[rows, i].tobytes())
        columns[name] = zeros if column == zeros else column
    return columns


def _run_columns(index: Mapping[str, int], width: int, runs: list[tuple[Sequence[int], int, int]],
                 n: int) -> dict[str, Sequence[int | None]] | None:
    """The columns of ``n`` ports' totals laid out as ``runs`` (array, first offset, end) of
    rows of ``width`` on ``index``; None when a total outgrew 64 bits."""
    rows_of, start, end = runs[0]
    one = len(runs) == 1 and type(rows_of) is array
    zeros = _zeros(n)
    columns: dict[str, Sequence[int | None]] = {}
    for name, i in index.items():
        if one:
            column = rows_of[start + i : end : width]
        else:
            # Each run's part of the column, appended: a copy of the column only, where
            # copying the runs' rows end to end first cost twice as much (a block of
            # 8,192 ports in two runs: 2.1 -> 0.9 ms).
            column = array("Q")
            try:
                for part, lo, hi in runs:
                    # a list once a total outgrew 64 bits: OverflowError
                    column.extend(part[lo + i : hi : width])
            except (OverflowError, TypeError):
                return None
        # Most error counters of a fabric are zero on every port: their columns, kept until
        # the next publish to compare with, share one array (7 MB at 36,720 ports).
        columns[name] = zeros if column == zeros else column
    return columns


_ZEROS: dict[int, array[int]] = {}


def _zeros(n: int) -> array[int]:
    """A shared all-zero column of ``n`` ports (one per block length in use)."""
    zeros = _ZEROS.get(n)
    if zeros is None:
        if len(_ZEROS) > 8:  # block lengths change only when the fabric does
            _ZEROS.clear()
        zeros = _ZEROS[n] = array("Q", bytes(8 * n))
    return zeros


def _columns(totals: list[Mapping[str, int]]) -> dict[str, Sequence[int | None]]:
    try:
        rows: list[tuple[int | None, ...]] = list(map(_ALL_COUNTERS, totals))
    except KeyError:  # a port without some counter: the slower way
        rows = [tuple(map(t.get, _COUNTER_NAMES)) for t in totals]
    return dict(zip(_COUNTER_NAMES, zip(*rows, strict=True), strict=True))


_TOTALS = attrgetter("totals")
_NOT_NONE = partial(is_not, None)
_IDENTITY = attrgetter("identity")
_LINK = attrgetter("link")
_WIDTH = attrgetter("active_width")
_SPEED = attrgetter("active_speed")
_COUNTER_NAMES = tuple(spec.name for spec in CATALOGUE)
_ALL_COUNTERS = itemgetter(*_COUNTER_NAMES)


@dataclass(frozen=True, slots=True)
class _Family:
    """One metric family after the ``_info`` ones: how its lines are made, and what of each
    view they depend on (``keys``: one value per view, compared with ``==`` between renders).
    ``keys`` is None for families whose values change every poll anyway (rates): caching them
    would cost a comparison and save nothing. The lines come from the labels and the keys
    alone (``key_lines``: the counter families, read as columns) or from the block (``lines``:
    its (labels, view) pairs, or columns of its views); exactly one of the two is set."""

    header: str
    lines: _Lines | None
    keys: _Keys | None
    key_lines: _KeyLines | None = None

    def render(
        self, block: _Block, names: _EscapeMemo, keys: Sequence[object] | None = None
    ) -> _Text:
        """The block's lines: from its keys (``keys`` when the caller has them) where the
        family makes its lines from them, else from the views."""
        if self.key_lines is not None:
            assert self.keys is not None
            return self.key_lines(block.labels, self.keys(block) if keys is None else keys)
        assert self.lines is not None
        return self.lines(block, names)


def _state_lines(block: _Block, names: _EscapeMemo) -> list[str]:
    return [f"ibmon_port_state{{{lb}}} {v.state}\n" for lb, v in block.pairs if v.state is not None]


def _phys_lines(block: _Block, names: _EscapeMemo) -> list[str]:
    return [f"ibmon_port_physical_state{{{lb}}} {v.phys_state}\n"
            for lb, v in block.pairs if v.phys_state is not None]


def _float_lines(head: str) -> _KeyLines:
    """Lines ``{head}{label}} {value}`` of a float column (a value each port, None: no line)."""

    def key_lines(labels: Sequence[str], values: Sequence[object] | None) -> list[str]:
        assert values is not None
        texts = float_texts(values)  # type: ignore[arg-type]
        if texts is not None:
            return _text_lines(head, labels, texts)
        lines = [f"{head}{lb}}} {float(x)!r}\n"  # type: ignore[arg-type]
                 for lb, x in zip(labels, values, strict=True) if x is not None]
        return lines if _finite(values) else [_fix_non_finite(line) for line in lines]

    return key_lines


def _text_lines(head: str, labels: Sequence[str], texts: list[str]) -> list[str]:
    """Lines ``{head}{label}} {text}`` of a column's texts; a port whose text is ``NO_TEXT``
    (None) has no line."""
    if NO_TEXT in texts:
        kept = list(map(NO_TEXT.__ne__, texts))
        labels, texts = list(compress(labels, kept)), list(compress(texts, kept))
    return _joined_lines((head, "", "} ", "", "\n"), {1: labels, 3: texts})


def _finite(values: Iterable[object]) -> bool:
    """Whether every value that is not None is finite: a pass in C (about 40 ns a value),
    where looking for ``inf``/``nan`` in the rendered text read every byte of it."""
    return all(map(isfinite, filter(_NOT_NONE, values)))  # type: ignore[arg-type]


def _counter_family(name: str, head: str, header: str) -> _Family:
    def keys(block: _Block) -> Sequence[object] | None:
        # Totals are ints, so a None value means "not counted on this port".
        return block.counter(name)

    def key_lines(labels: Sequence[str], values: Sequence[object] | None) -> _Text:
        if values is None:
            return []
        texts = int_texts(values)  # type: ignore[arg-type]
        if texts is not None:  # a column of 64-bit totals: no None among them
            return _joined_lines((head, "", "} ", "", "\n"), {1: labels, 3: texts})
        return [f"{head}{lb}}} {x}\n"
                for lb, x in zip(labels, values, strict=True) if x is not None]

    return _Family(header, None, keys, key_lines=key_lines)


def _hw_lines(block: _Block, names: _EscapeMemo) -> list[str]:
    return [f'ibmon_port_hw_stat_total{{{lb},stat="{names[k]}"}} {n}\n'
            for lb, v in block.pairs if v.hw_totals for k, n in v.hw_totals.items()]


def _hw_gauge_lines(block: _Block, names: _EscapeMemo) -> list[str]:
    return [f'ibmon_port_hw_stat{{{lb},stat="{names[k]}"}} {n}\n'
            for lb, v in block.pairs if v.hw_gauges for k, n in v.hw_gauges.items()]


def _util_lines(block: _Block, names: _EscapeMemo) -> _Text:
    # The family that changes on every port every poll: both directions' texts spelled in C,
    # each port's two lines put together by C passes (``_line_parts``).
    tx_texts, rx_texts, _ = block.ratio_texts()
    if tx_texts is None or rx_texts is None:
        tx, rx, _ = block.ratios()
        tx_texts = float_texts(tx)
        rx_texts = float_texts(rx) if tx_texts is not None else None
        if tx_texts is None or rx_texts is None:
            return _util_lines_python(block.labels, tx, rx)
    labels = block.labels
    parts = _line_parts(_UTIL_LINE, {1: labels, 3: tx_texts, 6: labels, 8: rx_texts})
    # A direction without a value (a port whose link rate is unknown) has no line: its
    # parts are emptied (found in C; most blocks have none).
    width = len(_UTIL_LINE)
    for at, texts in ((0, tx_texts), (5, rx_texts)):
        if NO_TEXT in texts:
            for i in compress(range(len(texts)), map(NO_TEXT.__eq__, texts)):
                parts[i * width + at : i * width + at + 5] = _NO_LINE
    return _chunks(parts, width)


def _util_lines_python(labels: Sequence[str], tx: Sequence[float | None],
                       rx: Sequence[float | None]) -> list[str]:
    """The utilization lines spelled by Python: small blocks, non-finite values."""
    lines = [
        f'ibmon_port_utilization_ratio{{{lb},direction="transmit"}} {float(t)!r}\n'
        f'ibmon_port_utilization_ratio{{{lb},direction="receive"}} {float(r)!r}\n'
        if t is not None and r is not None else _one_util(
            lb, NO_TEXT if t is None else repr(float(t)), NO_TEXT if r is None else repr(float(r)))
        for lb, t, r in zip(labels, tx, rx, strict=True)
        if t is not None or r is not None
    ]
    return lines if _finite(tx) and _finite(rx) else [_fix_non_finite(line) for line in lines]


def _one_util(lb: str, tx: str, rx: str) -> str:
    """The utilization line of a port that has only one direction's (texts: ``NO_TEXT`` for
    the direction it has not)."""
    if tx != NO_TEXT:
        return f'ibmon_port_utilization_ratio{{{lb},direction="transmit"}} {tx}\n'
    return f'ibmon_port_utilization_ratio{{{lb},direction="receive"}} {rx}\n'


_UTIL_LINE: tuple[str, ...] = (
    "ibmon_port_utilization_ratio{", "", ',direction="transmit"} ', "", "\n",
    "ibmon_port_utilization_ratio{", "", ',direction="receive"} ', "", "\n")
_NO_LINE = ("",) * 5


def _line_parts(line: tuple[str, ...], columns: Mapping[int, Sequence[str]]) -> list[str]:
    """The parts of one ``line`` a port, each column's values put at their place in it
    (``columns``: position in ``line`` -> a value a port; every column as long)."""
    width = len(line)
    size = len(next(iter(columns.values())))
    parts = list(line) * size
    for at, column in columns.items():
        parts[at::width] = column
    return parts


def _joined_lines(line: tuple[str, ...], columns: Mapping[int, Sequence[str]]) -> list[str]:
    """A block's lines of a family that changes every poll (``_line_parts``), made by C: the
    parts put in place by slice assignments and joined a slice at a time, where an f-string
    a line cost twice as much (180 against 90 ns a line, 8,192 ports; 440,000 such lines a
    poll at 36,720 ports)."""
    return _chunks(_line_parts(line, columns), len(line))


class _Joined(list[str]):
    """Text of ``SLICE_LINES`` lines an item (``_chunks``), where a family's render otherwise
    returns a line an item: ``_encoded`` encodes each item as it is."""


def _chunks(parts: list[str], width: int) -> _Joined:
    """``parts`` of lines of ``width`` parts each, joined ``SLICE_LINES`` lines at a time: a
    slice's text stays in the CPU's cache while it is encoded and compressed (one string a
    block of 8,192 ports, 1.2 MB, made the render 15 % slower). A slice whose lines were all
    emptied is left out, so a family without a sample has no text (and no header)."""
    step = SLICE_LINES * width
    joined = ("".join(parts[at : at + step]) for at in range(0, len(parts), step))
    return _Joined(filter(None, joined))


def _wait_lines(block: _Block, names: _EscapeMemo) -> _Text:
    texts = block.ratio_texts()[2]
    if texts is not None:
        return _text_lines(_WAIT_HEAD, block.labels, texts)
    return _WAIT_LINES(block.labels, block.ratios()[2])


_WAIT_HEAD = "ibmon_port_transmit_wait_ratio{"
_WAIT_LINES = _float_lines(_WAIT_HEAD)


def _wait_unit_lines(block: _Block, names: _EscapeMemo) -> list[str]:
    lines = []
    for lb, v in block.pairs:
        unit = v.identity.xmit_wait
        size = unit.bytes_per_count(v.active_width)
        if size is not None and v.xmit_wait_seconds is not None:
            lines.append(f'ibmon_port_transmit_wait_unit_bytes{{{lb},'
                         f'per="{"lane" if unit.per_lane else "port"}",source="{unit.source}",'
                         f'family="{names[unit.family]}"}} {size!r}\n')
    return lines


def _wait_unit_keys(block: _Block) -> Sequence[object]:
    return [(v.identity.xmit_wait, v.active_width, v.xmit_wait_seconds is None)
            for v in block.views]


def _cond_lines(block: _Block, names: _EscapeMemo) -> list[str]:
    # frozensets iterate in hash order, which changes between runs: sort for stable output.
    return [f'ibmon_port_condition{{{lb},condition="{names[c]}"}} 1\n'
            for lb, v in block.pairs if v.conditions for c in sorted(v.conditions)]


def _cause_lines(block: _Block, names: _EscapeMemo) -> list[str]:
    return [f'ibmon_port_condition_cause{{{lb},condition="{names[c]}",cause="{names[k]}"}} 1\n'
            for lb, v in block.pairs if v.causes for c, k in sorted(v.causes.items())]


def _sat_lines(block: _Block, names: _EscapeMemo) -> list[str]:
    return [f'ibmon_port_saturated{{{lb},counter="{names[c]}"}} 1\n'
            for lb, v in block.pairs if v.saturated for c in sorted(v.saturated)]


def _stale_lines(block: _Block, names: _EscapeMemo) -> list[str]:
    return [f"ibmon_port_stale{{{lb}}} 1\n" for lb, v in block.pairs if v.stale]


def _resets_lines(block: _Block, names: _EscapeMemo) -> list[str]:
    return [f'ibmon_port_resets_total{{{lb},counter="{names[c]}"}} {n}\n'
            for lb, v in block.pairs if v.resets for c, n in sorted(v.resets.items())]


def _attr_keys(attr: str) -> _Keys:
    get = attrgetter(attr)

    def keys(block: _Block) -> Sequence[object]:
        return list(map(get, block.views))

    return keys


#: Every family after the ``_info`` ones, in exposition order: link state and rate, the
#: catalogue's totals, the driver's hw_counters (counts, then settings/levels), then health.
_FAMILIES: tuple[_Family, ...] = (
    _Family(_STATE_HEADER, _state_lines, _attr_keys("state")),
    _Family(_PHYS_HEADER, _phys_lines, _attr_keys("phys_state")),
    _Family(_RATE_HEADER, None, _attr_keys("rate_bytes_per_second"),
            key_lines=_float_lines("ibmon_port_rate_bytes_per_second{")),
    *(_counter_family(name, head, header) for name, head, header in _COUNTER_HEADERS),
    _Family(_HW_HEADER, _hw_lines, _attr_keys("hw_totals")),
    _Family(_HW_GAUGE_HEADER, _hw_gauge_lines, _attr_keys("hw_gauges")),
    _Family(_UTIL_HEADER, _util_lines, None),
    _Family(_WAIT_HEADER, _wait_lines, None),
    _Family(_WAIT_SECONDS_HEADER, None, _attr_keys("xmit_wait_seconds"),
            key_lines=_float_lines("ibmon_port_transmit_wait_seconds_total{")),
    _Family(_WAIT_UNIT_HEADER, _wait_unit_lines, _wait_unit_keys),
    _Family(_BER_HEADER, None, _attr_keys("symbol_error_ber"),
            key_lines=_float_lines("ibmon_port_symbol_error_ber{")),
    _Family(_COND_HEADER, _cond_lines, _attr_keys("conditions")),
    _Family(_CAUSE_HEADER, _cause_lines, _attr_keys("causes")),
    _Family(_SAT_HEADER, _sat_lines, _attr_keys("saturated")),
    _Family(_STALE_HEADER, _stale_lines, _attr_keys("stale")),
    _Family(_RESETS_HEADER, _resets_lines, _attr_keys("resets")),
)


def _some(chunk: bytes) -> Iterator[bytes]:
    """Yield a non-empty chunk from a frame of its own, so no caller variable keeps it alive."""
    if chunk:
        yield chunk


def _family(header: str, lines: _Text) -> bytes:
    """One family's encoded text, or b"" when it has no samples (no header for an empty one)."""
    if not lines:
        return b""
    lines.insert(0, header)
    text = "".join(lines)
    lines.clear()  # the caller's list: free the per-line strings before encoding
    return text.encode("utf-8")


def render_ports(ports: Iterable[PortView]) -> bytes:
    """One-off rendering without a cache (tests, ``ibmon scan``); the exporter keeps a renderer."""
    return PortRenderer().render(ports)
