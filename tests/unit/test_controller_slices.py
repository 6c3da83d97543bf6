"""The slice table's arithmetic: devices its slices hold, what `Describe` shows, and which
asks a named slice answers."""

from __future__ import annotations

from pathways_operator.controller.slices import cluster_info, free_machines
from pathways_wire import ir
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


def test_a_named_slice_answers_an_ask_of_its_size_and_of_no_other_island_or_host_size() -> None:
    rec = slice_record("pool", 2)  # 8 devices, 2 hosts of 4, on island-a
    what = "slice 'pool'"

    for fits in (ir.SliceDecl("pool", "pool", 8), ir.SliceDecl("pool", "pool", 8, 4, "island-a")):
        assert rec.reuse_refusal(what, fits) == ""
    assert rec.reuse_refusal(what, ir.SliceDecl("pool", "pool", 4)) == (
        "slice 'pool' has 8 devices; a program asked for 4. Use another name, or ask for the slice as it is"
    )
    assert rec.reuse_refusal(what, ir.SliceDecl("pool", "pool", 8, island="island-b")) == (
        "slice 'pool' is on island 'island-a'; a program pinned it to island 'island-b'. Use another "
        "name, or ask for the slice as it is (no island, or 'island-a')"
    )
    assert rec.reuse_refusal(what, ir.SliceDecl("pool", "pool", 8, devices_per_host=2)) == (
        "slice 'pool' has 4 devices per host; a program asked for 2. Use another name, or ask for the "
        "slice as it is"
    )
