"""Fat-tree generators, ibsim net files and ibnetdiscover loading."""

from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from ibmon.infiniband.model import GUID_RE
from ibmon.infiniband.xmitwait import family_of
from mocks.topology import (
    DEVICE_IDS,
    Fabric,
    Link,
    Node,
    fabric_for_hosts,
    fabric_for_ports,
    fat_tree,
    link_rate_bps,
    load_ibnetdiscover,
    to_ibsim_netfile,
)
from tests.fixtures import real_fixture, real_fixtures
from tests.syspkg import require_binary, unavailable


def _link_set(f: Fabric) -> set[tuple[tuple[str, int], tuple[str, int], str, str]]:
    return {(min(lk.a, lk.b), max(lk.a, lk.b), lk.width, lk.speed) for lk in f.links}


def test_default_fat_tree_is_non_blocking_and_fully_wired() -> None:
    f = fat_tree()
    switches = [n for n in f.nodes.values() if n.kind == "switch"]
    hcas = f.hosts()
    assert len(hcas) == 4 * 18
    assert {n.desc for n in switches} == {"leaf01", "leaf02", "leaf03", "leaf04",
                                         "spine01", "spine02"}
    # every switch port is used: 4 leaves x 36 + 2 spines x 36, plus one port per HCA
    assert len(f.ports()) == 4 * 36 + 2 * 36 + 72
    leaf = f.node_by_desc("leaf03")
    ups = [f.peer(leaf.guid, p) for p in range(19, 37)]
    assert all(u is not None and f.nodes[u[0]].desc.startswith("spine") for u in ups)


def test_guids_lids_and_descriptions_are_stable_and_well_formed() -> None:
    a, b = fat_tree(), fat_tree()
    assert a.nodes == b.nodes
    assert all(GUID_RE.match(g) for g in a.nodes)
    lids = [n.lid for n in a.nodes.values()]
    assert len(set(lids)) == len(lids)
    assert min(lids) >= 1
    host = a.node_by_desc("host042 mlx5_0")
    assert host.kind == "ca"
    assert host.nports == 1
    assert a.peer(host.guid, 1) == (a.node_by_desc("leaf03").guid, 6)
    # OUI | role (0a HCA, 01 leaf) | 7-digit index | a zero nibble for the port number
    assert (host.guid, a.node_by_desc("leaf03").guid) == ("0x0002c90a00000290",
                                                          "0x0002c90100000020")


def test_links_appended_later_are_found_and_a_shared_description_is_refused() -> None:
    f = fat_tree(radix=4, leaves=1, levels=1, hosts_per_leaf=3)
    leaf, host = f.node_by_desc("leaf01"), f.node_by_desc("host001 mlx5_0")
    assert f.peer(leaf.guid, 4) is None  # answered before the link below exists
    other = Node(guid="0x0002c90a000000f0", kind="ca", desc="host001 mlx5_0", nports=1, lid=99)
    f.nodes[other.guid] = other
    f.links.append(Link(a=(leaf.guid, 4), b=(other.guid, 1), width="4X", speed="EDR"))
    assert f.peer(leaf.guid, 4) == (other.guid, 1)
    assert f.link_of(other.guid, 1) is f.links[-1]
    with pytest.raises(ValueError, match="2 nodes share the description"):
        f.node_by_desc(host.desc)


def test_peer_is_symmetric_and_links_carry_their_tier_rates() -> None:
    f = fat_tree(host_link=("4X", "HDR"), leaf_link=("4X", "EDR"))
    keys = f.ports()
    assert len(keys) == 2 * len(f.links)
    for key in keys:
        peer = f.peer(*key)
        assert peer is not None and peer != key
        assert f.peer(*peer) == key
        link = f.link_of(*key)
        assert link is not None and link is f.link_of(*peer)
        assert {key, peer} == {link.a, link.b}
        # the link's own tuple, so the simulator's tables share one key object per port
        assert key is link.a or key is link.b
    assert f.peer("0xdead", 1) is None and f.link_of(f.hosts()[0].guid, 2) is None
    host = f.hosts()[0]
    link = f.link_of(host.guid, 1)
    assert link is not None
    assert link.rate_bps == 200e9
    assert link_rate_bps("4X", "EDR") == 100e9


def test_three_level_tree_connects_every_spine_to_cores() -> None:
    f = fat_tree(levels=3, radix=8, leaves=8, hosts_per_leaf=4)
    cores = [n for n in f.nodes.values() if n.desc.startswith("core")]
    spines = [n for n in f.nodes.values() if n.desc.startswith("spine")]
    assert cores
    assert spines
    for s in spines:
        peers = [f.peer(s.guid, p) for p in range(5, 9)]
        assert all(p is not None and f.nodes[p[0]].desc.startswith("core") for p in peers)


