"""Simulated fabric topologies: fat-tree generators, ibsim net files, ibnetdiscover loading.

Everything here is deterministic: GUIDs and LIDs derive from a node's role and index, so the same
parameters give the same fabric on every run and in every renderer (in-process, sysfs, ibsim).
GUIDs follow the layout ibsim uses for HCAs (port GUID = node GUID + port number), so a net file
written here yields the same GUIDs inside ibsim.

Every generated node also has a PCI device ID (NodeInfo.DeviceID), which decides what one of its
PortXmitWait counts means (``ibmon.infiniband.xmitwait.FAMILIES``). It follows the node's role, so a
fat tree holds both documented rules: HCAs are ConnectX-6 (0x101b) and leaves Quantum (0xd2f0),
8 bytes per count per port; spines are Switch-IB 2 (0xcf08), 32 bytes per count per lane; cores
are Quantum-2 (0xd2f2), 8 bytes per port.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from ibmon.infiniband.linkspeed import LANE_EFFECTIVE_GBPS, WIDTH_LANES

__all__ = [
    "DEVICE_IDS",
    "SPEEDS",
    "WIDTHS",
    "Fabric",
    "Link",
    "Node",
    "fabric_for_hosts",
    "fabric_for_ports",
    "fat_tree",
    "lane_gbps",
    "link_rate_bps",
    "load_ibnetdiscover",
    "to_ibsim_netfile",
]

# Lane rates and widths come from ibmon.infiniband.linkspeed, the one table the daemon also uses.
_LANE_GBPS = LANE_EFFECTIVE_GBPS
SPEEDS: tuple[str, ...] = tuple(_LANE_GBPS)
_WIDTH_LANES = WIDTH_LANES
WIDTHS: tuple[str, ...] = tuple(_WIDTH_LANES)

# GUID layout: 0x0002c9 (Mellanox OUI) | role byte | 7-hex-digit index | low nibble = port.
_OUI = 0x0002C9
_ROLE_HCA = 0x0A
_ROLE_LEAF = 0x01
_ROLE_SPINE = 0x02
_ROLE_CORE = 0x03

_VENDOR_ID = 0x02C9  # Mellanox/NVIDIA, what ibsim and ibnetdiscover write as vendid=0x2c9
#: PCI device ID (NodeInfo.DeviceID) of each generated role: a Quantum leaf and Quantum-2 core
#: (8 bytes a PortXmitWait count, per port), a Switch-IB 2 spine (32 bytes a count, per lane)
#: and ConnectX-6 HCAs (8 bytes, per port), so every fat tree exercises both rules.
DEVICE_IDS: dict[str, int] = {"ca": 0x101B, "leaf": 0xD2F0, "spine": 0xCF08, "core": 0xD2F2}


def lane_gbps(speed: str) -> float:
    """Effective per-lane rate of an IB speed name; ValueError for an unknown name."""
    try:
        return _LANE_GBPS[speed]
    except KeyError:
        raise ValueError(f"unknown link speed {speed!r} (expected one of {', '.join(SPEEDS)})") \
            from None


def link_rate_bps(width: str, speed: str) -> float:
    """Effective data rate of a link in bits/s (4X EDR = 100e9)."""
    try:
        lanes = _WIDTH_LANES[width]
    except KeyError:
        raise ValueError(f"unknown link width {width!r} (expected one of {', '.join(WIDTHS)})") \
            from None
    return lanes * lane_gbps(speed) * 1e9


def _guid(role: int, index: int) -> str:
    return f"0x{_OUI:06x}{role:02x}{index:07x}0"


@dataclass(frozen=True, slots=True)
class Node:
    """A switch or a channel adapter (one HCA device)."""

    guid: str
    kind: str  # "switch" | "ca"
    desc: str
    nports: int
    lid: int  # switches: the switch LID (port 0); CAs: LID of port 1
    #: PCI device ID (NodeInfo.DeviceID; sysfs ``hca_type`` MT<decimal>), 0 when unknown: what
    #: one PortXmitWait count means on the node's ports (``ibmon.infiniband.xmitwait.family_of``).
    device_id: int = 0


@dataclass(frozen=True, slots=True)
class Link:
    """One cable. Both ends run at the same width and speed."""

    a: tuple[str, int]
    b: tuple[str, int]
    width: str
    speed: str

    @property
    def rate_bps(self) -> float:
        return link_rate_bps(self.width, self.speed)


@dataclass(slots=True)
class Fabric:
    """Nodes by GUID plus the links between their ports.

    The peer index is rebuilt whenever the number of links changes, so callers that append links
    see them; replacing a link in place needs a new Fabric.
    """

    nodes: dict[str, Node]
    links: list[Link]
    _index: dict[tuple[str, int], Link] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _indexed: int = field(default=-1, init=False, repr=False, compare=False)
    _by_desc: dict[str, list[Node]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def _ensure_index(self) -> None:
        if self._indexed == len(self.links) and len(self._by_desc) <= len(self.nodes):
            return
        # Each end to its link only: the far end is the link's other tuple (a pair per port
        # of (link, far end) cost 6.6 MB at 118,400 ports, for the life of the simulator).
        index: dict[tuple[str, int], Link] = {}
        for link in self.links:
            index[link.a] = index[link.b] = link
        by_desc: dict[str, list[Node]] = {}
        for node in self.nodes.values():
            by_desc.setdefault(node.desc, []).append(node)
        self._index = index
        self._by_desc = by_desc
        self._indexed = len(self.links)

    def ports(self) -> list[tuple[str, int]]:
        """Every connected (guid, port), in node order then port order.

        Each key is its link's own tuple, not an equal copy: one tuple per port however many
        tables key on it (2.4 MB at 36,720 ports).
        """
        self._ensure_index()
        connected = self._index
        out: list[tuple[str, int]] = []
        for guid, node in self.nodes.items():
            for p in range(1, node.nports + 1):
                link = connected.get((guid, p))
                if link is not None:
                    out.append(link.a if link.a == (guid, p) else link.b)
        return out

    def peer(self, guid: str, port: int) -> tuple[str, int] | None:
        self._ensure_index()
        link = self._index.get((guid, port))
        if link is None:
            return None
        return link.b if link.a == (guid, port) else link.a

    def link_of(self, guid: str, port: int) -> Link | None:
        self._ensure_index()
        return self._index.get((guid, port))

    def node_by_desc(self, desc: str) -> Node:
        """The node with this description; KeyError if none, ValueError if several share it."""
        self._ensure_index()
        found = self._by_desc.get(desc)
        if not found:
            raise KeyError(f"no node with description {desc!r}")
        if len(found) > 1:
            raise ValueError(f"{len(found)} nodes share the description {desc!r}")
        return found[0]

    def hosts(self) -> list[Node]:
        """Channel adapters in node order (what a sysfs tree shows)."""
        return [n for n in self.nodes.values() if n.kind == "ca"]


# --------------------------------------------------------------------------------------------
# Generators


def _digits(count: int, minimum: int) -> int:
    return max(minimum, len(str(count)))


class _Builder:
    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self.links: list[Link] = []
        self.next_lid = 1

    def add(self, role: int, index: int, kind: str, desc: str, nports: int, *,
            device_id: int) -> Node:
        node = Node(guid=_guid(role, index), kind=kind, desc=desc, nports=nports,
                    lid=self.next_lid, device_id=device_id)
        self.next_lid += 1
        self.nodes[node.guid] = node
        return node

    def link(self, a: tuple[str, int], b: tuple[str, int], kind: tuple[str, str]) -> None:
        link_rate_bps(*kind)  # validate early with a clear message
        self.links.append(Link(a=a, b=b, width=kind[0], speed=kind[1]))


@dataclass(frozen=True, slots=True)
class _Plan:
    down: int
    leaves: int
    leaves_per_pod: int
    spines_per_pod: int
    k_leaf: int
    n_spines: int
    cores_per_group: int
    k_spine: int
    n_cores: int

    @property
    def n_ports(self) -> int:
        links = (self.leaves * self.down + self.leaves * self.spines_per_pod * self.k_leaf
                 + self.n_spines * self.cores_per_group * self.k_spine)
        return 2 * links


def _plan(*, levels: int, radix: int, leaves: int, spines: int | None, cores: int | None,
          hosts_per_leaf: int, hcas_per_host: int) -> _Plan:
    """Size every tier, or raise ValueError saying why these parameters cannot be built."""
    if levels not in (1, 2, 3):
        raise ValueError(f"levels must be 1, 2 or 3, not {levels}")
    if radix < 2 or leaves < 1 or hosts_per_leaf < 0 or hcas_per_host < 1:
        raise ValueError("radix >= 2, leaves >= 1, hosts_per_leaf >= 0, hcas_per_host >= 1")
    down = hosts_per_leaf * hcas_per_host
    if down > radix:
        raise ValueError(f"{down} host ports per leaf exceed the switch radix {radix}")
    up = radix - down
    if levels > 1 and up < 1:
        raise ValueError(f"leaves have no uplink ports left (radix {radix}, {down} host ports)")
    if levels == 1 and leaves != 1:
        raise ValueError("a 1-level fabric has exactly one switch (leaves=1)")

    # Plan the switch tiers before creating anything, so errors come before work.
    pods = 1
    leaves_per_pod = leaves
    spines_per_pod = 0
    k_leaf = 0  # parallel links from each leaf to each spine of its pod
    core_groups = 0
    cores_per_group = 0
    k_spine = 0  # parallel links from each spine to each core of its group
    if levels == 2:
        spines_per_pod = spines if spines is not None else max(1, math.ceil(leaves * up / radix))
        k_leaf = up // spines_per_pod if spines_per_pod else 0
        if spines_per_pod < 1 or k_leaf < 1:
            raise ValueError(
                f"{leaves} leaves need {spines_per_pod} spines but each leaf has only {up} "
                "uplinks; use levels=3 or a larger radix"
            )
        if leaves * k_leaf > radix:
            raise ValueError(
                f"{leaves} leaves x {k_leaf} links exceed the spine radix {radix}; "
                "use more spines or levels=3"
            )
    elif levels == 3:
        spine_down = radix // 2
        spine_up = radix - spine_down
        leaves_per_pod = min(leaves, spine_down)
        pods = math.ceil(leaves / leaves_per_pod)
        if spines is not None:
            if spines % pods:
                raise ValueError(f"spines={spines} is not a multiple of the {pods} pods")
            spines_per_pod = spines // pods
        else:
            spines_per_pod = max(1, math.ceil(leaves_per_pod * up / spine_down))
        k_leaf = up // spines_per_pod if spines_per_pod else 0
        if spines_per_pod < 1 or k_leaf < 1 or leaves_per_pod * k_leaf > spine_down:
            raise ValueError(f"cannot spread {up} leaf uplinks over {spines_per_pod} spines/pod")
        core_groups = spines_per_pod
        if cores is not None:
            if cores % core_groups:
                raise ValueError(f"cores={cores} is not a multiple of {core_groups} core groups")
            cores_per_group = cores // core_groups
        else:
            cores_per_group = max(1, math.ceil(pods * spine_up / radix))
        k_spine = spine_up // cores_per_group if cores_per_group else 0
        if cores_per_group < 1 or k_spine < 1 or pods * k_spine > radix:
            raise ValueError(
                f"{pods} pods cannot reach {cores_per_group} cores per group with radix {radix}"
            )

    return _Plan(down=down, leaves=leaves, leaves_per_pod=leaves_per_pod,
                 spines_per_pod=spines_per_pod, k_leaf=k_leaf, n_spines=pods * spines_per_pod,
                 cores_per_group=cores_per_group, k_spine=k_spine,
                 n_cores=core_groups * cores_per_group)


def fat_tree(
    *,
    levels: int = 2,
    radix: int = 36,
    leaves: int = 4,
    spines: int | None = None,
    cores: int | None = None,
    hosts_per_leaf: int = 18,
    hcas_per_host: int = 1,
    host_link: tuple[str, str] = ("4X", "EDR"),
    leaf_link: tuple[str, str] = ("4X", "EDR"),
    spine_link: tuple[str, str] = ("4X", "EDR"),
) -> Fabric:
    """A 1-, 2- or 3-level fat tree of single-port HCAs.

    Leaves use ports 1..hosts_per_leaf*hcas_per_host for hosts and the rest as uplinks spread
    evenly over the spines (parallel links when there are fewer spines than uplinks). With three
    levels, leaves form pods of at most radix/2 leaves, each pod has its own spines, and spine
    number j of every pod connects to core group j, as in a k-ary fat tree.
    ``spines`` is the total over all pods; ``cores`` the total over all groups.
    """
    plan = _plan(levels=levels, radix=radix, leaves=leaves, spines=spines, cores=cores,
                 hosts_per_leaf=hosts_per_leaf, hcas_per_host=hcas_per_host)
    down = plan.down
    leaves_per_pod = plan.leaves_per_pod
    spines_per_pod = plan.spines_per_pod
    k_leaf = plan.k_leaf
    cores_per_group = plan.cores_per_group
    k_spine = plan.k_spine
    n_spines = plan.n_spines
    n_cores = plan.n_cores
    b = _Builder()
    core_nodes = [
        b.add(_ROLE_CORE, i, "switch", f"core{i + 1:0{_digits(n_cores, 2)}d}", radix,
              device_id=DEVICE_IDS["core"])
        for i in range(n_cores)
    ]
    spine_nodes = [
        b.add(_ROLE_SPINE, i, "switch", f"spine{i + 1:0{_digits(n_spines, 2)}d}", radix,
              device_id=DEVICE_IDS["spine"])
        for i in range(n_spines)
    ]
    leaf_nodes = [
        b.add(_ROLE_LEAF, i, "switch", f"leaf{i + 1:0{_digits(leaves, 2)}d}", radix,
              device_id=DEVICE_IDS["leaf"])
        for i in range(leaves)
    ]
    n_hosts = leaves * hosts_per_leaf
    hdig = _digits(n_hosts, 3)
    hca_index = 0
    for li, leaf in enumerate(leaf_nodes):
        port = 1
        for h in range(hosts_per_leaf):
            host_no = li * hosts_per_leaf + h + 1
            for d in range(hcas_per_host):
                hca = b.add(_ROLE_HCA, hca_index, "ca", f"host{host_no:0{hdig}d} mlx5_{d}", 1,
                            device_id=DEVICE_IDS["ca"])
                hca_index += 1
                b.link((leaf.guid, port), (hca.guid, 1), host_link)
                port += 1

    if levels >= 2:
        spine_next_port = [1] * n_spines
        for li, leaf in enumerate(leaf_nodes):
            pod = li // leaves_per_pod
            port = down + 1
            for s in range(spines_per_pod):
                si = pod * spines_per_pod + s
                for _ in range(k_leaf):
                    b.link((leaf.guid, port), (spine_nodes[si].guid, spine_next_port[si]),
                           leaf_link)
                    port += 1
                    spine_next_port[si] += 1
        if levels == 3:
            core_next_port = [1] * n_cores
            for si, spine in enumerate(spine_nodes):
                group = si % spines_per_pod
                port = radix // 2 + 1
                for c in range(cores_per_group):
                    ci = group * cores_per_group + c
                    for _ in range(k_spine):
                        b.link((spine.guid, port), (core_nodes[ci].guid, core_next_port[ci]),
                               spine_link)
                        port += 1
                        core_next_port[ci] += 1
    return Fabric(nodes=b.nodes, links=b.links)


def fabric_for_ports(n_ports: int, **kw: Any) -> Fabric:
    """The smallest fat tree (by leaf count) with at least ``n_ports`` connected ports.

    Two levels while the spine radix allows it, then three levels (a 2-level radix-36 tree stops
    at ~2,600 ports; 20,000 ports need pods). ``hosts_per_leaf`` defaults to radix/2
    (non-blocking leaves); other keywords go to :func:`fat_tree`.
    """
    if n_ports < 1:
        raise ValueError("n_ports must be >= 1")
    radix = int(kw.pop("radix", 36))
    kw.setdefault("hosts_per_leaf", radix // 2)
    plan_kw = {k: kw[k] for k in ("spines", "cores", "hosts_per_leaf", "hcas_per_host") if k in kw}
    plan_kw.setdefault("spines", None)
    plan_kw.setdefault("cores", None)
    plan_kw.setdefault("hcas_per_host", 1)
    wanted_levels = kw.pop("levels", None)
    for levels in (2, 3):
        if wanted_levels is not None and wanted_levels != levels:
            continue
        leaves = 1
        while True:
            try:
                plan = _plan(levels=levels, radix=radix, leaves=leaves, **plan_kw)
            except ValueError:
                break
            if plan.n_ports >= n_ports:
                return fat_tree(levels=levels, radix=radix, leaves=leaves, **kw)
            leaves += 1
    raise ValueError(f"no fat tree with radix {radix} reaches {n_ports} ports")


def fabric_for_hosts(n_hosts: int, **kw: Any) -> Fabric:
    """The smallest fat tree with at least ``n_hosts`` host HCAs (for ``--hosts``)."""
    if n_hosts < 1:
        raise ValueError("n_hosts must be >= 1")
    radix = int(kw.pop("radix", 36))
    hpl = int(kw.pop("hosts_per_leaf", radix // 2))
    hcas = int(kw.get("hcas_per_host", 1))
    leaves = max(1, math.ceil(n_hosts / hpl))
    for levels in (2, 3):
        try:
            return fat_tree(levels=levels, radix=radix, leaves=leaves,
                            hosts_per_leaf=hpl, **kw)
        except ValueError:
            continue
    raise ValueError(f"no fat tree with radix {radix} holds {n_hosts} hosts x {hcas} HCAs")


# --------------------------------------------------------------------------------------------
# ibsim net files


def _hex(guid: str) -> str:
    return guid[2:]


def _node_id(node: Node) -> str:
    return ("S-" if node.kind == "switch" else "H-") + _hex(node.guid)


def _linkspec(link: Link) -> str:
    return f"{link.width.lower()}{link.speed}"


def _check_desc(desc: str) -> None:
    # ibsim splits on '"' and '#'; a description containing them cannot be represented.
    if any(ch in desc for ch in '"\n\r'):
        raise ValueError(f"node description {desc!r} cannot be written to a net file")


def to_ibsim_netfile(fabric: Fabric) -> str:
    """The fabric in ibnetdiscover format, which ``ibsim -s`` loads.

    ``switchguid=`` / ``caguid=`` lines before each record make ibsim use our GUIDs (ibsim assigns
    GUIDs from those bases and ignores the "S-<guid>" ids). The first record is a switch so the
    SM port sits on a switch, like ibsim's own examples; LIDs in comments are informational
    (opensm assigns the real ones). ``vendid=`` / ``devid=`` lines before each record set its
    NodeInfo.VendorID / DeviceID (ibsim resets the vendor ID after every node and keeps the
    device ID until changed, so both are written for every node).
    """
    out: list[str] = ["# ibmon simulated fabric (mocks/topology.py)", ""]
    nodes = sorted(fabric.nodes.values(), key=lambda n: n.kind != "switch")
    for node in nodes:
        _check_desc(node.desc)
        nid = _node_id(node)
        out.append(f"vendid=0x{_VENDOR_ID:x}")
        out.append(f"devid=0x{node.device_id:x}")
        if node.kind == "switch":
            out.append(f"switchguid={node.guid}({_hex(node.guid)})")
            out.append(f'Switch\t{node.nports} "{nid}"\t\t# "{node.desc}" base port 0 '
                       f"lid {node.lid} lmc 0")
        else:
            out.append(f"caguid={node.guid}")
            out.append(f'Ca\t{node.nports} "{nid}"\t\t# "{node.desc}"')
        for port in range(1, node.nports + 1):
            link = fabric.link_of(node.guid, port)
            if link is None:
                continue
            peer = link.b if link.a == (node.guid, port) else link.a
            pnode = fabric.nodes[peer[0]]
            pid = _node_id(pnode)
            spec = _linkspec(link)
            if node.kind == "switch":
                pguid = f"({int(pnode.guid, 16) + peer[1]:x})" if pnode.kind == "ca" else ""
                out.append(f'[{port}]\t"{pid}"[{peer[1]}]{pguid}\t\t# "{pnode.desc}" '
                           f"lid {pnode.lid} {spec}")
            else:
                portguid = f"{int(node.guid, 16) + port:x}"
                out.append(f'[{port}]({portguid}) \t"{pid}"[{peer[1]}]\t\t# lid {node.lid} '
                           f'lmc 0 "{pnode.desc}" lid {pnode.lid} {spec}')
        out.append("")
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# ibnetdiscover / ibsim net file loading

_HEADER_RE = re.compile(r'^(Switch|Hca|Ca|Rt)\s*(\d+)\s+"([^"]*)"(.*)$')
_PORT_RE = re.compile(r'^\[(\d+)\](?:\(([0-9a-fA-Fx]+)\))?\s*"([^"]*)"\s*(?:\[(\d+)\])?(.*)$')
_SPEC_RE = re.compile(r"\b(\d+)x(SDR|DDR|QDR|FDR10|FDR|EDR|HDR|NDR|XDR)\b")
_WOPT_RE = re.compile(r"\bw=(\d+)")
_DEVID_RE = re.compile(r"^devid\s*=\s*(0x[0-9a-fA-F]+|\d+)\s*$")
_GUIDLINE_RE = re.compile(r"^(switchguid|hcaguids|caguid|rtguid)\s*([=+])\s*(0x[0-9a-fA-F]+|\d+)")
_DESC_RE = re.compile(r'#\s*"([^"]*)"')
_LID_RE = re.compile(r"\blid\s+(\d+)")
#: LinkWidthEnabled bits (``w=``), widest first: ibsim's ``get_active_linkwidth`` order.
_WIDTH_BITS = ((8, "12X"), (4, "8X"), (2, "4X"), (16, "2X"), (1, "1X"))


@dataclass(slots=True)
class _RawNode:
    nid: str
    kind: str
    nports: int
    desc: str
    guid: int
    lid: int
    line: int
    device_id: int
    ports: dict[int, tuple[str, int, str | None, str | None, int]] = field(default_factory=dict)


def _peer_desc_and_spec(rest: str) -> tuple[str | None, str | None]:
    spec = _SPEC_RE.search(rest)
    width = speed = None
    if spec:
        width, speed = f"{spec.group(1)}X", spec.group(2)
    else:
        w = _WOPT_RE.search(rest)
        if w:
            mask = int(w.group(1))
            width = next((name for bit, name in _WIDTH_BITS if mask & bit), None)
    return width, speed


def load_ibnetdiscover(text: str) -> Fabric:
    """Parse plain ``ibnetdiscover`` output or an ibsim net file into a Fabric.

    Follows ibsim's reading rules so a file means the same thing here and in ibsim: lines outside
    a node record that are not understood are ignored (ibnetdiscover interleaves vendor/devid
    lines and tools' warnings), a record ends at the first line not starting with ``[``, GUIDs
    come from ``switchguid=``/``caguid=`` lines or ibsim's own sequence (CAs from 0x100000,
    switches from 0x200000); ``switchguid+N`` is N past the last absolute base, not past the
    GUIDs handed out since (ibsim ``sim_net.c`` ``parse_guidbase``). Links without a
    width/speed are 4X SDR, ibsim's default. When the two ends of a link state different widths
    or speeds (hand-edited captures do, e.g. the ibnetdiscover man page), the link gets the lower
    one: a link runs at what both ends manage.
    A ``devid=`` line gives the following records their device ID until the next one, as in ibsim
    (ibnetdiscover writes one before every record).
    Anything inside a record that cannot be understood, and dangling or one-sided links, raise
    ValueError naming the line.
    """
    guid_base = {"switch": 0x200000, "ca": 0x100000, "router": 0x300000}  # ibsim 0.10
    absolute = dict(guid_base)  # the last ``=`` of each kind, what ``+`` counts from
    nodes: dict[str, _RawNode] = {}
    current: _RawNode | None = None
    found_any = False
    device_id = 0
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip("\r\n")
        if current is not None:
            if line.startswith("#"):
                continue
            if line.startswith("["):
                _parse_port_line(current, line, lineno)
                continue
            current = None
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        head = _HEADER_RE.match(line)
        if head:
            kind = {"Switch": "switch", "Rt": "router"}.get(head.group(1), "ca")
            nports = int(head.group(2))
            nid = head.group(3)
            rest = head.group(4)
            if not 1 <= nports <= 255:
                raise ValueError(f"line {lineno}: node {nid!r} has {nports} ports (1-255)")
            if not nid:
                raise ValueError(f"line {lineno}: empty node id")
            if nid in nodes:
                raise ValueError(f"line {lineno}: node {nid!r} defined twice "
                                 f"(first at line {nodes[nid].line})")
            dm = _DESC_RE.search(rest)
            desc = dm.group(1) if dm else nid
            lm = _LID_RE.search(rest)
            lid = int(lm.group(1)) if lm else 0
            guid = guid_base[kind]
            guid_base[kind] += 1 if kind == "switch" else nports + 1
            current = _RawNode(nid=nid, kind=kind, nports=nports, desc=desc, guid=guid, lid=lid,
                               line=lineno, device_id=device_id)
            nodes[nid] = current
            found_any = True
            continue
        if re.match(r"^(Switch|Hca|Ca|Rt)\b", line):
            raise ValueError(f"line {lineno}: malformed node header {line.strip()!r} "
                             '(expected: Switch|Ca <nports> "<id>")')
        if line.startswith("["):
            raise ValueError(f"line {lineno}: port line outside a node record")
        gm = _GUIDLINE_RE.match(line)
        if gm:
            kind = {"switchguid": "switch", "rtguid": "router"}.get(gm.group(1), "ca")
            value = int(gm.group(3), 0)
            if gm.group(2) == "=":
                absolute[kind], value = value, 0
            guid_base[kind] = absolute[kind] + value
            continue
        dv = _DEVID_RE.match(stripped)
        if dv:
            device_id = int(dv.group(1), 0) & 0xFFFF  # NodeInfo.DeviceID is 16 bits
            continue
        if line.startswith(("include", "do ")):
            raise ValueError(f"line {lineno}: ibsim 'include'/'do' directives are not supported")
        # Anything else outside a record (vendid=, sysimgguid=, "Non-Chassis Nodes", warnings)
        # is ignored, exactly as ibsim does.
    if not found_any:
        raise ValueError("no Switch or Ca records found (not ibnetdiscover output?)")
    return _resolve(nodes)


def _parse_port_line(node: _RawNode, line: str, lineno: int) -> None:
    m = _PORT_RE.match(line)
    if not m:
        raise ValueError(f'line {lineno}: malformed port line {line.strip()!r} '
                         '(expected: [port] "<remote id>"[remote port])')
    port = int(m.group(1))
    if not 1 <= port <= node.nports:
        raise ValueError(f"line {lineno}: port {port} out of range 1-{node.nports} "
                         f"for {node.nid!r}")
    if port in node.ports:
        raise ValueError(f"line {lineno}: port {port} of {node.nid!r} listed twice")
    remote = m.group(3)
    rport = int(m.group(4)) if m.group(4) else 1
    rest = m.group(5) or ""
    width, speed = _peer_desc_and_spec(rest)
    if node.kind != "switch" and not node.lid:
        lm = _LID_RE.search(rest)
        if lm:
            node.lid = int(lm.group(1))
    node.ports[port] = (remote, rport, width, speed, lineno)


def _resolve(raw: dict[str, _RawNode]) -> Fabric:
    nodes: dict[str, Node] = {}
    guid_of: dict[str, str] = {}
    for r in raw.values():
        guid = f"0x{r.guid:016x}"
        if guid in nodes:
            raise ValueError(f"line {r.line}: GUID {guid} of {r.nid!r} already used")
        kind = "switch" if r.kind == "switch" else "ca"
        nodes[guid] = Node(guid=guid, kind=kind, desc=r.desc, nports=r.nports, lid=r.lid,
                           device_id=r.device_id)
        guid_of[r.nid] = guid
    links: list[Link] = []
    for r in raw.values():
        for port, (remote, rport, width, speed, lineno) in sorted(r.ports.items()):
            other = raw.get(remote)
            if other is None:
                raise ValueError(f"line {lineno}: {r.nid!r}[{port}] connects to unknown node "
                                 f"{remote!r}")
            if not 1 <= rport <= other.nports:
                raise ValueError(f"line {lineno}: remote port {rport} out of range 1-"
                                 f"{other.nports} for {remote!r}")
            back = other.ports.get(rport)
            if back is None or back[0] != r.nid or back[1] != port:
                said = f"{back[0]!r}[{back[1]}] at line {back[4]}" if back else "nothing"
                raise ValueError(f"line {lineno}: {r.nid!r}[{port}] -> {remote!r}[{rport}] "
                                 f"but {remote!r}[{rport}] lists {said}")
            a_key = (r.nid, port)
            b_key = (remote, rport)
            if b_key < a_key:
                continue  # the other end's line creates the link
            widths = [w for w in (width, back[2]) if w]
            speeds = [s for s in (speed, back[3]) if s]
            links.append(Link(a=(guid_of[r.nid], port), b=(guid_of[remote], rport),
                              width=min(widths, key=WIDTHS.index) if widths else "4X",
                              speed=min(speeds, key=SPEEDS.index) if speeds else "SDR"))
    return Fabric(nodes=nodes, links=links)
