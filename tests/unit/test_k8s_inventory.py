"""Machines and devices in use from listed Nodes and pods (``k8s/inventory.py``)."""

from __future__ import annotations

import dataclasses

from pathways_operator.core.driver_placement import DriverPlacement, Node, Taint
from pathways_operator.core.placement import HostResources, Machine
from pathways_operator.k8s.gang_pods import PodView
from pathways_operator.k8s.inventory import Reservation, ReservationLedger, in_use, machines, nodes, unreachable
from pathways_wire.kube_names import ISLAND_LABEL
from tests.unit.k8s_builders import node, placement, pod

NODES = [node("a-0", "island-a", 4), node("a-1", "island-a", 4), node("b-0", "island-b", 8)]


def views(*pods: dict[str, object]) -> list[PodView]:
    return [PodView.from_manifest(p) for p in pods]


def test_only_labelled_nodes_with_devices_are_machines() -> None:
    listed = [*NODES, node("plain", None, 4), node("empty", "island-a", 0), node("junk", "island-a", "lots")]
    assert [m.name for m in machines(listed, [], [])] == ["a-0", "a-1", "b-0"]


def test_not_ready_and_cordoned_nodes_are_unschedulable() -> None:
    found = machines([node("a-0", "island-a", 4, ready=False), node("a-1", "island-a", 4, cordoned=True)], [], [])
    assert [m.schedulable for m in found] == [False, False]


def test_only_the_node_lifecycle_no_execute_taint_marks_a_node_unreachable() -> None:
    def tainted(*taints: tuple[str, str]) -> dict[str, object]:
        found = node("a-0", "island-a", 4, ready=False)
        found["spec"] = {"taints": [{"key": key, "effect": effect} for key, effect in taints]}
        return found

    assert unreachable(tainted(("node.kubernetes.io/unreachable", "NoExecute")))
    assert not unreachable(tainted(("node.kubernetes.io/unreachable", "NoSchedule")))
    assert not unreachable(tainted(("node.kubernetes.io/not-ready", "NoExecute")))
    assert not unreachable(node("a-0", "island-a", 4))


def test_live_bound_pods_hold_devices_finished_and_unbound_ones_do_not() -> None:
    pods = views(
        pod("any", node="a-0", devices=3),                        # not ours: still counts
        pod("gone", node="a-0", devices=4, phase="Succeeded"),
        pod("failed", node="a-1", devices=4, phase="Failed"),
        pod("unbound", devices=4, phase="Pending"),
        pod("ending", node="b-0", devices=2, deleting=True),     # terminating: still holds
    )
    used = {m.name: m.used_devices for m in machines(NODES, pods, [])}
    assert used == {"a-0": 3, "a-1": 0, "b-0": 2}


def test_reservations_count_the_hosts_whose_pod_does_not_exist_yet() -> None:
    gang = Reservation("ns", "train", 1, placement("train", "island-a", ("a-0", 4), ("a-1", 4)))
    host0 = pod("train-0", node="a-0", devices=4, slice_="train", host_index=0, generation=1)
    used = {m.name: m.used_devices for m in machines(NODES, views(host0), [gang])}
    assert used == {"a-0": 4, "a-1": 4, "b-0": 0}, "host 0 counted once, host 1 promised"
    stale = pod("train-0", node="a-0", devices=4, slice_="train", host_index=0, generation=0)
    used = {m.name: m.used_devices for m in machines(NODES, views(stale), [gang])}
    assert used["a-0"] == 8, "a pod of an older generation is not the reserved host"


def test_machine_fields() -> None:
    assert machines([node("b-0", "island-b", 8)], [], []) == [Machine("b-0", "island-b", 8, 0, True)]


def test_ledger_keeps_the_first_adopted_reservation() -> None:
    ledger = ReservationLedger()
    first = Reservation("ns", "s", 1, placement("s", "island-a", ("a-0", 4)))
    second = Reservation("ns", "s", 2, placement("s", "island-b", ("b-0", 4)))
    assert ledger.adopt(first) is first and ledger.adopt(second) is first
    ledger.reserve(second)
    assert ledger.get("ns/s") is second and ledger.all() == [second]
    assert ledger.release("ns/s") is second and ledger.get("ns/s") is None


