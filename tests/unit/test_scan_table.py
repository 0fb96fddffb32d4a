"""``ibmon scan``'s table: its ERRORS column counts each error once.

The receive-error and discard details split their aggregate by cause (every increment of a
detail is also one of its aggregate), so a port with N receive errors has N errors, whatever
the fabric source read of their details.
"""

from __future__ import annotations

from ibmon.cli.scan import render_table
from ibmon.infiniband.model import Snapshot
from ibmon.track.tracker import Tracker
from mocks.topology import fat_tree
from mocks.traffic import FabricModel


def test_the_errors_column_counts_a_receive_error_once_with_its_details() -> None:
    model = FabricModel(fat_tree(levels=2, radix=8, leaves=2, hosts_per_leaf=4), seed=3)
    key = model.keys[0]
    model.set_error_rate(key, "receive_errors", 50.0)
    tracker = Tracker()
    for t in range(3):
        sample = model.port_sample(*key)
        views = tracker.update(Snapshot("mock", float(t), 1e9 + t, {sample.key: sample}))
        model.advance(1.0)
    (view,) = views.values()
    totals = view.totals
    assert totals["receive_errors"] == totals["receive_local_physical_errors"] > 0
    header, row = render_table([view]).splitlines()
    at, end = header.index("ERRORS"), header.index("BER")  # cells start under their header
    assert row[at:end].strip() == str(totals["receive_errors"])
