"""Pure parsers for what fabric tools print and what the fabric answers, one module per format.

- ``smp``: NodeInfo, NodeDescription, PortInfo payloads (the ``mad`` source's SMP replies)
- ``pma``: ClassPortInfo, PortCounters, PortCountersExtended, PortRcvErrorDetails and
  PortXmitDiscardDetails payloads and the capability rules
- ``perfquery``: ``perfquery`` text (extended and plain blocks; ``-E``/``-D`` detail blocks;
  ``-c`` PortSamplesControl, for its Tick)
- ``ibnetdiscover``: ``ibnetdiscover -p`` (ports format) and format detection
- ``topofile``: plain ``ibnetdiscover`` output, the topology-file format
- ``discovered``: the ports a text discovery yields, and the Topology built from them
- ``ibnd_cache``: libibnetdisc's binary fabric cache (``ibnetdiscover --cache``)
- ``node_name_map``: rdma-core's node-name-map file
- ``sysfs_values``: a counter or LID as one sysfs file holds it
- ``errors``: ``ParseError``, the one way every parser here refuses an input

Both fabric sources decode PortInfo and counters through the same functions here, which is what
makes their topologies and snapshots identical. Every text and cache parser reads its format
exactly or raises ``ParseError`` for the whole input: never half an output. Nothing here runs a
process or touches the network, so every function is tested on recorded output. Everything is
re-exported here, so ``from ibmon.sources.parse import parse_perfquery`` keeps working.
"""

from __future__ import annotations

from ibmon.sources.parse.discovered import DiscoveredPort, topology_from_ports
from ibmon.sources.parse.errors import ParseError
from ibmon.sources.parse.ibnd_cache import CacheFabric, CacheNode, parse_ibnd_cache
from ibmon.sources.parse.ibnetdiscover import parse_ibnetdiscover, parse_ibnetdiscover_ports
from ibmon.sources.parse.node_name_map import load_node_name_map, parse_node_name_map
from ibmon.sources.parse.perfquery import (
    PerfBlock,
    counters_from_blocks,
    expect_blocks,
    parse_perfquery,
    parse_perfquery_blocks,
    parse_perfquery_details,
    parse_perfquery_tick,
)
from ibmon.sources.parse.pma import (
    CPI_CAP2_ADDL_EXT,
    CPI_CAP_EXT_WIDTH,
    CPI_CAP_EXT_WIDTH_NOIETF,
    CPI_CAP_XMIT_WAIT,
    ClassPortInfo,
    PortCounterValues,
    decode_class_port_info,
    decode_counters,
    decode_details,
    decode_samples_control_tick,
    merge_counters,
)
from ibmon.sources.parse.smp import (
    NodeInfo,
    PortInfo,
    clean_node_desc,
    decode_node_desc,
    decode_node_info,
    decode_port_info,
    has_mlnx_ext_port_info,
    may_be_fdr10,
    with_mlnx_speeds,
)
from ibmon.sources.parse.topofile import parse_topology_file

__all__ = [
    "CPI_CAP2_ADDL_EXT",
    "CPI_CAP_EXT_WIDTH",
    "CPI_CAP_EXT_WIDTH_NOIETF",
    "CPI_CAP_XMIT_WAIT",
    "CacheFabric",
    "CacheNode",
    "ClassPortInfo",
    "DiscoveredPort",
    "NodeInfo",
    "ParseError",
    "PerfBlock",
    "PortCounterValues",
    "PortInfo",
    "clean_node_desc",
    "counters_from_blocks",
    "decode_class_port_info",
    "decode_counters",
    "decode_details",
    "decode_node_desc",
    "decode_node_info",
    "decode_port_info",
    "decode_samples_control_tick",
    "expect_blocks",
    "has_mlnx_ext_port_info",
    "load_node_name_map",
    "may_be_fdr10",
    "merge_counters",
    "parse_ibnd_cache",
    "parse_ibnetdiscover",
    "parse_ibnetdiscover_ports",
    "parse_node_name_map",
    "parse_perfquery",
    "parse_perfquery_blocks",
    "parse_perfquery_details",
    "parse_perfquery_tick",
    "parse_topology_file",
    "topology_from_ports",
    "with_mlnx_speeds",
]
