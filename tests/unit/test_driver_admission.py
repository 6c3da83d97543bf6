"""A program's driver is admitted with its slices: the whole group, driver included, or nothing."""

from __future__ import annotations

import dataclasses

from pathways_operator.core.admission import QueuedGang, admit
from pathways_operator.core.driver_placement import (
    DriverPlacement,
    DriverRequest,
    Node,
    NodeRoom,
    Taint,
    Toleration,
)
from pathways_operator.core.placement import HostResources, Machine
from pathways_operator.core.reasons import Reason

from .builders import gang, island

NOW = 10_000.0
GI = 1 << 30


def hosts_needing(queued: QueuedGang, cpu: int) -> QueuedGang:
    """``queued`` with each host requesting ``cpu`` millicores."""
    return dataclasses.replace(queued, request=dataclasses.replace(queued.request, host_resources=HostResources(cpu)))


def as_node(machine: Machine) -> Node:
    """A machine as the Node list sees it (the k8s inventory lists both from the same Nodes)."""
    return Node(machine.name, machine.schedulable, machine.allocatable_cpu_millis, machine.allocatable_memory_bytes,
                machine.used_cpu_millis, machine.used_memory_bytes, island=machine.island)


def driver(program: str, cpu: int, memory: int = 0, **more: object) -> DriverRequest:
    return DriverRequest(program, HostResources(cpu, memory), **more)  # type: ignore[arg-type]


def program_p(cpu: int = 1000) -> list[QueuedGang]:
    return [hosts_needing(gang("p-main", 4, at=1, group="p", size=2), cpu),
            hosts_needing(gang("p-aux", 4, at=1, group="p", size=2), cpu)]


def test_group_is_admitted_with_its_driver_on_a_node_without_devices() -> None:
    machines = island("a", 2, 4, cpu=4000, memory=8 * GI)
    nodes = [*map(as_node, machines), Node("cpu-0", allocatable_cpu_millis=2000, allocatable_memory_bytes=4 * GI)]
    r = admit(program_p(), machines, now=NOW, drivers={"p": driver("ns/p", 2000, GI)}, nodes=nodes)
    assert sorted(p.slice for p in r.admitted) == ["p-aux", "p-main"]
    assert r.waiting == []
    assert r.drivers == {"p": DriverPlacement("ns/p", "cpu-0", HostResources(2000, GI))}


def test_driver_bigger_than_any_node_admits_nothing_and_leaves_the_devices_to_others() -> None:
    machines = island("a", 2, 4, cpu=4000, memory=8 * GI)
    nodes = [*map(as_node, machines), Node("cpu-0", allocatable_cpu_millis=2000, allocatable_memory_bytes=4 * GI)]
    q = [*program_p(), gang("other", 8, at=2)]
    r = admit(q, machines, now=NOW, drivers={"p": driver("ns/p", 64_000, GI)}, nodes=nodes)
    assert [p.slice for p in r.admitted] == ["other"], "the devices the group would have taken go to the next gang"
    assert r.drivers == {}
    assert {w.slice: w.reason for w in r.waiting} == {
        "p-main": Reason.INSUFFICIENT_DRIVER_RESOURCES, "p-aux": Reason.INSUFFICIENT_DRIVER_RESOURCES,
    }
    message = next(w.message for w in r.waiting if w.slice == "p-main")
    assert message == (
        "slice 'p-main' holds no devices until its program's driver fits too: the driver of PathwaysProgram "
        "ns/p requests cpu 64, memory 1Gi; the most a Node offers is a-m0 with cpu 3, memory 8Gi free, and no "
        "Node has that much allocatable: lower spec.driver.resources, or add a bigger Node; admission group "
        "'p' (2 slices) is admitted with its driver, whole or not at all"
    )


def test_the_groups_own_hosts_count_as_used_on_the_machine_the_driver_would_share() -> None:
    machines = island("a", 1, 8, cpu=4000)
    nodes = [as_node(m) for m in machines]
    q = [hosts_needing(gang("p-main", 8, at=1, group="p"), 3000)]
    refused = admit(q, machines, now=NOW, drivers={"p": driver("ns/p", 2000)}, nodes=nodes)
    assert refused.admitted == []
    (why,) = refused.waiting
    assert why.reason is Reason.INSUFFICIENT_DRIVER_RESOURCES
    assert "the most a Node offers is a-m0 with cpu 1, memory 0 free; it is admitted once a Node has room" in why.message

    fits = admit(q, machines, now=NOW, drivers={"p": driver("ns/p", 1000)}, nodes=nodes)
    assert [p.slice for p in fits.admitted] == ["p-main"]
    assert fits.drivers["p"].node == "a-m0"


