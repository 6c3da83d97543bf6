"""A program's driver pod is admitted with its slices: all of it runs, or none of it holds anything.

The test Nodes have 16 cpu each. A program whose driver asks for more stays queued with
no pod at all, its slices and its status naming the driver; lowered, it runs. A program
queued behind another for devices has no worker pod and no driver pod while it waits.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.cluster.builders import Manifest, inline_slice, program
from tests.cluster.harness import Objects, OperatorProcess, condition
from tests.cluster.test_checkpoints import FAULTY, PROGRAM_DONE_S

QUEUED_S = 60.0


def pod_names(objects: Objects) -> list[str]:
    return sorted(p.metadata.name for p in objects.pods(""))


def admitted_reason(objects: Objects, slice_name: str, reason: str) -> Manifest | None:
    """The slice's Admitted condition once it has ``reason``, else None."""
    found = objects.get("virtualslices", slice_name) or {}
    if not (found.get("status") or {}).get("conditions"):
        return None
    admitted = condition(found, "Admitted")
    return admitted if admitted["reason"] == reason else None


@pytest.mark.timeout(420, func_only=True)
def test_driver_no_node_can_hold_keeps_the_program_queued_until_its_request_is_lowered(
    objects: Objects, operator: OperatorProcess
) -> None:
    manifest = program("greedy", f"{FAULTY}:returns_results", inline_slice("main", 2), args={"results": {"x": 1.0}})
    manifest["spec"]["driver"] = {"resources": {"requests": {"cpu": "64"}}}
    objects.apply(manifest)

    admitted = objects.cluster.poll(lambda: admitted_reason(objects, "greedy-main", "InsufficientDriverResources"),
                                    timeout=QUEUED_S, interval=0.5, what="greedy-main waiting for its driver")
    ns = objects.namespace
    message = admitted["message"]
    assert f"the driver of PathwaysProgram {ns}/greedy requests cpu 64; the most a Node offers is " in message, message
    assert "no Node has that much allocatable: lower spec.driver.resources" in message, message

    def program_says_why() -> str | None:
        text = str((objects.program("greedy").get("status") or {}).get("message") or "")
        return text if f"the driver of PathwaysProgram {ns}/greedy requests cpu 64" in text else None

    objects.cluster.poll(program_says_why, timeout=QUEUED_S, interval=0.5, what="greedy's message naming its driver")
    assert objects.program("greedy")["status"]["phase"] == "Pending"
    assert pod_names(objects) == [], "a program whose driver fits nowhere holds no worker pod and no driver pod"

    objects.cluster.kubectl("patch", "pathwaysprograms", "greedy", "-n", ns, "--type=merge", "-p",
                            json.dumps({"spec": {"driver": {"resources": {"requests": {"cpu": "100m"}}}}}))
    done = objects.wait_program("greedy", {"Succeeded", "Failed"}, PROGRAM_DONE_S, operator)
    assert done["status"]["phase"] == "Succeeded", done["status"].get("message")
    driver: Any = objects.core.read_namespaced_pod("greedy-driver", ns)
    assert (driver.spec.scheduler_name, bool(driver.spec.node_name)) == ("pathways", True), (
        "the driver pod is bound by the operator to the Node admission chose")


@pytest.mark.timeout(600, func_only=True)
def test_program_queued_for_devices_has_no_worker_pod_and_no_driver_pod(
    objects: Objects, operator: OperatorProcess
) -> None:
    objects.apply(program("holder", f"{FAULTY}:sleeps", inline_slice("main", 8, island="island-a"),
                          args={"seconds": 600}))
    objects.wait_steps("holder", 1, PROGRAM_DONE_S, what="holder's driver running")
    objects.apply(program("queued", f"{FAULTY}:returns_results", inline_slice("main", 8, island="island-a"),
                          args={"results": {"x": 1.0}}))

    objects.cluster.poll(lambda: admitted_reason(objects, "queued-main", "InsufficientDevices"),
                         timeout=QUEUED_S, interval=0.5, what="queued-main waiting for devices")
    assert objects.program("holder")["status"]["phase"] == "Running", "checked while holder holds island-a"
    assert objects.pods("pathways.dev/slice=queued-main") == [], "a queued program holds no worker pod"
    assert "queued-driver" not in pod_names(objects), "a queued program holds no driver pod"
    assert objects.program("queued")["status"]["phase"] == "Pending"

    objects.delete("pathwaysprograms", "holder")
    done = objects.wait_program("queued", {"Succeeded", "Failed"}, PROGRAM_DONE_S, operator)
    assert done["status"]["phase"] == "Succeeded", done["status"].get("message")