def test_impossible_trees_say_why() -> None:
    with pytest.raises(ValueError, match="exceed the switch radix"):
        fat_tree(radix=8, hosts_per_leaf=9)
    assert len(fat_tree(levels=1, radix=4, leaves=1, hosts_per_leaf=4).hosts()) == 4  # full
    with pytest.raises(ValueError, match="exactly one switch"):
        fat_tree(levels=1, radix=8, leaves=2, hosts_per_leaf=4)
    with pytest.raises(ValueError, match="exceed the spine radix"):
        fat_tree(levels=2, radix=8, leaves=10, hosts_per_leaf=4, spines=1)
    with pytest.raises(ValueError, match="pods cannot reach 1 cores per group"):
        fat_tree(levels=3, radix=8, leaves=12, hosts_per_leaf=4, cores=4)
    with pytest.raises(ValueError, match="levels=3"):
        fat_tree(radix=8, leaves=20, hosts_per_leaf=4)
    with pytest.raises(ValueError, match="unknown link speed"):
        fat_tree(host_link=("4X", "QQR"))


@pytest.mark.parametrize("n", [1, 300, 2600, 20_000])
def test_fabric_for_ports_reaches_the_requested_size(n: int) -> None:
    f = fabric_for_ports(n)
    assert len(f.ports()) >= n
    assert len(f.ports()) < n * 1.3 + 200  # smallest tree, not an arbitrary big one


def test_fabric_for_ports_of_an_exact_tree_size_is_that_tree() -> None:
    # radix 36: one leaf with 18 hosts and 18 uplinks to one spine is 72 ports
    assert len(fabric_for_ports(72).ports()) == 72
    assert len(fabric_for_ports(73).ports()) == 144


def test_fabric_for_hosts() -> None:
    assert len(fabric_for_hosts(100).hosts()) >= 100
    assert len(fabric_for_hosts(5000).hosts()) >= 5000


def test_netfile_round_trips() -> None:
    f = fat_tree(levels=2, radix=8, leaves=3, hosts_per_leaf=4, host_link=("1X", "HDR"))
    g = load_ibnetdiscover(to_ibsim_netfile(f))
    assert g.nodes == f.nodes
    assert _link_set(g) == _link_set(f)


def test_every_role_has_a_device_of_a_documented_family() -> None:
    """Leaves and cores count PortXmitWait in 8-byte per-port units (Quantum, Quantum-2),
    spines in 32-byte per-lane units (Switch-IB 2), HCAs in 8-byte units (ConnectX-6): one fat
    tree exercises both rules."""
    f = fat_tree(levels=3, radix=8, leaves=8, hosts_per_leaf=4)
    families: dict[str, set[tuple[str, str]]] = {}
    for n in f.nodes.values():
        role = re.sub(r"\d.*", "", n.desc)
        unit = family_of(n.device_id)
        assert unit is not None, n
        families.setdefault(role, set()).add((unit.family, unit.text))
    assert families == {
        "host": {("ConnectX-6", "8/port")},
        "leaf": {("Quantum", "8/port")},
        "spine": {("Switch-IB 2", "32/lane")},
        "core": {("Quantum-2", "8/port")},
    }
    assert DEVICE_IDS == {"ca": 0x101B, "leaf": 0xD2F0, "spine": 0xCF08, "core": 0xD2F2}


def test_netfile_gives_ibsim_every_node_s_vendor_and_device_id() -> None:
    f = fat_tree(radix=4, leaves=2, hosts_per_leaf=2)
    lines = to_ibsim_netfile(f).splitlines()
    heads = [n for n, line in enumerate(lines) if line.startswith(("Switch", "Ca"))]
    assert len(heads) == len(f.nodes)
    for n in heads:
        # vendid= is reset by ibsim after every node: both lines precede every record
        vend, dev, guid = lines[n - 3], lines[n - 2], lines[n - 1]
        assert vend == "vendid=0x2c9"
        assert re.fullmatch(r"devid=0x[0-9a-f]+", dev), dev
        assert guid.startswith(("switchguid=", "caguid="))
        node = f.nodes["0x" + re.sub(r"[(].*", "", guid.split("=")[1])[2:]]
        assert int(dev.split("=")[1], 16) == node.device_id


