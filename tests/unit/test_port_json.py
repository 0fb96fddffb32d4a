"""One port JSON and one set of state names for scan, the API and top."""

from __future__ import annotations

from exporters.ports import port_json
from ibmon.infiniband.model import phys_state_name, state_label, state_name
from tests.detect_views import view


def test_state_names_as_the_kernel_spells_them() -> None:
    assert [state_name(s) for s in (1, 2, 3, 4)] == ["DOWN", "INIT", "ARMED", "ACTIVE"]
    assert [phys_state_name(p) for p in (2, 3, 4, 5, 6)] == [
        "Polling", "Disabled", "PortConfigurationTraining", "LinkUp", "LinkErrorRecovery"]
    assert state_name(None) is None and state_name(9) == "9"


def test_table_cells_explain_a_port_that_is_not_active() -> None:
    assert state_label(4, 5) == "ACTIVE"
    assert state_label(1, 2) == "DOWN/Polling"
    assert state_label(1, 3) == "DOWN/Disabled"
    assert state_label(2, 5) == "INIT/LinkUp"
    assert state_label(1, None) == "DOWN"
    assert state_label(None, None) == "-"


def test_port_json_keeps_numbers_and_adds_names() -> None:
    doc = port_json(view(state=1))
    assert (doc["state"], doc["state_name"]) == (1, "DOWN")
    assert (doc["phys_state"], doc["phys_state_name"]) == (2, "Polling")
    for key in ("totals", "rates", "hw_totals", "conditions", "active", "symbol_error_ber",
                "utilization", "transmit_wait_ratio", "remote", "source"):
        assert key in doc
