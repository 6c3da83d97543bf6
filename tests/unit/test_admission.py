"""Gang admission: queue order, no over-commit, backfill, and the anti-starvation reservation."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from pathways_operator.core.admission import QueuedGang, admit, queue_order
from pathways_operator.core.placement import GangRequest, HostResources, Placement, Unplaceable
from pathways_operator.core.reasons import Reason

from .builders import gang, island

NOW = 10_000.0


def names(items: Sequence[Placement | Unplaceable]) -> list[str]:
    return [x.slice for x in items]


def test_queue_order_is_priority_then_age_then_name() -> None:
    q = [gang("c", 4, at=1), gang("b", 4, at=1), gang("a", 4, at=5), gang("hi", 4, priority=10, at=9)]
    assert [g.request.slice for g in queue_order(q)] == ["hi", "b", "c", "a"]


def test_two_gangs_never_over_commit() -> None:
    # Each alone fits on the one island of 8; together they need 12.
    r = admit([gang("first", 8, at=1), gang("second", 4, at=2)], island("a", 2, 4), now=NOW)
    assert names(r.admitted) == ["first"]
    assert names(r.waiting) == ["second"]
    assert r.waiting[0].reason is Reason.INSUFFICIENT_DEVICES
    assert "best is a with 0 free" in r.waiting[0].message


def test_admitted_gangs_share_an_island_without_overlap() -> None:
    r = admit([gang("x", 4, at=1), gang("y", 4, at=2)], island("a", 2, 4), now=NOW)
    assert [p.hosts[0].machine for p in r.admitted] == ["a-m0", "a-m1"]


def test_waiting_gang_holds_nothing_and_smaller_ones_backfill() -> None:
    q = [gang("big", 16, at=1), gang("small", 4, at=2)]
    r = admit(q, island("a", 4, 4, used=(4,)), now=10.0)  # big has waited 9s only
    assert names(r.admitted) == ["small"]
    assert names(r.waiting) == ["big"]
    assert r.reserved == {}


def test_old_waiting_gang_reserves_its_island_against_backfill() -> None:
    q = [gang("big", 16, at=0), gang("small", 4, at=2)]
    machines = island("a", 4, 4, used=(4,)) + island("b", 1, 4, used=(4,))
    r = admit(q, machines, now=600.0, reserve_after=300.0)
    assert r.admitted == []
    assert r.reserved == {"a": "big"}
    blocked = r.waiting[1]
    assert blocked.slice == "small"
    assert blocked.reason is Reason.ISLAND_RESERVED
    assert blocked.retryable
    assert "would fit on a, but a is held for slice 'big', which has waited 600s" in blocked.message


def test_reservation_leaves_other_islands_open() -> None:
    q = [gang("big", 16, at=0), gang("small", 4, at=2)]
    machines = island("a", 4, 4, used=(4,)) + island("b", 1, 4)
    r = admit(q, machines, now=600.0, reserve_after=300.0)
    assert [(p.slice, p.island) for p in r.admitted] == [("small", "b")]


def test_higher_priority_is_not_blocked_by_a_reservation() -> None:
    q = [gang("big", 16, at=0), gang("urgent", 4, priority=5, at=500)]
    r = admit(q, island("a", 4, 4, used=(4,)), now=600.0, reserve_after=300.0)
    assert names(r.admitted) == ["urgent"]


def test_gangs_that_never_fit_reserve_nothing() -> None:
    q = [gang("huge", 64, at=0), gang("small", 4, at=2)]
    r = admit(q, island("a", 4, 4), now=600.0, reserve_after=300.0)
    assert names(r.admitted) == ["small"]
    assert r.waiting[0].reason is Reason.EXCEEDS_ISLAND
    assert r.reserved == {}


def test_admission_is_order_independent_in_its_input() -> None:
    q = [gang(f"s{i}", 4 * (1 + i % 3), at=i) for i in range(8)]
    machines = island("a", 4, 4) + island("b", 6, 4, used=(2,))
    assert admit(q, machines, now=NOW) == admit(q[::-1], machines[::-1], now=NOW)


def test_same_slice_queued_twice_is_rejected() -> None:
    with pytest.raises(ValueError, match="'s' is queued twice"):
        admit([gang("s", 4), gang("s", 4)], island("a", 1, 4), now=NOW)


def test_many_gangs_fill_exactly_without_over_commit() -> None:
    machines = island("a", 4, 8) + island("b", 2, 8)
    q: list[QueuedGang] = [gang(f"g{i}", 4, at=i) for i in range(14)]
    r = admit(q, machines, now=NOW)
    assert len(r.admitted) == 12  # 48 devices / 4
    use: dict[str, int] = {}
    for p in r.admitted:
        for machine, n in p.devices_by_machine().items():
            use[machine] = use.get(machine, 0) + n
    assert all(n <= 8 for n in use.values())


def test_two_gangs_admitted_together_never_over_commit_cpu() -> None:
    # Devices for both (2 x 4 on one 8-device machine), CPU for one (6 of 8 CPUs each).
    needs = HostResources(cpu_millis=6_000)
    q = [QueuedGang(GangRequest(name, 4, host_resources=needs), queued_at=at) for name, at in (("x", 1), ("y", 2))]
    r = admit(q, island("a", 1, 8, cpu=8_000), now=NOW)
    assert names(r.admitted) == ["x"]
    assert names(r.waiting) == ["y"]
    assert "free cpu/memory for only 0 of 1 host" in r.waiting[0].message


# -- admission groups: a program's slices are admitted whole or not at all ---------------------


def test_two_groups_compete_and_only_the_one_that_fits_whole_is_placed() -> None:
    # Two islands of 8. Program p holds a:8 + b:4; q wants b:4 + a:8 and must take nothing
    # while a is full, although its b slice alone would fit in b's free 4.
    machines = island("a", 2, 4, used=(4, 4)) + island("b", 2, 4, used=(4,))
    q = [gang("q-stage1", 4, on="b", at=1, group="q", size=2), gang("q-stage0", 8, on="a", at=1, group="q", size=2)]
    r = admit(q, machines, now=NOW)
    assert r.admitted == [], "no slice of a group that does not fit whole is placed"
    assert names(r.waiting) == ["q-stage0", "q-stage1"]
    stage0, stage1 = r.waiting
    assert stage0.reason is Reason.INSUFFICIENT_DEVICES
    assert "admission group 'q' (2 slices) is admitted whole or not at all" in stage0.message
    assert stage1.reason is Reason.ADMISSION_GROUP_WAITING
    assert stage1.message.startswith(
        "slice 'q-stage1' holds no devices until its whole admission group 'q' (2 slices) fits: "
        "slice 'q-stage0' needs 8 devices"
    ), stage1.message


def test_first_group_in_queue_order_takes_the_room_and_the_second_places_nothing() -> None:
    machines = island("a", 2, 4) + island("b", 2, 4)
    q = [
        gang("p0", 8, at=1, group="p", size=2), gang("p1", 4, at=1, group="p", size=2),
        gang("q0", 4, at=2, group="q", size=2), gang("q1", 8, at=2, group="q", size=2),
    ]
    r = admit(q, machines, now=NOW)
    assert sorted(names(r.admitted)) == ["p0", "p1"]
    assert sorted(names(r.waiting)) == ["q0", "q1"]
    assert {w.reason for w in r.waiting} == {Reason.INSUFFICIENT_DEVICES, Reason.ADMISSION_GROUP_WAITING}


def test_devices_of_a_refused_group_stay_free_for_gangs_behind_it() -> None:
    # Group g (4 + 16) cannot fit: its 4-device slice must not eat the room of "solo".
    machines = island("a", 2, 4)
    q = [gang("g0", 4, at=1, group="g", size=2), gang("g1", 16, at=1, group="g", size=2), gang("solo", 8, at=2)]
    r = admit(q, machines, now=NOW)
    assert names(r.admitted) == ["solo"]
    assert sorted(names(r.waiting)) == ["g0", "g1"]


def test_group_waits_until_all_its_slices_exist() -> None:
    r = admit([gang("p0", 4, at=1, group="p", size=2)], island("a", 2, 4), now=NOW)
    assert r.admitted == []
    (waiting,) = r.waiting
    assert waiting.reason is Reason.ADMISSION_GROUP_INCOMPLETE
    assert "admission group 'p' (2 in all); 1 exist so far, waiting for 1 more" in waiting.message


def test_group_member_is_admitted_alone_when_the_rest_already_holds_devices() -> None:
    # p1 runs already (holding); p0 was recreated and queues again by itself.
    r = admit([gang("p0", 4, at=1, group="p", size=2)], island("a", 2, 4), now=NOW, holding={"p": 1})
    assert names(r.admitted) == ["p0"]


def test_group_takes_its_place_in_the_queue_from_its_first_member() -> None:
    # "late" is older than every member of g but g's "g0" is older still.
    machines = island("a", 2, 4)
    q = [gang("late", 8, at=2), gang("g0", 4, at=1, group="g", size=2), gang("g1", 4, at=3, group="g", size=2)]
    r = admit(q, machines, now=NOW)
    assert sorted(names(r.admitted)) == ["g0", "g1"]
    assert names(r.waiting) == ["late"]


def test_group_size_below_one_is_rejected() -> None:
    with pytest.raises(ValueError, match="admission group size 0"):
        admit([gang("x", 4, group="g", size=0)], island("a", 1, 4), now=NOW)
