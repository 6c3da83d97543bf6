"""The worker pods a gang is made of (``k8s/gang_pods.py``) and how a pod is read back."""

from __future__ import annotations

import dataclasses
import re
from decimal import Decimal
from typing import Any

import pytest

from pathways_operator.core.placement import HostResources
from pathways_operator.k8s.gang_pods import (
    PodView,
    WorkerDefaults,
    check_resources,
    host_pod_manifest,
    host_resources,
    placement_from_json,
    placement_to_json,
    quantity,
    requested_devices,
    requested_resources,
)
from pathways_wire.kube_names import DEVICE_RESOURCE, PLACEMENT_ANNOTATION, SCHEDULER_NAME
from pathways_operator.k8s.virtual_slice import VirtualSliceObject
from tests.unit.k8s_builders import placement, pod, virtual_slice

GANG = placement("ns/train", "island-a", ("a-0", 4), ("a-1", 4))
SLICE = VirtualSliceObject.from_manifest(virtual_slice("train", 8))


def env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "<from field>") for e in container["env"]}


def containers(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in manifest["spec"]["containers"]}


def test_host_pod_is_a_worker_and_a_dataflow_sidecar_bound_by_the_operator() -> None:
    manifest = host_pod_manifest(SLICE, GANG, 1, generation=3, defaults=WorkerDefaults())
    meta, spec = manifest["metadata"], manifest["spec"]
    assert meta["name"] == "train-1" and meta["namespace"] == "ns"
    assert meta["labels"]["pathways.dev/slice"] == "train"
    assert meta["labels"]["pathways.dev/host-index"] == "1"
    assert meta["labels"]["pathways.dev/generation"] == "3"
    assert meta["ownerReferences"][0]["uid"] == "uid-train"
    assert placement_from_json("ns/train", meta["annotations"][PLACEMENT_ANNOTATION]) == GANG
    assert spec["schedulerName"] == SCHEDULER_NAME and spec["restartPolicy"] == "Never"
    by_name = containers(manifest)
    assert sorted(by_name) == ["dataflow", "worker"]
    worker = env(by_name["worker"])
    assert worker["PATHWAYS_HOST_INDEX"] == "1" and worker["PATHWAYS_NUM_HOSTS"] == "2"
    assert "PATHWAYS_COORDINATOR" not in worker, "host 0's IP does not exist yet: the sidecar is told it"
    assert worker["PATHWAYS_SHM_DIR"] == env(by_name["dataflow"])["PATHWAYS_SHM_DIR"]
    assert worker["PATHWAYS_DEVICES"] == "4"
    assert by_name["worker"]["resources"]["requests"][DEVICE_RESOURCE] == "4"
    assert requested_devices(manifest) == 4


def test_host_zero_coordinates_on_its_own_ip() -> None:
    manifest = host_pod_manifest(SLICE, GANG, 0, generation=1, defaults=WorkerDefaults())
    assert env(containers(manifest)["worker"])["PATHWAYS_COORDINATOR"] == "$(POD_IP):8476"


def test_sidecar_exposes_its_metrics_port() -> None:
    sidecar = containers(host_pod_manifest(SLICE, GANG, 0, 1, WorkerDefaults()))["dataflow"]
    ports = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    assert ports["metrics"] == int(env(sidecar)["PATHWAYS_SIDECAR_METRICS_PORT"])
    assert ports["dataflow"] == sidecar["readinessProbe"]["tcpSocket"]["port"]


def test_slice_image_and_resources_override_the_operator_defaults() -> None:
    custom = VirtualSliceObject.from_manifest(
        virtual_slice("train", 8, image="me/worker:1", resources={"requests": {"cpu": "2"}})
    )
    defaults = WorkerDefaults(image="default:1", pull_policy="IfNotPresent", resources={"requests": {"cpu": "1"}})
    by_name = containers(host_pod_manifest(custom, GANG, 0, 1, defaults))
    assert {c["image"] for c in by_name.values()} == {"me/worker:1"}
    assert {c["imagePullPolicy"] for c in by_name.values()} == {"IfNotPresent"}
    assert by_name["worker"]["resources"]["requests"] == {"cpu": "2", DEVICE_RESOURCE: "4"}
    plain = containers(host_pod_manifest(SLICE, GANG, 0, 1, defaults))
    assert plain["worker"]["image"] == "default:1"
    assert plain["worker"]["resources"]["requests"]["cpu"] == "1"


def test_placement_json_round_trips_and_garbage_is_none() -> None:
    assert placement_from_json("ns/train", placement_to_json(GANG)) == GANG
    assert placement_from_json("ns/train", "not json") is None
    assert placement_from_json("ns/train", "") is None


def test_pod_view_reads_labels_devices_and_readiness() -> None:
    view = PodView.from_manifest(
        pod("train-1", node="a-1", devices=4, slice_="train", host_index=1, generation=2, ready=True)
    )
    assert (view.slice, view.host_index, view.generation) == ("train", 1, 2)
    assert view.devices == 4 and view.node == "a-1" and view.ready and view.live
    assert view.failure == ""


def test_pod_view_says_why_a_host_is_gone() -> None:
    failed = PodView.from_manifest(pod("x-1", phase="Failed", terminated=("worker", 1, "Error")))
    assert failed.failure == "container worker exited with code 1 (Error)" and not failed.live
    evicted = PodView.from_manifest({**pod("x-2", phase="Failed"), "status": {"phase": "Failed", "reason": "Evicted"}})
    assert evicted.failure == "Evicted"
    assert PodView.from_manifest(pod("x-3", deleting=True)).deleting


