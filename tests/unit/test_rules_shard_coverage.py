"""IbmonFabricShardsUncovered counts shards, not daemons: promtool on a healthy HA pair of one
shard while another shard's only daemon is dead (deploy/prometheus/tests/
ibmon-shard-coverage.test.yml). Without ``max by (fabric, shard)`` the pair's two series would
cover for the missing shard and the alert would stay silent."""

from __future__ import annotations

import subprocess

import pytest

from tests.promql_sources import REPO
from tests.syspkg import require_binary

SHARD_TESTS = REPO / "deploy" / "prometheus" / "tests" / "ibmon-shard-coverage.test.yml"


@pytest.mark.system
def test_a_healthy_ha_pair_does_not_cover_a_dead_shard() -> None:
    proc = subprocess.run([require_binary("promtool"), "test", "rules", SHARD_TESTS.name],
                          cwd=SHARD_TESTS.parent, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout
