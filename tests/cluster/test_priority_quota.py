"""Priority across namespaces: the gang's pods carry the slice's PriorityClass, so a
ResourceQuota scoped to that class limits a namespace, and a gang the quota refuses is
removed whole and says why instead of retrying in silence.

System classes (``system-node-critical``) are refused by the operator; that case is in
the bad-input corpus (``bad_manifests/vs-system-priority-class.yaml``), as is a host
asking more CPU than any Node has (``vs-cpu-larger-than-any-node.yaml``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.cluster.builders import Manifest, virtual_slice
from tests.cluster.harness import Cluster, Objects, OperatorProcess, condition

CLASS = "pw-quota-test-high"
CLASS_VALUE = 100
READY_S = 120.0
REFUSED_S = 60.0


@pytest.fixture(scope="module")
def priority_class(cluster: Cluster) -> Iterator[str]:
    cluster.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
        "metadata": {"name": CLASS}, "value": CLASS_VALUE,
    }))  # fmt: skip
    yield CLASS
    cluster.kubectl("delete", "priorityclass", CLASS, "--wait=false", check=False)


def two_hosts(name: str, priority_class: str) -> Manifest:
    manifest = virtual_slice(name, 4, devices_per_host=2)
    manifest["spec"]["priorityClassName"] = priority_class
    return manifest


def quota(pods: int, priority_class: str) -> Manifest:
    return {
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "high-priority-pods"},
        "spec": {
            "hard": {"pods": str(pods)},
            "scopeSelector": {"matchExpressions": [
                {"scopeName": "PriorityClass", "operator": "In", "values": [priority_class]},
            ]},
        },
    }  # fmt: skip


def apply_quota(objects: Objects, pods: int, priority_class: str) -> None:
    """Apply the quota and wait until the quota controller has published it (admission needs status.hard)."""
    objects.apply(quota(pods, priority_class))
    core: Any = client.CoreV1Api(objects.cluster.api)

    def published() -> bool:
        found = core.read_namespaced_resource_quota("high-priority-pods", objects.namespace)
        return bool(found.status and (found.status.hard or {}).get("pods") == str(pods))

    objects.cluster.poll(published, timeout=30, interval=0.25, what=f"ResourceQuota with pods={pods} published")


@pytest.mark.timeout(240, func_only=True)
def test_worker_pods_carry_the_slice_priority_class(
    objects: Objects, operator: OperatorProcess, priority_class: str
) -> None:
    objects.apply(two_hosts("ranked", priority_class))
    objects.wait_slice("ranked", "Ready", READY_S, operator)
    pods = objects.pods("pathways.dev/slice=ranked")
    assert len(pods) == 2
    assert {(p.spec.priority_class_name, p.spec.priority) for p in pods} == {(priority_class, CLASS_VALUE)}


@pytest.mark.timeout(300, func_only=True)
def test_quota_scoped_to_the_class_refuses_the_gang_whole_and_the_slice_says_so(
    objects: Objects, operator: OperatorProcess, priority_class: str
) -> None:
    apply_quota(objects, 1, priority_class)
    objects.apply(two_hosts("capped", priority_class))

    def refused() -> Manifest | None:
        found = objects.get("virtualslices", "capped") or {}
        admitted = [c for c in (found.get("status") or {}).get("conditions") or [] if c["type"] == "Admitted"]
        return found if admitted and admitted[0]["reason"] == "PodRefused" else None

    found = objects._wait(refused, "Admitted=False, reason PodRefused", REFUSED_S, operator, "virtualslices", "capped")
    message = condition(found, "Admitted")["message"]
    assert found["status"]["phase"] == "Pending"
    assert "exceeded quota: high-priority-pods" in message and "limited: pods=1" in message, message
    assert f"kubectl describe resourcequota -n {objects.namespace}" in message
    assert objects.wait_event("capped", "PodRefused").type == "Warning"

    # The half-created gang is removed: it holds no devices while it waits.
    objects.cluster.poll(lambda: not objects.pods("pathways.dev/slice=capped"), timeout=60, interval=0.25,
                         what="pods of the refused gang removed")  # fmt: skip

    apply_quota(objects, 2, priority_class)
    ready = objects.wait_slice("capped", "Ready", READY_S + 120, operator)
    assert condition(ready, "Admitted")["status"] == "True"
