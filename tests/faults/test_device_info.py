"""The device's firmware, type and board reach the operator (node_exporter's
``node_infiniband_info`` has them): ``ibmon_device_info`` on /metrics and in the JSON API, from a
real daemon on a sysfs tree; a device that goes away leaves no series behind."""

from __future__ import annotations

import json
import shutil
import urllib.request
from pathlib import Path

from tests.faults.daemonproc import DaemonProcess
from tests.faults.promise import TotalsWatch
from tests.faults.test_state import Tree, config, polls
from tests.sysfs_tree import class_dir, write_device, write_port

INFO = "ibmon_device_info"


def test_device_firmware_type_and_board_are_exported(tmp_path: Path) -> None:
    tree = Tree(tmp_path / "sys")  # mlx5_0: fw 20.31.1014, MT4123, MT_0000000223
    write_device(tree.root, "mlx5_1", node_guid="0002:c903:00a1:b2c9", fw_ver="16.35.2000\n",
                 hca_type="MT4119\n", board_id="MT_0000000008\n")
    write_port(tree.root, "mlx5_1", 1)
    cfg = config(tmp_path, tree, state=tmp_path / "state.json")
    daemon = DaemonProcess(tmp_path, cfg, TotalsWatch())
    try:
        daemon.start()
        s = daemon.scrape_until("a poll", lambda s: polls(s) >= 2)
        assert s.value(INFO, source="node", device="mlx5_0", guid="0x0002c90300a1b2c3",
                       fw_ver="20.31.1014", hca_type="MT4123", board_id="MT_0000000223") == 1
        assert s.value(INFO, source="node", device="mlx5_1", guid="0x0002c90300a1b2c9",
                       fw_ver="16.35.2000", hca_type="MT4119", board_id="MT_0000000008") == 1
        api = daemon.url.replace("/metrics", "/api/v1/ports")
        with urllib.request.urlopen(api, timeout=10) as resp:
            ports = json.loads(resp.read())["ports"]
        assert {(p["device"], p["fw_ver"], p["hca_type"], p["board_id"]) for p in ports} == {
            ("mlx5_0", "20.31.1014", "MT4123", "MT_0000000223"),
            ("mlx5_1", "16.35.2000", "MT4119", "MT_0000000008")}
        shutil.rmtree(class_dir(tree.root) / "mlx5_1")  # hot-unplugged
        daemon.scrape_until("the device's series to go",
                            lambda s: s.value(INFO, source="node", device="mlx5_1",
                                              guid="0x0002c90300a1b2c9", fw_ver="16.35.2000",
                                              hca_type="MT4119",
                                              board_id="MT_0000000008") is None)
        assert daemon.stop() == 0
        daemon.traceback_free()
    finally:
        daemon.cleanup()
