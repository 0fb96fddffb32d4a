"""Asking about one port or the whole fabric: the one-port API, the topology API, ``ibmon
explain``, ``ibmon topology`` (with the real ``dot``) and ``ibmon top --url``, against a real
daemon, in the clear and behind TLS with basic auth.

The source is a two-port fabric: leaf07 port 12 cabled to gpu031 mlx5_0 port 1. leaf07 receives
errors that are 98 % local physical errors (detail counters as the fabric sources report them),
and the host end counts symbol errors: the event, the API and the report must name the cause and
both ends.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from exporters.http import hash_password
from ibmon.config import SourceConfig, load_settings
from ibmon.infiniband.counters import BY_NAME
from ibmon.infiniband.model import LinkInfo, PortIdentity, PortSample, Snapshot, Topology
from ibmon.runtime.daemon import Daemon
from ibmon.sources.sysfs import SysfsSourceConfig
from tests.syspkg import require_binary

IBMON = Path(sys.executable).with_name("ibmon")
LEAF = "0x0002c90100000070"
HOST = "0x0002c90a00000031"
T0 = time.monotonic()
#: The detail counters are in the catalogue. Until then the tracker does not
#: know them, the cause comes from the symbol errors on the same port (physical all the same),
#: and the parts of the answers that quote the details are not checked.
DETAILS = "receive_local_physical_errors" in BY_NAME


class CableSource:
    """leaf07 port 12 <-> gpu031 mlx5_0 port 1; the leaf end receives 1,240 errors/s."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def discover(self) -> Topology:
        return Topology(source=self.name)

    async def sample(self) -> Snapshot:
        now = time.monotonic()
        n = int((now - T0) * 20)  # 20 polls a second: counters grow per 50 ms
        snap = Snapshot(source=self.name, monotonic=now, wall=time.time())
        leaf = PortIdentity(guid=LEAF, port="12", node_desc="leaf07", node_type="switch", lid=3,
                            source=self.name)
        host = PortIdentity(guid=HOST, port="1", device="mlx5_0", node_desc="gpu031 mlx5_0",
                            lid=9, source=self.name)
        edr = {"active_width": "4X", "active_speed": "EDR", "max_width": "4X",
               "max_speed": "EDR"}
        snap.ports[leaf.key] = PortSample(
            identity=leaf, state=4, phys_state=5, rate_bps=100e9, active_width="4X",
            active_speed="EDR",
            link=LinkInfo(remote_guid=HOST, remote_port="1", remote_node_desc="gpu031 mlx5_0",
                          **edr),
            counters={"receive_errors": 62 * n, "symbol_errors": 50 * n,
                      "transmit_data": 1000 * n,
                      **({"receive_local_physical_errors": 61 * n,
                          "receive_malformed_packet_errors": n} if DETAILS else {})},
        )
        snap.ports[host.key] = PortSample(
            identity=host, state=4, phys_state=5, rate_bps=100e9, active_width="4X",
            active_speed="EDR",
            link=LinkInfo(remote_guid=LEAF, remote_port="12", remote_node_desc="leaf07", **edr),
            counters={"receive_errors": 0, "symbol_errors": 50 * n, "transmit_data": 1000 * n},
        )
        return snap

    async def close(self) -> None:
        return None


