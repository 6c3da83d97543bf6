"""The preemption decision: who is evicted so that a gang of higher priority fits."""

from __future__ import annotations

from pathways_operator.core.placement import GangRequest, HostAssignment, HostResources, Machine, Placement
from pathways_operator.core.preemption import RunningGang, choose_victims


def island(name: str, used: dict[str, int]) -> list[Machine]:
    """Two 4-device machines ``<name>-0``, ``<name>-1`` with the given devices in use."""
    return [Machine(f"{name}-{i}", name, 4, used.get(f"{name}-{i}", 0)) for i in range(2)]


def gang(key: str, priority: int, *hosts: tuple[str, int], island_name: str = "a", at: float = 0.0) -> RunningGang:
    placement = Placement(key, island_name, tuple(HostAssignment(i, m, d) for i, (m, d) in enumerate(hosts)))
    return RunningGang(placement, priority, at)


def test_a_higher_priority_gang_evicts_the_lowest_priority_gang_it_needs() -> None:
    machines = island("a", {"a-0": 4, "a-1": 4})
    running = [gang("ns/low", 1, ("a-0", 4)), gang("ns/mid", 5, ("a-1", 4))]
    plan = choose_victims(GangRequest("ns/urgent", 4, 4), 10, running, machines)
    assert plan is not None
    assert plan.victims == ("ns/low",)
    assert plan.placement.hosts[0].machine == "a-0"


def test_a_whole_island_gang_evicts_every_lower_gang_there() -> None:
    machines = island("a", {"a-0": 4, "a-1": 4})
    running = [gang("ns/low", 1, ("a-0", 4)), gang("ns/mid", 5, ("a-1", 4))]
    plan = choose_victims(GangRequest("ns/urgent", 8, 4), 10, running, machines)
    assert plan is not None and sorted(plan.victims) == ["ns/low", "ns/mid"]


def test_equal_or_lower_priority_never_preempts() -> None:
    machines = island("a", {"a-0": 4, "a-1": 4})
    running = [gang("ns/one", 5, ("a-0", 4)), gang("ns/two", 5, ("a-1", 4))]
    assert choose_victims(GangRequest("ns/peer", 4, 4), 5, running, machines) is None
    assert choose_victims(GangRequest("ns/lesser", 4, 4), 1, running, machines) is None


def test_no_plan_when_even_evicting_every_lower_gang_is_not_enough() -> None:
    machines = island("a", {"a-0": 4, "a-1": 4})
    running = [gang("ns/low", 1, ("a-0", 4)), gang("ns/high", 50, ("a-1", 4))]
    assert choose_victims(GangRequest("ns/urgent", 8, 4), 10, running, machines) is None


def test_victims_that_are_not_needed_are_given_back() -> None:
    # newest low gang is tried first but only the 4-device gang frees a whole host
    machines = island("a", {"a-0": 4, "a-1": 4})
    running = [
        gang("ns/big", 1, ("a-0", 4), at=1.0),
        gang("ns/small1", 1, ("a-1", 2), at=2.0),
        gang("ns/small2", 1, ("a-1", 2), at=3.0),
    ]
    plan = choose_victims(GangRequest("ns/urgent", 4, 4), 10, running, machines)
    assert plan is not None
    assert len(plan.victims) in (1, 2)
    freed = {"ns/big": 4, "ns/small1": 2, "ns/small2": 2}
    assert sum(freed[v] for v in plan.victims) == 4


def test_the_island_with_the_cheapest_victims_wins_and_pins_are_respected() -> None:
    machines = island("a", {"a-0": 4, "a-1": 4}) + island("b", {"b-0": 4, "b-1": 4})
    running = [
        gang("ns/a-low", 3, ("a-0", 4), ("a-1", 4)),
        gang("ns/b-lower", 1, ("b-0", 4), ("b-1", 4), island_name="b"),
    ]
    plan = choose_victims(GangRequest("ns/urgent", 8, 4), 10, running, machines)
    assert plan is not None and (plan.island, plan.victims) == ("b", ("ns/b-lower",))
    pinned = choose_victims(GangRequest("ns/urgent", 8, 4, island="a"), 10, running, machines)
    assert pinned is not None and (pinned.island, pinned.victims) == ("a", ("ns/a-low",))


def test_evicting_a_gang_frees_its_cpu_too() -> None:
    # a-1 has free devices but its CPUs are held by a pod no gang owns; a-0's devices and
    # CPUs are the low gang's, so only evicting it (devices and CPU) makes room.
    needs = HostResources(cpu_millis=4_000)
    machines = [
        Machine("a-0", "a", 4, 4, allocatable_cpu_millis=4_000, used_cpu_millis=4_000),
        Machine("a-1", "a", 4, 0, allocatable_cpu_millis=4_000, used_cpu_millis=4_000),
    ]
    low = RunningGang(Placement("ns/low", "a", (HostAssignment(0, "a-0", 4),), needs), 1)
    plan = choose_victims(GangRequest("ns/urgent", 4, 4, host_resources=needs), 10, [low], machines)
    assert plan is not None
    assert plan.victims == ("ns/low",)
    assert plan.placement.hosts[0].machine == "a-0" and plan.placement.host_resources == needs
