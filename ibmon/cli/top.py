"""``ibmon top``: a live terminal view of the worst ports, their conditions and recent events.

Two ways to get data, one view: read a running daemon's JSON API (``--url``), or sample a source
directly (``--source``) through the same ``Pipeline`` the daemon uses, for a host where no
daemon runs. Node descriptions and everything else read from a fabric or a daemon are untrusted
text: every cell is shown with rich markup escaped and control characters made visible
(``ibmon.cli.terminal.printable``), so a node description cannot restyle or rewrite the screen.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from exporters.api import worst_first
from exporters.ports import port_json
from ibmon.cli.apiclient import ApiClient
from ibmon.cli.terminal import ber_text, printable
from ibmon.config import Settings, SourceConfig
from ibmon.detect.events import Event, severity_rank
from ibmon.infiniband.model import state_label
from ibmon.runtime.pipeline import Pipeline, build_state
from ibmon.runtime.selfmetrics import SelfMetrics
from ibmon.sources import Source

__all__ = ["ApiReader", "DirectSampler", "SourceUnavailableError", "render", "run_top"]

Frame = tuple[list[dict[str, Any]], list[dict[str, Any]], str]
_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}


class SourceUnavailableError(OSError):
    """A direct sample failed; shown in place of the frame (and the reason, for ``--once``)."""


def _pct(x: Any) -> str:
    return "-" if x is None else f"{float(x) * 100:.1f}%"


def _cell(value: Any) -> str:
    """Untrusted text for a ``Text`` cell (no markup is parsed there): controls made visible."""
    return printable("" if value is None else value)


def _markup(value: Any) -> str:
    """Untrusted text for a cell or title that rich parses as markup."""
    return escape(_cell(value))


#: The widest a port's name may make its column before the rest of the row runs short.
_NAME_WIDTH = 32


def render(ports: list[dict[str, Any]], events: list[dict[str, Any]], title: str,
           *, limit: int = 20) -> Group:
    """The screen: worst ports first (as the API orders them), then the newest events.

    One line per port and per event at any terminal width, as ``top`` keeps its rows: a
    wrapped row would push the worst ports off an 80-column screen. A cell that does not fit
    ends with an ellipsis; the port's name keeps its width first (it says which cable), the
    conditions and the event's message take what is left (the API has them whole). A port whose
    source did not answer says ``stale:`` before its last known state, where no width cuts it.
    """
    shown = ports[:limit]
    names = [f"{p.get('node_desc') or p.get('device') or p['guid']} [{p['port']}]"
             for p in shown]
    table = Table(title=_markup(title), expand=True, header_style="bold", box=box.SIMPLE_HEAD,
                  padding=0, show_edge=False)
    table.add_column("port", no_wrap=True, overflow="ellipsis",
                     min_width=min(_NAME_WIDTH, max(map(len, names), default=4)))
    table.add_column("state", no_wrap=True, overflow="ellipsis", max_width=14)
    for col in ("tx", "rx", "wait", "BER"):  # "100.0%", "1.0e-09": the widths they need
        table.add_column(col, no_wrap=True, justify="right", min_width=7 if col == "BER" else 6)
    table.add_column("conditions", no_wrap=True, overflow="ellipsis", ratio=1)
    for p, raw_name in zip(shown, names, strict=True):
        name = _markup(raw_name)
        worst = max((str(a.get("severity", "info")) for a in p.get("active", [])),
                    key=severity_rank, default=None)
        conds = _cell(", ".join(str(c) for c in p.get("conditions", [])))
        util = p.get("utilization") or {}
        state = state_label(p.get("state"), p.get("phys_state"))
        table.add_row(
            name, _markup(f"stale: {state}" if p.get("stale") else state),
            _pct(util.get("transmit")), _pct(util.get("receive")),
            _pct(p.get("transmit_wait_ratio")), ber_text(p.get("symbol_error_ber")),
            Text(conds, style=_STYLE.get(worst or "", "")),
        )
    log = Table(title="recent events", expand=True, header_style="bold", box=box.SIMPLE_HEAD,
                padding=0, show_edge=False)
    for col in ("time", "status", "severity", "type"):
        log.add_column(col, no_wrap=True, overflow="ellipsis")
    log.add_column("message", no_wrap=True, overflow="ellipsis", ratio=1)
    for e in reversed(events[-10:]):
        severity = _cell(e.get("severity", ""))
        log.add_row(_markup(str(e.get("time", ""))[11:19]), _markup(e.get("status", "")),
                    Text(severity, style=_STYLE.get(severity, "")),
                    _markup(e.get("type", "")), Text(_cell(e.get("message", ""))))
    return Group(table, log)


class ApiReader:
    """Frames from a running daemon's ``/api/v1`` endpoints (basic auth and a CA file through
    ``client``, an ``ibmon.cli.apiclient.ApiClient``)."""

    def __init__(self, url: str, *, limit: int = 20, timeout: float = 5.0,
                 client: ApiClient | None = None) -> None:
        self.url = url.rstrip("/")
        self.limit = limit
        self.timeout = timeout
        self.client = client or ApiClient(url, timeout=timeout)

    def _get(self, path: str, query: dict[str, str]) -> Any:
        return self.client.get(path, query)

    async def frame(self) -> Frame:
        ports = await asyncio.to_thread(self._get, "/api/v1/ports", {"limit": str(self.limit)})
        events = await asyncio.to_thread(self._get, "/api/v1/events", {"limit": "50"})
        title = f"ibmon top - {self.url} - {ports['count']} ports"
        return ports["ports"], events["events"], title


class DirectSampler:
    """Frames from sampling a source in-process through the daemon's pipeline (no daemon)."""

    def __init__(self, cfg: SourceConfig, *, limit: int = 20, settings: Settings | None = None,
                 factory: Callable[[SourceConfig], Source] | None = None) -> None:
        from ibmon.sources.registry import build_source

        settings = settings or Settings()
        self.cfg = cfg
        self.limit = limit
        self.source = (factory or build_source)(cfg)
        self.pipeline = Pipeline(cfg, metrics=SelfMetrics(), tables=settings.detect.tables(),
                                 fabric=settings.fabric, log_failures=False)
        self.events: deque[Event] = deque(maxlen=50)

    async def frame(self) -> Frame:
        pipeline = self.pipeline
        self.events.extend(await pipeline.poll(self.source))
        if pipeline.error is not None:
            raise SourceUnavailableError(pipeline.error)
        state = build_state([pipeline])
        rows = worst_first(state, pipeline.active())
        ports = [port_json(v, a) for v, a in rows[: self.limit]]
        events = [e.model_dump(mode="json") for e in self.events]
        title = f"ibmon top - {self.cfg.label} ({self.cfg.type}) - {len(state.ports)} ports"
        return ports, events, title

    async def close(self) -> None:
        await self.source.close()


async def run_top(reader: ApiReader | DirectSampler, *, interval: float = 2.0,
                  once: bool = False, console: Console | None = None,
                  limit: int = 20) -> None:
    """Refresh every ``interval`` seconds until Ctrl-C; ``once`` prints a single frame."""
    console = console or Console()
    try:
        if once:
            if isinstance(reader, DirectSampler):
                await reader.frame()  # the first sample is a baseline: no rates yet
                await asyncio.sleep(min(interval, 1.0))
            console.print(render(*await reader.frame(), limit=limit))
            return
        with Live(console=console, auto_refresh=False, screen=False) as live:
            while True:
                started = time.monotonic()
                try:
                    ports, events, title = await reader.frame()
                    stamp = datetime.now(tz=UTC).strftime("%H:%M:%S")
                    live.update(render(ports, events, f"{title} - {stamp}", limit=limit),
                                refresh=True)
                except (OSError, ValueError) as exc:
                    live.update(Text(f"ibmon top: {exc}", style="red"), refresh=True)
                await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))
    finally:
        if isinstance(reader, DirectSampler):
            await reader.close()
