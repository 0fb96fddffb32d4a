"""``ibmon scan``: two polls through the one pipeline, printed as a table, JSON or exposition.

The scan shows what the daemon would show at that moment: the same pipeline (tracker and
detectors) turns the second sample into rates, conditions and BER, and ``--format prom`` is the
port series ``/metrics`` would serve for that state, byte for byte, after the self metrics that
describe a one-shot run (``ONE_SHOT_FAMILIES``: no counters or histograms of a process that
exits). The first poll is the baseline every rate needs.

A scan that fails still has something true to say: the source is down. ``ScanError.scan`` holds
that result (``ibmon_source_up`` 0, and the ports of a first poll that worked, stale), so that a
node_exporter textfile written from it says "blind" instead of keeping the last good numbers.

A scan that worked may still have failed to read something (an unreadable counter file, a
device whose PMA does not answer): the daemon counts those in ``ibmon_source_poll_errors_total``
by reason, and so does the scan's exposition, for the scan's two polls, right after the one-shot
self metrics. Without it a textfile would look clean while a value, or a whole port, is
missing, and the only trace would be a warning on the cron job's stderr. A scan without errors
has no such family, so its output is unchanged.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass

import structlog

from exporters.ports import port_json
from ibmon.cli.terminal import ber_text, printable, rate_text
from ibmon.config import Settings, SourceConfig
from ibmon.detect.engine import ActiveCondition
from ibmon.infiniband.counters import CATALOGUE
from ibmon.infiniband.model import PortKey, PortView, state_label
from ibmon.runtime.pipeline import Pipeline, build_state
from ibmon.runtime.selfmetrics import SelfMetrics
from ibmon.sources import Source
from ibmon.sources.registry import build_source
from ibmon.state import FabricState, in_port_order

__all__ = ["POLL_ERRORS", "Scan", "ScanError", "run_scan"]

log = structlog.get_logger("ibmon.cli.scan")

#: The daemon's family of poll errors (``SelfMetrics.poll_errors``), by its name without
#: ``_total`` as ``Registry.render(only=...)`` takes it.
POLL_ERRORS = "ibmon_source_poll_errors"

#: The counters the table's ERRORS column sums: every error and discard counter of the
#: catalogue, not the detail counters, whose increments are already their aggregate's.
_ERRORS = frozenset(c.name for c in CATALOGUE if not c.data and c.part_of is None
                    and "packets" not in c.name and c.name != "transmit_wait")


class ScanError(Exception):
    """The source could not be polled; the message says why (for one line on stderr), and
    ``scan`` is what the scan knows nonetheless (the source reported down)."""

    def __init__(self, message: str, scan: Scan) -> None:
        super().__init__(message)
        self.scan = scan


@dataclass(frozen=True, slots=True)
class Scan:
    """The state after the second poll, the conditions firing then, and the self metrics."""

    label: str
    state: FabricState
    conditions: tuple[ActiveCondition, ...]
    metrics: SelfMetrics

    def by_port(self) -> Mapping[PortKey, list[ActiveCondition]]:
        out: dict[PortKey, list[ActiveCondition]] = {}
        for a in self.conditions:
            out.setdefault(a.key, []).append(a)
        return out

    def prom(self) -> bytes:
        """One-shot self metrics, the poll errors of the scan (if any), then the port series
        exactly as ``/metrics`` renders them."""
        from exporters.render import PortRenderer

        views = in_port_order(self.state.ports.values())
        return self.metrics.render_one_shot() + self.poll_errors() + PortRenderer().render(views)

    def poll_errors(self) -> bytes:
        """``ibmon_source_poll_errors_total{source,reason}`` as ``/metrics`` would show it after
        these two polls, or nothing when the scan read everything."""
        registry = self.metrics.registry
        wanted = POLL_ERRORS + "_total"
        if not any(sample.name == wanted for sample in registry.samples()):
            return b""
        return registry.render(only=(POLL_ERRORS,))

    def json(self) -> str:
        by_port = self.by_port()
        views = in_port_order(self.state.ports.values())
        ports = [port_json(v, by_port.get(v.key, [])) for v in views]
        return json.dumps({"source": self.label, "ports": ports}, indent=2) + "\n"

    def table(self) -> str:
        return render_table(in_port_order(self.state.ports.values()))


async def run_scan(cfg: SourceConfig, settings: Settings, *, interval: float) -> Scan:
    """Poll ``cfg``'s source twice, ``interval`` seconds apart.

    ScanError if the source cannot be built or a poll fails; its ``scan`` is the result so far.
    """
    metrics = SelfMetrics()
    metrics.describe_sources(settings.fabric, [cfg])
    pipeline = Pipeline(
        cfg,
        metrics=metrics,
        tables=settings.detect.tables(),
        fabric=settings.fabric,
        log_failures=False,  # the CLI prints the one error line itself
    )
    try:
        source = build_source(cfg)
    except (OSError, RuntimeError, ValueError) as exc:
        pipeline.fail("init_failed", exc)
        raise ScanError(str(exc) or type(exc).__name__, _result(pipeline)) from exc
    try:
        await _poll_twice(pipeline, source, interval)
    finally:
        try:
            async with asyncio.timeout(1.0):
                await source.close()
        except Exception as exc:
            log.warning("source_close_failed", source=cfg.label, error=str(exc) or repr(exc))
    return _result(pipeline)


async def _poll_twice(pipeline: Pipeline, source: Source, interval: float) -> None:
    for i in range(2):
        if i:
            await asyncio.sleep(interval)
        await pipeline.poll(source)
        if pipeline.error is not None:
            raise ScanError(pipeline.error, _result(pipeline))


def _result(pipeline: Pipeline) -> Scan:
    return Scan(pipeline.label, build_state([pipeline]), tuple(pipeline.active()),
                pipeline.metrics)


def _row(v: PortView) -> tuple[str, ...]:
    ident = v.identity
    errors = sum(n for name, n in v.totals.items() if name in _ERRORS)
    return (
        ident.guid,
        ident.port,
        (ident.node_desc or ident.device)[:32],
        state_label(v.state, v.phys_state),
        rate_text(v.rate_bytes_per_second),
        rate_text(v.rates.get("transmit_data")),
        rate_text(v.rates.get("receive_data")),
        str(errors),
        ber_text(v.symbol_error_ber),
        ",".join(sorted(v.saturated)),
        ",".join(sorted(v.conditions)),
    )


_HEADER = (
    "GUID", "PORT", "NAME", "STATE", "RATE", "TX", "RX", "ERRORS", "BER", "SATURATED",
    "CONDITIONS",
)


def render_table(views: list[PortView]) -> str:
    """Aligned columns, one port a line, in the given order (words start under their header).

    Every cell goes through ``printable``: a node description is untrusted text and must not
    reach the terminal as escape sequences (nor break the columns with a newline).
    """
    rows: list[tuple[str, ...]] = [
        _HEADER, *(tuple(printable(c) for c in _row(v)) for v in views)
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_HEADER))]
    lines = ("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)
    return "\n".join(lines) + "\n"
