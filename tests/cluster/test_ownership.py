"""The operator acts only on objects it controls, and only on what it observes.

A Secret named like a slice's token Secret, made by a user before the slice, is
neither adopted nor deleted: the slice waits (``Admitted=False, ObjectNotOwned``),
naming it, and deleting the slice leaves it. Pods that bear a slice's label but are
not controlled by it (no ownerReference, or one that is not ``controller: true``) are
never counted, torn down or deleted with the slice; a pod that took a host pod's name
makes the slice wait, holding no devices, until it is gone.

Status is the operator's report, not its memory: a ``status.phase: Failed``,
``restarts`` and ``hosts`` forged through the status subresource on a Ready slice
change nothing (not even across an operator restart): the same pods keep running, the
report is rewritten from what is observed, and a program still runs on the slice.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
from kubernetes import client

from tests.cluster.builders import GROUP, VERSION, program, ref_slice, virtual_slice
from tests.cluster.harness import Objects, OperatorProcess, condition

SLICE_READY_S = 120.0
PROGRAM_DONE_S = 180.0


def _idle_pod(name: str, labels: dict[str, str], owners: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A pod no scheduler binds (it holds no devices and never runs)."""
    metadata: dict[str, Any] = {"name": name, "labels": labels}
    if owners:
        metadata["ownerReferences"] = owners
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "schedulerName": "nobody",
            "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "3600"]}],
        },
    }


def _pod_exists(objects: Objects, name: str) -> bool:
    try:
        objects.core.read_namespaced_pod(name, objects.namespace)
    except client.ApiException as e:
        if e.status == 404:
            return False
        raise
    return True


def _remove_pods(objects: Objects, *names: str) -> None:
    for name in names:
        try:
            objects.core.delete_namespaced_pod(name, objects.namespace, grace_period_seconds=0)
        except client.ApiException as e:
            if e.status != 404:
                raise


def _refused(objects: Objects, slice_name: str, words: str) -> dict[str, Any]:
    def waiting() -> dict[str, Any] | None:
        found = objects.get("virtualslices", slice_name) or {}
        status = found.get("status") or {}
        if status.get("phase") != "Pending" or not status.get("conditions"):
            return None
        admitted = condition(found, "Admitted")
        return found if admitted["reason"] == "ObjectNotOwned" and words in admitted["message"] else None

    found: dict[str, Any] = objects.cluster.poll(
        waiting, timeout=60, interval=0.5, what=f"{slice_name} Pending, ObjectNotOwned: {words!r}"
    )
    return found


def _operator_looked_again(objects: Objects, slice_name: str) -> None:
    """Forge a harmless status field and wait until the operator rewrote it: one full look happened."""
    objects.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, objects.namespace, "virtualslices", slice_name, {"status": {"readyHosts": "forged"}}
    )
    objects.cluster.poll(
        lambda: objects.slice(slice_name)["status"].get("readyHosts") != "forged",
        timeout=30, interval=0.25, what=f"operator rewrote the status of {slice_name}",
    )


@pytest.mark.timeout(300, func_only=True)
def test_users_secret_of_the_token_name_is_neither_adopted_nor_deleted(
    objects: Objects, operator: OperatorProcess
) -> None:
    secret = client.V1Secret(
        metadata=client.V1ObjectMeta(name="taken-pathways-token"), string_data={"token": "the user's own"}
    )
    objects.core.create_namespaced_secret(objects.namespace, secret)
    objects.apply(virtual_slice("taken", 2))

    found = _refused(objects, "taken", f"Secret {objects.namespace}/taken-pathways-token exists and is not "
                                       "this VirtualSlice's (no controller)")
    message = condition(found, "Admitted")["message"]
    assert "delete or rename that Secret, or give the VirtualSlice another name" in message
    assert found["status"]["island"] == "" and found["status"]["hosts"] == []
    assert objects.pods("pathways.dev/slice=taken") == [], "a refused slice holds no pods"
    assert objects.wait_event("taken", "ObjectNotOwned").type == "Warning"

    objects.delete("virtualslices", "taken")
    objects.cluster.poll(lambda: objects.get("virtualslices", "taken") is None, timeout=60, interval=0.5,
                         what="VirtualSlice taken deleted")
    kept = objects.core.read_namespaced_secret("taken-pathways-token", objects.namespace)
    assert base64.b64decode(kept.data["token"]).decode() == "the user's own"
    assert not kept.metadata.owner_references


