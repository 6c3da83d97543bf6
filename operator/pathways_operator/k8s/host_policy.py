"""The NetworkPolicy in front of a VirtualSlice's host pods.

A host pod serves several ports: the sidecar's gRPC port (8470) and the worker's
(8471), the JAX coordinator on host 0 (8476), the sidecar's metrics (8477), and
ports picked at start-up (session ports, the data channel, the collectives' own
connections between workers). The gRPC, session and data-channel ports demand the
slice's token; the JAX coordinator and the collectives' connections cannot, so only
the network keeps a stranger away from them.

With ``--host-network-policy=on`` every slice gets a NetworkPolicy
``<slice>-pathways-hosts``, owned by the VirtualSlice (it goes when the slice goes)
and created before the slice's first pod, that isolates the slice's pods for ingress
and admits, on every port:

* the pods of kube-pathways slices in the slice's namespace: its own gang's peers
  (the JAX job, collectives) and the other slices a program routes values from;
* the driver pods of kube-pathways programs in that namespace (their clients put
  inputs and fetch outputs at the sidecars);
* the operator's own pods (the controller's streams to the sidecars), matched by the
  namespace and labels the operator is told (``--operator-namespace``,
  ``--operator-pod-labels``: the Helm chart passes its Deployment's).

and, on the sidecar's metrics port only, anyone (Prometheus scrapers). The kubelet's
probes come from the node, which a NetworkPolicy never blocks.

The policy is kept, not just made: the operator watches NetworkPolicies, and when a
slice's is deleted it makes it again, and when its spec is changed it puts back its own
(``gang_actions.slice_host_policy``). One it cannot restore (it may not update it, say)
stops the slice's gang, as a missing one stops it starting.

Labels can be set by whoever creates a pod: the policy keeps out pods that are not
labelled as kube-pathways hosts or drivers of the namespace, not a namespace's own
users, whom the slice tokens stop. It takes effect where the cluster's network plugin
enforces NetworkPolicies.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from pathways_operator.k8s.cluster_api import Json
from pathways_operator.k8s.gang_pods import slice_labels, slice_object_metadata
from pathways_operator.k8s.virtual_slice import VirtualSliceObject
from pathways_wire.kube_names import (
    DRIVER_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    SIDECAR_METRICS_PORT,
    SLICE_LABEL,
)

HOST_POLICY_SUFFIX = "-pathways-hosts"

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
"""The label the API server puts on every Namespace, its own name."""


@dataclasses.dataclass(frozen=True)
class OperatorPods:
    """Where the operator's pods are and the labels that select them."""

    namespace: str
    labels: Mapping[str, str]

    def __post_init__(self) -> None:
        if not self.namespace:
            raise ValueError("the operator's namespace is empty: a host policy would admit no operator")
        if not self.labels:
            raise ValueError("the operator's pod labels are empty: a host policy would admit every pod "
                             "of the operator's namespace")
        for key, value in self.labels.items():
            if not isinstance(key, str) or not isinstance(value, str) or not key:
                raise ValueError(f"the operator's pod label {key!r}: {value!r} is not a label (string keys and "
                                 "values)")


def host_policy_name(slice_name: str) -> str:
    """The NetworkPolicy in front of the host pods of VirtualSlice ``slice_name``."""
    return f"{slice_name}{HOST_POLICY_SUFFIX}"


def slice_of_host_policy(policy_name: str) -> str | None:
    """The VirtualSlice whose host NetworkPolicy would be named ``policy_name``, if any."""
    slice_name, suffix, rest = policy_name.rpartition(HOST_POLICY_SUFFIX)
    return slice_name if suffix and slice_name and not rest else None


def _labelled(key: str) -> Json:
    """Pods of this namespace that kube-pathways manages and that bear the label ``key``."""
    return {"podSelector": {"matchExpressions": [
        {"key": key, "operator": "Exists"},
        {"key": MANAGED_BY_LABEL, "operator": "In", "values": [MANAGED_BY]},
    ]}}


def host_policy_manifest(vslice: VirtualSliceObject, operator: OperatorPods) -> Json:
    """The slice's host NetworkPolicy (see the module's docstring for what it admits)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": slice_object_metadata(vslice, host_policy_name(vslice.name)),
        "spec": {
            "podSelector": {"matchLabels": slice_labels(vslice.name)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [
                    _labelled(SLICE_LABEL),
                    _labelled(DRIVER_LABEL),
                    {
                        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: operator.namespace}},
                        "podSelector": {"matchLabels": dict(operator.labels)},
                    },
                ]},
                {"ports": [{"protocol": "TCP", "port": SIDECAR_METRICS_PORT}]},
            ],
        },
    }
