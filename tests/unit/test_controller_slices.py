"""The slice table's arithmetic: devices its slices hold, and what `Describe` shows."""

from __future__ import annotations

from pathways_operator.controller.slices import cluster_info, free_machines
from tests.unit.builders import island
from tests.unit.controller_builders import slice_record


def test_the_controllers_own_slices_count_as_used_on_their_machines() -> None:
    machines = island("island-a", 3, 4, used=(1,))
    rec = slice_record("a", 2)  # hosts on island-a-m0 and -m1, 4 devices each
    assert [m.used_devices for m in free_machines(machines, [rec])] == [5, 4, 0]


def test_describe_sums_each_island_and_shows_no_slice_token() -> None:
    machines = island("island-b", 1, 8) + island("island-a", 2, 4, used=(4,))
    info = cluster_info(machines, [slice_record("a", 1, token="secret")])
    assert [(i.name, i.devices, i.free_devices, i.devices_per_host) for i in info.islands] == [
        ("island-a", 8, 4, 4), ("island-b", 8, 8, 8),
    ]
    (shown,) = info.slices
    assert shown.token == "" and shown.slice_id == "a-phys"
    assert [h.address for h in shown.hosts] == ["10.0.a.0:1"]