def test_cpu_and_memory_are_allocatable_minus_requests_of_live_pods_and_promised_hosts() -> None:
    nodes = [node("a-0", "island-a", 4, cpu="16", memory="64Gi"), node("a-1", "island-a", 4, cpu="15500m")]
    gang = Reservation("ns", "train", 1, dataclasses.replace(
        placement("train", "island-a", ("a-0", 4), ("a-1", 4)), host_resources=HostResources(2000, 1 << 30)))
    pods = views(
        pod("other", node="a-0", requests={"cpu": "1500m", "memory": "512Mi"}),  # not ours: still counts
        pod("done", node="a-0", phase="Succeeded", requests={"cpu": "8"}),
        pod("train-0", node="a-0", devices=4, slice_="train", host_index=0, generation=1,
            requests={"cpu": "2", "memory": "1Gi"}),
    )
    found = {m.name: m for m in machines(nodes, pods, [gang])}
    assert (found["a-0"].allocatable_cpu_millis, found["a-0"].allocatable_memory_bytes) == (16_000, 64 << 30)
    assert (found["a-0"].used_cpu_millis, found["a-0"].used_memory_bytes) == (3_500, (512 << 20) + (1 << 30))
    assert (found["a-1"].allocatable_cpu_millis, found["a-1"].allocatable_memory_bytes) == (15_500, 0)
    assert (found["a-1"].used_cpu_millis, found["a-1"].used_memory_bytes) == (2_000, 1 << 30), "host 1 promised"


def test_unreadable_node_quantities_count_as_nothing_allocatable() -> None:
    [found] = machines([node("a-0", "island-a", 4, cpu="lots", memory="-1Gi")], [], [])
    assert (found.allocatable_cpu_millis, found.allocatable_memory_bytes) == (0, 0)


def test_every_node_is_listed_for_drivers_with_its_cpu_memory_labels_and_taints() -> None:
    plain = node("plain", None, 0, cpu="2", memory="4Gi")
    plain["metadata"]["labels"] = {"pool": "drivers"}
    plain["spec"] = {"taints": [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]}
    listed = [node("a-0", "island-a", 4, cpu="8", memory="16Gi"), plain]
    worker = pod("w", node="a-0", devices=4, requests={"cpu": "3", "memory": "1Gi"})
    found = nodes(listed, in_use(views(worker), [], []))
    assert found == [
        Node("a-0", True, 8000, 16 << 30, 3000, 1 << 30, labels={ISLAND_LABEL: "island-a"},
             island="island-a"),
        Node("plain", True, 2000, 4 << 30, labels={"pool": "drivers"}, taints=(Taint("dedicated", "x", "NoSchedule"),)),
    ]


def test_an_admitted_driver_holds_its_node_until_its_pod_is_bound_there() -> None:
    listed = [node("a-0", "island-a", 4, cpu="8"), node("plain", None, 0, cpu="2")]
    driver = DriverPlacement("ns/train", "a-0", HostResources(2000))
    assert [n.used_cpu_millis for n in nodes(listed, in_use([], [], [driver]))] == [2000, 0]
    assert machines(listed, [], [], [driver])[0].used_cpu_millis == 2000, "a machine's cpu is the Node's"
    unbound = pod("train-driver", requests={"cpu": "2"}, phase="Pending")
    assert [n.used_cpu_millis for n in nodes(listed, in_use(views(unbound), [], [driver]))] == [2000, 0]
    bound = pod("train-driver", node="a-0", requests={"cpu": "2"})
    assert [n.used_cpu_millis for n in nodes(listed, in_use(views(bound), [], [driver]))] == [2000, 0], "counted once"
    elsewhere = pod("train-driver", namespace="other", node="plain", requests={"cpu": "2"})
    assert [n.used_cpu_millis for n in nodes(listed, in_use(views(elsewhere), [], [driver]))] == [2000, 2000]
