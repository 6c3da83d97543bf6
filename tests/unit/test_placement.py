"""Gang placement: whole gangs on one island, best fit, and messages that carry the numbers."""

from __future__ import annotations

import dataclasses

import pytest

from pathways_operator.core.placement import (
    GangRequest,
    HostAssignment,
    HostResources,
    Machine,
    Placement,
    Unplaceable,
    cpu_text,
    memory_text,
    place_gang,
    reserve,
)
from pathways_operator.core.reasons import Reason

from .builders import island


def placed(outcome: Placement | Unplaceable) -> Placement:
    assert isinstance(outcome, Placement), outcome
    return outcome


def refused(outcome: Placement | Unplaceable) -> Unplaceable:
    assert isinstance(outcome, Unplaceable), outcome
    return outcome


def test_splits_slice_into_hosts_of_the_island_machine_size() -> None:
    p = placed(place_gang(GangRequest("train", 8), island("island-a", 4, 4)))
    assert p.island == "island-a"
    assert p.devices_per_host == 4
    assert p.hosts == (HostAssignment(0, "island-a-m0", 4), HostAssignment(1, "island-a-m1", 4))
    assert p.devices == 8


def test_small_slice_is_one_host_smaller_than_a_machine() -> None:
    p = placed(place_gang(GangRequest("tiny", 2), island("a", 2, 4)))
    assert p.hosts == (HostAssignment(0, "a-m0", 2),)


def test_several_hosts_share_a_machine_with_room() -> None:
    p = placed(place_gang(GangRequest("train", 8, devices_per_host=4), island("a", 1, 8)))
    assert [h.machine for h in p.hosts] == ["a-m0", "a-m0"]
    assert p.devices_by_machine() == {"a-m0": 8}


def test_hosts_go_to_the_fullest_machines_first() -> None:
    machines = island("a", 3, 4, used=(0, 2, 0))
    p = placed(place_gang(GangRequest("s", 2, devices_per_host=2), machines))
    assert p.hosts == (HostAssignment(0, "a-m1", 2),)


def test_best_fit_island_leaves_big_islands_free() -> None:
    machines = island("big", 8, 4) + island("small", 2, 4)
    assert placed(place_gang(GangRequest("s", 8), machines)).island == "small"


def test_island_ties_break_by_name() -> None:
    machines = island("b", 2, 4) + island("a", 2, 4)
    assert placed(place_gang(GangRequest("s", 4), machines)).island == "a"


def test_all_hosts_on_one_island_or_none() -> None:
    # 4 + 4 free across two islands is 8, but no island alone has 8.
    machines = island("island-a", 2, 4, used=(0, 4)) + island("island-b", 2, 4, used=(2, 4))
    u = refused(place_gang(GangRequest("train", 8), machines))
    assert u.reason is Reason.INSUFFICIENT_DEVICES
    assert u.retryable
    assert u.closest_island == "island-a"
    assert u.message == (
        "slice 'train' needs 8 devices on one island (2 hosts of 4); "
        "best is island-a with 4 free, island-b has 2 free"
    )


def test_fragmentation_is_explained() -> None:
    # 8 free devices, but as 2+2+2+2: no machine holds a host of 4.
    machines = island("a", 4, 4, used=(2, 2, 2, 2))
    u = refused(place_gang(GangRequest("s", 8), machines))
    assert u.reason is Reason.INSUFFICIENT_DEVICES
    assert "8 free but room for only 0 of 2 hosts of 4" in u.message


def test_one_of_a_thing_is_singular() -> None:
    waiting = refused(place_gang(GangRequest("s", 1), island("a", 1, 1, used=(1,))))
    assert "slice 's' needs 1 device on one island (1 host of 1); best is a with 0 free" == waiting.message
    too_big = refused(place_gang(GangRequest("s", 2, devices_per_host=2), island("a", 2, 1)))
    assert "has 1 device, less than a host of 2" in too_big.message, too_big.message
    assert "1 devices" not in too_big.message and "1 hosts" not in too_big.message


def test_cordoned_machines_count_for_never_but_not_for_now() -> None:
    machines = [dataclasses.replace(m, schedulable=False) for m in island("a", 2, 4)]
    u = refused(place_gang(GangRequest("s", 8), machines))
    assert u.reason is Reason.INSUFFICIENT_DEVICES


def test_too_big_for_every_island_never_fits() -> None:
    machines = island("island-a", 8, 4) + island("island-b", 2, 4)
    u = refused(place_gang(GangRequest("train", 64), machines))
    assert u.reason is Reason.EXCEEDS_ISLAND
    assert not u.retryable
    assert u.closest_island is None
    assert u.message == "slice 'train' asks for 64 devices but the largest island (island-a) has 32"


def test_host_bigger_than_any_machine_never_fits() -> None:
    u = refused(place_gang(GangRequest("s", 16, devices_per_host=16), island("a", 4, 8)))
    assert u.reason is Reason.EXCEEDS_ISLAND
    assert "largest machine on a (a-m0) has 8 devices, less than a host of 16" in u.message