def test_netfile_starts_with_a_switch_and_refuses_what_it_cannot_write() -> None:
    """The first record is where ibsim attaches its first client (opensm): a switch, as in
    ibsim's examples. A description with a double quote or a line break cannot be written."""
    f = fat_tree(radix=4, leaves=1, levels=1, hosts_per_leaf=2)
    switch, *hosts = f.nodes.values()
    f.nodes = {n.guid: n for n in (hosts[0], switch, *hosts[1:])}  # a host first
    records = re.findall(r"^(Switch|Ca)\t", to_ibsim_netfile(f), re.M)
    assert records == ["Switch", "Ca", "Ca"]
    host = f.hosts()[0]
    for bad in ('gpu"01', "gpu\n01"):
        f.nodes[host.guid] = Node(guid=host.guid, kind="ca", desc=bad, nports=1, lid=2)
        with pytest.raises(ValueError, match="cannot be written"):
            to_ibsim_netfile(f)


def test_net_file_details_read_as_ibsim_reads_them() -> None:
    """ibsim ``sim_net.c``: ``+`` counts from the last ``=`` base (``parse_guidbase``), a
    remote port not given is 1, a 16-bit device ID, ``w=`` is LinkWidthEnabled and the link
    trains to the widest bit; a switch's port lines name the peer's LID, never its own."""
    text = ('switchguid=0x500\nSwitch 4 "S1"\n[1] "H1"[1] # "h1" lid 7 4xFDR\n'
            '[2] "S2"[1] w=18\n[3] "H2" w=16\n\n'
            'switchguid+0x10\nSwitch 2 "S2"\n[1] "S1"[2] w=2\n\n'
            'devid=0x1d2f0\nCa 1 "H1"\n[1] "S1"[1] # lid 7 4xEDR\n\n'
            'Ca 1 "H2"\n[1] "S1"[3] w=16\n')
    f = load_ibnetdiscover(text)
    s1, s2 = f.node_by_desc("S1"), f.node_by_desc("S2")
    assert (s1.guid, s2.guid) == ("0x0000000000000500", "0x0000000000000510")
    assert s1.lid == 0  # "lid 7" on its port line is H1's
    h1, h2 = f.node_by_desc("H1"), f.node_by_desc("H2")
    assert (h1.lid, h1.device_id) == (7, 0xD2F0)
    assert f.peer(s1.guid, 3) == (h2.guid, 1)
    host_link = f.link_of(s1.guid, 1)
    assert host_link is not None and host_link.speed == "FDR"  # the lower of FDR and EDR
    isl, narrow = f.link_of(s1.guid, 2), f.link_of(s1.guid, 3)
    assert isl is not None and isl.width == "4X"  # 4X|2X enabled at one end, 4X at the other
    assert narrow is not None and narrow.width == "2X"


def test_devid_applies_to_following_records_until_changed() -> None:
    """ibsim's reading (and ibnetdiscover writes one before every record)."""
    text = ('devid=0xcf08\nSwitch 2 "S1"\n[1] "H1"[1]\n[2] "H2"[1]\n\n'
            'Ca 1 "H1"\n[1] "S1"[1]\n\ndevid=4123\nCa 1 "H2"\n[1] "S1"[2]\n')
    f = load_ibnetdiscover(text)
    ids = {n.desc: n.device_id for n in f.nodes.values()}
    assert ids == {"S1": 0xCF08, "H1": 0xCF08, "H2": 0x101B}
    assert load_ibnetdiscover('Switch 1 "S1"\n').node_by_desc("S1").device_id == 0


def test_netfile_states_the_same_width_on_both_ends() -> None:
    text = to_ibsim_netfile(fat_tree(radix=4, leaves=2, hosts_per_leaf=2,
                                     leaf_link=("1X", "FDR")))
    assert "1xFDR" in text
    assert "4xEDR" in text
    assert text.count("1xFDR") == 2 * 4  # 4 leaf-spine links, written from both ends


def test_loads_real_ibnetdiscover_captures() -> None:
    by_name = {p.name: load_ibnetdiscover(p.read_text()) for p in
               real_fixtures("ibtopotool/tests/*.topo")}
    f3 = by_name["3.topo"]  # starts with a tool warning line; contains loopback cables
    sw = f3.nodes["0xe41d2d030003e470"]
    assert sw.desc == "SwitchIB Mellanox Technologies"
    assert sw.lid == 268
    assert sw.device_id == 0xCB20  # its devid= line: Switch-IB, 32 bytes a count per lane
    unit = family_of(sw.device_id)
    assert unit is not None
    assert unit.text == "32/lane"
    assert f3.peer("0xe41d2d030003e470", 1) == ("0xe41d2d030003e470", 2)
    link = f3.link_of("0x0002c9030004e938", 1)
    assert link is not None
    assert (link.width, link.speed) == ("4X", "QDR")
    f2 = by_name["2.topo"]
    ca = f2.nodes["0x0002c9030002847c"]
    assert ca.desc == "compute-00-00 HCA-1"
    assert ca.nports == 2
    assert ca.lid == 2
    assert f2.peer(ca.guid, 2) == ("0x000b8cffff0053ee", 2)
    # the man page example states 4x on one end and 1x on the other: the link runs at 1x
    f1 = by_name["1.topo"]
    narrow = f1.link_of("0x0008f10400410015", 1)
    assert narrow is not None
    assert narrow.width == "1X"


