"""A Node whose machine dies: NotReady by node lifecycle, its pods evicted by the taint manager.

Two extra node agents serve one Node each of ``island-f``; a one-host slice is placed on
one of them, and that agent is SIGKILLed, as a machine dies: its containers die with it
and nobody renews the Node's Lease or status any more. Kubernetes alone then marks the
Node NotReady (Ready Unknown), taints it ``node.kubernetes.io/unreachable:NoExecute`` and,
once the pod's default toleration runs out, evicts the pod (``TaintManagerEviction``).
No kubelet will ever confirm that pod's end, so the operator deletes it at once and
places the gang again on the island's other Node.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from pathways_devcluster.node_agent import NodeSpec
from pathways_wire.kube_names import ISLAND_LABEL

from tests.cluster.builders import inline_slice, program, virtual_slice
from tests.cluster.harness import Objects, OperatorProcess

UNREACHABLE = "node.kubernetes.io/unreachable"
DRIVER_STEPS = 10


def ready_status(cluster: Any, node: str) -> str:
    conditions = cluster.core.read_node(node).status.conditions or []
    return next((c.status for c in conditions if c.type == "Ready"), "")


@pytest.mark.timeout(300, func_only=True)
def test_dead_node_goes_not_ready_its_pod_is_evicted_and_the_slice_re_placed(
    objects: Objects, operator: OperatorProcess
) -> None:
    agents = {name: objects.cluster.start_agent([NodeSpec(name, "island-f", 4)])
              for name in ("f-0", "f-1")}
    cluster = objects.cluster
    try:
        objects.apply(virtual_slice("survivor", 4, island="island-f"))
        first = objects.wait_slice("survivor", "Ready", 120, operator)["status"]
        (host,) = first["hosts"]
        dead, other = host["node"], ({"f-0", "f-1"} - {host["node"]}).pop()
        (pod,) = objects.pods("pathways.dev/slice=survivor")

        agents[dead].kill()
        last_renewal = cluster.coordination.read_namespaced_lease(dead, "kube-node-lease").spec.renew_time
        cluster.poll(lambda: ready_status(cluster, dead) == "Unknown", timeout=90, interval=0.5,
                     what=f"Node {dead} NotReady (Ready Unknown) once its agent died")
        not_ready = time.monotonic()
        lease = cluster.coordination.read_namespaced_lease(dead, "kube-node-lease")
        assert lease.spec.renew_time == last_renewal, "nobody renews a dead Node's Lease"

        def tainted() -> bool:
            taints = cluster.core.read_node(dead).spec.taints or []
            return any(t.key == UNREACHABLE and t.effect == "NoExecute" for t in taints)

        cluster.poll(tainted, timeout=60, interval=0.5,
                     what=f"Node {dead} tainted {UNREACHABLE}:NoExecute by node lifecycle")

        objects.wait_event(pod.metadata.name, "TaintManagerEviction", timeout=90)

        def re_placed() -> Any:
            status = objects.slice("survivor").get("status") or {}
            hosts = status.get("hosts") or []
            moved = status.get("phase") == "Ready" and [h["node"] for h in hosts] == [other]
            return status if moved else None

        moved = cluster.poll(re_placed, timeout=120, interval=0.5,
                             what=f"slice 'survivor' Ready again on {other}")
        re_placed_at = time.monotonic()
        assert moved["restarts"] == 1, moved
        assert moved["island"] == "island-f", moved
        left = [p.metadata.name for p in objects.pods("pathways.dev/slice=survivor")
                if p.spec.node_name == dead]
        assert not left, f"pods still bound to the dead Node {dead}: {left}"
        print(f"\nnode {dead} died: NotReady -> slice re-placed on {other} in "
              f"{re_placed_at - not_ready:.1f} s")
    finally:
        for agent in agents.values():
            agent.stop()


@pytest.mark.timeout(400, func_only=True)
def test_a_driver_pod_on_a_dead_node_is_removed_and_the_run_starts_again_on_another(
    objects: Objects, operator: OperatorProcess
) -> None:
    """The taint manager evicts the driver pod of a dead Node, but no kubelet confirms its end:
    the operator removes it at once (grace 0), as it does a gang's, so the program's next
    driver pod, of the same name, can be created on a live Node."""
    agents = {name: objects.cluster.start_agent([NodeSpec(name, "island-g", 4)]) for name in ("g-0", "g-1")}
    cluster = objects.cluster
    try:
        manifest = program("stranded", "examples.programs:paper_example", inline_slice("main", 4, island="island-a"),
                           steps=DRIVER_STEPS, args={"step_seconds": 0.5})
        manifest["spec"]["driver"] = {"nodeSelector": {ISLAND_LABEL: "island-g"}}
        objects.apply(manifest)
        objects.wait_steps("stranded", 2, 120, what="program 'stranded' mid-run")
        first = cluster.core.read_namespaced_pod("stranded-driver", objects.namespace)
        dead = first.spec.node_name
        assert dead in agents, f"the driver pod went to {dead}, not to an island-g Node"
        other = ({"g-0", "g-1"} - {dead}).pop()

        agents[dead].kill()
        objects.wait_event("stranded-driver", "TaintManagerEviction", timeout=120)

        done = objects.wait_program("stranded", {"Succeeded", "Failed"}, 240, operator)
        assert done["status"]["phase"] == "Succeeded", done["status"].get("message")
        assert done["status"]["restarts"] == 1, "the run lost with its Node counts as a lost run"
        assert done["status"]["stepsCompleted"] == DRIVER_STEPS
        second = cluster.core.read_namespaced_pod("stranded-driver", objects.namespace)
        assert second.metadata.uid != first.metadata.uid
        assert second.spec.node_name == other, f"the next driver pod went to {second.spec.node_name}"
        lost = objects.wait_event("stranded", "HostLost")
        assert f"stranded-driver was lost with its Node {dead}" in lost.message, lost.message
    finally:
        for agent in agents.values():
            agent.stop()


def test_a_slice_waiting_for_its_island_is_admitted_when_a_node_of_it_joins(
    objects: Objects, operator: OperatorProcess
) -> None:
    objects.apply(virtual_slice("late", 4, island="island-j"))

    def no_island() -> Any:
        found = objects.slice("late")
        admitted = [c for c in (found.get("status") or {}).get("conditions") or [] if c["type"] == "Admitted"]
        return found if admitted and admitted[0]["reason"] == "NoIsland" else None

    waiting = objects.cluster.poll(no_island, timeout=60, interval=0.5, what="slice 'late' Pending, NoIsland")
    assert waiting["status"]["phase"] == "Pending"
    with objects.cluster.start_agent([NodeSpec("j-0", "island-j", 4)]):
        ready = objects.wait_slice("late", "Ready", 120, operator)["status"]
        assert [h["node"] for h in ready["hosts"]] == ["j-0"] and ready["island"] == "island-j"
        log = operator.log_tail(200_000)
        assert "Node j-0 joined with what admission reads of it: every slice and program looks again" in log \
            or "Node j-0 changed in what admission reads of it: every slice and program looks again" in log, (
                "the Node's arrival woke the waiting slice")
        objects.delete("virtualslices", "late")