def test_indivisible_devices_suggest_a_host_size() -> None:
    u = refused(place_gang(GangRequest("s", 6), island("a", 4, 4)))
    assert u.reason is Reason.INDIVISIBLE_DEVICES
    assert "a has 4 devices per machine and 6 is not a multiple of 4" in u.message
    assert "set devicesPerHost to a divisor of 6 (1, 2, 3, 6)" in u.message


def test_explicit_host_size_must_divide_devices() -> None:
    u = refused(place_gang(GangRequest("s", 6, devices_per_host=4), island("a", 4, 4)))
    assert u.reason is Reason.INVALID_SPEC
    assert "6 devices in hosts of 4" in u.message


def test_explicit_host_size_rescues_an_island_with_other_machine_size() -> None:
    p = placed(place_gang(GangRequest("s", 6, devices_per_host=2), island("a", 4, 4)))
    assert [h.devices for h in p.hosts] == [2, 2, 2]
    assert p.devices_by_machine() == {"a-m0": 4, "a-m1": 2}


@pytest.mark.parametrize(("devices", "per_host"), [(0, None), (4, 0)])
def test_nonsense_counts_are_invalid_spec(devices: int, per_host: int | None) -> None:
    u = refused(place_gang(GangRequest("s", devices, per_host), island("a", 1, 4)))
    assert u.reason is Reason.INVALID_SPEC
    assert "slice 's'" in u.message


def test_pinned_island_is_the_only_candidate() -> None:
    machines = island("a", 2, 4) + island("b", 4, 4)
    assert placed(place_gang(GangRequest("s", 8, island="b"), machines)).island == "b"
    full = island("a", 2, 4) + island("b", 2, 4, used=(4, 0))
    u = refused(place_gang(GangRequest("s", 8, island="b"), full))
    assert u.message == "slice 's' needs 8 devices on island b (pinned) (2 hosts of 4); it has 4 free"


def test_pinned_to_missing_island() -> None:
    u = refused(place_gang(GangRequest("s", 4, island="c"), island("a", 1, 4)))
    assert u.reason is Reason.NO_ISLAND
    assert "island 'c'" in u.message and "islands: a" in u.message


def test_no_machines_at_all() -> None:
    u = refused(place_gang(GangRequest("s", 4), []))
    assert u.reason is Reason.NO_ISLAND


def test_bad_inventory_is_an_error_not_an_answer() -> None:
    with pytest.raises(ValueError, match="'m' is listed twice"):
        place_gang(GangRequest("s", 1), [Machine("m", "a", 4), Machine("m", "a", 4)])
    with pytest.raises(ValueError, match="'m' on island 'a' has allocatable -1"):
        place_gang(GangRequest("s", 1), [Machine("m", "a", -1)])


def test_over_committed_machine_has_no_free_devices() -> None:
    assert Machine("m", "a", 4, used_devices=6).free_devices == 0


def test_reserve_counts_the_placement_as_used() -> None:
    machines = island("a", 2, 4)
    p = placed(place_gang(GangRequest("s", 4), machines))
    after = reserve(machines, p)
    assert [m.used_devices for m in after] == [4, 0]
    assert refused(place_gang(GangRequest("t", 8), after)).reason is Reason.INSUFFICIENT_DEVICES


def test_placement_is_deterministic_under_input_order() -> None:
    machines = island("a", 4, 4, used=(1, 0, 3, 0)) + island("b", 4, 4, used=(0, 2, 0, 0))
    req = GangRequest("s", 8, devices_per_host=2)
    assert place_gang(req, machines) == place_gang(req, machines[::-1])


GiB = 1 << 30


def test_host_asking_more_cpu_than_any_machine_has_never_fits_and_says_so() -> None:
    # The 16-CPU machines have every device free: only the cpu request keeps the host out.
    machines = island("island-a", 2, 4, cpu=16_000, memory=64 * GiB)
    u = refused(place_gang(GangRequest("hog", 4, host_resources=HostResources(cpu_millis=1_000_000)), machines))
    assert u.reason is Reason.INSUFFICIENT_RESOURCES
    assert not u.retryable
    assert u.message == (
        "slice 'hog' (4 devices) cannot fit on any island even when it is empty: each host needs "
        "cpu 1000; the best machine on island-a (island-a-m0) has cpu 16 allocatable; "
        "lower the cpu/memory requests in spec.resources, or add bigger Nodes"
    )


def test_memory_is_fitted_like_cpu_and_names_both_when_both_are_short() -> None:
    machines = island("a", 1, 4, cpu=2_000, memory=8 * GiB)
    needs = HostResources(cpu_millis=4_000, memory_bytes=16 * GiB)
    u = refused(place_gang(GangRequest("s", 4, host_resources=needs), machines))
    assert u.reason is Reason.INSUFFICIENT_RESOURCES
    assert "each host needs cpu 4, memory 16Gi; the best machine on a (a-m0) has cpu 2 and memory 8Gi" in u.message
    just_memory = refused(place_gang(GangRequest("s", 4, host_resources=HostResources(memory_bytes=16 * GiB)), machines))
    assert "needs memory 16Gi; the best machine on a (a-m0) has memory 8Gi allocatable" in just_memory.message