def test_loads_ibsim_examples_with_ibsim_guids() -> None:
    for path in real_fixtures("ibsim/net-examples/net*"):
        f = load_ibnetdiscover(path.read_text())
        assert f.links, path.name
    f = load_ibnetdiscover(real_fixture("ibsim/net-examples/net.2sw2path4hca2port").read_text())
    # ibsim 0.10 numbers CAs from 0x100000 (reserving nports+1 each), switches from 0x200000
    assert f.node_by_desc("Hca2").guid == "0x0000000000100003"
    assert f.node_by_desc("Switch2").guid == "0x0000000000200001"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('Switch 4 "S1"\n[1] "H1"[1]\n[x] "H2"[1]\n', r"line 3: malformed port line"),
        ('Switch 4 "S1"\n[9] "H1"[1]\n', r"line 2: port 9 out of range"),
        ('Switch 4 "S1"\n[1] "H1"[1]\n\nCa 1 "H1"\n[1] "S1"[2]\n', r"line 2: .*lists 'S1'\[2\]"),
        ('Switch 4 "S1"\n[1] "H9"[1]\n', r"line 2: .*unknown node 'H9'"),
        ('Switch 4 "S1"\n\nSwitch 4 "S1"\n', r"line 3: node 'S1' defined twice"),
        ('Switch four "S1"\n', r"line 1: malformed node header"),
        ("vendid=0x2c9\n", r"no Switch or Ca records"),
        ('\n[1] "H1"[1]\n', r"line 2: port line outside a node record"),
    ],
)
def test_bad_input_names_the_line(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_ibnetdiscover(text)


def _umad2sim() -> str:
    hits = glob.glob("/usr/lib/*/umad2sim/libumad2sim.so") + glob.glob(
        "/usr/lib/umad2sim/libumad2sim.so")
    if not hits:
        unavailable("libumad2sim.so not installed (apt package libumad2sim0)")
    return hits[0]


@pytest.mark.system
def test_ibsim_serves_the_generated_fabric(tmp_path: Path) -> None:
    """ibsim parses our net file; ibnetdiscover through it sees our GUIDs, names and rates."""
    ibsim = require_binary("ibsim")
    ibnetdiscover = require_binary("ibnetdiscover")
    preload = _umad2sim()
    fabric = fat_tree(radix=4, leaves=2, hosts_per_leaf=2, host_link=("1X", "HDR"),
                      leaf_link=("4X", "FDR"))
    net = tmp_path / "net"
    net.write_text(to_ibsim_netfile(fabric))
    env = {**os.environ, "IBSIM_SOCKNAME": f"ibmon-topo-{uuid.uuid4().hex[:8]}"}
    sim = subprocess.Popen([ibsim, "-s", "-n", str(net)], cwd=tmp_path, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    try:
        out = ""
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            res = subprocess.run([ibnetdiscover], env={**env, "LD_PRELOAD": preload},
                                 capture_output=True, text=True, timeout=10, check=False)
            out = res.stdout
            if res.returncode == 0 and "Switch" in out:
                break
            time.sleep(0.3)
        seen = load_ibnetdiscover(out)
        assert seen.nodes.keys() == fabric.nodes.keys()
        assert {n.desc for n in seen.nodes.values()} == {n.desc for n in fabric.nodes.values()}
        assert _link_set(seen) == _link_set(fabric)
        # NodeInfo.DeviceID as ibsim answers it: each node's family, from the net file
        assert {g: n.device_id for g, n in seen.nodes.items()} == {
            g: n.device_id for g, n in fabric.nodes.items()}
        assert re.search(r'"host001 mlx5_0" lid \d+ 1xHDR', out)
        # every port GUID the net file states (a CA's: node GUID + port) is the one ibsim uses
        def port_guids(text: str) -> set[int]:
            return {int(g, 16) for g in re.findall(r"\(([0-9a-f]+)\)", text)}

        assert port_guids(net.read_text()) == port_guids(out)
    finally:
        os.killpg(sim.pid, signal.SIGKILL)
        sim.wait(timeout=5)
