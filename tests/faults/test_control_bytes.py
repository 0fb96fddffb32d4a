"""Node descriptions with raw control bytes reach no output as themselves.

A host's administrator sets ``node_desc``; ESC, BEL, NUL, CR and C1 controls in it used to reach
/metrics label values unchanged, so ``curl`` on a terminal acted on them. One printable form is
made at ingest (``\\x1b``) and every output shows that: checked here on a real daemon's
/metrics bytes and its JSON API.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from tests.faults.daemonproc import DaemonProcess
from tests.faults.promise import TotalsWatch
from tests.faults.test_state import Tree, config, polls
from tests.sysfs_tree import write_file

HOSTILE = "node\x1b[2J\x07\x00\r\x9b\u202eend"
SHOWN = "node\\x1b[2J\\x07\\x00\\x0d\\x9b\\u202eend"


def test_control_bytes_in_a_node_description_are_escaped_everywhere(tmp_path: Path) -> None:
    tree = Tree(tmp_path / "sys")
    write_file(tree.root / "class" / "infiniband" / "mlx5_0" / "node_desc", HOSTILE + "\n")
    daemon = DaemonProcess(tmp_path, config(tmp_path, tree, state=tmp_path / "state.json"),
                           TotalsWatch())
    try:
        daemon.start()
        daemon.scrape_until("a poll", lambda s: polls(s) >= 2)
        with urllib.request.urlopen(daemon.url, timeout=10) as resp:
            body = resp.read()
        text = body.decode("utf-8")
        assert not [c for c in text if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) <= 0x9F
                    or c == "\u202e"]
        # the label value is the printable form, its backslashes escaped as the format says
        assert f'node_desc="{SHOWN.replace(chr(92), chr(92) * 2)}"' in text
        api = daemon.url.replace("/metrics", "/api/v1/ports")
        with urllib.request.urlopen(api, timeout=10) as resp:
            ports = json.loads(resp.read())["ports"]
        assert {p["node_desc"] for p in ports} == {SHOWN}
        assert daemon.stop() == 0
        daemon.traceback_free()
    finally:
        daemon.cleanup()