def get(base: str, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(base + path, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def ibmon(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(IBMON), *args], capture_output=True, text=True, timeout=60,
                          check=False)


async def _running(tmp_path: Path, **prometheus: Any) -> AsyncIterator[tuple[Daemon, str]]:
    cfg: SourceConfig = SysfsSourceConfig(name="fabric", interval=0.05)
    settings = load_settings(None, prometheus={"listen": "127.0.0.1:0", **prometheus},
                             sources=[cfg.model_dump()])
    daemon = Daemon(settings, source_factory=lambda c: CableSource(c.label))
    task = asyncio.create_task(daemon.run())
    try:
        await daemon.ready.wait()
        assert daemon.exporter is not None
        scheme = "https" if prometheus.get("tls_cert") else "http"
        deadline = time.monotonic() + 15
        # the engine holds a condition before the poll's end publishes its event
        while ({a.type for a in daemon.conditions()} != {"receive_errors", "high_ber"}
               or {e.type for e in daemon.bus.history} != {"receive_errors", "high_ber"}):
            assert time.monotonic() < deadline, "receive_errors and high_ber never fired"
            await asyncio.sleep(0.05)
        yield daemon, f"{scheme}://127.0.0.1:{daemon.exporter.port}"
    finally:
        daemon.stop()
        await task


@pytest.fixture
async def plain(tmp_path: Path) -> AsyncIterator[tuple[Daemon, str]]:
    async for running in _running(tmp_path):
        yield running


async def test_one_port_with_both_ends_cause_breakdown_and_events(
    plain: tuple[Daemon, str],
) -> None:
    _, base = plain
    status, body = await asyncio.to_thread(get, base, f"/api/v1/ports/{LEAF}/12")
    assert status == 200
    assert body["port"]["node_desc"] == "leaf07"
    assert body["peer"]["node_desc"] == "gpu031 mlx5_0"
    assert body["peer"]["symbol_error_ber"] > 0
    assert body["link"]["active_width"] == "4X"
    assert body["link"]["degraded"] is False
    (cond,) = [c for c in body["conditions"] if c["type"] == "receive_errors"]
    assert (cond["on"], cond["cause"]) == ("port", "physical")
    assert "leaf07 port 12" in cond["action"]
    assert "gpu031 mlx5_0 port 1" in cond["action"]
    assert "symbol errors are rising on the same link" in cond["message"]
    if DETAILS:
        assert cond["breakdown"]["receive_local_physical_errors"] > 0
        assert "98 % local physical errors" in cond["message"]
        details = body["port"]["breakdown"]["receive_errors"]["details"]
        assert (details["receive_local_physical_errors"]
                > details["receive_malformed_packet_errors"])
    assert body["port"]["causes"] == {"receive_errors": "physical", "high_ber": "physical"}
    types = {(e["type"], e["port"]["guid"]) for e in body["events"]}
    assert ("receive_errors", LEAF) in types
    assert ("high_ber", HOST) in types  # the far end's event is in the same answer
    assert ("high_ber", LEAF) in types
    # the same port from the far end's side, and any GUID spelling
    _, far = await asyncio.to_thread(get, base, "/api/v1/ports/0002:c90a:0000:0031/1")
    assert far["port"]["guid"] == HOST
    assert [c["on"] for c in far["conditions"] if c["type"] == "receive_errors"] == ["peer"]
    assert (await asyncio.to_thread(get, base, f"/api/v1/ports/{LEAF}/99"))[0] == 404
    assert (await asyncio.to_thread(get, base, "/api/v1/ports/leaf07/12"))[0] == 400
    assert (await asyncio.to_thread(get, base, f"/api/v1/ports/{LEAF}/x"))[0] == 400


async def test_topology_pages_list_every_node_and_link_once(plain: tuple[Daemon, str]) -> None:
    _, base = plain
    status, first = await asyncio.to_thread(get, base, "/api/v1/topology?limit=1")
    assert status == 200
    assert (first["count"], first["links"], len(first["nodes"])) == (2, 1, 1)
    assert first["next"]
    _, second = await asyncio.to_thread(get, base, f"/api/v1/topology?limit=1&cursor="
                                                   f"{first['next']}")
    assert second["next"] is None
    nodes = first["nodes"] + second["nodes"]
    assert [n["guid"] for n in nodes] == [LEAF, HOST]
    (link,) = [ln for n in nodes for ln in n["links"]]
    assert (link["a"]["guid"], link["b"]["guid"]) == (LEAF, HOST)
    assert link["faulty"] is True
    assert "receive_errors" in link["conditions"]
    assert (await asyncio.to_thread(get, base, "/api/v1/topology?cursor=zz"))[0] == 400


@pytest.mark.parametrize("spec", [f"{LEAF}/12", '"leaf07"[12]', "leaf07[12]"])
async def test_explain_names_the_cause_and_both_ends(plain: tuple[Daemon, str],
                                                     spec: str) -> None:
    _, base = plain
    proc = await asyncio.to_thread(ibmon, "explain", spec, "--url", base)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith(f"leaf07 port 12 ({LEAF}/12, switch, LID 3)")
    assert "linked to gpu031 mlx5_0 port 1" in out
    assert "receive_errors warning, firing since" in out
    assert "likely cause physical" in out
    assert "first: Check the cable and transceivers between leaf07 port 12 and gpu031" in out
    if DETAILS:
        assert "local physical errors" in out


async def test_explain_host_device_and_usage_errors(plain: tuple[Daemon, str]) -> None:
    _, base = plain
    proc = await asyncio.to_thread(ibmon, "explain", "gpu031/mlx5_0", "--url", base,
                                   "--format", "json")
    assert proc.returncode == 0, proc.stderr
    body = json.loads(proc.stdout)
    assert (body["port"]["guid"], body["port"]["port"]) == (HOST, "1")
    proc = await asyncio.to_thread(ibmon, "explain", "gpu031", "--url", base, "--format", "json")
    assert proc.returncode == 0, proc.stderr  # a host with one CA: the host name is enough
    body = json.loads(proc.stdout)
    assert (body["port"]["guid"], body["port"]["port"]) == (HOST, "1")
    for spec, message in (("nosuch[1]", "no node 'nosuch'"), ("leaf07[40]", "has no port 40"),
                          ("leaf07", "is a switch: name its port"), ("what?", "no node 'what?'"),
                          ("a/b/c", "is not GUID/PORT")):
        proc = await asyncio.to_thread(ibmon, "explain", spec, "--url", base)
        assert proc.returncode == 2
        assert message in proc.stderr
        assert "Traceback" not in proc.stderr


async def test_topology_dot_renders_with_graphviz(plain: tuple[Daemon, str],
                                                  tmp_path: Path) -> None:
    dot = require_binary("dot")
    _, base = plain
    proc = await asyncio.to_thread(ibmon, "topology", "--url", base, "--format", "dot")
    assert proc.returncode == 0, proc.stderr
    assert "color=red" in proc.stdout
    svg = await asyncio.to_thread(subprocess.run, [dot, "-Tsvg"], input=proc.stdout,
                                  capture_output=True, text=True, timeout=60, check=False)
    assert svg.returncode == 0, svg.stderr
    assert "<svg" in svg.stdout
    assert "leaf07" in svg.stdout
    assert 'stroke="red"' in svg.stdout
    proc = await asyncio.to_thread(ibmon, "topology", "--url", base)
    body = json.loads(proc.stdout)
    assert (len(body["nodes"]), body["links"]) == (2, 1)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    openssl = require_binary("openssl")
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60, start_new_session=True,
    )
    users = d / "users"
    users.write_text(f"sre:{hash_password('s3cret-pass')}\n", encoding="utf-8")
    return cert, key, users


