"""The free-capacity index decides exactly as the scan does, on many random clusters and queues."""

from __future__ import annotations

import random

import pytest

from pathways_operator.core.admission import QueuedGang, admit, admit_on
from pathways_operator.core.free_capacity import CapacityIndex
from pathways_operator.core.placement import (
    GangRequest,
    HostResources,
    Machine,
    MachineScan,
    Placement,
    Unplaceable,
    place_gang,
    reserve,
)

from .builders import island

CLUSTERS = 400
"""Random clusters per property; each test stays well under a second."""

GiB = 1 << 30


def random_machines(rng: random.Random) -> list[Machine]:
    machines = []
    for i in range(rng.randint(1, 4)):
        for j in range(rng.randint(1, 10)):
            devices = rng.choice((0, 1, 2, 4, 4, 8))
            cpu = rng.choice((0, 4_000, 8_000, 16_000))
            memory = rng.choice((0, 8 * GiB, 32 * GiB))
            machines.append(Machine(
                name=f"i{i}-m{j:02d}",
                island=f"island-{i}",
                allocatable_devices=devices,
                used_devices=rng.choice((0, 0, devices // 2, devices, devices + 1)),
                schedulable=rng.random() > 0.1,
                allocatable_cpu_millis=cpu,
                allocatable_memory_bytes=memory,
                used_cpu_millis=rng.choice((0, 0, cpu // 2, cpu)),
                used_memory_bytes=rng.choice((0, 0, memory // 4, memory)),
            ))
    rng.shuffle(machines)
    return machines


def random_request(rng: random.Random, name: str) -> GangRequest:
    return GangRequest(
        name,
        devices=rng.choice((1, 2, 4, 4, 8, 8, 12, 16, 32)) if rng.random() > 0.05 else rng.choice((0, 3, 6)),
        devices_per_host=rng.choice((None, None, None, None, 1, 2, 4, 4, 8)) if rng.random() > 0.05 else rng.choice((0, 3)),
        island=rng.choice((None, None, None, "island-0", "island-1", "island-9")),
        host_resources=rng.choice((
            HostResources(), HostResources(), HostResources(1_000), HostResources(3_000, 4 * GiB),
            HostResources(0, 16 * GiB), HostResources(20_000),
        )),
    )


def random_queue(rng: random.Random) -> list[QueuedGang]:
    queue = []
    for k in range(rng.randint(1, 12)):
        group = rng.choice(("", "", "", "g0", "g1"))
        queue.append(QueuedGang(
            random_request(rng, f"s{k}"),
            priority=rng.choice((0, 0, 1)),
            queued_at=float(rng.randint(0, 1_000)),
            group=group,
            group_size=rng.randint(1, 3) if group else 1,
        ))
    return queue


@pytest.mark.parametrize("seed", range(4))
def test_index_places_each_gang_as_the_scan_does(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(CLUSTERS):
        machines = random_machines(rng)
        index = CapacityIndex(machines)
        islands = sorted({m.island for m in machines})
        for k in range(8):
            request = random_request(rng, f"s{k}")
            excluding = set(rng.sample(islands, rng.randint(0, len(islands)))) if rng.random() < 0.3 else set()
            expected = place_gang(request, [m for m in machines if m.island not in excluding])
            assert index.place(request, excluding=excluding) == expected, (machines, request, excluding)


@pytest.mark.parametrize("seed", range(4))
def test_index_reserves_and_restores_as_the_scan_counts(seed: int) -> None:
    rng = random.Random(100 + seed)
    for _ in range(CLUSTERS):
        machines = random_machines(rng)
        index = CapacityIndex(machines)
        scanned = list(machines)
        previous = []
        for k in range(6):
            outcome = place_gang(random_request(rng, f"s{k}"), scanned)
            if isinstance(outcome, Placement):
                scanned = reserve(scanned, outcome)
                previous.extend(index.reserve(outcome))
            assert index.machines() == scanned
            request = random_request(rng, f"probe{k}")
            assert index.place(request) == place_gang(request, scanned)
        index.restore(previous)
        assert index.machines() == machines
        request = random_request(rng, "after-restore")
        assert index.place(request) == place_gang(request, machines)


@pytest.mark.parametrize("seed", range(4))
def test_admission_with_the_index_decides_as_admission_by_scan_does(seed: int) -> None:
    rng = random.Random(200 + seed)
    for _ in range(CLUSTERS // 2):
        machines = random_machines(rng)
        queue = random_queue(rng)
        now = float(rng.choice((0, 500, 2_000)))
        holding = {"g1": 1} if rng.random() < 0.3 else None
        expected = admit_on(MachineScan(machines), queue, now=now, reserve_after=300.0, holding=holding)
        assert admit(queue, machines, now=now, reserve_after=300.0, holding=holding) == expected


def test_a_fit_remembered_for_a_gang_shape_is_forgotten_once_the_island_changes() -> None:
    index = CapacityIndex(island("a", 1, 4))
    first = index.place(GangRequest("s1", 4))
    assert isinstance(first, Placement)
    taken = index.reserve(first)
    refused = index.place(GangRequest("s2", 4))
    assert isinstance(refused, Unplaceable) and refused.message.startswith("slice 's2' needs 4 devices")
    again = index.place(GangRequest("s3", 4))  # the same shape: judged from what the island remembers
    assert isinstance(again, Unplaceable) and again.message.startswith("slice 's3' needs 4 devices")
    index.restore(taken)
    freed = index.place(GangRequest("s2", 4))
    assert isinstance(freed, Placement) and freed.slice == "s2"


def test_a_placement_naming_a_machine_the_index_lacks_is_refused() -> None:
    index = CapacityIndex(island("a", 1, 4))
    elsewhere = place_gang(GangRequest("s", 4), island("b", 1, 4))
    assert isinstance(elsewhere, Placement)
    with pytest.raises(ValueError, match="names machine 'b-m0', which this inventory does not have"):
        index.reserve(elsewhere)


def test_index_refuses_an_inventory_the_scan_refuses() -> None:
    with pytest.raises(ValueError, match="listed twice"):
        CapacityIndex(island("a", 1, 4) + island("a", 1, 4))
