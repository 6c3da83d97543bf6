"""On Kubernetes each VirtualSlice's hosts demand its token, kept in a Secret it owns.

Two slices become Ready; each has a Secret ``<slice>-pathways-token`` owned by it and
mounted into both containers of its pods. A caller at a host of slice ``b`` presenting
slice ``a``'s token (what a pod of ``a`` holds), or none, is refused with
``UNAUTHENTICATED`` naming the host; ``b``'s own token is let in. Deleting the slice
deletes its Secret. A gang recreated after its Secret was deleted gets a new one (and
a new token), not pods waiting for a Secret that is gone.
"""

from __future__ import annotations

import base64

import grpc
import numpy as np
import pytest
from kubernetes import client

from pathways_wire import transfer
from pathways_wire import pathways_pb2 as pb
from pathways_wire import pathways_pb2_grpc as pb_grpc
from pathways_wire.slice_token import call_metadata
from tests.cluster.builders import virtual_slice
from tests.cluster.harness import Objects, OperatorProcess


def _put(address: str, token: str) -> int:
    chunks = transfer.whole_value_chunks("intruder", pb.ValueRef(node=-1, index=0), np.ones(4, np.float32), "x")
    with grpc.insecure_channel(address) as channel:
        reply = pb_grpc.DataflowStub(channel).Put(chunks, timeout=10, metadata=call_metadata(token))
    return int(reply.pieces)


@pytest.mark.timeout(240, func_only=True)
def test_a_pod_of_another_slice_is_refused(objects: Objects, operator: OperatorProcess) -> None:
    objects.apply(virtual_slice("a", 4))
    objects.apply(virtual_slice("b", 4))
    objects.wait_slice("a", "Ready", 120, operator)
    b = objects.wait_slice("b", "Ready", 120, operator)
    token_a, token_b = objects.slice_token("a"), objects.slice_token("b")
    assert token_a and token_b and token_a != token_b
    pod = objects.pods("pathways.dev/slice=b")[0]
    for container in pod.spec.containers:
        env = {e.name: e.value for e in container.env or []}
        assert env["PATHWAYS_SLICE_TOKEN_FILE"].startswith("/var/run/pathways/slice-token/"), container.name
    address = f"{b['status']['hosts'][0]['podIP']}:8470"
    for token, why in (("", "presented no x-pathways-slice-token"), (token_a, "another slice's")):
        with pytest.raises(grpc.RpcError) as refused:
            _put(address, token)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        details = refused.value.details() or ""
        assert "host b/host-0" in details, details
        assert why in details, details
    assert _put(address, token_b) == 1

    objects.delete("virtualslices", "b")

    def secret_gone() -> bool:
        try:
            objects.cluster.core.read_namespaced_secret("b-pathways-token", objects.namespace)
        except Exception:  # noqa: BLE001 - 404 once deleted
            return True
        return False

    objects.cluster.poll(secret_gone, timeout=60, interval=0.5, what="Secret b-pathways-token deleted")


@pytest.mark.timeout(300, func_only=True)
def test_a_gang_recreated_after_its_secret_was_deleted_gets_a_new_one(
    objects: Objects, operator: OperatorProcess
) -> None:
    objects.apply(virtual_slice("rekeyed", 4))
    objects.wait_slice("rekeyed", "Ready", 120, operator)
    core = client.CoreV1Api(objects.cluster.api)
    first = core.read_namespaced_secret("rekeyed-pathways-token", objects.namespace)
    core.delete_namespaced_secret("rekeyed-pathways-token", objects.namespace)
    old = objects.pods("pathways.dev/slice=rekeyed")
    core.delete_namespaced_pod(old[0].metadata.name, objects.namespace, grace_period_seconds=0)

    def ready_again() -> bool:
        found = objects.get("virtualslices", "rekeyed") or {}
        status = found.get("status") or {}
        pods = objects.pods("pathways.dev/slice=rekeyed")
        return (status.get("phase") == "Ready" and status.get("restarts", 0) >= 1 and bool(pods)
                and all(p.metadata.uid not in {o.metadata.uid for o in old} for p in pods))

    objects.cluster.poll(ready_again, timeout=120, interval=0.5, what="rekeyed Ready again on a new gang")
    second = core.read_namespaced_secret("rekeyed-pathways-token", objects.namespace)
    assert second.metadata is not None and first.metadata is not None
    assert second.metadata.uid != first.metadata.uid, "the new gang's Secret was made anew"
    assert objects.slice_token("rekeyed") and objects.slice_token("rekeyed") != _token(first)
    objects.delete("virtualslices", "rekeyed")


def _token(secret: client.V1Secret) -> str:
    return base64.b64decode((secret.data or {}).get("token", "")).decode()