@pytest.mark.timeout(300, func_only=True)
def test_labelled_pods_the_slice_does_not_control_are_left_alone(
    objects: Objects, operator: OperatorProcess
) -> None:
    objects.apply(virtual_slice("mine", 4))
    ready = objects.wait_slice("mine", "Ready", SLICE_READY_S, operator)
    gang = objects.pod_uids("pathways.dev/slice=mine")
    uid = ready["metadata"]["uid"]
    labels = {"pathways.dev/slice": "mine", "pathways.dev/host-index": "0", "pathways.dev/generation": "0"}
    not_controller = [{"apiVersion": f"{GROUP}/{VERSION}", "kind": "VirtualSlice", "name": "mine",
                       "uid": uid, "controller": False}]
    objects.core.create_namespaced_pod(objects.namespace, _idle_pod("unrelated", labels))
    objects.core.create_namespaced_pod(objects.namespace, _idle_pod("referring", labels, not_controller))
    try:
        _operator_looked_again(objects, "mine")
        assert _pod_exists(objects, "unrelated") and _pod_exists(objects, "referring")
        again = objects.slice("mine")
        assert again["status"]["phase"] == "Ready" and again["status"]["restarts"] == 0
        assert {n: u for n, u in objects.pod_uids("pathways.dev/slice=mine").items() if n in gang} == gang

        objects.delete("virtualslices", "mine")
        objects.cluster.poll(
            lambda: objects.get("virtualslices", "mine") is None
            and not any(_pod_exists(objects, name) for name in gang),
            timeout=90, interval=0.5, what="slice mine and its own pods deleted",
        )
        assert _pod_exists(objects, "unrelated"), "a pod the slice does not control was deleted with it"
    finally:
        _remove_pods(objects, "unrelated", "referring")


@pytest.mark.timeout(300, func_only=True)
def test_pod_holding_a_host_pod_name_makes_the_slice_wait_holding_nothing(
    objects: Objects, operator: OperatorProcess
) -> None:
    objects.core.create_namespaced_pod(objects.namespace, _idle_pod("clash-0", {"app": "someone-else"}))
    try:
        objects.apply(virtual_slice("clash", 2))
        found = _refused(objects, "clash", f"pod {objects.namespace}/clash-0 exists and is not this "
                                           "VirtualSlice's (no controller)")
        assert "delete or rename that pod" in condition(found, "Admitted")["message"]
        assert objects.pods("pathways.dev/slice=clash") == [], "the slice holds no pods while it waits"
        assert found["status"]["island"] == ""
        assert _pod_exists(objects, "clash-0")
    finally:
        _remove_pods(objects, "clash-0")
    ready = objects.wait_slice("clash", "Ready", SLICE_READY_S, operator)
    assert condition(ready, "Admitted")["status"] == "True"


@pytest.mark.timeout(400, func_only=True)
def test_forged_status_changes_nothing(objects: Objects, operator: OperatorProcess) -> None:
    objects.apply(virtual_slice("steady", 8))
    ready = objects.wait_slice("steady", "Ready", SLICE_READY_S, operator)
    pods = objects.pod_uids("pathways.dev/slice=steady")
    hosts = ready["status"]["hosts"]
    forged = {
        "phase": "Failed",
        "restarts": 7,
        "readyHosts": "0/2",
        "island": "nowhere",
        "hosts": [{"index": 0, "pod": "someone-0", "node": "nowhere-0", "podIP": "10.0.0.1", "devices": 8}],
    }
    objects.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, objects.namespace, "virtualslices", "steady", {"status": forged}
    )

    def repaired() -> dict[str, Any] | None:
        status = objects.slice("steady").get("status") or {}
        honest = status.get("phase") == "Ready" and status.get("restarts") == 0 and status.get("hosts") == hosts
        return status if honest else None

    objects.cluster.poll(repaired, timeout=60, interval=0.25, what="forged status rewritten")
    assert objects.pod_uids("pathways.dev/slice=steady") == pods, "no pod deleted or created"

    # Forged while the operator is down: what a restarted operator remembers is not in status either.
    operator.stop(kill=True)
    objects.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, objects.namespace, "virtualslices", "steady", {"status": forged}
    )
    operator.start()
    objects.cluster.poll(repaired, timeout=90, interval=0.25, what="forged status rewritten after a restart")
    assert objects.pod_uids("pathways.dev/slice=steady") == pods, "no pod deleted or created"

    objects.apply(program("after", "examples.programs:paper_example", ref_slice("main", "steady"), steps=2))
    done = objects.wait_program("after", {"Succeeded", "Failed"}, PROGRAM_DONE_S, operator)
    assert done["status"]["phase"] == "Succeeded", done["status"].get("message")
    assert objects.pod_uids("pathways.dev/slice=steady") == pods
