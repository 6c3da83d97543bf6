"""With ``--host-network-policy=on`` each VirtualSlice's hosts stand behind a NetworkPolicy it owns.

A slice becomes Ready with a NetworkPolicy ``<slice>-pathways-hosts`` that selects
exactly its pods, is controlled by the slice, was made no later than its first pod,
and admits the operator's pods as the operator was told them; it goes with the slice.
A NetworkPolicy of that name made by a user before the slice is neither adopted nor
changed: the slice waits (``Admitted=False, ObjectNotOwned``) holding no pods, naming
it, and starts once it is gone. (The test cluster stores NetworkPolicies but has no
network plugin to enforce them; what they admit is checked in the unit tests.)
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client

from tests.cluster.builders import virtual_slice
from tests.cluster.harness import Objects, OperatorProcess, condition

SLICE_READY_S = 120.0
OPERATOR_NAMESPACE = "kube-pathways-system"
OPERATOR_LABELS = {"app.kubernetes.io/name": "kube-pathways", "app.kubernetes.io/component": "operator"}


@pytest.fixture(scope="module")
def operator_args() -> tuple[str, ...]:
    return ("--host-network-policy", "on", "--operator-namespace", OPERATOR_NAMESPACE,
            "--operator-pod-labels", json.dumps(OPERATOR_LABELS))


def _policy(objects: Objects, name: str) -> Any:
    try:
        return client.NetworkingV1Api(objects.cluster.api).read_namespaced_network_policy(name, objects.namespace)
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


@pytest.mark.timeout(240, func_only=True)
def test_a_slice_gets_its_host_policy_before_its_pods_and_it_goes_with_the_slice(
    objects: Objects, operator: OperatorProcess
) -> None:
    objects.apply(virtual_slice("guarded", 8))
    found = objects.wait_slice("guarded", "Ready", SLICE_READY_S, operator)
    policy = _policy(objects, "guarded-pathways-hosts")
    assert policy is not None, "a Ready slice has its host NetworkPolicy"
    owners = [(r.kind, r.name, r.uid, r.controller) for r in policy.metadata.owner_references or []]
    assert owners == [("VirtualSlice", "guarded", found["metadata"]["uid"], True)]
    selector = ",".join(f"{k}={v}" for k, v in policy.spec.pod_selector.match_labels.items())
    pods = objects.pods("pathways.dev/slice=guarded")
    assert len(pods) == 2 and {p.metadata.name for p in objects.pods(selector)} == {p.metadata.name for p in pods}
    assert all(policy.metadata.creation_timestamp <= p.metadata.creation_timestamp for p in pods)
    assert policy.spec.policy_types == ["Ingress"]
    operator_peer = policy.spec.ingress[0]._from[2]
    assert operator_peer.namespace_selector.match_labels == {"kubernetes.io/metadata.name": OPERATOR_NAMESPACE}
    assert operator_peer.pod_selector.match_labels == OPERATOR_LABELS

    objects.delete("virtualslices", "guarded")
    objects.cluster.poll(lambda: _policy(objects, "guarded-pathways-hosts") is None, timeout=60, interval=0.5,
                         what="NetworkPolicy guarded-pathways-hosts deleted with its slice")


@pytest.mark.timeout(300, func_only=True)
def test_a_users_policy_of_that_name_makes_the_slice_wait_holding_no_pods(
    objects: Objects, operator: OperatorProcess
) -> None:
    networking = client.NetworkingV1Api(objects.cluster.api)
    users = client.V1NetworkPolicy(
        metadata=client.V1ObjectMeta(name="taken-pathways-hosts"),
        spec=client.V1NetworkPolicySpec(pod_selector=client.V1LabelSelector(), ingress=[client.V1NetworkPolicyIngressRule()]),
    )
    networking.create_namespaced_network_policy(objects.namespace, users)
    objects.apply(virtual_slice("taken", 4))

    words = f"NetworkPolicy {objects.namespace}/taken-pathways-hosts exists and is not this VirtualSlice's"

    def waiting() -> dict[str, Any] | None:
        found = objects.get("virtualslices", "taken") or {}
        if (found.get("status") or {}).get("phase") != "Pending" or not found["status"].get("conditions"):
            return None
        admitted = condition(found, "Admitted")
        return found if admitted["reason"] == "ObjectNotOwned" and words in admitted["message"] else None

    objects.cluster.poll(waiting, timeout=60, interval=0.5, what=f"taken Pending, ObjectNotOwned: {words!r}")
    assert objects.pods("pathways.dev/slice=taken") == [], "no host starts without its own policy"
    assert objects.wait_event("taken", "ObjectNotOwned").type == "Warning"
    kept = networking.read_namespaced_network_policy("taken-pathways-hosts", objects.namespace)
    assert kept.metadata is not None and kept.spec is not None and kept.spec.pod_selector is not None
    assert not kept.metadata.owner_references and kept.spec.pod_selector.match_labels is None

    networking.delete_namespaced_network_policy("taken-pathways-hosts", objects.namespace)
    found = objects.wait_slice("taken", "Ready", SLICE_READY_S, operator)
    policy = _policy(objects, "taken-pathways-hosts")
    assert [(r.kind, r.uid) for r in policy.metadata.owner_references] == [("VirtualSlice", found["metadata"]["uid"])]


@pytest.mark.timeout(300, func_only=True)
def test_a_deleted_or_changed_host_policy_is_restored_while_the_slice_keeps_its_gang(
    objects: Objects, operator: OperatorProcess
) -> None:
    networking = client.NetworkingV1Api(objects.cluster.api)
    objects.apply(virtual_slice("kept", 4))
    objects.wait_slice("kept", "Ready", SLICE_READY_S, operator)
    pods = {p.metadata.uid for p in objects.pods("pathways.dev/slice=kept")}
    first = _policy(objects, "kept-pathways-hosts")
    made = networking.api_client.sanitize_for_serialization(first.spec)

    networking.delete_namespaced_network_policy("kept-pathways-hosts", objects.namespace)
    again = objects.cluster.poll(
        lambda: (p := _policy(objects, "kept-pathways-hosts")) is not None and p.metadata.uid != first.metadata.uid
        and p, timeout=30, interval=0.2, what="kept-pathways-hosts made again after its deletion")
    assert networking.api_client.sanitize_for_serialization(again.spec) == made
    assert [r.uid for r in again.metadata.owner_references] == [first.metadata.owner_references[0].uid]

    opened = client.V1NetworkPolicySpec(pod_selector=client.V1LabelSelector(), ingress=[client.V1NetworkPolicyIngressRule()])
    networking.patch_namespaced_network_policy("kept-pathways-hosts", objects.namespace, {"spec": opened})
    restored = objects.cluster.poll(
        lambda: (p := _policy(objects, "kept-pathways-hosts")) is not None
        and networking.api_client.sanitize_for_serialization(p.spec) == made and p,
        timeout=30, interval=0.2, what="kept-pathways-hosts given its spec back after it was opened")
    assert restored.metadata.uid == again.metadata.uid, "restored in place, not deleted and made again"

    objects.cluster.poll(lambda: "kept-pathways-hosts had been changed" in operator.log_path.read_text(errors="replace"), timeout=10,
                         interval=0.2, what="the operator's log saying it restored the policy")
    found = objects.wait_slice("kept", "Ready", 10, operator)
    assert {p.metadata.uid for p in objects.pods("pathways.dev/slice=kept")} == pods, "the gang kept its pods"
    assert _policy(objects, "kept-pathways-hosts").metadata.resource_version == restored.metadata.resource_version, (
        "a policy as the operator made it is not written again"
    )
    assert found["status"]["phase"] == "Ready"
    objects.delete("virtualslices", "kept")
