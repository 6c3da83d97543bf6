"""How the operator's pod deletions reach the API server (``k8s/cluster_api.py``)."""

from __future__ import annotations

from typing import Any

from kubernetes import client as kclient

from pathways_operator.k8s.cluster_api import ClusterApi


class RecordingCore:
    def __init__(self) -> None:
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def delete_namespaced_pod(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append((args, kwargs))


def deletion(grace_seconds: int | None) -> dict[str, Any]:
    api = ClusterApi(kclient.ApiClient(), None)
    core = RecordingCore()
    api.core = core  # type: ignore[assignment]
    api.delete_pod("ns", "train-1", "uid-1", grace_seconds=grace_seconds)
    ((_, kwargs),) = core.calls
    body: dict[str, Any] = kclient.ApiClient().sanitize_for_serialization(kwargs["body"])  # type: ignore[no-untyped-call]
    return body


def test_immediate_pod_deletion_carries_grace_zero_in_the_body_beside_the_uid_precondition() -> None:
    # With a body, the API server reads no query parameters: the grace period must be in it.
    assert deletion(0) == {"gracePeriodSeconds": 0, "preconditions": {"uid": "uid-1"}}


def test_ordinary_pod_deletion_leaves_the_grace_period_to_the_pod() -> None:
    assert deletion(None) == {"preconditions": {"uid": "uid-1"}}