def test_requested_devices_ignores_unparsable_values() -> None:
    manifest = pod("p", devices=2)
    manifest["spec"]["containers"].append({"name": "odd", "resources": {"limits": {DEVICE_RESOURCE: "many"}}})
    assert requested_devices(manifest) == 2


GiB = 1 << 30


def test_host_resources_are_what_both_containers_of_the_pod_request() -> None:
    custom = VirtualSliceObject.from_manifest(
        virtual_slice("train", 8, resources={"requests": {"cpu": "1500m"}, "limits": {"memory": "2Gi"}})
    )
    needs = host_resources(custom, WorkerDefaults())
    assert needs == HostResources(cpu_millis=1500, memory_bytes=2 * GiB), "a limit alone is the request"
    manifest = host_pod_manifest(custom, GANG, 0, 1, WorkerDefaults())
    assert requested_resources(manifest) == needs, "placement fits exactly what the pod requests"


def test_host_resources_fall_back_to_the_operator_defaults() -> None:
    defaults = WorkerDefaults(resources={"requests": {"cpu": "1", "memory": "512Mi"}})
    assert host_resources(SLICE, defaults) == HostResources(1000, 512 << 20)
    assert host_resources(SLICE, WorkerDefaults()) == HostResources()


@pytest.mark.parametrize(
    ("resources", "words"),
    [
        ({"requests": {"cpu": "lots"}}, "spec.resources.requests.cpu: 'lots' is not a Kubernetes quantity"),
        ({"limits": {"memory": "-1Gi"}}, "spec.resources.limits.memory: '-1Gi' is negative"),
        ({"requests": ["cpu"]}, "spec.resources.requests must be a map"),
        ({"requests": {"cpu": True}}, "spec.resources.requests.cpu: True is not a Kubernetes quantity"),
        ({"requests": {"cpu": "2"}, "limits": {"cpu": "1500m"}},
         "spec.resources.requests.cpu (2) is more than spec.resources.limits.cpu (1500m)"),
    ],
)
def test_malformed_resources_are_refused_naming_the_field(resources: dict[str, Any], words: str) -> None:
    bad = VirtualSliceObject.from_manifest(virtual_slice("train", 8, resources=resources))
    with pytest.raises(ValueError, match=re.escape(words)):
        host_resources(bad, WorkerDefaults())


def test_check_resources_names_where_the_resources_came_from() -> None:
    with pytest.raises(ValueError, match="--worker-resources.requests.cpu: 'x'"):
        check_resources({"requests": {"cpu": "x"}}, "--worker-resources")
    check_resources({"requests": {"cpu": 2, "memory": "1e9", "ephemeral-storage": "1Gi"}}, "ok")


@pytest.mark.parametrize(
    ("text", "value"), [("500m", Decimal("0.5")), ("2", Decimal(2)), ("4Gi", Decimal(4 * GiB)), (3, Decimal(3)),
                        ("1e3", Decimal(1000)), ("1k", Decimal(1000))],
)
def test_quantity_parses_kubernetes_quantities(text: str | int, value: Decimal) -> None:
    assert quantity(text, "f") == value


def test_pod_requests_count_like_kube_scheduler() -> None:
    # containers 1 + 2 cpu, a sidecar init container 1 cpu, a plain init container 3 cpu, overhead 250m.
    manifest = {"spec": {
        "containers": [{"resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
                       {"resources": {"limits": {"cpu": "2"}}}],
        "initContainers": [{"restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}},
                           {"resources": {"requests": {"cpu": "3", "memory": "4Gi"}}}],
        "overhead": {"cpu": "250m"},
    }}
    # cpu: max(1 + 2 + 1 sidecar, 1 sidecar + 3 init) + 250m; memory: max(1Gi, 4Gi).
    assert requested_resources(manifest) == HostResources(4250, 4 * GiB)
    assert requested_resources({"spec": {}}) == HostResources()


def test_pod_view_reads_cpu_and_memory_requests() -> None:
    view = PodView.from_manifest(pod("p", node="a-0", requests={"cpu": "250m", "memory": "1Gi"}))
    assert (view.cpu_millis, view.memory_bytes) == (250, GiB)


def test_placement_json_carries_the_host_resources() -> None:
    gang = dataclasses.replace(GANG, host_resources=HostResources(2000, GiB))
    assert placement_from_json("ns/train", placement_to_json(gang)) == gang
    assert "hostResources" not in placement_to_json(GANG), "annotations of plain gangs are unchanged"


def test_every_pod_of_the_gang_carries_the_slice_priority_class() -> None:
    urgent = VirtualSliceObject.from_manifest(virtual_slice("train", 8, priorityClassName="team-high"))
    for index in (0, 1):
        assert host_pod_manifest(urgent, GANG, index, 1, WorkerDefaults())["spec"][
            "priorityClassName"] == "team-high"
    assert "priorityClassName" not in host_pod_manifest(SLICE, GANG, 0, 1, WorkerDefaults())["spec"]


def test_host_pods_mount_no_service_account_token() -> None:
    for index in (0, 1):
        spec = host_pod_manifest(SLICE, GANG, index, 1, WorkerDefaults())["spec"]
        assert spec["automountServiceAccountToken"] is False
