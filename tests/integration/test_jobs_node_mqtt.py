"""A node-local daemon with a real Slurm: the job on this host reaches every channel.

One ``ibmon run`` reads a sysfs tree (host01's HCA) and asks a real slurmctld (``squeue
--json``) which jobs run; a real Mosquitto takes its events. When host01's cable is pulled, the
``port_down`` event on MQTT, in the event file and in the API history names the job running on
host01 (``how: host``), the port's API answer lists it, and ``ibmon explain`` prints it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from ibmon.detect.events import Event
from tests.integration.test_mqtt import _daemon_config
from tests.mqtt_broker import Collector, Mosquitto
from tests.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.system

GUID = "0x0002c90300a1b2c3"


def _get(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return json.load(r)


async def test_the_job_on_a_pulled_cables_host_is_named_on_every_channel(
    broker: Mosquitto, tmp_path: Path
) -> None:
    with SlurmCluster(["host01", "host02"], tmp_path / "slurm") as slurm:
        ours = slurm.submit(["host01"], "resnet-mqtt")
        other = slurm.submit(["host02"], "elsewhere")
        for job in (ours, other):
            slurm.wait_running(job, timeout=60)
        cfg = _daemon_config(tmp_path, broker.port)
        events = tmp_path / "events.jsonl"
        cfg.write_text(cfg.read_text() + f'[slurm]\ninterval = "500ms"\n'
                       f'slurm_conf = "{slurm.conf}"\n[events]\nfile = "{events}"\n')
        log = tmp_path / "daemon.log"
        with log.open("wb") as err:
            proc = subprocess.Popen(  # noqa: ASYNC220 - returns at once; the test is the wait
                [sys.executable, "-m", "ibmon", "run", "--config", str(cfg)],
                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
                env={"IBMON_LOG__FORMAT": "json", "PATH": "/usr/bin:/bin"},
            )
        try:
            async with Collector(broker.port, "ibmon/main/events/#").running() as sub:
                port = await _listening(log, sub)
                await sub.wait_for(lambda: _jobs(port) == {ours, other}, within=30)
                root = tmp_path / "sys/class/infiniband/mlx5_0/ports/1"
                (root / "phys_state").write_text("2: Polling\n")
                (root / "state").write_text("1: DOWN\n")
                topic = "ibmon/main/events/port_down"
                await sub.wait_for(lambda: bool(sub.on(topic)), within=20)
                down = Event.model_validate_json(sub.on(topic)[0])
                named = [{"id": ours, "user": "root", "name": "resnet-mqtt", "how": "host"}]
                assert down.details["jobs"] == named, down.details
                assert down.details["jobs_total"] == 1 and down.details["jobs_known"] is True
                on_file = [json.loads(line) for line in events.read_text().splitlines()]
                assert [e["details"]["jobs"] for e in on_file if e["type"] == "port_down"] \
                    == [named]
                history = _get(port, "/api/v1/events")
                listed = history["events"] if isinstance(history, dict) else history
                assert [e["details"]["jobs"] for e in listed if e["type"] == "port_down"] \
                    == [named]
                answer = _get(port, f"/api/v1/ports/{GUID}/1")
                assert [j["id"] for j in answer["jobs"]["list"]] == [ours]
                explained = subprocess.run(  # noqa: ASYNC221 - the test waits for it
                    [sys.executable, "-m", "ibmon", "explain", f"{GUID}/1", "--url",
                     f"http://127.0.0.1:{port}"], capture_output=True, text=True, timeout=60,
                    check=True).stdout
                assert "resnet-mqtt" in explained and "elsewhere" not in explained, explained
        finally:
            proc.kill()
            proc.wait(timeout=10)
        assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


async def _listening(log: Path, sub: Collector) -> int:
    found: list[int] = []

    def listening() -> bool:
        for line in log.read_text(errors="replace").splitlines():
            if '"listening"' in line:
                found.append(int(json.loads(line)["port"]))
        return bool(found)

    await sub.wait_for(listening, within=30)
    return found[-1]


def _jobs(port: int) -> set[str]:
    body = _get(port, "/api/v1/jobs")
    return {j["id"] for j in body["jobs"]} if body.get("known") else set()