def test_a_driver_on_a_machine_keeps_its_cpu_from_hosts_admitted_after_it() -> None:
    machines = island("a", 1, 8, cpu=4000)
    q = [hosts_needing(gang("p-main", 4, at=1, group="p"), 1000), hosts_needing(gang("other", 4, at=2), 2000)]
    r = admit(q, machines, now=NOW, drivers={"p": driver("ns/p", 2000)}, nodes=[as_node(m) for m in machines])
    assert r.drivers["p"].node == "a-m0"
    assert [p.slice for p in r.admitted] == ["p-main"], "1 cpu is left on a-m0 once p's host and driver run"
    assert [(w.slice, w.reason) for w in r.waiting] == [("other", Reason.INSUFFICIENT_DEVICES)]


def test_hosts_are_not_moved_to_make_room_for_the_driver() -> None:
    # The host goes to a-m0 (equally free, first by name), leaving 2 cpu on each machine.
    # Had it gone to a-m1, a-m0 would keep 4 cpu for the driver; admission does not try that.
    roomy, small = island("a", 2, 8, cpu=4000)
    machines = [roomy, dataclasses.replace(small, allocatable_cpu_millis=2000)]
    q = [hosts_needing(gang("p-main", 8, at=1, group="p"), 2000)]
    r = admit(q, machines, now=NOW, drivers={"p": driver("ns/p", 3000)}, nodes=[as_node(m) for m in machines])
    assert r.admitted == []
    assert r.waiting[0].reason is Reason.INSUFFICIENT_DRIVER_RESOURCES


def test_two_programs_compete_for_the_last_cpu_and_the_second_holds_nothing() -> None:
    machines = island("a", 2, 4)  # devices for both programs, no cpu for a driver
    nodes = [*map(as_node, machines), Node("cpu-0", allocatable_cpu_millis=2000)]
    q = [gang("q-main", 4, at=2, group="q"), gang("p-main", 4, at=1, group="p")]
    drivers = {"p": driver("ns/p", 2000), "q": driver("ns/q", 2000)}
    r = admit(q, machines, now=NOW, drivers=drivers, nodes=nodes)
    assert [p.slice for p in r.admitted] == ["p-main"], "the older program is admitted whole"
    assert r.drivers == {"p": DriverPlacement("ns/p", "cpu-0", HostResources(2000))}
    (waiting,) = r.waiting
    assert (waiting.slice, waiting.reason) == ("q-main", Reason.INSUFFICIENT_DRIVER_RESOURCES)
    assert "the most a Node offers is a-m0 with cpu 0, memory 0 free; it is admitted once a Node has room" in (
        waiting.message)


def test_slices_without_a_group_are_admitted_without_any_driver() -> None:
    # A program made only of named (shared) slices has no admission group: its slices are
    # admitted on their own, and its driver is placed when it starts (NodeRoom.place).
    machines = island("a", 1, 4)
    r = admit([gang("shared", 4, at=1)], machines, now=NOW, drivers={"": driver("ns/p", 64_000)}, nodes=[])
    assert [p.slice for p in r.admitted] == ["shared"]
    assert r.drivers == {}


def test_driver_goes_to_the_best_fitting_node_then_by_name() -> None:
    nodes = [Node("c", allocatable_cpu_millis=2000), Node("b", allocatable_cpu_millis=1000),
             Node("a", allocatable_cpu_millis=1000), Node("d", allocatable_cpu_millis=8000)]
    placed = NodeRoom(nodes).place(driver("ns/p", 1000))
    assert isinstance(placed, DriverPlacement)
    assert placed.node == "a"


def test_driver_takes_only_selected_nodes_whose_repelling_taints_it_tolerates() -> None:
    nodes = [
        Node("big", allocatable_cpu_millis=8000),
        Node("gpu", allocatable_cpu_millis=8000, labels={"pool": "drivers"}, taints=(Taint("dedicated", "x"),)),
        Node("soft", allocatable_cpu_millis=8000, labels={"pool": "drivers"}, taints=(Taint("k", "", "PreferNoSchedule"),)),
        Node("cordoned", schedulable=False, allocatable_cpu_millis=8000, labels={"pool": "drivers"}),
    ]
    selected = driver("ns/p", 1000, node_selector={"pool": "drivers"})
    assert NodeRoom(nodes).place(selected) == DriverPlacement("ns/p", "soft", HostResources(1000))
    tolerant = dataclasses.replace(selected, tolerations=(Toleration("dedicated", "Equal", "x"),))
    assert NodeRoom(nodes[:2]).place(tolerant) == DriverPlacement("ns/p", "gpu", HostResources(1000))
    nowhere = NodeRoom(nodes[:2]).place(selected)
    assert nowhere == (
        "the driver of PathwaysProgram ns/p requests cpu 1, but no Node it may use is schedulable "
        "(nodeSelector: pool=drivers; every NoSchedule or NoExecute taint must be tolerated); change "
        "spec.driver.nodeSelector or spec.driver.tolerations, or add such a Node"
    )
