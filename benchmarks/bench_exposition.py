"""Prometheus exposition of a 20,000-port fabric: ibmon's renderer versus prometheus_client.

The baseline is what a straightforward exporter would do: a custom collector yielding
CounterMetricFamily/GaugeMetricFamily with one add_metric per port, serialised by
``prometheus_client.generate_latest``. Both export exactly the same series (the unit tests parse
both outputs and compare them sample by sample). Both are timed in the same run, best of N, and the
script exits 1 when ibmon is less than 10x faster.

Memory is the process's VmRSS after the exporter has published (and scraped) several states, so
it includes what publishing leaves behind (allocator fragmentation), not just live objects.

    .venv/bin/python benchmarks/bench_exposition.py [--ports 20000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import http.client
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporters.http import deflate_chunks
from exporters.prometheus import GZIP_LEVEL, PrometheusExporter
from exporters.render import PortRenderer
from ibmon.infiniband.counters import CATALOGUE
from ibmon.infiniband.model import LinkInfo, PortIdentity, PortKey, PortView
from ibmon.runtime.selfmetrics import SelfMetrics
from ibmon.state import FabricState

REQUIRED_RATIO = 10.0
HW_COUNTERS = ("np_cnp_sent", "rp_cnp_handled", "out_of_buffer")
SWITCH_PORTS = 36


def build_views(n: int) -> list[PortView]:
    """A deterministic fabric: switch-sized nodes, every port with everything a port can have.

    Values are large and varied (no small-int caching flattering memory), descriptions include
    quotes, backslashes and non-ASCII on some nodes so escaping is on the measured path.
    """
    views: list[PortView] = []
    for i in range(n):
        node, port = divmod(i, SWITCH_PORTS)
        guid = f"0x0002c903{node:08x}"
        desc = f"leaf-{node} rack{node % 40}"
        if node % 97 == 0:
            desc = f'leaf-{node} "rack {node % 40}" \\ n\u00e9ud'
        ident = PortIdentity(
            guid=guid, port=str(port + 1), device="mlx5_0" if node % 2 else "",
            node_desc=desc, node_type="switch" if node % 3 else "ca", lid=node + 1,
            source="mad",
        )
        peer = (node + 1) % max(1, (n + SWITCH_PORTS - 1) // SWITCH_PORTS)
        link = LinkInfo(
            remote_guid=f"0x0002c903{peer:08x}", remote_port=str(port + 1),
            remote_node_desc=f"spine-{peer}", active_width="4X", active_speed="HDR",
            max_width="4X", max_speed="HDR",
        )
        base = (i + 1) * 1_000_003
        totals = {spec.name: base * (k + 1) * (4 if spec.data else 1) + k
                  for k, spec in enumerate(CATALOGUE)}
        views.append(PortView(
            identity=ident, state=4 if i % 50 else 1, phys_state=5 if i % 50 else 2,
            rate_bytes_per_second=25e9, active_width="4X", active_speed="HDR", link=link,
            totals=totals,
            rates={spec.name: base / 7.0 + k for k, spec in enumerate(CATALOGUE)},
            saturated=frozenset({"symbol_errors"}) if i % 1000 == 3 else frozenset(),
            resets={"transmit_data": 2} if i % 500 == 7 else {},
            hw_totals={name: base + k for k, name in enumerate(HW_COUNTERS)},
            utilization_tx=(i % 100) / 100.0, utilization_rx=((i * 7) % 100) / 100.0,
            xmit_wait_ratio=(i % 13) / 1000.0,
            symbol_error_ber=(i % 11) * 1e-15 if i % 11 else 0.0,
            conditions=frozenset({"congestion"}) if i % 400 == 5 else frozenset(),
        ))
    return views


class ReferenceCollector(Collector):
    """The straightforward prometheus_client exporter of the same series (the baseline)."""

    def __init__(self, views: Sequence[PortView]) -> None:
        self.views = views

    def collect(self) -> Iterator[Metric]:
        vs = self.views
        info = GaugeMetricFamily(
            "ibmon_port_info", "Descriptive data of a port; always 1. Join on (guid, port).",
            labels=["guid", "port", "device", "node_desc", "node_type", "lid", "link_layer",
                    "source"])
        link = GaugeMetricFamily(
            "ibmon_link_info", "The far end of a port's link; always 1.",
            labels=["guid", "port", "remote_guid", "remote_port", "remote_node_desc",
                    "active_width", "active_speed", "max_width", "max_speed"])
        state = GaugeMetricFamily("ibmon_port_state", "PortState.", labels=["guid", "port"])
        phys = GaugeMetricFamily("ibmon_port_physical_state", "PortPhysicalState.",
                                 labels=["guid", "port"])
        rate = GaugeMetricFamily("ibmon_port_rate_bytes_per_second", "Link rate.",
                                 labels=["guid", "port"])
        for v in vs:
            ident = v.identity
            g, p = ident.guid, ident.port
            info.add_metric([g, p, ident.device, ident.node_desc, ident.node_type,
                             "" if ident.lid is None else str(ident.lid), ident.link_layer,
                             ident.source], 1)
            if v.link is not None:
                lk = v.link
                link.add_metric([g, p, lk.remote_guid, lk.remote_port, lk.remote_node_desc,
                                 v.active_width or lk.active_width,
                                 v.active_speed or lk.active_speed, lk.max_width, lk.max_speed],
                                1)
            if v.state is not None:
                state.add_metric([g, p], v.state)
            if v.phys_state is not None:
                phys.add_metric([g, p], v.phys_state)
            if v.rate_bytes_per_second is not None:
                rate.add_metric([g, p], v.rate_bytes_per_second)
        yield from (info, link, state, phys, rate)
        for spec in CATALOGUE:
            fam = CounterMetricFamily(spec.metric, spec.help, labels=["guid", "port"])
            for v in vs:
                if spec.name in v.totals:
                    fam.add_metric([v.identity.guid, v.identity.port], v.totals[spec.name])
            yield fam
        hw = CounterMetricFamily("ibmon_port_hw_stat", "hw_counters.",
                                 labels=["guid", "port", "stat"])
        hw_gauge = GaugeMetricFamily("ibmon_port_hw_stat", "hw_counters settings.",
                                     labels=["guid", "port", "stat"])
        util = GaugeMetricFamily("ibmon_port_utilization_ratio", "Utilization.",
                                 labels=["guid", "port", "direction"])
        wait = GaugeMetricFamily("ibmon_port_transmit_wait_ratio", "Wait.",
                                 labels=["guid", "port"])
        ber = GaugeMetricFamily("ibmon_port_symbol_error_ber", "BER.", labels=["guid", "port"])
        cond = GaugeMetricFamily("ibmon_port_condition", "Conditions.",
                                 labels=["guid", "port", "condition"])
        sat = GaugeMetricFamily("ibmon_port_saturated", "Saturated.",
                                labels=["guid", "port", "counter"])
        resets = CounterMetricFamily("ibmon_port_resets", "Resets.",
                                     labels=["guid", "port", "counter"])
        for v in vs:
            g, p = v.identity.guid, v.identity.port
            for name, total in v.hw_totals.items():
                hw.add_metric([g, p, name], total)
            for name, value in v.hw_gauges.items():
                hw_gauge.add_metric([g, p, name], value)
            if v.utilization_tx is not None:
                util.add_metric([g, p, "transmit"], v.utilization_tx)
            if v.utilization_rx is not None:
                util.add_metric([g, p, "receive"], v.utilization_rx)
            if v.xmit_wait_ratio is not None:
                wait.add_metric([g, p], v.xmit_wait_ratio)
            if v.symbol_error_ber is not None:
                ber.add_metric([g, p], v.symbol_error_ber)
            for c in sorted(v.conditions):
                cond.add_metric([g, p, c], 1)
            for c in sorted(v.saturated):
                sat.add_metric([g, p, c], 1)
            for c, n in sorted(v.resets.items()):
                resets.add_metric([g, p, c], n)
        yield from (hw, hw_gauge, util, wait, ber, cond, sat, resets)


def reference_render(views: Sequence[PortView]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReferenceCollector(views))
    return generate_latest(registry)


def rss_mb() -> tuple[float, float]:
    """(VmRSS, VmHWM) in MB from /proc/self/status (psutil is not a dependency)."""
    fields: dict[str, float] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(rest.split()[0]) / 1024
    return fields["VmRSS"], fields["VmHWM"]


def best_of(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


async def publish_in_threads(exporter: PrometheusExporter, ports: dict[PortKey, PortView],
                             n: int) -> None:
    """Publish as the daemon does, rendering in a worker thread (its own glibc arena)."""
    for i in range(n):
        await exporter.publish(FabricState(generated=10.0 + i, ports=ports))


def _get(conn: http.client.HTTPConnection, encoding: str) -> int:
    conn.request("GET", "/metrics", headers={"Accept-Encoding": encoding})
    resp = conn.getresponse()
    return len(resp.read())


async def scrape_times(exporter: PrometheusExporter,
                       repeat: int) -> list[tuple[str, list[float], int]]:
    """Wall times and wire size of loopback scrapes over one kept-alive connection (stdlib
    client in a thread): gzip (spliced), plain (inflated as sent)."""
    results = []
    await exporter.start()
    conn = http.client.HTTPConnection("127.0.0.1", exporter.port, timeout=120)
    try:
        for label, encoding, n in (("gzip", "gzip", repeat),
                                   ("plain (inflates)", "identity", max(1, repeat // 2))):
            times, size = [], 0
            for _ in range(n):
                t0 = time.perf_counter()
                size = await asyncio.to_thread(_get, conn, encoding)
                times.append(time.perf_counter() - t0)
            results.append((label, times, size))
    finally:
        conn.close()
        await exporter.stop()
    return results


async def server_cpu_per_scrape(ports: int, n: int) -> tuple[float, int]:
    """CPU of the event loop thread (the whole server side) per gzip scrape of a small,
    node-sized exposition, over one kept-alive connection as Prometheus scrapes."""
    exporter = PrometheusExporter(listen="127.0.0.1:0", self_metrics=SelfMetrics())
    views = build_views(ports)
    exporter.publish_now(FabricState(generated=1.0, ports={v.key: v for v in views}))
    await exporter.start()
    conn = http.client.HTTPConnection("127.0.0.1", exporter.port, timeout=30)

    def scrape_n() -> int:
        return sum(_get(conn, "gzip") for _ in range(n))

    try:
        await asyncio.to_thread(_get, conn, "gzip")  # connection and caches warm
        c0 = time.thread_time()
        wire = await asyncio.to_thread(scrape_n)
        cpu = time.thread_time() - c0
    finally:
        conn.close()
        await exporter.stop()
    return cpu / n, wire // n


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ports", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--small-ports", type=int, default=16,
                    help="ports of the node-sized exposition (server CPU per scrape)")
    ap.add_argument("--small-scrapes", type=int, default=1000)
    args = ap.parse_args(argv)

    rss_start, _ = rss_mb()
    cpu = time.process_time
    views = build_views(args.ports)
    ports = {v.key: v for v in views}
    rss_views, _ = rss_mb()

    # The exporter's whole publish path (sort, render into the compressor with its caches, swap),
    # first thing after building the views so RSS and its peak are ibmon's own, not the
    # baseline's.
    exporter = PrometheusExporter(listen="127.0.0.1:0", self_metrics=SelfMetrics())
    t0 = time.perf_counter()
    exporter.publish_now(FabricState(generated=0.0, ports=ports))
    cold = time.perf_counter() - t0
    publish = best_of(lambda: exporter.publish_now(FabricState(generated=1.0, ports=ports)),
                      args.repeat)
    c0 = cpu()
    exporter.publish_now(FabricState(generated=2.0, ports=ports))
    publish_cpu = cpu() - c0
    asyncio.run(publish_in_threads(exporter, ports, 2))
    gc.collect()
    rss_held, hwm = rss_mb()
    size = exporter.exposition_size
    held = exporter.exposition_compressed_size

    renderer = PortRenderer()
    body = renderer.render(views)
    samples = sum(1 for line in body.splitlines() if not line.startswith(b"#"))
    del body
    ours = best_of(lambda: renderer.render(views), args.repeat)
    chunks = list(renderer.iter_chunks(views))
    c0 = cpu()
    deflate_chunks(chunks, GZIP_LEVEL)
    deflate_cpu = cpu() - c0
    del chunks
    theirs = best_of(lambda: reference_render(views), max(1, args.repeat // 2))

    scrapes = asyncio.run(scrape_times(exporter, args.repeat))
    small_cpu, small_wire = asyncio.run(server_cpu_per_scrape(args.small_ports, args.small_scrapes))

    ratio = theirs / ours
    print(f"ports                 {args.ports}")
    print(f"samples               {samples}")
    print(f"body                  {size / 1e6:.1f} MB, held deflated: {held / 1e6:.1f} MB")
    print(f"ibmon first publish   {cold * 1000:.0f} ms (empty label cache)")
    print(f"ibmon publish         {publish * 1000:.0f} ms (sort + render + deflate + swap, best "
          f"of {args.repeat}); CPU {publish_cpu * 1000:.0f} ms")
    print(f"deflate whole body    CPU {deflate_cpu * 1000:.0f} ms (level {GZIP_LEVEL}; the "
          f"publish reuses the _info families' segment)")
    print(f"ibmon render          {ours * 1000:.0f} ms (best of {args.repeat})")
    print(f"prometheus_client     {theirs * 1000:.0f} ms (best of {max(1, args.repeat // 2)})")
    print(f"ratio                 {ratio:.1f}x (required >= {REQUIRED_RATIO:.0f}x)")
    for label, times, wire in scrapes:
        print(f"scrape {label:<16} median {statistics.median(times) * 1000:.0f} ms, max "
              f"{max(times) * 1000:.0f} ms (n={len(times)}), {wire / 1e6:.1f} MB on the wire")
    print(f"server CPU per scrape {small_cpu * 1e6:.0f} us (gzip, {args.small_ports} ports, "
          f"{small_wire} bytes, {args.small_scrapes} scrapes on one kept-alive connection)")
    print(f"RSS interpreter       {rss_start:.0f} MB")
    print(f"RSS + views           {rss_views:.0f} MB")
    print(f"RSS + published body  {rss_held:.0f} MB after {args.repeat + 4} publishes, the last "
          f"2 in worker threads (peak {hwm:.0f} MB, while publishing)")
    if ratio < REQUIRED_RATIO:
        print("FAIL: ibmon renderer is less than 10x faster than prometheus_client",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
