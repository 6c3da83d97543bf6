"""The NetworkPolicy in front of a slice's host pods (``k8s/host_policy.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from pathways_operator.core.slice_look import InTheWay
from pathways_operator.k8s.cluster_api import Json, KubeError
from pathways_operator.k8s.gang_actions import slice_host_policy
from pathways_operator.k8s.host_policy import OperatorPods, host_policy_manifest, host_policy_name
from pathways_operator.k8s.virtual_slice import VirtualSliceObject
from pathways_wire.kube_names import SIDECAR_METRICS_PORT
from tests.unit.k8s_builders import virtual_slice

SLICE = VirtualSliceObject.from_manifest(virtual_slice("train", 8, namespace="team-a"))
OPERATOR = OperatorPods("kube-pathways", {"app.kubernetes.io/name": "kube-pathways", "app.kubernetes.io/instance": "kp"})


def _managed(key: str) -> dict[str, Any]:
    return {"podSelector": {"matchExpressions": [
        {"key": key, "operator": "Exists"},
        {"key": "app.kubernetes.io/managed-by", "operator": "In", "values": ["kube-pathways"]},
    ]}}


def test_host_policy_selects_only_the_slices_pods_and_belongs_to_the_slice() -> None:
    policy = host_policy_manifest(SLICE, OPERATOR)
    meta = policy["metadata"]
    assert (policy["kind"], meta["name"], meta["namespace"]) == ("NetworkPolicy", "train-pathways-hosts", "team-a")
    assert meta["name"] == host_policy_name("train")
    assert meta["ownerReferences"] == [SLICE.owner_reference()]
    assert meta["ownerReferences"][0]["controller"] is True
    assert policy["spec"]["podSelector"] == {"matchLabels": {
        "pathways.dev/slice": "train", "app.kubernetes.io/managed-by": "kube-pathways",
    }}
    assert policy["spec"]["policyTypes"] == ["Ingress"]


def test_host_policy_admits_hosts_drivers_and_the_operator_on_every_port_and_metrics_to_anyone() -> None:
    everything, metrics = host_policy_manifest(SLICE, OPERATOR)["spec"]["ingress"]
    assert "ports" not in everything, "peers, drivers and the operator reach ports picked at start-up"
    assert everything["from"] == [
        _managed("pathways.dev/slice"),
        _managed("pathways.dev/driver"),
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-pathways"}},
            "podSelector": {"matchLabels": dict(OPERATOR.labels)},
        },
    ]
    # No namespaceSelector on the first two: only pods of the slice's own namespace.
    assert all("namespaceSelector" not in peer for peer in everything["from"][:2])
    assert metrics == {"ports": [{"protocol": "TCP", "port": SIDECAR_METRICS_PORT}]}


@pytest.mark.parametrize(("namespace", "labels", "complaint"), [
    ("", {"app": "op"}, "namespace is empty"),
    ("kube-pathways", {}, "labels are empty: a host policy would admit every pod"),
    ("kube-pathways", {"app": 3}, "is not a label"),
])
def test_operator_pods_that_would_open_the_hosts_are_refused(namespace: str, labels: Any, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        OperatorPods(namespace, labels)


class PolicyApi:
    """The ClusterApi calls `slice_host_policy` makes, on a dict of NetworkPolicies."""

    def __init__(self, *found: Json, refuse: int = 0) -> None:
        self.policies = {p["metadata"]["name"]: p for p in found}
        self.refuse = refuse
        self.created: list[Json] = []

    def get_network_policy(self, namespace: str, name: str) -> Json | None:
        if self.refuse:
            raise KubeError(f"reading NetworkPolicy {namespace}/{name}", self.refuse, "no")
        return self.policies.get(name)

    def create_network_policy(self, namespace: str, body: Json) -> Json:
        self.created.append(body)
        self.policies[body["metadata"]["name"]] = body
        return body


def _owned_by(kind: str, uid: str) -> Json:
    return {"metadata": {"name": "train-pathways-hosts", "ownerReferences": [
        {"apiVersion": "pathways.dev/v1alpha1", "kind": kind, "name": "train", "uid": uid, "controller": True},
    ]}}


def test_a_missing_host_policy_is_made_and_then_the_slice_may_start() -> None:
    api = PolicyApi()
    assert slice_host_policy(api, SLICE, OPERATOR) is None  # type: ignore[arg-type]
    assert api.created == [host_policy_manifest(SLICE, OPERATOR)]
    assert slice_host_policy(api, SLICE, OPERATOR) is None  # type: ignore[arg-type]
    assert len(api.created) == 1, "the slice's own policy is found, not made again"


@pytest.mark.parametrize(("found", "refuse", "words", "warning"), [
    ({"metadata": {"name": "train-pathways-hosts"}}, 0,
     "exists and is not this VirtualSlice's (no controller)", True),
    (_owned_by("VirtualSlice", "an-earlier-uid"), 0, "belongs to an earlier VirtualSlice train", False),
    (None, 403, "may not read or create NetworkPolicy team-a/train-pathways-hosts", True),
])
def test_no_host_starts_without_the_slices_own_policy(
    found: Json | None, refuse: int, words: str, warning: bool,
) -> None:
    api = PolicyApi(*([found] if found else []), refuse=refuse)
    why = slice_host_policy(api, SLICE, OPERATOR)  # type: ignore[arg-type]
    assert isinstance(why, InTheWay) and words in why.message, why
    assert why.warning is warning
    assert why.reason == ("HostPolicyForbidden" if refuse == 403 else "ObjectNotOwned")
    assert api.created == [], "a foreign policy is neither replaced nor adopted"


def test_other_api_failures_are_raised_for_the_reconciler_to_retry() -> None:
    with pytest.raises(KubeError, match="HTTP 500"):
        slice_host_policy(PolicyApi(refuse=500), SLICE, OPERATOR)  # type: ignore[arg-type]
