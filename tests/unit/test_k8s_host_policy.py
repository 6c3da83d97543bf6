"""The NetworkPolicy in front of a slice's host pods (``k8s/host_policy.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from pathways_operator.core.slice_look import InTheWay
from pathways_operator.k8s.cluster_api import Json, KubeError
from pathways_operator.k8s.gang_actions import slice_host_policy
from pathways_operator.k8s.host_policy import (
    OperatorPods, host_policy_manifest, host_policy_name, slice_of_host_policy,
)
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

    def __init__(self, *found: Json, refuse: int = 0, refuse_update: int = 0) -> None:
        self.policies = {p["metadata"]["name"]: p for p in found}
        self.refuse = refuse
        self.refuse_update = refuse_update
        self.created: list[Json] = []
        self.replaced: list[Json] = []
        self.versions = 0

    def _stored(self, body: Json) -> Json:
        self.versions += 1
        stored = {**body, "metadata": {**body["metadata"], "resourceVersion": str(self.versions)}}
        self.policies[body["metadata"]["name"]] = stored
        return stored

    def get_network_policy(self, namespace: str, name: str) -> Json | None:
        if self.refuse:
            raise KubeError(f"reading NetworkPolicy {namespace}/{name}", self.refuse, "no")
        return self.policies.get(name)

    def create_network_policy(self, namespace: str, body: Json) -> Json:
        self.created.append(body)
        return self._stored(body)

    def replace_network_policy(self, namespace: str, name: str, body: Json) -> Json:
        doing = f"replacing NetworkPolicy {namespace}/{name}"
        if self.refuse_update:
            raise KubeError(doing, self.refuse_update, "no")
        if body["metadata"].get("resourceVersion") != self.policies[name]["metadata"]["resourceVersion"]:
            raise KubeError(doing, 409, "the object has been modified")
        self.replaced.append(body)
        return self._stored(body)


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
    (None, 403, "may not read, create or restore NetworkPolicy team-a/train-pathways-hosts", True),
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


def _opened(api: PolicyApi) -> None:
    """Someone rewrites the slice's policy to admit every pod of the cluster."""
    policy = api.policies["train-pathways-hosts"]
    api.policies["train-pathways-hosts"] = {**policy, "spec": {"podSelector": {}, "ingress": [{}]}}


def test_a_changed_host_policy_gets_the_slices_spec_back_and_an_unchanged_one_is_left_alone() -> None:
    api = PolicyApi()
    assert slice_host_policy(api, SLICE, OPERATOR) is None  # type: ignore[arg-type]
    assert slice_host_policy(api, SLICE, OPERATOR) is None  # type: ignore[arg-type]
    assert api.replaced == [], "a policy as the operator made it is not written again"

    _opened(api)
    assert slice_host_policy(api, SLICE, OPERATOR) is None  # type: ignore[arg-type]
    restored = api.policies["train-pathways-hosts"]
    assert restored["spec"] == host_policy_manifest(SLICE, OPERATOR)["spec"]
    assert restored["metadata"]["ownerReferences"] == host_policy_manifest(SLICE, OPERATOR)["metadata"]["ownerReferences"]
    assert [r["metadata"]["resourceVersion"] for r in api.replaced] == ["1"], "replaced at the version it read"


def test_a_deleted_host_policy_is_made_again() -> None:
    api = PolicyApi()
    assert slice_host_policy(api, SLICE, OPERATOR) is None  # type: ignore[arg-type]
    del api.policies["train-pathways-hosts"]
    assert slice_host_policy(api, SLICE, OPERATOR) is None  # type: ignore[arg-type]
    assert len(api.created) == 2 and api.policies["train-pathways-hosts"]["spec"] == api.created[0]["spec"]


def test_a_changed_host_policy_the_operator_may_not_restore_stops_the_gang() -> None:
    api = PolicyApi(refuse_update=403)
    assert slice_host_policy(api, SLICE, OPERATOR) is None  # type: ignore[arg-type]
    _opened(api)
    why = slice_host_policy(api, SLICE, OPERATOR)  # type: ignore[arg-type]
    assert isinstance(why, InTheWay) and why.reason == "HostPolicyForbidden" and why.warning, why
    assert "may not read, create or restore NetworkPolicy team-a/train-pathways-hosts" in why.message
    assert "update" in why.message


def test_a_policy_changed_again_while_being_restored_is_looked_at_again() -> None:
    api = PolicyApi()
    assert slice_host_policy(api, SLICE, OPERATOR) is None  # type: ignore[arg-type]
    _opened(api)
    read = api.get_network_policy

    def read_then_changed(namespace: str, name: str) -> Json | None:
        found = read(namespace, name)
        api.versions += 1
        api.policies[name] = {**api.policies[name], "metadata": {**api.policies[name]["metadata"],
                                                                 "resourceVersion": str(api.versions)}}
        return found

    api.get_network_policy = read_then_changed  # type: ignore[method-assign]
    with pytest.raises(KubeError, match="HTTP 409"):
        slice_host_policy(api, SLICE, OPERATOR)  # type: ignore[arg-type]
    api.get_network_policy = read  # type: ignore[method-assign]
    assert slice_host_policy(api, SLICE, OPERATOR) is None  # type: ignore[arg-type]
    assert api.policies["train-pathways-hosts"]["spec"] == host_policy_manifest(SLICE, OPERATOR)["spec"]


@pytest.mark.parametrize(("policy", "slice_name"), [
    ("train-pathways-hosts", "train"),
    ("a-pathways-hosts-pathways-hosts", "a-pathways-hosts"),
    ("-pathways-hosts", None),
    ("train-pathways-hosts-x", None),
    ("default-deny", None),
])
def test_the_slice_a_host_policy_belongs_to_is_read_from_its_name(policy: str, slice_name: str | None) -> None:
    assert slice_of_host_policy(policy) == slice_name
    if slice_name is not None:
        assert host_policy_name(slice_name) == policy
