"""Control-plane faults under a running program: the operator rides them out.

* The operator is killed twice: once while a program's inline gang is launching (pods
  being created and bound), once mid-program. Afterwards the gang has exactly one pod
  per host (none duplicated, none orphaned: every pod of the slice is owned by it), the
  program finishes with the fault-free results and each step is counted once.
* The API server is restarted mid-program (down for a few seconds): the operator's
  watches and the driver reconnect, and the program finishes.
* The Node under a Ready slice is deleted (its node agent stops: the Node object and the
  pods' processes go): the gang is torn down at once (its pods force-deleted, since no
  kubelet is left to confirm), the slice waits with a reason naming the devices it needs
  while the other islands are full, and is re-placed on another island once one has room.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.cluster.builders import inline_slice, program, virtual_slice
from tests.cluster.harness import Objects, OperatorProcess, condition
from pathways_devcluster.node_agent import NodeSpec

PROGRAM_DONE_S = 180.0


def _results(objects: Objects, done: dict[str, object]) -> dict[str, object]:
    where = done["status"]["results"]  # type: ignore[index]
    return {k: json.loads(v) for k, v in objects.configmap(where["configMap"]).items()}


def _one_pod_per_host(objects: Objects, slice_name: str, hosts: int) -> None:
    pods = [p for p in objects.pods(f"pathways.dev/slice={slice_name}") if not p.metadata.deletion_timestamp]
    names = sorted(p.metadata.name for p in pods)
    assert len(names) == hosts == len(set(names)), f"slice {slice_name}: pods {names}, expected {hosts}"
    owners = {ref.kind for p in pods for ref in p.metadata.owner_references or []}
    assert owners == {"VirtualSlice"}, f"pods of {slice_name} are owned by {owners}"


def _each_step_recorded_once(operator: OperatorProcess, namespace: str, name: str, steps: int) -> None:
    """The driver's progress file (one JSON line per finished step) names each step once."""
    files = list(operator.state_dir.rglob(f"{namespace}/{name}-*/progress.jsonl"))
    assert len(files) == 1, f"progress files of {namespace}/{name}: {files}"
    recorded = [json.loads(line)["step"] for line in files[0].read_text().splitlines() if line.strip()]
    assert recorded == list(range(steps)), f"{files[0]}: steps recorded {recorded}"


@pytest.mark.timeout(300, func_only=True)
def test_operator_killed_during_gang_launch_and_mid_program(objects: Objects, operator: OperatorProcess) -> None:
    objects.apply(program("twice", "examples.programs:paper_example", inline_slice("main", 8),
                          steps=8, args={"step_seconds": 0.5}))

    def launching() -> bool:
        return bool(objects.pods("pathways.dev/slice=twice-main"))

    objects.cluster.poll(launching, timeout=60, interval=0.1, what="the gang's first pod")
    operator.restart(kill=True)  # mid-launch: some pods may exist, none ready

    objects.wait_steps("twice", 2, PROGRAM_DONE_S, what="program mid-run")
    _one_pod_per_host(objects, "twice-main", 2)
    pods_before = objects.pod_uids("pathways.dev/slice=twice-main")
    operator.restart(kill=True)
    done = objects.wait_program("twice", {"Succeeded", "Failed"}, PROGRAM_DONE_S, operator)
    assert done["status"]["phase"] == "Succeeded", done["status"].get("message")
    assert done["status"]["stepsCompleted"] == 8, "each step counted once"
    _each_step_recorded_once(operator, objects.namespace, "twice", 8)
    after = set(objects.pod_uids("pathways.dev/slice=twice-main").values())
    assert after <= set(pods_before.values()), "no pod created after the second restart"
    assert _results(objects, done)["y"] == [2.0 * i + 1 for i in range(1, 9)]


@pytest.mark.timeout(300, func_only=True)
def test_api_server_restart_mid_program(objects: Objects, operator: OperatorProcess) -> None:
    objects.apply(program("outage", "examples.programs:paper_example", inline_slice("main", 4),
                          steps=10, args={"step_seconds": 0.5}))

    objects.wait_steps("outage", 2, PROGRAM_DONE_S, what="program mid-run")
    down = time.monotonic()
    objects.cluster.control_plane.restart("kube-apiserver", down_seconds=3.0)
    print(f"\nkube-apiserver back after {time.monotonic() - down:.1f} s")
    done = objects.wait_program("outage", {"Succeeded", "Failed"}, PROGRAM_DONE_S, operator)
    assert done["status"]["phase"] == "Succeeded", done["status"].get("message")
    assert done["status"]["stepsCompleted"] == 10
    _each_step_recorded_once(operator, objects.namespace, "outage", 10)
    assert operator.alive(), "the operator rode out the outage without exiting"
    print(f"program finished {time.monotonic() - down:.1f} s after the API server went down")


@pytest.mark.timeout(300, func_only=True)
def test_node_deleted_under_a_ready_slice(objects: Objects, operator: OperatorProcess) -> None:
    agent = objects.cluster.start_agent([NodeSpec("z-0", "island-z", 4)])
    try:
        for filler in ("fill-1", "fill-2"):  # an 8-device gang fills island-a or island-b
            objects.apply(virtual_slice(filler, 8))
            objects.wait_slice(filler, "Ready", 120, operator)
        objects.apply(virtual_slice("moving", 4))
        ready = objects.wait_slice("moving", "Ready", 120, operator)
        assert ready["status"]["island"] == "island-z", ready["status"]
    finally:
        deleted = time.monotonic()
        agent.stop()  # the Node goes, and the processes of its pods with it

    def waiting() -> bool:
        status = objects.slice("moving").get("status") or {}
        admitted = [c for c in status.get("conditions") or [] if c["type"] == "Admitted"]
        return (
            status.get("restarts") == 1 and status.get("phase") in ("Pending", "Recovering")
            and bool(admitted) and admitted[0]["status"] == "False" and "4 devices" in admitted[0]["message"]
        )

    objects.cluster.poll(waiting, timeout=90, interval=0.5, what="slice 'moving' waiting for room")
    assert not objects.pods("pathways.dev/slice=moving"), "pods on the deleted Node are gone"
    reason = condition(objects.slice("moving"), "Admitted")
    print(f"\nnode deleted: slice waits: {reason['reason']}: {reason['message']}")
    objects.delete("virtualslices", "fill-1")
    moved = objects.wait_slice("moving", "Ready", 120, operator)["status"]
    assert moved["island"] in ("island-a", "island-b") and moved["restarts"] == 1, moved
    print(f"node deleted: slice Ready on {moved['island']} {time.monotonic() - deleted:.1f} s later")