def test_a_node_advertising_no_cpu_takes_no_host_that_requests_cpu() -> None:
    # kube-scheduler's rule: an unadvertised resource is 0 allocatable; a request of 0 always fits.
    machines = island("a", 1, 4)
    assert placed(place_gang(GangRequest("s", 4), machines)).hosts[0].machine == "a-m0"
    u = refused(place_gang(GangRequest("s", 4, host_resources=HostResources(cpu_millis=100)), machines))
    assert u.reason is Reason.INSUFFICIENT_RESOURCES and "has cpu 0 allocatable" in u.message


def test_cpu_limits_how_many_hosts_share_a_machine() -> None:
    # One 8-device machine could hold two hosts of 4 by devices, but its 6 CPUs hold one host of 4 CPUs.
    machines = island("a", 2, 8, cpu=6_000)
    needs = HostResources(cpu_millis=4_000)
    p = placed(place_gang(GangRequest("s", 8, devices_per_host=4, host_resources=needs), machines))
    assert sorted(h.machine for h in p.hosts) == ["a-m0", "a-m1"]
    assert p.host_resources == needs
    u = refused(place_gang(GangRequest("s", 16, devices_per_host=4, host_resources=needs), machines))
    assert u.reason is Reason.INSUFFICIENT_RESOURCES
    assert "each host needs cpu 4; a holds at most 2 such hosts of 4 devices even when empty, and the slice needs 4" in u.message


def test_cpu_held_by_other_pods_makes_the_gang_wait_with_the_reason() -> None:
    # Devices are all free, but other pods hold 14 of the 16 CPUs of machine m0.
    machines = island("a", 2, 4, cpu=16_000, used_cpu=(14_000, 0))
    needs = HostResources(cpu_millis=4_000, memory_bytes=0)
    u = refused(place_gang(GangRequest("s", 8, host_resources=needs), machines))
    assert u.reason is Reason.INSUFFICIENT_DEVICES and u.retryable
    assert u.message == (
        "slice 's' needs 8 devices on one island (2 hosts of 4, each with cpu 4); "
        "best is a with 8 free but free cpu/memory for only 1 of 2 hosts"
    )
    assert placed(place_gang(GangRequest("s", 4, host_resources=needs), machines)).hosts[0].machine == "a-m1"


def test_reserve_counts_cpu_and_memory_of_every_host() -> None:
    machines = island("a", 1, 8, cpu=8_000, memory=8 * GiB)
    needs = HostResources(cpu_millis=3_000, memory_bytes=2 * GiB)
    p = placed(place_gang(GangRequest("s", 4, devices_per_host=2, host_resources=needs), machines))
    after = reserve(machines, p)
    assert (after[0].used_devices, after[0].used_cpu_millis, after[0].used_memory_bytes) == (4, 6_000, 4 * GiB)
    # 4 devices are still free, but only 2 CPUs: the next gang of the same shape waits.
    assert refused(place_gang(GangRequest("t", 2, host_resources=needs), after)).reason is Reason.INSUFFICIENT_DEVICES


def test_requests_of_zero_never_limit() -> None:
    machines = island("a", 1, 4, cpu=1, memory=1)
    assert Machine("m", "a", 4).room(2, HostResources()) == 2
    assert placed(place_gang(GangRequest("s", 4, host_resources=HostResources()), machines))


def test_negative_cpu_or_memory_in_an_inventory_is_an_error() -> None:
    with pytest.raises(ValueError, match="'m' on island 'a' has negative cpu or memory"):
        place_gang(GangRequest("s", 1), [Machine("m", "a", 4, used_cpu_millis=-1)])


@pytest.mark.parametrize(("millis", "text"), [(2000, "2"), (1500, "1500m"), (0, "0")])
def test_cpu_text(millis: int, text: str) -> None:
    assert cpu_text(millis) == text


@pytest.mark.parametrize(
    ("count", "text"), [(4 * GiB, "4Gi"), (1536 << 20, "1536Mi"), (10**9, "1G"), (1500, "1500"), (123, "123")]
)
def test_memory_text(count: int, text: str) -> None:
    assert memory_text(count) == text


def test_every_island_too_small_in_cpu_is_listed_after_what_a_host_needs() -> None:
    machines = island("a", 1, 4, cpu=16_000) + island("b", 1, 4, cpu=8_000) + island("c", 1, 2, cpu=64_000)
    u = refused(place_gang(GangRequest("hog", 4, devices_per_host=4, host_resources=HostResources(32_000)), machines))
    assert u.reason is Reason.INSUFFICIENT_RESOURCES
    assert u.message == (
        "slice 'hog' (4 devices) cannot fit on any island even when it is empty: each host needs cpu 32; "
        "the best machine on a (a-m0) has cpu 16 allocatable; the best machine on b (b-m0) has cpu 8 allocatable; "
        "c has 2 devices in all; lower the cpu/memory requests in spec.resources, or add bigger Nodes"
    )