async def test_clients_with_basic_auth_and_a_ca_file(tls: tuple[Path, Path, Path],
                                                     tmp_path: Path) -> None:
    cert, key, users = tls
    pw = tmp_path / "pw"
    pw.write_text("s3cret-pass\n", encoding="utf-8")
    wrong = tmp_path / "wrong"
    wrong.write_text("nope\n", encoding="utf-8")
    async for _, base in _running(tmp_path, tls_cert=str(cert), tls_key=str(key),
                                  basic_auth_file=str(users)):
        auth = ["--url", base, "--user", "sre", "--password-file", str(pw),
                "--ca-file", str(cert)]
        proc = await asyncio.to_thread(ibmon, "explain", "leaf07[12]", *auth)
        assert proc.returncode == 0, proc.stderr
        assert "likely cause physical" in proc.stdout
        proc = await asyncio.to_thread(ibmon, "topology", *auth, "--format", "dot")
        assert proc.returncode == 0, proc.stderr
        proc = await asyncio.to_thread(ibmon, "top", *auth, "--once", "--limit", "5")
        assert proc.returncode == 0, proc.stderr
        assert "leaf07" in proc.stdout
        # each missing piece is one line that says what to give
        for args, message in (
            (["--url", base, "--user", "sre", "--password-file", str(pw)], "--ca-file"),
            (["--url", base, "--ca-file", str(cert)], "--user and --password-file"),
            (["--url", base, "--user", "sre", "--password-file", str(wrong), "--ca-file",
              str(cert)], "wrong user or password"),
        ):
            for cmd in (["explain", f"{LEAF}/12"], ["top", "--once"]):
                proc = await asyncio.to_thread(ibmon, *cmd, *args)
                assert proc.returncode == 2, (cmd, args, proc.stdout)
                assert message in proc.stderr, (cmd, proc.stderr)
                assert "Traceback" not in proc.stderr
