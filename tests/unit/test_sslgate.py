"""A node daemon whose config has no TLS starts without OpenSSL, and still serves TLS if a
reload asks for it (``ibmon.runtime.sslgate``).

Each case runs in a fresh interpreter (the gate only acts before asyncio is imported), and
asserts on what the process really has mapped (``/proc/self/maps``), not on module names alone.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.mqtt_broker import make_tls
from tests.syspkg import require_binary

REPO = Path(__file__).resolve().parents[2]

#: Runs the gate, then reports what the interpreter has loaded and what hashing gives.
_PROBE = """
import json, sys
from pathlib import Path
from ibmon.runtime.sslgate import import_without_openssl
cfg = Path(sys.argv[1]) if sys.argv[1] else None
deferred = import_without_openssl(cfg, json.loads(sys.argv[2]))
import asyncio.base_events, asyncio.sslproto, hashlib, hmac

def mapped():
    maps = Path("/proc/self/maps").read_text()
    return sorted({lib for lib in ("libssl", "libcrypto") if lib in maps})

report = {
    "deferred": deferred,
    "asyncio_has_ssl": asyncio.base_events.ssl is not None,
    "modules": sorted(m for m in ("ssl", "_ssl", "_hashlib") if sys.modules.get(m)),
    "mapped": mapped(),
    "sha256": hashlib.sha256(b"ibmon").hexdigest(),
    "sha1": hashlib.sha1(b"sysfs:mlx5_0", usedforsecurity=False).hexdigest(),
    "compare": hmac.compare_digest("a" * 64, "a" * 64),
}
import ssl  # importable again once asyncio and hashlib are bound
report["mapped_after_import"] = mapped()
print(json.dumps(report))
"""


def _probe(config: Path | None, env: dict[str, str] | None = None) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(config or ""), json.dumps(env or {})],
        capture_output=True, text=True, timeout=60, cwd=REPO, check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("IBMON_")},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report: dict[str, object] = json.loads(done.stdout)
    return report


def _config(tmp_path: Path, text: str) -> Path:
    cfg = tmp_path / "ibmon.toml"
    cfg.write_text(text)
    return cfg


PLAIN = '[prometheus]\nlisten = "127.0.0.1:0"\n[[sources]]\ntype = "sysfs"\n'


def test_a_config_without_tls_runs_asyncio_and_hashing_without_openssl(tmp_path: Path) -> None:
    report = _probe(_config(tmp_path, PLAIN))
    assert report["deferred"] is True
    assert report["asyncio_has_ssl"] is False
    assert report["modules"] == []
    assert report["mapped"] == []  # the 4.5 MB this is for
    # hashlib's built-in implementations give the digests OpenSSL gives (shard keys, event ids).
    assert report["sha256"] == hashlib.sha256(b"ibmon").hexdigest()
    assert report["sha1"] == hashlib.sha1(b"sysfs:mlx5_0", usedforsecurity=False).hexdigest()
    assert report["compare"] is hmac.compare_digest("a" * 64, "a" * 64)
    # Nothing stays blocked: whatever needs ssl later (MQTT) loads it then.
    assert report["mapped_after_import"] == ["libcrypto", "libssl"]


@pytest.mark.parametrize(
    ("text", "env"),
    [
        (PLAIN + '[mqtt]\nhost = "broker"\n[mqtt.tls]\nca_file = "/etc/ca.pem"\n', {}),
        (PLAIN.replace("[prometheus]\n", '[prometheus]\ntls_cert = "/etc/c.pem"\n'), {}),
        ("# TLS is turned on by a reload later\n" + PLAIN, {}),
        (PLAIN, {"IBMON_PROMETHEUS__TLS_CERT": "/etc/c.pem"}),
        (PLAIN, {"IBMON_PROMETHEUS": '{"tls_cert": "/etc/c.pem", "tls_key": "/etc/k.pem"}'}),
    ],
    ids=["mqtt-tls", "prometheus-tls", "comment", "env-name", "env-json"],
)
def test_any_mention_of_tls_loads_openssl_as_usual(
    tmp_path: Path, text: str, env: dict[str, str]
) -> None:
    report = _probe(_config(tmp_path, text), env)
    assert report["deferred"] is False
    assert report["asyncio_has_ssl"] is True


def test_an_unreadable_config_decides_nothing(tmp_path: Path) -> None:
    assert _probe(tmp_path / "missing.toml")["deferred"] is False


#: Deferred start, then a TLS server built the way the exporter builds it, and a real handshake.
_TLS_SERVER = """
import sys
from pathlib import Path
from ibmon.runtime.sslgate import import_without_openssl
assert import_without_openssl(None, {})
import asyncio, ssl
from exporters.http import tls_context

async def main():
    ctx = tls_context(Path(sys.argv[1]), Path(sys.argv[2]))

    async def answer(reader, writer):
        writer.write(b"over tls\\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=ctx)
    port = server.sockets[0].getsockname()[1]
    client = ssl.create_default_context(cafile=sys.argv[3])
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
    print((await reader.readline()).decode().strip(), writer.get_extra_info("cipher")[1])
    writer.close()
    server.close()

asyncio.run(main())
"""


def test_tls_still_works_in_a_process_that_started_without_openssl(tmp_path: Path) -> None:
    require_binary("openssl")
    tls = make_tls(tmp_path / "tls")
    done = subprocess.run(
        [sys.executable, "-c", _TLS_SERVER, str(tls.server_cert), str(tls.server_key),
         str(tls.ca)],
        capture_output=True, text=True, timeout=60, cwd=REPO, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[:2] == ["over", "tls"]
    assert done.stdout.split()[2].startswith("TLSv1.")
